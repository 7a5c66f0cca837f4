-- Creating day partitions by hand (`SELECT outbox_create_partitions(7)`)
-- waits for the claims open on the outbox before it moves rows out of the
-- default partition, as `outbox-relay partitions maintain` does: moving a
-- row a claim waits for while attaching its day would otherwise deadlock
-- the two (PostgreSQL ends one of them after a second). Only on an outbox
-- partitioned by `0008_partition_outbox`.

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
