-- Outbox tables for MariaDB (10.6 or later) and MySQL (8.0 or later).
--
-- `id`, `aggregatetype`, `aggregateid`, `type` and `payload` are the columns
-- of Debezium's Outbox Event Router; every other column has a default, so an
-- INSERT naming only those five is a valid pending row. Times are UTC.

CREATE TABLE IF NOT EXISTS outbox (
    id               CHAR(36)     CHARACTER SET ascii NOT NULL PRIMARY KEY,
    aggregatetype    VARCHAR(255) NOT NULL,
    aggregateid      VARCHAR(255) NOT NULL,
    type             VARCHAR(255) NOT NULL,
    payload          JSON,
    -- insertion order; the relay claims pending rows by it
    seq              BIGINT       NOT NULL AUTO_INCREMENT UNIQUE,
    event_version    INT          NOT NULL DEFAULT 1,
    -- 1, 2, 3, ... per aggregate, in commit order; NULL for rows written by plain SQL
    aggregate_seq    BIGINT       NULL,
    traceparent      VARCHAR(255) NULL,
    created_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    published_at     DATETIME(6)  NULL,
    attempts         INT          NOT NULL DEFAULT 0,
    last_error       TEXT         NULL,
    dead_lettered_at DATETIME(6)  NULL,
    -- Pending rows are the (NULL, NULL) prefix of this index, in claim order:
    -- the equivalent of a partial index on pending rows.
    KEY outbox_pending_idx (published_at, dead_lettered_at, seq)
) ENGINE = InnoDB;

-- The last sequence number given to each aggregate; kept when retention
-- deletes the aggregate's published rows.
CREATE TABLE IF NOT EXISTS outbox_sequence (
    aggregatetype VARCHAR(255) NOT NULL,
    aggregateid   VARCHAR(255) NOT NULL,
    last_seq      BIGINT       NOT NULL,
    PRIMARY KEY (aggregatetype, aggregateid)
) ENGINE = InnoDB;
