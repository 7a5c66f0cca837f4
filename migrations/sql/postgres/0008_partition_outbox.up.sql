-- Day-partitioned outbox (PostgreSQL 13 or later). Not part of the default
-- migrations: `outbox-relay migrate --partitioned`, or add
-- `outbox_migrations::PartitionOutbox` to your migrator after the others.
--
-- The outbox becomes a table partitioned by range on `created_at`, one
-- partition per day (UTC), named `outbox_pYYYYMMDD`, plus `outbox_default`,
-- which takes a row whose day has no partition yet, so that no insert ever
-- fails; `outbox_create_partitions` moves such rows into their day's
-- partition. Retention drops a day's partition once every row in it is
-- published (`outbox-relay partitions maintain`): no DELETE, no vacuum debt.
--
-- The primary key becomes (id, created_at), as PostgreSQL requires of a
-- partitioned table's unique keys: two rows may then share an id only with
-- different creation times. Event ids are UUIDs drawn per event, and
-- consumers deduplicate by id, so this changes nothing they rely on.
--
-- Run on an existing plain outbox, this converts it in one transaction
-- that holds the table's lock throughout (writers wait):
--   * an empty table is replaced;
--   * a table with rows becomes the partition `outbox_unpartitioned` for
--     every creation time before tomorrow (UTC), rows unmoved and still
--     pending where they were; day partitions start tomorrow, and
--     maintenance drops `outbox_unpartitioned` like any other partition
--     once all its rows are published. Attaching it builds the new primary
--     key's index and checks its rows' creation times: time proportional
--     to the table, under the lock. Publish or clean up first to keep it
--     short.
-- A publication (CDC mode) that names the plain table names the partitioned
-- one afterwards, publishing through the partition root (a consumer sees
-- one table); a CDC relay reading it carries on. A publication FOR ALL
-- TABLES is left as it is: `outbox-relay run --mode cdc` says what to set.

-- The outbox's partitions with their ranges (NULL: unbounded), the
-- default partition last.
CREATE OR REPLACE FUNCTION outbox_partitions()
RETURNS TABLE (name text, lower_bound timestamptz, upper_bound timestamptz, is_default boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.relname::text,
           CASE WHEN b.expr LIKE 'FOR VALUES FROM (MINVALUE)%' THEN NULL
                ELSE substring(b.expr FROM 'FROM \(''([^'']*)''\)')::timestamptz END,
           CASE WHEN b.expr LIKE '%TO (MAXVALUE)' THEN NULL
                ELSE substring(b.expr FROM 'TO \(''([^'']*)''\)')::timestamptz END,
           b.expr = 'DEFAULT'
    FROM pg_inherits AS i
    JOIN pg_class AS c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) AS b
    WHERE i.inhparent = 'outbox'::regclass
    ORDER BY b.expr = 'DEFAULT', 2 NULLS FIRST
$$;

-- Creates the partition of one day (UTC), moving into it the rows of that
-- day the default partition holds. Returns whether it created one: not
-- when a partition already covers part of the day.
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

