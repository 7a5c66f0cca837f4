//! [`CdcError`]: why CDC mode could not start, or why a replication session
//! ended.
//!
//! Each message names its cause inline (as the logs print it), so the
//! variants carry the underlying error as a field rather than as a source.

use std::time::Duration;

use crate::relay::RelayError;
use crate::source::SourceError;

use super::pgoutput;

/// The SQLSTATE PostgreSQL answers a request for a replication slot that
/// another process reads (`object_in_use`).
pub const OBJECT_IN_USE: &str = "55006";

/// Why CDC mode stopped, or one of its steps failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdcError {
    /// A slot or publication name PostgreSQL would not take unquoted.
    #[error(
        "{option} {name:?} is not a valid name: use 1 to 63 lowercase letters, digits and \
         underscores"
    )]
    InvalidName {
        /// The option that named it (`--slot`, `--publication`).
        option: String,
        /// The rejected name.
        name: String,
    },
    /// The server does not decode its write-ahead log logically.
    #[error(
        "PostgreSQL's wal_level is `{level}`, but CDC mode reads the write-ahead log through \
         logical decoding, which needs `logical`: run `ALTER SYSTEM SET wal_level = logical` \
         as a superuser and restart PostgreSQL (or use --mode poll)"
    )]
    WalLevel {
        /// The server's `wal_level`.
        level: String,
    },
    /// A statement on the ordinary connection failed.
    #[error("{action}: {error}")]
    Database {
        /// What was being done, e.g. `cannot read replication slot outbox_relay`.
        action: String,
        /// The database's error.
        error: sqlx::Error,
    },
    /// The outbox table's `pg_class` oid does not fit an oid.
    #[error("the outbox table's oid {oid} is out of range")]
    OidOutOfRange {
        /// The oid read.
        oid: i64,
    },
    /// The publication exists but does not publish the outbox table.
    #[error(
        "the publication {name} exists but does not include this outbox table: add it with \
         `ALTER PUBLICATION {name} ADD TABLE <schema>.outbox` or choose another --publication"
    )]
    PublicationWithoutOutbox {
        /// The publication.
        name: String,
    },
    /// The outbox is partitioned but the publication publishes each
    /// partition's changes under the partition's own name, which CDC mode
    /// does not read.
    #[error(
        "the outbox is partitioned, but publication {name} does not publish through the \
         partition root: run `ALTER PUBLICATION {name} SET (publish_via_partition_root = true)`"
    )]
    PublicationNotViaRoot {
        /// The publication.
        name: String,
    },
    /// `drop-slot` on a slot a relay reads.
    #[error(
        "replication slot {name} is in use by a running relay (server process {}); stop that \
         relay first",
        pid.map_or_else(|| "?".to_owned(), |pid| pid.to_string())
    )]
    SlotInUse {
        /// The slot.
        name: String,
        /// The server process reading it.
        pid: Option<i32>,
    },
    /// The database URL cannot be read.
    #[error("invalid database URL {url}: {error}")]
    InvalidUrl {
        /// The URL, credentials masked.
        url: String,
        /// Why.
        error: sqlx::Error,
    },
    /// The replication connection failed.
    #[error("replication connection: {0}")]
    Replication(pgwire_replication::PgWireError),
    /// The server ended the replication stream.
    #[error("the server ended the replication stream")]
    StreamEnded,
    /// The server's answer about the slot had no row, or no process id.
    #[error("no answer about the replication slot: {0}")]
    NoSlotAnswer(&'static str),
    /// An insert into the outbox table arrived without its transaction's Begin.
    #[error("an insert arrived outside a transaction")]
    InsertOutsideTransaction,
    /// A change message could not be read.
    #[error(transparent)]
    Decode(#[from] pgoutput::DecodeError),
    /// Delivered rows could not be marked published.
    #[error("cannot mark published rows: {0}")]
    Mark(SourceError),
    /// No server process holds the slot any more: this session's ended
    /// (terminated, or its connection lost) and no other took its place.
    #[error("the replication session's server process ended; no process holds the slot")]
    SessionProcessEnded,
    /// Whether this session still holds the slot could not be found out in time.
    #[error("the database took more than {0:?} to say who holds the replication slot")]
    OwnershipUnconfirmed(Duration),
    /// The relay stopped (the sink closed).
    #[error(transparent)]
    Relay(#[from] RelayError),
}

impl CdcError {
    /// A failed statement, described by `action`.
    pub(crate) fn database(action: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Self {
        let action = action.into();
        move |error| Self::Database { action, error }
    }

    /// The SQLSTATE of a replication connection's error, if the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Self::Replication(error) => sqlstate(error),
            _ => None,
        }
    }
}

/// The SQLSTATE of a server error on the replication connection.
///
/// `pgwire_replication` keeps the server's error response as text only,
/// ending in `(SQLSTATE xxxxx)`; this reads the code back out of it, the one
/// place that knows that format.
pub fn sqlstate(error: &pgwire_replication::PgWireError) -> Option<&str> {
    let pgwire_replication::PgWireError::Server(message) = error else {
        return None;
    };
    let start = message.rfind("(SQLSTATE ")? + "(SQLSTATE ".len();
    let code = message.get(start..start + 5)?;
    (message[start + 5..].starts_with(')') && code.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then_some(code)
}

#[cfg(test)]
mod tests {
    use pgwire_replication::PgWireError;

    use super::*;

    #[test]
    fn the_sqlstate_of_a_server_error_is_read() {
        let in_use = PgWireError::Server(
            "replication slot \"outbox_relay\" is active for PID 42 (SQLSTATE 55006)".into(),
        );
        assert_eq!(sqlstate(&in_use), Some(OBJECT_IN_USE));
        assert_eq!(
            CdcError::Replication(in_use).sqlstate(),
            Some(OBJECT_IN_USE)
        );
        assert_eq!(sqlstate(&PgWireError::Server("error".into())), None);
        assert_eq!(
            sqlstate(&PgWireError::Protocol("x (SQLSTATE 55006)".into())),
            None
        );
    }

    #[test]
    fn a_caller_matches_the_variant() {
        let error = CdcError::SlotInUse {
            name: "outbox_relay".into(),
            pid: Some(42),
        };
        assert!(matches!(error, CdcError::SlotInUse { pid: Some(42), .. }));
        assert_eq!(
            error.to_string(),
            "replication slot outbox_relay is in use by a running relay (server process 42); \
             stop that relay first"
        );
    }
}
