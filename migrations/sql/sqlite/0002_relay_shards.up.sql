-- SQLite runs a single relay per database file, so it has no shard
-- ownership tables.

-- Dead letters are few; counting them stays cheap for the metrics.
CREATE INDEX IF NOT EXISTS outbox_dead_letter_idx ON outbox (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL;
