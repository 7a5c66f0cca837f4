//! What a database adds to the source every SQL database shares
//! ([`SqlSource`]): its statements' text, how it connects and claims, and
//! how it marks a batch.
//!
//! The flow is the same everywhere: a claim reads this instance's shards
//! (with shard ownership), takes rows in each aggregate's order and holds
//! them (in an open transaction where the database has one per claim);
//! settling re-checks the shards' epochs (fencing), marks the published
//! rows, records the failures and commits. `status`, retention and
//! re-drive run statements each database words its own way. A database is
//! one type implementing this trait, in one file under `source/`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Database, Encode, Pool, Type};

use super::settle::Marking;
use super::shards::{ShardConfig, ShardStore};
use super::status::StatusRows;
use super::{AggregateKey, InFlight, SourceError, SourceOptions, SqlSource};
use crate::database::DatabaseUrl;
use crate::record::OutboxRecord;

/// A database connection of dialect `D`.
pub type Connection<D> = <<D as Dialect>::Db as Database>::Connection;

/// A row of dialect `D`.
pub type DbRow<D> = <<D as Dialect>::Db as Database>::Row;

/// One SQL database behind [`SqlSource`]. Statements name their bind
/// parameters as [`Dialect::PLACEHOLDERS`] says; each documents them in
/// order.
#[async_trait]
pub trait Dialect: Sized + Send + Sync + 'static {
    /// The sqlx driver.
    type Db: Database<QueryResult: RowsAffected>;

    /// How a claim's rows are marked when it is settled.
    type Marking: Marking<Self>;

    /// How `status` reads the rows of [`Dialect::PENDING_BY_TYPE`] and
    /// [`Dialect::DEAD_LETTERS`].
    type StatusRows: StatusRows<Self::Db>;

    /// How a retention age is bound in [`Dialect::DELETE_PUBLISHED`].
    type Age: for<'q> Encode<'q, Self::Db> + Type<Self::Db> + Send;

    /// Opens the claims' pool, its sessions set up for claiming, and this
    /// database's own state.
    async fn connect(
        url: &DatabaseUrl,
        options: &SourceOptions,
    ) -> Result<(Pool<Self::Db>, Self), sqlx::Error>;

    /// The shard ownership statements, on a connection of their own so
    /// that renewals never wait for a claim's; `None` (the default) where
    /// one relay serves a database alone.
    async fn shard_store(
        &self,
        pool: &Pool<Self::Db>,
        config: &ShardConfig,
    ) -> Result<Option<Arc<dyn ShardStore>>, sqlx::Error> {
        let _ = (pool, config);
        Ok(None)
    }

    /// How claims read shard ownership, with a [`Dialect::shard_store`].
    const SHARDS: Option<ShardStatements> = None;

    /// Whether a claim holds its rows in a transaction open until it is
    /// settled; otherwise the claim reads them and the settle marks them in
    /// a short transaction of its own.
    const HOLDS_CLAIMS: bool = true;

    /// Whether the relay may claim the next batch while one is in flight
    /// ([`super::Source::claim_ahead`]).
    const CLAIMS_AHEAD: bool = false;

    /// Sets up a claim's connection before anything is read, given the
    /// shard ownership this instance takes part in. A claim `ahead` (while
    /// another of this relay is open) may yield instead: `false` then, and
    /// the relay claims after its settle.
    async fn begin_claim(
        conn: &mut Connection<Self>,
        sharding: Option<&ShardConfig>,
        ahead: bool,
    ) -> Result<bool, sqlx::Error> {
        let _ = (conn, sharding, ahead);
        Ok(true)
    }

    /// Reads (and, in the claim's transaction `conn`, locks) up to
    /// `request.limit` pending rows in claim order: each aggregate's
    /// earliest pending rows in sequence order (see `source/runs.rs`).
    /// Rows that cannot be read are dead-lettered and left out. Without
    /// [`Dialect::HOLDS_CLAIMS`], `conn` is a pooled connection outside
    /// any transaction.
    async fn claim(
        source: &SqlSource<Self>,
        conn: &mut Connection<Self>,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimedRows, SourceError>;

    /// See [`super::Source::wait_for_rows`]; polling by default.
    async fn wait_for_rows(source: &SqlSource<Self>, timeout: Duration) {
        let _ = source;
        tokio::time::sleep(timeout).await;
    }

    /// Whether claims lock and marks find rows by id and creation time
    /// (on a partitioned outbox the time names the row's partition, where
    /// an id alone is looked up in every one), rather than by id alone.
    fn marks_by_creation_time(&self) -> bool {
        false
    }

    /// How statements name their bind parameters.
    const PLACEHOLDERS: Placeholders = Placeholders::QuestionMarks;

    /// The time now, in the form of the table's timestamps.
    const NOW: &'static str;

    /// Deletes at most the limit of rows published more than the age ago
    /// (parameters: [`Dialect::Age`], the limit).
    const DELETE_PUBLISHED: &'static str;

    /// The retention age as bound.
    fn age(older_than: Duration) -> Self::Age;

    /// Pending rows and the age of the oldest, in seconds.
    const BACKLOG: &'static str;

    /// Dead-lettered rows.
    const DEAD_LETTER_COUNT: &'static str;

    /// Pending rows per aggregate type, read by [`StatusRows::type_backlog`].
    const PENDING_BY_TYPE: &'static str;

    /// The oldest dead letters, read by [`StatusRows::dead_letter`]
    /// (parameter: how many).
    const DEAD_LETTERS: &'static str;

    /// The row id as text, compared with the ids given to a re-drive.
    const ID_AS_TEXT: &'static str;

    /// Makes at most `limit` rows passing `filter` pending again.
    fn redrive_sql(filter: &str, limit: u64) -> String;
}

