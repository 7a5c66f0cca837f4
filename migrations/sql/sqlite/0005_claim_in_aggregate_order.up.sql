-- Claims in aggregate order (SQLite).
--
-- The relay takes the aggregates of the oldest pending rows (by `seq`) and,
-- for each, its pending rows in `aggregate_seq` order, so an aggregate's
-- events are sent in the order their sequence numbers were given. This
-- index serves the second step; rows written by plain SQL (no
-- `aggregate_seq`) come first, in insertion order.

CREATE INDEX IF NOT EXISTS outbox_pending_aggregate_idx
    ON outbox (aggregatetype, aggregateid, aggregate_seq, seq)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;
