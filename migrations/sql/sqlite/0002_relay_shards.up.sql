-- SQLite runs a single relay per database file, so it has no shard
-- ownership; this migration exists to keep the versions of all backends
-- aligned.
SELECT 1;
