-- Inbox tables for PostgreSQL: what each consumer has applied.
--
-- Several consumers share the tables, each under its own name. The event
-- ids are kept for a retention window; the high-water marks are kept for
-- good, so redeliveries are recognised after their ids were deleted.

-- The ids of the events each consumer applied.
CREATE TABLE IF NOT EXISTS outbox_inbox (
    consumer     VARCHAR(255) NOT NULL,
    event_id     UUID         NOT NULL,
    processed_at TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Retention deletes a consumer's ids by age.
CREATE INDEX IF NOT EXISTS outbox_inbox_processed_idx ON outbox_inbox (consumer, processed_at);

-- The highest aggregateSequence each consumer applied per aggregate; the
-- topic stands for the aggregate type. The row is locked while an event of
-- the aggregate is applied, so concurrent consumers serialize on it.
CREATE TABLE IF NOT EXISTS outbox_inbox_sequence (
    consumer    VARCHAR(255) NOT NULL,
    topic       VARCHAR(255) NOT NULL,
    aggregateid VARCHAR(255) NOT NULL,
    last_seq    BIGINT       NOT NULL,
    PRIMARY KEY (consumer, topic, aggregateid)
);
