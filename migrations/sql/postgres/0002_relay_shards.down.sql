DROP INDEX IF EXISTS outbox_dead_letter_idx;
DROP TABLE IF EXISTS outbox_relay_shard;
DROP TABLE IF EXISTS outbox_relay_instance;
