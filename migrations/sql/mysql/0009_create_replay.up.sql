-- Replays for MariaDB (10.6 or later) and MySQL (8.0 or later):
-- `outbox-relay replay` re-sends published events.
--
-- `outbox_replay` is the audit record of each replay (who, when, what was
-- selected, where it went, how far it got), which `status` lists and
-- `replay --resume` continues from. `outbox_replay_row` is a replay's plan:
-- the selected events in the order they are sent (each aggregate's in its
-- sequence order), numbered by `ordinal`; a replay sends them in chunks
-- and records the last ordinal sent. The plan's rows are deleted once the
-- replay is done; the audit record stays. Times are UTC.
CREATE TABLE IF NOT EXISTS outbox_replay (
    id           VARCHAR(64)  CHARACTER SET ascii NOT NULL PRIMARY KEY,
    requested_by VARCHAR(255) NOT NULL,
    selection    TEXT         NOT NULL,
    destination  TEXT         NOT NULL,
    -- the --to topic template, or NULL for the relay's own topics
    topic        TEXT         NULL,
    planned      BIGINT       NOT NULL DEFAULT 0,
    sent         BIGINT       NOT NULL DEFAULT 0,
    last_ordinal BIGINT       NOT NULL DEFAULT 0,
    -- running, interrupted, failed or done
    state        VARCHAR(16)  NOT NULL,
    started_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    updated_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    finished_at  DATETIME(6)  NULL,
    last_error   TEXT         NULL
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS outbox_replay_row (
    replay_id  VARCHAR(64) CHARACTER SET ascii NOT NULL,
    ordinal    BIGINT      NOT NULL,
    id         CHAR(36)    CHARACTER SET ascii NOT NULL,
    created_at DATETIME(6) NOT NULL,
    PRIMARY KEY (replay_id, ordinal)
) ENGINE = InnoDB;