/// What a claim asks of [`Dialect::claim`].
#[derive(Debug)]
pub struct ClaimRequest<'a> {
    /// The most rows to claim.
    pub limit: usize,
    /// Aggregates none of whose rows may be claimed.
    pub excluded: &'a [AggregateKey],
    /// The rows of this relay's other open claim, after which their
    /// aggregates continue.
    pub in_flight: &'a InFlight,
    /// With shard ownership: the shards whose rows may be claimed.
    pub shards: Option<ShardScope>,
}

/// What a [`Dialect::claim`] took.
#[derive(Debug, Default)]
pub struct ClaimedRows {
    /// The rows, in claim order.
    pub records: Vec<OutboxRecord>,
    /// Aggregates of which the claim locked rows it did not take: a claim
    /// ahead leaves them out rather than wait for those rows
    /// ([`InFlight::held`]).
    pub held: Vec<AggregateKey>,
}

impl From<Vec<OutboxRecord>> for ClaimedRows {
    fn from(records: Vec<OutboxRecord>) -> Self {
        Self {
            records,
            held: Vec::new(),
        }
    }
}

/// The shards a claim may take rows of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardScope {
    /// The number of shards.
    pub count: u32,
    /// The shards this instance owns (never empty).
    pub owned: Vec<i64>,
}

/// The statements through which claims and `status` read shard ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardStatements {
    /// This instance's shards with a current lease, and their epochs, at a
    /// claim (`shard`, `epoch`; parameter: the instance).
    pub at_claim: &'static str,
    /// Every shard this instance owns, and their epochs, when the claim is
    /// marked (fencing).
    pub at_mark: &'static str,
    /// Relays owning shards: owner, shards, seconds until the earliest
    /// lease expires.
    pub owners: &'static str,
}

/// How a database names its bind parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholders {
    /// `?` each (MariaDB/MySQL, SQLite).
    QuestionMarks,
    /// `$1`, `$2`, ... (PostgreSQL).
    Numbered,
}

impl Placeholders {
    /// The bind parameter `n` (1-based).
    pub fn nth(self, n: usize) -> String {
        match self {
            Self::QuestionMarks => "?".to_owned(),
            Self::Numbered => format!("${n}"),
        }
    }
}

/// How many rows a statement changed, as every driver's result says it.
pub trait RowsAffected {
    /// The rows the statement inserted, changed or deleted.
    fn rows_affected(&self) -> u64;
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl RowsAffected for sqlx::mysql::MySqlQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}
