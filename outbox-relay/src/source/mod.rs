//! Row sources: where pending outbox rows are claimed from and marked in.
//!
//! Every database goes through one [`SqlSource`], chosen from the URL's
//! [`Backend`] by [`connect`]: the pipeline is the same everywhere, and
//! each database is a [`Dialect`] that words it (`postgres/`, `mysql.rs`,
//! `sqlite.rs`). A [`Claim`] is a batch of pending rows, each aggregate's
//! in sequence order (`runs.rs`; PostgreSQL plans its claim in
//! `postgres/claim.rs`); on PostgreSQL and MariaDB/MySQL it holds the rows
//! locked in an open transaction until [`Claim::settle`] re-checks the
//! shards (`fencing.rs`, with ownership in `shards/`), marks them and
//! commits (`settle.rs`), so a crash at any point leaves them pending and
//! nothing is lost. A claimed row that cannot be read is dead-lettered
//! with its reason instead of failing the claim (`decode.rs`,
//! `dead_letters.rs`); `status.rs` reads what `status` shows. The
//! statements every database runs alike (table check, shard read,
//! retention, backlog, status, re-drive) are in `statements.rs`.

mod dead_letters;
mod decode;
pub mod dialect;
pub mod extra;
mod fencing;
pub mod mysql;
mod oldest;
pub mod postgres;
mod settle;
pub mod shards;
mod sql;
pub mod sqlite;
mod statements;
mod status;

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::database::{Backend, DatabaseUrl};
use crate::metrics::BatchObservation;
use crate::record::OutboxRecord;
use crate::redact::redact_url;
pub(crate) use dead_letters::redrive_filter;
pub(crate) use decode::records as decode_records;
pub use dialect::Dialect;
pub use settle::{IdLists, Marking};
pub use sql::SqlSource;
pub use statements::SharedStatements;
pub use status::{StatusRows, Typed};

/// How rows are claimed and settled.
#[derive(Debug, Clone, Default)]
pub struct SourceOptions {
    /// Delete published rows instead of marking them.
    pub delete_on_publish: bool,
    /// Share the work with other instances through shard ownership
    /// (PostgreSQL and MariaDB/MySQL). Without it, a claim takes any pending
    /// row (`FOR UPDATE SKIP LOCKED`), which suits one instance only.
    pub shards: Option<shards::ShardConfig>,
    /// Claims read each row's creation time (`--format cloudevents`
    /// carries it as the event's `time`). MariaDB/MySQL and SQLite always
    /// read it; PostgreSQL reads it on a partitioned outbox anyway.
    pub creation_times: bool,
    /// Columns read beyond the outbox's own (see [`extra`]).
    pub extra: extra::ExtraColumns,
}

/// A source of pending outbox rows.
#[async_trait]
pub trait Source: Send + Sync {
    /// Fails with [`SourceError::MissingTable`] when the outbox table is absent.
    async fn check_table(&self) -> Result<(), SourceError>;

    /// Claims up to `limit` pending rows, skipping every row of the
    /// `excluded` aggregates: the aggregates of the oldest pending rows,
    /// each with its earliest pending rows in `aggregate_seq` order (see
    /// `source/runs.rs`), so no event of an aggregate is claimed while an
    /// earlier one is pending outside the claim. An empty claim is fine and must still be
    /// settled or dropped.
    async fn claim(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
    ) -> Result<Box<dyn Claim>, SourceError>;

    /// Claims like [`Source::claim`] while an earlier claim of this relay
    /// is still open (`in_flight`), so the relay can read the next batch
    /// while the broker acknowledges the current one: the rows of the open
    /// claim, which come before the new ones in `seq` and so in their
    /// aggregates' order, are left out. `None` when the source
    /// cannot hold two claims at once; the relay then claims after each
    /// settle.
    async fn claim_ahead(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
        in_flight: &InFlight,
    ) -> Result<Option<Box<dyn Claim>>, SourceError> {
        let _ = (limit, excluded, in_flight);
        Ok(None)
    }

    /// Returns when new rows may be pending: after `timeout` at the latest,
    /// earlier when the database notifies. The caller claims again after
    /// each return; a source may return at once so that this claim comes
    /// after its preparation to wait (PostgreSQL takes its wake-up locks).
    async fn wait_for_rows(&self, timeout: Duration);

    /// Deletes at most `limit` rows published more than `older_than` ago;
    /// returns how many it deleted.
    async fn delete_published(&self, older_than: Duration, limit: u64) -> Result<u64, SourceError>;

    /// How far behind publishing is, from the partial indexes only: cheap
    /// enough to sample every few seconds.
    async fn backlog(&self) -> Result<Backlog, SourceError>;

    /// The backlog, pending rows per aggregate type, the published count,
    /// the oldest dead letters and the shard owners.
    async fn status(&self) -> Result<Status, SourceError>;

