-- Inbox tables for MariaDB (10.6 or later) and MySQL (8.0 or later): what
-- each consumer has applied. Times are UTC.
--
-- Several consumers share the tables, each under its own name. The event
-- ids are kept for a retention window; the high-water marks are kept for
-- good, so redeliveries are recognised after their ids were deleted.

-- The ids of the events each consumer applied.
CREATE TABLE IF NOT EXISTS outbox_inbox (
    consumer     VARCHAR(255) NOT NULL,
    event_id     CHAR(36)     CHARACTER SET ascii NOT NULL,
    processed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, event_id),
    -- retention deletes a consumer's ids by age
    KEY outbox_inbox_processed_idx (consumer, processed_at)
) ENGINE = InnoDB;

-- The highest aggregateSequence each consumer applied per aggregate; the
-- topic stands for the aggregate type. The row is locked while an event of
-- the aggregate is applied, so concurrent consumers serialize on it.
CREATE TABLE IF NOT EXISTS outbox_inbox_sequence (
    consumer    VARCHAR(255) NOT NULL,
    topic       VARCHAR(255) NOT NULL,
    aggregateid VARCHAR(255) NOT NULL,
    last_seq    BIGINT       NOT NULL,
    PRIMARY KEY (consumer, topic, aggregateid)
) ENGINE = InnoDB;
