//! The control side of CDC mode, over an ordinary connection: the
//! `wal_level` check, the publication limited to the outbox table, the
//! logical replication slot, its position for `status` and the metrics, and
//! dropping it when a relay is retired.

use std::str::FromStr;

use pgwire_replication::ReplicationConfig;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use super::CdcError;
use super::pgoutput::OutboxTable;
use crate::redact::redact_url;

/// The default name of the replication slot and of the publication.
pub const DEFAULT_NAME: &str = "outbox_relay";

/// The `application_name` of a relay's replication connection: a standby
/// only ever ends a server process that streams to an outbox relay.
pub const APPLICATION_NAME: &str = "outbox-relay";

/// Checks that `name` can name a slot or a publication: 1 to 63 lowercase
/// letters, digits and underscores (PostgreSQL's rule for slot names).
pub fn check_name(option: &str, name: &str) -> Result<(), CdcError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
    if !valid {
        return Err(CdcError::InvalidName {
            option: option.to_owned(),
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// The error for a server whose `wal_level` is not `logical`.
pub fn wal_level_error(level: &str) -> String {
    CdcError::WalLevel {
        level: level.to_owned(),
    }
    .to_string()
}

/// Fails with [`wal_level_error`] unless the server decodes its WAL logically.
pub async fn check_wal_level(pool: &PgPool) -> Result<(), CdcError> {
    let level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(pool)
        .await
        .map_err(CdcError::database("cannot read wal_level"))?;
    if level != "logical" {
        return Err(CdcError::WalLevel { level });
    }
    Ok(())
}

/// The outbox table the connection's search path finds: its schema and
/// `pg_class` oid.
pub async fn outbox_table(pool: &PgPool) -> Result<OutboxTable, CdcError> {
    let (schema, oid): (String, i64) = sqlx::query_as(
        "SELECT n.nspname::text, c.oid::int8 FROM pg_class AS c \
         JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = 'outbox'::regclass",
    )
    .fetch_one(pool)
    .await
    .map_err(CdcError::database("cannot find the outbox table"))?;
    let oid = u32::try_from(oid).map_err(|_| CdcError::OidOutOfRange { oid })?;
    Ok(OutboxTable {
        schema,
        oid,
        extra: Vec::new(),
    })
}

/// Creates the publication of the outbox table's inserts if it is missing;
/// fails when a publication of that name exists without the table. A
/// partitioned outbox is published through its root, so its rows arrive as
/// the outbox's whatever partition holds them.
pub async fn ensure_publication(pool: &PgPool, name: &str) -> Result<(), CdcError> {
    let partitioned = crate::partitions::is_partitioned(pool)
        .await
        .map_err(CdcError::database("cannot read the outbox table's kind"))?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)")
            .bind(name)
            .fetch_one(pool)
            .await
            .map_err(CdcError::database(format!(
                "cannot read publication {name}"
            )))?;
    if !exists {
        // `name` passed check_name: it needs no quoting.
        let via_root = if partitioned {
            ", publish_via_partition_root = true"
        } else {
            ""
        };
        let create = format!(
            "CREATE PUBLICATION {name} FOR TABLE outbox WITH (publish = 'insert'{via_root})"
        );
        match sqlx::query(sqlx::AssertSqlSafe(create)).execute(pool).await {
            Ok(_) => tracing::info!(publication = name, "created the publication"),
            // Another relay created it at the same time.
            Err(error) if has_state(&error, "42710") => {}
            Err(error) => {
                return Err(CdcError::database(format!(
                    "cannot create publication {name}"
                ))(error));
            }
        }
    }
    let (covers_outbox, via_root): (bool, bool) = sqlx::query_as(
        "SELECT p.puballtables OR EXISTS (SELECT 1 FROM pg_publication_rel AS r \
         WHERE r.prpubid = p.oid AND r.prrelid = 'outbox'::regclass), p.pubviaroot \
         FROM pg_publication AS p WHERE p.pubname = $1",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .map_err(CdcError::database(format!(
        "cannot read publication {name}"
    )))?;
    if !covers_outbox {
        return Err(CdcError::PublicationWithoutOutbox {
            name: name.to_owned(),
        });
    }
    if partitioned && !via_root {
        return Err(CdcError::PublicationNotViaRoot {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Creates the logical replication slot (plugin `pgoutput`) if it is missing.
/// Rows committed before the slot existed are not in it.
pub async fn ensure_slot(pool: &PgPool, name: &str) -> Result<(), CdcError> {
    if slot_status(pool, name).await?.is_some() {
        return Ok(());
    }
    match sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(name)
        .execute(pool)
        .await
    {
        Ok(_) => {
            tracing::info!(slot = name, "created the replication slot");
            Ok(())
        }
        Err(error) if has_state(&error, "42710") => Ok(()),
        Err(error) => Err(CdcError::database(format!(
            "cannot create replication slot {name}"
        ))(error)),
    }
}

/// A replication slot's state, as `status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct SlotStatus {
    /// The slot's name.
    pub slot: String,
    /// Whether a relay is reading from it now.
    pub active: bool,
    /// The server process of that relay.
    pub active_pid: Option<i32>,
    /// The position up to which every event was acknowledged.
    pub confirmed_flush_lsn: Option<String>,
    /// WAL written since that position: how far the relay is behind.
    pub behind_bytes: Option<i64>,
    /// WAL the server keeps for the slot (since its restart position).
    pub retained_wal_bytes: Option<i64>,
}

/// The state of the slot `name` in the connection's database, if it exists.
pub async fn slot_status(pool: &PgPool, name: &str) -> Result<Option<SlotStatus>, CdcError> {
    let status = sqlx::query_as::<_, SlotStatus>(
        "SELECT slot_name::text AS slot, active, active_pid, \
         confirmed_flush_lsn::text AS confirmed_flush_lsn, \
         pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8 AS behind_bytes, \
         pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 AS retained_wal_bytes \
         FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()",
    )
    .bind(name)
    .fetch_optional(pool)
    .await
    .map_err(CdcError::database(format!(
        "cannot read replication slot {name}"
    )))?;
    Ok(status)
}

/// Drops the slot `name`, releasing the WAL it retains; returns whether it
/// existed. A slot a relay is reading from is not dropped.
pub async fn drop_slot(pool: &PgPool, name: &str) -> Result<bool, CdcError> {
    match slot_status(pool, name).await? {
        None => Ok(false),
        Some(SlotStatus {
            active: true,
            active_pid,
            ..
        }) => Err(CdcError::SlotInUse {
            name: name.to_owned(),
            pid: active_pid,
        }),
        Some(_) => {
            sqlx::query("SELECT pg_drop_replication_slot($1)")
                .bind(name)
                .execute(pool)
                .await
                .map_err(CdcError::database(format!(
                    "cannot drop replication slot {name}"
                )))?;
            Ok(true)
        }
    }
}

/// The process reading a slot, as a standby sees it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SlotReader {
    /// The server process streaming the slot (`active_pid`).
    pub pid: i32,
    /// Whether that process streams to an outbox relay (a walsender with
    /// the relay's application name), not to some other program or session.
    pub is_relay: bool,
    /// Whether its replication statistics are visible to this user (a
    /// superuser, the same role, or `pg_read_all_stats`); without them a
    /// silent reader cannot be told from a live one.
    pub visible: bool,
    /// The send time of the last standby status update the server process
    /// took in from the relay, as text: compared, never interpreted (it is
    /// the reader's clock).
    pub reply_time: Option<String>,
    /// Whether the server process waits on its client right now (to write
    /// to it, or for its next message), rather than decoding: a process
    /// that waits takes in every status update the relay sends.
    pub waiting_on_client: bool,
}

/// The process reading the slot `name`, if one does.
pub async fn slot_reader(pool: &PgPool, name: &str) -> Result<Option<SlotReader>, CdcError> {
    let reader = sqlx::query_as::<_, SlotReader>(
        "SELECT s.active_pid AS pid, \
         COALESCE(a.backend_type = 'walsender' AND a.application_name = $2, false) AS is_relay, \
         r.state IS NOT NULL AS visible, \
         r.reply_time::text AS reply_time, \
         COALESCE(a.wait_event_type = 'Client' OR a.wait_event = 'WalSenderMain', false) \
           AS waiting_on_client \
         FROM pg_replication_slots AS s \
         LEFT JOIN pg_stat_activity AS a ON a.pid = s.active_pid \
         LEFT JOIN pg_stat_replication AS r ON r.pid = s.active_pid \
         WHERE s.slot_name = $1 AND s.database = current_database() \
         AND s.active_pid IS NOT NULL",
    )
    .bind(name)
    .bind(APPLICATION_NAME)
    .fetch_optional(pool)
    .await
    .map_err(CdcError::database(format!(
        "cannot read the reader of replication slot {name}"
    )))?;
    Ok(reader)
}

/// The server process holding the slot `name`, if any.
pub async fn slot_holder(pool: &PgPool, name: &str) -> Result<Option<i32>, CdcError> {
    let pid: Option<Option<i32>> = sqlx::query_scalar(
        "SELECT active_pid FROM pg_replication_slots \
         WHERE slot_name = $1 AND database = current_database()",
    )
    .bind(name)
    .fetch_optional(pool)
    .await
    .map_err(CdcError::database(format!(
        "cannot read replication slot {name}"
    )))?;
    Ok(pid.flatten())
}

/// Ends the server process `pid` (`pg_terminate_backend`): its client's
/// connection closes and the slot it held is free. Returns whether the
/// process existed.
pub async fn end_server_process(pool: &PgPool, pid: i32) -> Result<bool, CdcError> {
    sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .map_err(CdcError::database(format!(
            "cannot end server process {pid}"
        )))
}

/// Emits a small non-transactional message into the WAL, so that a relay
/// on a quiet database gets a position to confirm and the slot keeps up
/// with WAL written by other databases.
pub async fn emit_heartbeat(pool: &PgPool) -> Result<(), CdcError> {
    sqlx::query("SELECT pg_logical_emit_message(false, 'outbox-relay', 'heartbeat')")
        .execute(pool)
        .await
        .map_err(CdcError::database("cannot write the heartbeat"))?;
    Ok(())
}

/// The replication connection's settings, from the database URL.
pub fn replication_config(
    url: &str,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, CdcError> {
    let options = PgConnectOptions::from_str(url).map_err(|error| CdcError::InvalidUrl {
        url: redact_url(url),
        error,
    })?;
    let password = url::Url::parse(url)
        .ok()
        .and_then(|parsed| parsed.password().map(crate::redact::percent_decode))
        .unwrap_or_default();
    let host = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => options.get_host().to_owned(),
    };
    let user = options.get_username().to_owned();
    let database = options.get_database().unwrap_or(&user).to_owned();
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(options.get_port())
            .with_tls(crate::tls::replication_tls(options.get_ssl_mode(), url))
            .with_application_name(APPLICATION_NAME),
    )
}

/// Whether `error` is the database error `state` (a SQLSTATE).
fn has_state(error: &sqlx::Error, state: &str) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wal_level_error_says_how_to_fix_it() {
        let message = wal_level_error("replica");
        assert!(message.contains("wal_level is `replica`"), "{message}");
        assert!(
            message.contains("ALTER SYSTEM SET wal_level = logical"),
            "{message}"
        );
        assert!(message.contains("restart PostgreSQL"), "{message}");
        assert!(!message.contains('\n'));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("--slot", "outbox_relay_2").is_ok());
        for bad in ["", "Outbox", "a-b", "a'b", &"x".repeat(64)] {
            let error = check_name("--slot", bad).unwrap_err().to_string();
            assert!(error.starts_with("--slot"), "{error}");
        }
    }

    #[test]
    fn the_replication_connection_follows_the_url() {
        let config = replication_config(
            "postgres://relay:p%40ss@db.internal:6543/orders?options=-c%20search_path%3Dshop",
            "s",
            "p",
        )
        .unwrap();
        assert_eq!(
            (config.host.as_str(), config.port, config.user.as_str()),
            ("db.internal", 6543, "relay")
        );
        assert_eq!(config.password, "p@ss");
        assert_eq!(config.database, "orders");
        assert_eq!(config.slot, "s");
        let tls = replication_config(
            "postgres://h/db?sslmode=require&sslrootcert=/ca.pem",
            "s",
            "p",
        )
        .unwrap()
        .tls;
        assert_eq!(tls.mode, pgwire_replication::SslMode::Require);
        assert_eq!(tls.ca_pem_path, Some("/ca.pem".into()));
    }
}
