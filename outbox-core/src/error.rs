//! [`OutboxError`], the error of every append.

use sea_orm::DbErr;

/// Why events could not be appended. Whatever the variant, no outbox row of
/// the failed call was written outside the caller's transaction, and the
/// caller's transaction decides whether anything written inside it stays.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The connection is not a transaction, so the events could not commit
    /// atomically with the aggregate. Nothing was written.
    #[error(
        "outbox events must be saved inside a transaction, but the connection is a `{connection}`; \
         begin one with `db.begin()` and save through the transaction"
    )]
    NotInTransaction {
        /// The type of the connection that was passed.
        connection: &'static str,
    },
    /// An event's payload could not be serialized to JSON. Nothing was written.
    #[error("event `{event_type}` could not be serialized to JSON: {source}")]
    Serialize {
        /// The event type.
        event_type: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// A `traceparent` does not follow W3C Trace Context. Nothing was written.
    #[error(
        "event `{event_type}` has an invalid traceparent {value:?}; expected \
         `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`"
    )]
    InvalidTraceparent {
        /// The event type.
        event_type: &'static str,
        /// The rejected value.
        value: String,
    },
    /// An event appended without a saved model has no aggregate id.
    #[error(
        "event `{event_type}` has no aggregate id; set one with `OutboxEvent::new(event).aggregate_id(..)` \
         or append it with the saved model"
    )]
    MissingAggregateId {
        /// The event type.
        event_type: &'static str,
    },
    /// The saved model's primary key cannot serve as an aggregate id.
    #[error(
        "the primary key of the saved model cannot be used as an aggregate id ({reason}); \
         set one with `OutboxEvent::new(event).aggregate_id(..)`"
    )]
    UnsupportedPrimaryKey {
        /// What is wrong with it.
        reason: String,
    },
    /// [`crate::append_transient`] on a database without a log-based relay.
    /// Nothing was written.
    #[error(
        "transient events are read from PostgreSQL's write-ahead log by a CDC relay, but the \
         connection is {backend}; use `append`, whose rows the polling relay publishes"
    )]
    TransientNeedsPostgres {
        /// The connection's database.
        backend: String,
    },
    /// The database refused a statement.
    #[error(transparent)]
    Db(#[from] DbErr),
}

impl OutboxError {
    /// What kind of error this is, without its details.
    pub fn kind(&self) -> OutboxErrorKind {
        match self {
            Self::NotInTransaction { .. } => OutboxErrorKind::NotInTransaction,
            Self::Serialize { .. } => OutboxErrorKind::Serialize,
            Self::InvalidTraceparent { .. } => OutboxErrorKind::InvalidTraceparent,
            Self::MissingAggregateId { .. } => OutboxErrorKind::MissingAggregateId,
            Self::UnsupportedPrimaryKey { .. } => OutboxErrorKind::UnsupportedPrimaryKey,
            Self::TransientNeedsPostgres { .. } => OutboxErrorKind::TransientNeedsPostgres,
            Self::Db(_) => OutboxErrorKind::Db,
        }
    }
}

/// The kinds of [`OutboxError`], one per variant: what a caller matches
/// when only a [`DbErr`] reached it.
///
/// SeaORM's `ActiveModelBehavior` hooks (and so
/// [`active_model_behavior!`](crate::active_model_behavior)) can only fail
/// with a [`DbErr`]; an outbox refusal then travels as a
/// [`DbErr::Custom`] whose message starts with
/// `[outbox:<code>] ` ([`OutboxErrorKind::code`]) and goes on with the
/// [`OutboxError`]'s own message. [`OutboxErrorKind::of_db_err`] recovers
/// the kind from it:
///
/// ```
/// use outbox_core::{OutboxError, OutboxErrorKind};
/// use sea_orm::DbErr;
///
/// // What `order::ActiveModel { .. }.insert(&db)` returns when `db` is not a transaction:
/// let error: DbErr = OutboxError::NotInTransaction { connection: "DatabaseConnection" }.into();
/// assert_eq!(OutboxErrorKind::of_db_err(&error), Some(OutboxErrorKind::NotInTransaction));
/// assert_eq!(OutboxErrorKind::of_db_err(&DbErr::RecordNotInserted), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutboxErrorKind {
    /// [`OutboxError::NotInTransaction`]: events saved outside a transaction.
    NotInTransaction,
    /// [`OutboxError::Serialize`].
    Serialize,
    /// [`OutboxError::InvalidTraceparent`].
    InvalidTraceparent,
    /// [`OutboxError::MissingAggregateId`].
    MissingAggregateId,
    /// [`OutboxError::UnsupportedPrimaryKey`].
    UnsupportedPrimaryKey,
    /// [`OutboxError::TransientNeedsPostgres`].
    TransientNeedsPostgres,
    /// [`OutboxError::Db`]: converted back into the database's own
    /// [`DbErr`], so [`OutboxErrorKind::of_db_err`] never returns it.
    Db,
}

