-- Claims in aggregate order (MariaDB / MySQL).
--
-- The relay takes the aggregates of the oldest pending rows (by `seq`) and,
-- for each, its pending rows in `aggregate_seq` order, so an aggregate's
-- events are sent in the order their sequence numbers were given. This
-- index serves the second step: an aggregate's pending rows are the
-- (aggregate, NULL, NULL) prefix, in claim order. Rows written by plain SQL
-- (no `aggregate_seq`) come first, in insertion order.
--
-- MySQL has no CREATE INDEX IF NOT EXISTS: the statement is built only
-- when the index is missing, so the script can run twice.

SET @outbox_create_index = (
    SELECT IF(COUNT(*) = 0,
        'CREATE INDEX outbox_pending_aggregate_idx ON outbox (aggregatetype, aggregateid, published_at, dead_lettered_at, aggregate_seq, seq)',
        'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = 'outbox'
      AND index_name = 'outbox_pending_aggregate_idx'
);
PREPARE outbox_create_index FROM @outbox_create_index;
EXECUTE outbox_create_index;
DEALLOCATE PREPARE outbox_create_index;
