DROP TABLE IF EXISTS outbox_replay_row;
DROP TABLE IF EXISTS outbox_replay;