impl OutboxErrorKind {
    const REFUSALS: [Self; 6] = [
        Self::NotInTransaction,
        Self::Serialize,
        Self::InvalidTraceparent,
        Self::MissingAggregateId,
        Self::UnsupportedPrimaryKey,
        Self::TransientNeedsPostgres,
    ];

    /// The stable code in a [`DbErr::Custom`] message: `[outbox:<code>] `.
    pub const fn code(self) -> &'static str {
        match self {
            Self::NotInTransaction => "not_in_transaction",
            Self::Serialize => "serialize",
            Self::InvalidTraceparent => "invalid_traceparent",
            Self::MissingAggregateId => "missing_aggregate_id",
            Self::UnsupportedPrimaryKey => "unsupported_primary_key",
            Self::TransientNeedsPostgres => "transient_needs_postgres",
            Self::Db => "db",
        }
    }

    /// The kind of outbox error `error` carries, if it is one converted from
    /// an [`OutboxError`] (as hooks return them); `None` for the database's
    /// own errors.
    pub fn of_db_err(error: &DbErr) -> Option<Self> {
        let DbErr::Custom(message) = error else {
            return None;
        };
        let code = message.strip_prefix("[outbox:")?.split_once("] ")?.0;
        Self::REFUSALS.into_iter().find(|kind| kind.code() == code)
    }
}

impl From<OutboxError> for DbErr {
    /// Lets hooks and `?` in functions returning [`DbErr`] carry outbox
    /// errors: a [`DbErr`] stays itself, a refusal becomes a
    /// [`DbErr::Custom`] that [`OutboxErrorKind::of_db_err`] recognises.
    fn from(error: OutboxError) -> Self {
        match error {
            OutboxError::Db(db) => db,
            other => DbErr::Custom(format!("[outbox:{}] {other}", other.kind().code())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusals() -> Vec<OutboxError> {
        vec![
            OutboxError::NotInTransaction {
                connection: "sea_orm::DatabaseConnection",
            },
            OutboxError::Serialize {
                event_type: "OrderPlaced",
                source: serde_json::from_str::<u8>("x").unwrap_err(),
            },
            OutboxError::InvalidTraceparent {
                event_type: "OrderPlaced",
                value: "x".into(),
            },
            OutboxError::MissingAggregateId {
                event_type: "OrderPlaced",
            },
            OutboxError::UnsupportedPrimaryKey {
                reason: "a NULL key".into(),
            },
            OutboxError::TransientNeedsPostgres {
                backend: "Sqlite".into(),
            },
        ]
    }

    #[test]
    fn a_hook_refusal_is_matched_by_its_kind() {
        let db: DbErr = OutboxError::NotInTransaction {
            connection: "sea_orm::DatabaseConnection",
        }
        .into();
        assert!(matches!(
            OutboxErrorKind::of_db_err(&db),
            Some(OutboxErrorKind::NotInTransaction)
        ));
        assert!(db.to_string().contains("inside a transaction"), "{db}");
    }

    #[test]
    fn every_refusal_survives_the_trip_through_db_err() {
        for error in refusals() {
            let kind = error.kind();
            let message = error.to_string();
            let db = DbErr::from(error);
            assert_eq!(OutboxErrorKind::of_db_err(&db), Some(kind), "{db}");
            assert!(db.to_string().ends_with(&message), "{db}");
        }
    }

    #[test]
    fn database_errors_stay_themselves() {
        let db = DbErr::from(OutboxError::Db(DbErr::RecordNotInserted));
        assert!(matches!(db, DbErr::RecordNotInserted));
        assert_eq!(OutboxErrorKind::of_db_err(&db), None);
        assert_eq!(
            OutboxErrorKind::of_db_err(&DbErr::Custom("the effect failed".into())),
            None
        );
        assert_eq!(
            OutboxErrorKind::of_db_err(&DbErr::Custom("[outbox:db] not from here".into())),
            None
        );
    }
}
