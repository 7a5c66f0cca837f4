-- Replays for PostgreSQL: `outbox-relay replay` re-sends published events.
--
-- `outbox_replay` is the audit record of each replay (who, when, what was
-- selected, where it went, how far it got), which `status` lists and
-- `replay --resume` continues from. `outbox_replay_row` is a replay's plan:
-- the selected events in the order they are sent (each aggregate's in its
-- sequence order), numbered by `ordinal`; a replay sends them in chunks
-- and records the last ordinal sent. The plan's rows are deleted once the
-- replay is done; the audit record stays.
CREATE TABLE IF NOT EXISTS outbox_replay (
    id           VARCHAR(64)  PRIMARY KEY,
    requested_by VARCHAR(255) NOT NULL,
    selection    TEXT         NOT NULL,
    destination  TEXT         NOT NULL,
    -- the --to topic template, or NULL for the relay's own topics
    topic        TEXT,
    planned      BIGINT       NOT NULL DEFAULT 0,
    sent         BIGINT       NOT NULL DEFAULT 0,
    last_ordinal BIGINT       NOT NULL DEFAULT 0,
    -- running, interrupted, failed or done
    state        VARCHAR(16)  NOT NULL,
    started_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    finished_at  TIMESTAMPTZ,
    last_error   TEXT
);

CREATE TABLE IF NOT EXISTS outbox_replay_row (
    replay_id  VARCHAR(64) NOT NULL,
    ordinal    BIGINT      NOT NULL,
    id         UUID        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (replay_id, ordinal)
);