    /// Makes at most `limit` dead-lettered rows pending again with a fresh
    /// attempt count; returns how many. `ids` empty means every dead letter
    /// (of `aggregate_type`, when given).
    async fn redrive(
        &self,
        ids: &[String],
        aggregate_type: Option<&str>,
        limit: u64,
    ) -> Result<u64, SourceError>;

    /// Stops taking part in shard ownership, handing the shards over at once.
    async fn close(&self) {}
}

/// A hash map for the relay's own bookkeeping of a batch (claims, plans,
/// settles): a fast hash, randomly seeded per map. Aggregate keys come from
/// the table.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A set of [`FastMap`]'s kind.
pub(crate) type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// The rows of an open claim, which a claim ahead leaves out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlight {
    /// The rows' `seq`.
    pub seqs: Vec<i64>,
    /// Aggregates of which the claim holds locked rows it did not take: a
    /// claim ahead leaves them out.
    pub held: Vec<AggregateKey>,
}

impl InFlight {
    /// The rows of a claim.
    pub fn of(records: &[OutboxRecord]) -> Self {
        Self {
            seqs: records.iter().map(|record| record.seq).collect(),
            held: Vec::new(),
        }
    }

    /// Nothing in flight.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

/// An aggregate: `(aggregatetype, aggregateid)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AggregateKey {
    /// `aggregatetype`.
    pub aggregate_type: String,
    /// `aggregateid`.
    pub aggregate_id: String,
}

impl AggregateKey {
    /// The aggregate of a claimed row.
    pub fn of(record: &OutboxRecord) -> Self {
        Self {
            aggregate_type: record.aggregate_type.clone(),
            aggregate_id: record.aggregate_id.clone(),
        }
    }

    /// The key borrowed, for maps that need no copy of it.
    pub fn as_pair(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }
}

/// A batch of claimed rows, waiting to be settled.
#[async_trait]
pub trait Claim: Send {
    /// The claimed rows, in claim order: each aggregate's in sequence order.
    fn records(&self) -> &[OutboxRecord];

    /// What a claim ahead must leave this claim: its rows, and the
    /// aggregates of which it holds rows it did not take.
    fn in_flight(&self) -> InFlight {
        InFlight::of(self.records())
    }

    /// Until when the claimed rows may be handed to the sink: `None` where
    /// no lease bounds them (an unsharded relay); otherwise the end of the
    /// lease under which this instance owns their shards, as far as it
    /// knows, or an instant already past once it lost any of them. No
    /// message of the batch is handed over after it, so a relay paused in
    /// the middle of a batch sends none of the rest once resumed.
    fn send_until(&self) -> Option<Instant> {
        None
    }

    /// Keeps the first `len` rows in the batch and leaves the others out:
    /// they are neither sent nor marked, and stay pending (a claim that
    /// holds them releases them when it is settled).
    fn truncate(&mut self, len: usize);

    /// Marks (or deletes) the published rows, records the failures, and
    /// releases the claim.
    async fn settle(self: Box<Self>, settlement: &Settlement) -> Result<(), SourceError>;
}

/// What happens to each row of a claim once the sink has answered.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// Acknowledged by the sink: marked published (or deleted). Each of
    /// the claim's rows at most once, in claim order.
    pub published: Vec<String>,
    /// Refused by the sink: `attempts` + 1 and `last_error` recorded.
    pub failed: Vec<FailedRow>,
}

impl Settlement {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.published.is_empty() && self.failed.is_empty()
    }

    /// The settled rows for a [`BatchObservation`](crate::metrics::BatchObservation).
    pub fn observe(&self, records: &[OutboxRecord], claimed_at: Instant) -> BatchObservation {
        BatchObservation::new(
            records,
            self.published.iter().map(String::as_str),
            self.failed
                .iter()
                .map(|row| (row.id.as_str(), row.dead_letter)),
            claimed_at,
        )
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

/// How far behind publishing is.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Backlog {
    /// Rows waiting to be published.
    pub pending: i64,
    /// Age of the oldest pending row, in seconds.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Rows parked after failing for good.
    pub dead_letters: i64,
}

/// What `outbox-relay status` shows.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Status {
    /// Pending rows, their oldest age and dead letters.
    #[serde(flatten)]
    pub backlog: Backlog,
    /// Rows published and not yet deleted by retention.
    pub published: i64,
    /// Pending rows per aggregate type, most first.
    pub pending_by_type: Vec<TypeBacklog>,
    /// The oldest dead letters (at most [`DEAD_LETTERS_SHOWN`]).
    pub dead_letter_rows: Vec<DeadLetter>,
    /// Relays owning shards, with how many.
    pub shard_owners: Vec<ShardOwner>,
}

/// Pending rows of one aggregate type.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct TypeBacklog {
    /// `aggregatetype`.
    #[sqlx(rename = "aggregatetype")]
    pub aggregate_type: String,
    /// Pending rows.
    pub pending: i64,
    /// Age of its oldest pending row, in seconds.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// A relay instance owning shards.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct ShardOwner {
    /// The instance id.
    pub owner: String,
    /// How many shards it owns.
    pub shards: i64,
    /// Seconds until its earliest lease expires (negative: expired).
    pub lease_expires_in_seconds: Option<f64>,
}