-- Creates the partitions of today and the `days_ahead` days after it (UTC),
-- and of every day whose rows wait in the default partition. Returns how
-- many it created. One caller at a time (an advisory lock of the wake-up
-- key's family, slot 100).
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

DO $$
DECLARE
    kind "char";
    has_rows boolean;
    next_seq bigint;
    identity_sequence text;
    publications text[];
    publication text;
BEGIN
    SELECT c.relkind INTO kind FROM pg_class AS c WHERE c.oid = to_regclass('outbox');
    IF kind = 'p' THEN
        RETURN;
    END IF;
    LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
    SELECT EXISTS (SELECT 1 FROM outbox) INTO has_rows;
    SELECT COALESCE(array_agg(p.pubname::text), '{}') INTO publications
    FROM pg_publication AS p JOIN pg_publication_rel AS r ON r.prpubid = p.oid
    WHERE r.prrelid = 'outbox'::regclass;
    identity_sequence := pg_get_serial_sequence('outbox', 'seq');
    SELECT greatest(
        (SELECT COALESCE(max(seq), 0) FROM outbox),
        COALESCE(pg_sequence_last_value(identity_sequence::regclass), 0)) + 1
    INTO next_seq;

    ALTER TABLE outbox RENAME TO outbox_unpartitioned;
    -- Its key becomes the partitioned table's (id, created_at).
    ALTER TABLE outbox_unpartitioned DROP CONSTRAINT IF EXISTS outbox_pkey;
    ALTER INDEX IF EXISTS outbox_pending_idx RENAME TO outbox_unpartitioned_pending_idx;
    ALTER INDEX IF EXISTS outbox_published_idx RENAME TO outbox_unpartitioned_published_idx;
    ALTER INDEX IF EXISTS outbox_pending_aggregate_idx
        RENAME TO outbox_unpartitioned_pending_aggregate_idx;
    DROP TRIGGER IF EXISTS outbox_notify ON outbox_unpartitioned;
    ALTER TABLE outbox_unpartitioned ALTER COLUMN seq DROP IDENTITY IF EXISTS;

    EXECUTE format('CREATE SEQUENCE IF NOT EXISTS outbox_seq START WITH %s', next_seq);
    CREATE TABLE outbox (
        id               UUID         NOT NULL,
        aggregatetype    VARCHAR(255) NOT NULL,
        aggregateid      VARCHAR(255) NOT NULL,
        type             VARCHAR(255) NOT NULL,
        payload          JSONB,
        -- insertion order; the relay claims pending rows by it
        seq              BIGINT       NOT NULL DEFAULT nextval('outbox_seq'),
        event_version    INTEGER      NOT NULL DEFAULT 1,
        -- 1, 2, 3, ... per aggregate, in commit order; NULL for rows written by plain SQL
        aggregate_seq    BIGINT,
        traceparent      VARCHAR(255),
        -- the partition key
        created_at       TIMESTAMPTZ  NOT NULL DEFAULT now(),
        published_at     TIMESTAMPTZ,
        attempts         INTEGER      NOT NULL DEFAULT 0,
        last_error       TEXT,
        dead_lettered_at TIMESTAMPTZ,
        PRIMARY KEY (id, created_at)
    ) PARTITION BY RANGE (created_at);
    ALTER SEQUENCE outbox_seq OWNED BY outbox.seq;

    CREATE INDEX outbox_pending_idx ON outbox (seq)
        WHERE published_at IS NULL AND dead_lettered_at IS NULL;
    CREATE INDEX outbox_published_idx ON outbox (published_at)
        WHERE published_at IS NOT NULL;
    CREATE INDEX outbox_pending_aggregate_idx
        ON outbox (aggregatetype, aggregateid, aggregate_seq NULLS FIRST, seq)
        WHERE published_at IS NULL AND dead_lettered_at IS NULL;
    -- Maintenance finds a partition's dead letters without reading it whole.
    CREATE INDEX outbox_dead_lettered_idx ON outbox (dead_lettered_at)
        WHERE dead_lettered_at IS NOT NULL;

    IF has_rows THEN
        EXECUTE format(
            'ALTER TABLE outbox ATTACH PARTITION outbox_unpartitioned FOR VALUES FROM (MINVALUE) TO (%L)',
            ((now() AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC');
    ELSE
        DROP TABLE outbox_unpartitioned;
    END IF;
    CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;

    -- Publications of the plain table (CDC mode) publish the partitioned
    -- one through its root from this transaction on: no insert is missed.
    FOREACH publication IN ARRAY publications LOOP
        IF has_rows THEN
            EXECUTE format('ALTER PUBLICATION %I DROP TABLE outbox_unpartitioned', publication);
        END IF;
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE outbox', publication);
        EXECUTE format('ALTER PUBLICATION %I SET (publish_via_partition_root = true)',
                       publication);
    END LOOP;

    CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
        FOR EACH STATEMENT
        WHEN (NOT pg_try_advisory_xact_lock(1869968482, pg_backend_pid() % 64))
        EXECUTE FUNCTION outbox_notify();

    PERFORM outbox_create_partitions(7);
END
$$;
