-- Replays for SQLite (3.35 or later): `outbox-relay replay` re-sends
-- published events.
--
-- `outbox_replay` is the audit record of each replay (who, when, what was
-- selected, where it went, how far it got), which `status` lists and
-- `replay --resume` continues from. `outbox_replay_row` is a replay's plan:
-- the selected events in the order they are sent (each aggregate's in its
-- sequence order), numbered by `ordinal`; a replay sends them in chunks
-- and records the last ordinal sent. The plan's rows are deleted once the
-- replay is done; the audit record stays. Times are UTC, ISO 8601 text.
CREATE TABLE IF NOT EXISTS outbox_replay (
    id           TEXT    NOT NULL PRIMARY KEY,
    requested_by TEXT    NOT NULL,
    selection    TEXT    NOT NULL,
    destination  TEXT    NOT NULL,
    -- the --to topic template, or NULL for the relay's own topics
    topic        TEXT,
    planned      INTEGER NOT NULL DEFAULT 0,
    sent         INTEGER NOT NULL DEFAULT 0,
    last_ordinal INTEGER NOT NULL DEFAULT 0,
    -- running, interrupted, failed or done
    state        TEXT    NOT NULL,
    started_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    finished_at  TEXT,
    last_error   TEXT
);

CREATE TABLE IF NOT EXISTS outbox_replay_row (
    replay_id  TEXT    NOT NULL,
    ordinal    INTEGER NOT NULL,
    id         TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    PRIMARY KEY (replay_id, ordinal)
);
