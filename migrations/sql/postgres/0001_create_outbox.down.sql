DROP TABLE IF EXISTS outbox;
DROP TABLE IF EXISTS outbox_sequence;
DROP FUNCTION IF EXISTS outbox_notify();
