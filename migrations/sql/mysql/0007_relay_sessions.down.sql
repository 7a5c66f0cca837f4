DROP TABLE IF EXISTS outbox_relay_session;
