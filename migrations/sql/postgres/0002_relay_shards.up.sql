-- Shard ownership of the relay instances (PostgreSQL).
--
-- Each pending row belongs to a shard, a stable hash of its aggregate, and
-- each shard has at most one owner at a time: a relay instance holding an
-- unexpired lease. `epoch` grows at every change of owner; an instance
-- marks rows only while its epochs are current.

CREATE TABLE IF NOT EXISTS outbox_relay_shard (
    shard       INTEGER     PRIMARY KEY,
    owner       VARCHAR(64),
    epoch       BIGINT      NOT NULL DEFAULT 0,
    lease_until TIMESTAMPTZ
);

-- Live relay instances, so each can take a fair share of the shards.
CREATE TABLE IF NOT EXISTS outbox_relay_instance (
    id          VARCHAR(64) PRIMARY KEY,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);

-- Dead letters are few; counting them stays cheap for the metrics.
CREATE INDEX IF NOT EXISTS outbox_dead_letter_idx ON outbox (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL;
