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

impl From<OutboxError> for DbErr {
    /// Lets hooks and `?` in functions returning [`DbErr`] carry outbox errors.
    fn from(error: OutboxError) -> Self {
        match error {
            OutboxError::Db(db) => db,
            other => DbErr::Custom(other.to_string()),
        }
    }
}