/// How many dead letters `status` lists.
pub const DEAD_LETTERS_SHOWN: i64 = 20;

/// A dead-lettered row, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct DeadLetter {
    /// The event id.
    pub id: String,
    /// `aggregatetype`.
    #[sqlx(rename = "aggregatetype")]
    pub aggregate_type: String,
    /// `aggregateid`.
    #[sqlx(rename = "aggregateid")]
    pub aggregate_id: String,
    /// `type`.
    #[sqlx(rename = "type")]
    pub event_type: String,
    /// Failed attempts.
    pub attempts: i32,
    /// The last failure.
    pub last_error: Option<String>,
}

/// A source failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The URL names no supported database.
    #[error(transparent)]
    UnsupportedUrl(#[from] crate::database::UnsupportedUrl),
    /// The database could not be reached at start.
    #[error("{}", crate::tls::ConnectFailure::new(url, source))]
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
    /// Another instance took over a shard of the batch: nothing was marked.
    #[error("lost ownership of shards {0:?} during the batch; nothing was marked")]
    Fenced(Vec<i64>),
    /// The shard rows do not match `--shards`.
    #[error(
        "the outbox_relay_shard table has shards up to {found}, but this relay uses {configured}; \
         every relay on a database needs the same --shards"
    )]
    ShardCount {
        /// Shards this instance was configured with.
        configured: u32,
        /// Highest shard number found plus one.
        found: i64,
    },
    /// A settle's mark found fewer or more rows where the claim locked them
    /// than it was given: nothing was marked, and the rows stay pending.
    #[error(
        "the settle changed {changed} of the {claimed} rows where the claim locked them; \
         nothing was marked"
    )]
    NotWhereClaimed {
        /// Rows the statement was given.
        claimed: usize,
        /// Rows it changed.
        changed: u64,
    },
    /// PostgreSQL: the sequence behind the outbox's `seq` hands each
    /// connection a block of values, so a later event of an aggregate
    /// could get a lower `seq` than an earlier one.
    #[error(
        "the outbox's seq sequence caches {cache} values per connection, so a later event of \
         an aggregate can get a lower seq than an earlier one; run \
         `ALTER TABLE outbox ALTER COLUMN seq SET CACHE 1`"
    )]
    SequenceCache {
        /// The sequence's `CACHE`.
        cache: i64,
    },
    /// A statement failed.
    #[error("database error: {0}")]
    Query(#[from] sqlx::Error),
}

/// Connects to the database of `url` (its scheme chooses the
/// [`Backend`]) and returns its source, its outbox table checked.
pub async fn connect(url: &str, options: SourceOptions) -> Result<Box<dyn Source>, SourceError> {
    Ok(match DatabaseUrl::parse(url)?.backend() {
        Backend::Postgres => Box::new(postgres::open_checked(url, options).await?),
        Backend::MySql => Box::new(mysql::MySqlSource::open(url, options).await?),
        Backend::Sqlite => Box::new(sqlite::SqliteSource::open(url, options).await?),
    })
}

/// Connects to a PostgreSQL database (CDC mode, and the slot state of
/// `status`) and checks its outbox table.
pub async fn connect_postgres(
    url: &str,
    options: SourceOptions,
) -> Result<postgres::PostgresSource, SourceError> {
    postgres::open_checked(url, options).await
}

/// Connects to a MariaDB/MySQL database (partition maintenance) and
/// checks its outbox table.
pub async fn connect_mysql(
    url: &str,
    options: SourceOptions,
) -> Result<mysql::MySqlSource, SourceError> {
    mysql::MySqlSource::open(url, options).await
}

/// Shard owners, or none when the shard table does not exist (yet).
pub(crate) fn owners_or_none(
    owners: Result<Vec<ShardOwner>, sqlx::Error>,
) -> Result<Vec<ShardOwner>, SourceError> {
    match owners {
        Err(error) if is_missing_table(&error) => Ok(Vec::new()),
        other => Ok(other?),
    }
}

/// Names a missing outbox table (or shard table) as such.
pub(crate) fn missing_table(url: &str, error: SourceError) -> SourceError {
    match error {
        SourceError::Query(query) if is_missing_table(&query) => SourceError::MissingTable {
            url: redact_url(url),
        },
        other => other,
    }
}

/// PostgreSQL 42P01, MySQL 1146 (42S02), SQLite "no such table".
pub(crate) fn is_missing_table(error: &sqlx::Error) -> bool {
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

/// `(?, ?), (?, ?), ...`: one pair per excluded aggregate.
pub(crate) fn question_mark_pairs(count: usize) -> String {
    vec!["(?, ?)"; count].join(", ")
}
