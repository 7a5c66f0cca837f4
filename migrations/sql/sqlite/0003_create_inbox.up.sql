-- Inbox tables for SQLite (3.35 or later): what each consumer has applied.
-- Times are UTC, ISO 8601 text.
--
-- Several consumers share the tables, each under its own name. The event
-- ids are kept for a retention window; the high-water marks are kept for
-- good, so redeliveries are recognised after their ids were deleted.

-- The ids of the events each consumer applied.
CREATE TABLE IF NOT EXISTS outbox_inbox (
    consumer     TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (consumer, event_id)
);

-- Retention deletes a consumer's ids by age.
CREATE INDEX IF NOT EXISTS outbox_inbox_processed_idx ON outbox_inbox (consumer, processed_at);

-- The highest aggregateSequence each consumer applied per aggregate; the
-- topic stands for the aggregate type. SQLite runs one writer at a time,
-- so concurrent consumers serialize on the database.
CREATE TABLE IF NOT EXISTS outbox_inbox_sequence (
    consumer    TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    aggregateid TEXT    NOT NULL,
    last_seq    INTEGER NOT NULL,
    PRIMARY KEY (consumer, topic, aggregateid)
);
