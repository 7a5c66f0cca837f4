DROP TABLE IF EXISTS outbox_relay_shard;
DROP TABLE IF EXISTS outbox_relay_instance;
