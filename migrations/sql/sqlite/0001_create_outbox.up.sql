-- Outbox tables for SQLite (3.35 or later).
--
-- `id`, `aggregatetype`, `aggregateid`, `type` and `payload` are the columns
-- of Debezium's Outbox Event Router; every other column has a default, so an
-- INSERT naming only those five is a valid pending row. `seq` is the rowid
-- (never reused), so the event id is a unique key rather than the primary
-- key. Times are UTC, ISO 8601 text.

CREATE TABLE IF NOT EXISTS outbox (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    id               TEXT    NOT NULL UNIQUE,
    aggregatetype    TEXT    NOT NULL,
    aggregateid      TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    payload          TEXT    CHECK (payload IS NULL OR json_valid(payload)),
    event_version    INTEGER NOT NULL DEFAULT 1,
    -- 1, 2, 3, ... per aggregate, in commit order; NULL for rows written by plain SQL
    aggregate_seq    INTEGER,
    traceparent      TEXT,
    created_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    published_at     TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    dead_lettered_at TEXT
);

-- Only pending rows: the relay's claim stays cheap however much history accumulates.
CREATE INDEX IF NOT EXISTS outbox_pending_idx ON outbox (seq)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;
-- Retention deletes published rows by age.
CREATE INDEX IF NOT EXISTS outbox_published_idx ON outbox (published_at)
    WHERE published_at IS NOT NULL;

-- The last sequence number given to each aggregate; kept when retention
-- deletes the aggregate's published rows.
CREATE TABLE IF NOT EXISTS outbox_sequence (
    aggregatetype TEXT    NOT NULL,
    aggregateid   TEXT    NOT NULL,
    last_seq      INTEGER NOT NULL,
    PRIMARY KEY (aggregatetype, aggregateid)
);
