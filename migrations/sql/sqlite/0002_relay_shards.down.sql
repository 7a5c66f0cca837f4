DROP INDEX IF EXISTS outbox_dead_letter_idx;
