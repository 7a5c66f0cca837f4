-- Claims read every day again.

CREATE OR REPLACE FUNCTION outbox_create_day_partition(day date)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    partition text := 'outbox_p' || to_char(day, 'YYYYMMDD');
    day_start timestamptz := day::timestamp AT TIME ZONE 'UTC';
    day_end timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF EXISTS (
        SELECT 1 FROM outbox_partitions() AS p
        WHERE NOT p.is_default
          AND (p.lower_bound IS NULL OR p.lower_bound < day_end)
          AND (p.upper_bound IS NULL OR p.upper_bound > day_start)
    ) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE outbox INCLUDING DEFAULTS)', partition);
    EXECUTE format(
        'WITH moved AS (DELETE FROM outbox_default WHERE created_at >= $1 AND created_at < $2 RETURNING *) '
        'INSERT INTO %I SELECT * FROM moved', partition)
        USING day_start, day_end;
    EXECUTE format('ALTER TABLE outbox ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   partition, day_start, day_end);
    RETURN true;
END
$$;

DROP FUNCTION IF EXISTS outbox_claim_window_watch(text);
DROP FUNCTION IF EXISTS outbox_claim_window_reopen() CASCADE;
DROP TABLE IF EXISTS outbox_claim_window;
