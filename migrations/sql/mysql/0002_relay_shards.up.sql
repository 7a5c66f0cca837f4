-- Shard ownership of the relay instances (MariaDB / MySQL).
--
-- Each pending row belongs to a shard, a stable hash of its aggregate, and
-- each shard has at most one owner at a time: a relay instance holding an
-- unexpired lease. `epoch` grows at every change of owner; an instance
-- marks rows only while its epochs are current. Times are UTC.

CREATE TABLE IF NOT EXISTS outbox_relay_shard (
    shard       INT         NOT NULL PRIMARY KEY,
    owner       VARCHAR(64) NULL,
    epoch       BIGINT      NOT NULL DEFAULT 0,
    lease_until DATETIME(6) NULL
) ENGINE = InnoDB;

-- Live relay instances, so each can take a fair share of the shards.
CREATE TABLE IF NOT EXISTS outbox_relay_instance (
    id          VARCHAR(64) NOT NULL PRIMARY KEY,
    started_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    lease_until DATETIME(6) NOT NULL
) ENGINE = InnoDB;
