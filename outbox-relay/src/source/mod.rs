//! Row sources: where pending outbox rows are claimed from and marked in.
//!
//! One implementation per database ([`postgres`], [`mysql`], [`sqlite`]),
//! chosen from the URL's scheme by [`connect`]. A [`Claim`] is a batch of
//! pending rows in insertion order; on PostgreSQL and MariaDB/MySQL it holds
//! the rows locked (`FOR UPDATE SKIP LOCKED`) in an open transaction until
//! [`Claim::settle`] marks them and commits, so a crash at any point leaves
//! them pending and nothing is lost.

pub mod mysql;
pub mod postgres;
pub mod sqlite;

use std::time::Duration;

use async_trait::async_trait;

use crate::record::OutboxRecord;
use crate::redact::redact_url;

/// How claimed rows are settled.
#[derive(Debug, Clone, Copy, Default)]
pub struct SourceOptions {
    /// Delete published rows instead of marking them.
    pub delete_on_publish: bool,
}

/// A source of pending outbox rows.
#[async_trait]
pub trait Source: Send + Sync {
    /// Fails with [`SourceError::MissingTable`] when the outbox table is absent.
    async fn check_table(&self) -> Result<(), SourceError>;

    /// Claims up to `limit` pending rows, oldest first. An empty claim is
    /// fine and must still be settled or dropped.
    async fn claim(&self, limit: usize) -> Result<Box<dyn Claim>, SourceError>;

    /// Returns when new rows may be pending: after `timeout` at the latest,
    /// earlier when the database notifies.
    async fn wait_for_rows(&self, timeout: Duration);

    /// Deletes at most `limit` rows published more than `older_than` ago;
    /// returns how many it deleted.
    async fn delete_published(&self, older_than: Duration, limit: u64) -> Result<u64, SourceError>;

    /// Counts pending, published and dead-lettered rows.
    async fn status(&self) -> Result<Status, SourceError>;
}

/// A batch of claimed rows, waiting to be settled.
#[async_trait]
pub trait Claim: Send {
    /// The claimed rows, in insertion order.
    fn records(&self) -> &[OutboxRecord];

    /// Marks (or deletes) the published rows, records the failures, and
    /// releases the claim.
    async fn settle(self: Box<Self>, settlement: &Settlement) -> Result<(), SourceError>;
}

/// What happens to each row of a claim once the sink has answered.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// Acknowledged by the sink: marked published (or deleted).
    pub published: Vec<String>,
    /// Refused by the sink: `attempts` + 1 and `last_error` recorded.
    pub failed: Vec<FailedRow>,
}

impl Settlement {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.published.is_empty() && self.failed.is_empty()
    }
}

/// A row whose send failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRow {
    /// The row's `id`.
    pub id: String,
    /// Why, for `last_error`.
    pub error: String,
    /// Park the row as dead-lettered: it will not be claimed again.
    pub dead_letter: bool,
}

/// Row counts of the outbox table.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Status {
    /// Rows waiting to be published.
    pub pending: i64,
    /// Age of the oldest pending row, in seconds.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Rows parked after failing for good.
    pub dead_letters: i64,
    /// Rows published and not yet deleted by retention.
    pub published: i64,
}

/// A source failure.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The URL names no supported database.
    #[error(
        "unsupported database URL `{0}`; expected postgres://, mysql:// (or mariadb://) or sqlite://"
    )]
    UnsupportedUrl(String),
    /// The database could not be reached at start.
    #[error("cannot connect to the database at {url}: {source}")]
    Connect {
        /// The URL, without its password.
        url: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The outbox table is missing.
    #[error("the outbox table does not exist in {url}; create it with `outbox-relay migrate`")]
    MissingTable {
        /// The URL, without its password.
        url: String,
    },
    /// A statement failed.
    #[error("database error: {0}")]
    Query(#[from] sqlx::Error),
}

/// Connects to the database of `url` and returns its source.
pub async fn connect(url: &str, options: SourceOptions) -> Result<Box<dyn Source>, SourceError> {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme)
        .unwrap_or_default();
    let connect_error = |source| SourceError::Connect {
        url: redact_url(url),
        source,
    };
    let source: Box<dyn Source> = match scheme {
        "postgres" | "postgresql" => Box::new(
            postgres::PostgresSource::connect(url, options)
                .await
                .map_err(connect_error)?,
        ),
        "mysql" | "mariadb" => Box::new(
            mysql::MySqlSource::connect(url, options)
                .await
                .map_err(connect_error)?,
        ),
        "sqlite" => Box::new(
            sqlite::SqliteSource::connect(url, options)
                .await
                .map_err(connect_error)?,
        ),
        _ => return Err(SourceError::UnsupportedUrl(redact_url(url))),
    };
    source.check_table().await.map_err(|error| match error {
        SourceError::Query(query) if is_missing_table(&query) => SourceError::MissingTable {
            url: redact_url(url),
        },
        other => other,
    })?;
    Ok(source)
}

/// PostgreSQL 42P01, MySQL 1146 (42S02), SQLite "no such table".
fn is_missing_table(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            matches!(
                db.code().as_deref(),
                Some("42P01") | Some("42S02") | Some("1146")
            ) || db.message().contains("no such table")
        }
        _ => false,
    }
}

/// Placeholders `?, ?, ...` for an `IN` list.
pub(crate) fn question_marks(count: usize) -> String {
    vec!["?"; count].join(", ")
}
