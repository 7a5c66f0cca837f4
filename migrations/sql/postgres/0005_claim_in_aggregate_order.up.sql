-- Claims in aggregate order (PostgreSQL).
--
-- The relay takes the aggregates of the oldest pending rows (by `seq`, the
-- pending index) and, for each, its pending rows in `aggregate_seq` order,
-- so an aggregate's events are sent in the order their sequence numbers were
-- given, whatever order concurrent writers inserted them in. This index
-- serves the second step; rows written by plain SQL (no `aggregate_seq`)
-- come first, in insertion order.
--
-- On a large existing table, build it beforehand without blocking writers:
--   CREATE INDEX CONCURRENTLY outbox_pending_aggregate_idx ON outbox
--     (aggregatetype, aggregateid, aggregate_seq NULLS FIRST, seq)
--     WHERE published_at IS NULL AND dead_lettered_at IS NULL;

CREATE INDEX IF NOT EXISTS outbox_pending_aggregate_idx
    ON outbox (aggregatetype, aggregateid, aggregate_seq NULLS FIRST, seq)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;
