DROP INDEX IF EXISTS outbox_pending_aggregate_idx;
