-- Claims on a day-partitioned outbox leave out the days that hold no
-- pending row (PostgreSQL). Only on an outbox partitioned by
-- `0008_partition_outbox`.
--
-- Every partition a claim reads costs it time for each row it locks, so
-- partition maintenance (`outbox-relay partitions maintain`, or a relay
-- run with `--partition-maintenance`) *settles* the oldest days: those
-- before yesterday (UTC) up to the first that holds a pending row. A
-- settled day gets the row trigger `outbox_claim_window`, and the window's
-- lower bound (`outbox_claim_window.low`) moves to the first day left
-- open. Claims read only the rows created from `low` on, while
-- `outbox_claim_window.version` is the one they read `low` with.
--
-- A row that becomes pending in a settled day (written with an old
-- creation time by plain SQL, a dead letter re-driven) or in the default
-- partition before `low` reopens the window: its trigger sets `low` back
-- to -infinity and bumps the version, in the writer's transaction, so a
-- claim that sees the row also sees the new version, and reads every day
-- again until the next maintenance.

CREATE TABLE IF NOT EXISTS outbox_claim_window (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version bigint NOT NULL DEFAULT 0,
    low timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO outbox_claim_window DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Every pending row written into a watched partition bumps the version,
-- even one the window already covers: a maintenance settling days
-- meanwhile then finds the version changed and leaves the window as it is
-- (it would otherwise move the window past a row it did not see), and a
-- writer under REPEATABLE READ or SERIALIZABLE that raced with it fails
-- to serialize instead of passing the window by.
CREATE OR REPLACE FUNCTION outbox_claim_window_reopen()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE outbox_claim_window SET version = version + 1,
        low = CASE WHEN NEW.created_at < low THEN '-infinity'::timestamptz ELSE low END;
    RETURN NULL;
END
$$;

-- Gives partition `partition` the trigger that reopens the claim window
-- when one of its rows becomes pending (once).
CREATE OR REPLACE FUNCTION outbox_claim_window_watch(partition text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_trigger
        WHERE tgrelid = partition::regclass AND tgname = 'outbox_claim_window'
    ) THEN
        EXECUTE format(
            'CREATE TRIGGER outbox_claim_window AFTER INSERT OR UPDATE ON %I '
            'FOR EACH ROW WHEN (NEW.published_at IS NULL AND NEW.dead_lettered_at IS NULL) '
            'EXECUTE FUNCTION outbox_claim_window_reopen()', partition);
        -- Also where rows are applied as a replica (a logical subscriber,
        -- a restore without triggers).
        EXECUTE format('ALTER TABLE %I ENABLE ALWAYS TRIGGER outbox_claim_window', partition);
    END IF;
END
$$;

-- As `0008_partition_outbox`, and a day created before the claim window
-- (for rows the default partition caught) is watched as a settled day;
-- under the maintenance lock (an advisory lock of the wake-up key's
-- family, slot 100), so that no maintenance moves the window meanwhile.
CREATE OR REPLACE FUNCTION outbox_create_day_partition(day date)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    partition text := 'outbox_p' || to_char(day, 'YYYYMMDD');
    day_start timestamptz := day::timestamp AT TIME ZONE 'UTC';
    day_end timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    PERFORM pg_advisory_xact_lock(1869968482, 100);
    IF EXISTS (
        SELECT 1 FROM outbox_partitions() AS p
        WHERE NOT p.is_default
          AND (p.lower_bound IS NULL OR p.lower_bound < day_end)
          AND (p.upper_bound IS NULL OR p.upper_bound > day_start)
    ) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE outbox INCLUDING DEFAULTS)', partition);
    IF day_end <= (SELECT low FROM outbox_claim_window) THEN
        PERFORM outbox_claim_window_watch(partition);
    END IF;
    EXECUTE format(
        'WITH moved AS (DELETE FROM outbox_default WHERE created_at >= $1 AND created_at < $2 RETURNING *) '
        'INSERT INTO %I SELECT * FROM moved', partition)
        USING day_start, day_end;
    EXECUTE format('ALTER TABLE outbox ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   partition, day_start, day_end);
    RETURN true;
END
$$;
