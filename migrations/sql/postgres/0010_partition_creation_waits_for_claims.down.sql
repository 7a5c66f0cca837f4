-- Back to creating day partitions without waiting for open claims.

CREATE OR REPLACE FUNCTION outbox_create_partitions(days_ahead integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    waiting date;
    created integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(1869968482, 100);
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
