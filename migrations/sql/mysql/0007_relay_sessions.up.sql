-- The database sessions of each relay instance (MariaDB / MySQL).
--
-- An instance that takes over shards whose owner's lease expired ends that
-- owner's sessions (KILL CONNECTION), so that a claim of a paused or frozen
-- relay does not keep its rows locked until a server timeout. Connection
-- ids restart with the server, so each row records when the server it
-- belongs to started; a session of an earlier server run is never killed.
-- PostgreSQL finds a relay's sessions by their application_name instead.

CREATE TABLE IF NOT EXISTS outbox_relay_session (
    instance       VARCHAR(64)     NOT NULL,
    connection_id  BIGINT UNSIGNED NOT NULL,
    server_started DATETIME        NOT NULL,
    PRIMARY KEY (instance, connection_id)
) ENGINE = InnoDB;
