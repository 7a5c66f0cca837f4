-- The maintenance lock of the database again (`0010`, `0011`).

CREATE OR REPLACE FUNCTION outbox_create_partitions(days_ahead integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    waiting date;
    created integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(1869968482, 100);
    -- Moving rows out of the default partition locks them, and attaching
    -- their day then needs the default partition to itself, which a claim
    -- reading it holds until it ends: a claim waiting for a moved row would
    -- deadlock with this. Every claim holds this lock shared from its
    -- start: wait for the claims open now, and make later ones wait.
    IF EXISTS (SELECT 1 FROM outbox_default WHERE isfinite(created_at)) THEN
        PERFORM pg_advisory_xact_lock(
            (1869968482::bigint << 32) | 'outbox'::regclass::oid::bigint);
    END IF;
    FOR waiting IN
        SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date FROM outbox_default
        WHERE isfinite(created_at) ORDER BY 1
    LOOP
        IF outbox_create_day_partition(waiting) THEN
            created := created + 1;
        END IF;
    END LOOP;
    FOR offset_days IN 0 .. greatest(days_ahead, 0) LOOP
        IF outbox_create_day_partition(today + offset_days) THEN
            created := created + 1;
        END IF;
    END LOOP;
    RETURN created;
END
$$;

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
