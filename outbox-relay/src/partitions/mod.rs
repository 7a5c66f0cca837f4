//! The day partitions of a partitioned outbox (PostgreSQL, MariaDB/MySQL;
//! `outbox-relay migrate --partitioned`): what `partitions` lists, and the
//! maintenance that creates the coming days' partitions and drops past
//! days whose rows are all published.
//!
//! Each backend ([`postgres`], [`mysql`]) is a [`Store`]: how it lists,
//! creates and drops partitions. What maintenance decides is here, once: a
//! partition is dropped only under the outbox's exclusive lock, after
//! checking that it holds no pending and no dead-lettered row, so no row
//! can become pending in it between the check and the drop. That lock is
//! waited for a short time only ([`DROP_LOCK_TIMEOUT`]); a partition it
//! could not get is left for the next maintenance, and said so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::PartitionMaintenance;
use crate::database::{Backend, DatabaseUrl};
use crate::health::{Health, MIN_PARTITION_DAYS_AHEAD};
use crate::metrics;
use crate::shutdown::Shutdown;
use crate::source::{self, SourceError, SourceOptions};

pub mod mysql;
pub mod postgres;

pub use postgres::is_partitioned;

/// How a backend lists, creates and drops the outbox's partitions.
#[async_trait]
pub trait Store: Send + Sync {
    /// Whether the outbox is a partitioned table (false when there is none).
    async fn is_partitioned(&self) -> Result<bool, sqlx::Error>;

    /// Creates the partitions of today and the `ahead` days after it that
    /// are missing; returns how many it created.
    async fn create_ahead(&self, ahead: u32) -> Result<i64, PartitionError>;

    /// The partitions, in range order, the catch-all one last, with their
    /// rows counted.
    async fn list(&self) -> Result<Vec<Partition>, PartitionError>;

    /// Read cheaply: the day partitions' ranges and the rows of the
    /// catch-all partition.
    async fn coverage(&self) -> Result<(Vec<Range>, i64), PartitionError>;

    /// Drops `partition` unless it holds pending or dead-lettered rows,
    /// checked under the outbox's exclusive lock.
    async fn drop_if_published(&self, partition: &str) -> Result<Outcome, PartitionError>;

    /// Settles the oldest days for claims to leave out (PostgreSQL, see
    /// `migrations/sql/postgres/0011_claims_skip_settled_days.up.sql`):
    /// those ending by the start of yesterday, up to the first holding a
    /// pending row, get the trigger that reopens the claim window, and the
    /// window starts after them. Returns where claims start reading now;
    /// `None` where there is no claim window (MariaDB/MySQL, an outbox
    /// migrated before it) or the outbox was too busy to settle.
    async fn settle_days(&self) -> Result<Option<DateTime<Utc>>, PartitionError> {
        Ok(None)
    }

    /// Closes its connections.
    async fn close(&self);
}

/// Connects to the database of `url` for partition work; `None` when the
/// backend has no partitioned outbox (SQLite).
pub async fn connect(url: &str) -> Result<Option<Box<dyn Store>>, SourceError> {
    Ok(match DatabaseUrl::parse(url)?.backend() {
        Backend::Postgres => {
            let source = source::connect_postgres(url, SourceOptions::default()).await?;
            Some(Box::new(postgres::PgStore(source.pool().clone())))
        }
        Backend::MySql => {
            let source = source::connect_mysql(url, SourceOptions::default()).await?;
            Some(Box::new(mysql::MySqlStore(source.pool().clone())))
        }
        Backend::Sqlite => None,
    })
}

/// How long a drop waits for the outbox's exclusive lock (writers queue
/// behind a waiting drop for at most this long).
pub const DROP_LOCK_TIMEOUT: Duration = Duration::from_millis(1000);

/// PostgreSQL: the advisory lock one maintenance of an outbox holds at a
/// time, `MAINTENANCE_LOCK | <the outbox's oid>` (see [`outbox_lock_key`];
/// migration 0012): the key one above the wake-up key
/// ([`crate::contract::wakeup::LOCK_KEY`]) in the upper half. Outboxes in
/// other schemas have locks of their own.
pub const MAINTENANCE_LOCK: i64 = (crate::contract::wakeup::LOCK_KEY as i64 + 1) << 32;

/// PostgreSQL: the advisory lock every claim holds shared for its
/// transaction, and a drop exclusively before it locks the outbox: the
/// drop waits for the claims open then (not for the next ones, which wait
/// for it before they lock anything), so writers queue behind the drop's
/// lock for the time a claim takes, never behind a claim that waits for
/// them. One lock per outbox table: the single 64-bit key
/// [`outbox_lock_key`] computes, this key in its high half and the table's
/// oid in its low half (a key space apart from the two-key locks).
pub const DROP_LOCK: i64 = (crate::contract::wakeup::LOCK_KEY as i64) << 32;

/// [`DROP_LOCK`]'s or [`MAINTENANCE_LOCK`]'s key for the outbox the
/// session's search path finds, with that constant bound as `$n`.
pub fn outbox_lock_key(n: usize) -> String {
    format!("(${n}::bigint | 'outbox'::regclass::oid::bigint)")
}

/// MariaDB/MySQL: the named lock one maintenance of an outbox holds at a
/// time is this prefix and the MD5 of the database's name (61 characters,
/// within the server's 64): named locks are the server's, and outboxes in
/// other databases have locks of their own.
pub const MAINTENANCE_LOCK_NAME: &str = "outbox_partition_maintenance_";

/// Why listing or maintaining partitions failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PartitionError {
    /// The outbox is a plain table.
    #[error(
        "the outbox table is not partitioned; run `outbox-relay migrate --partitioned` to \
         partition it by day"
    )]
    NotPartitioned,
    /// A query failed.
    #[error("{what} failed: {source}")]
    Query {
        /// What was being done.
        what: &'static str,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
}

impl PartitionError {
    /// Whether a statement failed because a partition it named no longer
    /// exists (PostgreSQL 42P01; MariaDB/MySQL 1735, "Unknown partition"):
    /// another maintenance dropped it.
    pub(crate) fn is_vanished(error: &sqlx::Error) -> bool {
        match error {
            sqlx::Error::Database(db) => {
                matches!(db.code().as_deref(), Some("42P01"))
                    || db
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|error| error.number() == 1735)
            }
            _ => false,
        }
    }

    pub(crate) fn query(what: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| Self::Query { what, source }
    }
}

/// One partition of the outbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Partition {
    /// Its table's name (`outbox_pYYYYMMDD`, `outbox_default`, or
    /// `outbox_unpartitioned` for the rows of a converted plain outbox).
    pub name: String,
    /// Where its range starts (`None`: unbounded, or the default partition).
    pub from: Option<DateTime<Utc>>,
    /// Where its range ends, exclusive (`None`: unbounded, or default).
    pub to: Option<DateTime<Utc>>,
    /// Whether it is the catch-all partition, which takes rows no day
    /// partition covers (PostgreSQL's default partition, MariaDB's
    /// `p_future`).
    pub default: bool,
    /// Its rows: the planner's estimate when the partition was analyzed
    /// (`rows_estimated`), else counted.
    pub rows: i64,
    /// Whether `rows` is an estimate.
    pub rows_estimated: bool,
    /// Its pending rows, counted.
    pub pending: i64,
    /// Its dead-lettered rows, counted.
    pub dead_letters: i64,
    /// Its size on disk with indexes, in bytes.
    pub bytes: i64,
}

/// The partitions of the outbox, in range order, the catch-all one last.
pub async fn list(store: &dyn Store) -> Result<Vec<Partition>, PartitionError> {
    check_partitioned(store).await?;
    store.list().await
}

/// How far a partitioned outbox's day partitions reach, read cheaply:
/// whole days from today with partitions, and rows in the catch-all
/// partition.
pub async fn coverage(store: &dyn Store) -> Result<(i64, i64), PartitionError> {
    let (ranges, default_rows) = store.coverage().await?;
    Ok((days_ahead(&ranges, Utc::now()), default_rows))
}

/// Fails with [`PartitionError::NotPartitioned`] unless the outbox is a
/// partitioned table.
pub async fn check_partitioned(store: &dyn Store) -> Result<(), PartitionError> {
    let partitioned = store
        .is_partitioned()
        .await
        .map_err(PartitionError::query("reading the outbox table's kind"))?;
    if partitioned {
        Ok(())
    } else {
        Err(PartitionError::NotPartitioned)
    }
}

/// The ranges of the day partitions of `partitions` (not the default one).
pub fn ranges(partitions: &[Partition]) -> Vec<Range> {
    partitions
        .iter()
        .filter(|partition| !partition.default)
        .map(|partition| Range {
            from: partition.from,
            to: partition.to,
        })
        .collect()
}

/// A partition's range of creation times (`None`: unbounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Range {
    /// Where it starts.
    #[sqlx(rename = "lower_bound")]
    pub from: Option<DateTime<Utc>>,
    /// Where it ends, exclusive.
    #[sqlx(rename = "upper_bound")]
    pub to: Option<DateTime<Utc>>,
}

/// Whole days from the start of today (UTC) that the `ranges` of day
/// partitions cover without a hole: 0 when today has none.
pub fn days_ahead(ranges: &[Range], now: DateTime<Utc>) -> i64 {
    let start = now
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc();
    let mut covered_to = start;
    // Each step ends later than the one before: at most one per range.
    while let Some(range) = ranges.iter().find(|range| {
        range.from.is_none_or(|from| from <= covered_to)
            && range.to.is_none_or(|to| to > covered_to)
    }) {
        match range.to {
            Some(to) => covered_to = to,
            None => return i64::MAX,
        }
    }
    (covered_to - start).num_days()
}

/// Keeps a partitioned outbox while the relay runs: every `check` it
/// reads how far the partitions reach (the `outbox_partition_*` gauges and
/// `/readyz`), and with `maintenance` it maintains them every
/// `maintenance.interval` (the first time at once), until `stop` is
/// requested between two turns. Failures are logged and tried again at the
/// next turn; nothing here stops the relay.
pub async fn keep(
    store: Arc<dyn Store>,
    maintenance: Option<PartitionMaintenance>,
    health: Option<Arc<Health>>,
    check: Duration,
    stop: Shutdown,
) {
    let mut next_maintenance = Instant::now();
    let mut warned = false;
    loop {
        if let Some(maintenance) = &maintenance
            && Instant::now() >= next_maintenance
        {
            next_maintenance = Instant::now() + maintenance.interval;
            let retain = maintenance.retain.unwrap_or(Duration::MAX);
            match maintain(store.as_ref(), retain, maintenance.ahead).await {
                Ok(done) => log_maintenance(&done),
                Err(error) => {
                    tracing::warn!(%error, "partition maintenance failed; trying again next interval")
                }
            }
        }
        match coverage(store.as_ref()).await {
            Ok((days, default_rows)) => {
                metrics::record_partitions(days, default_rows);
                if let Some(health) = &health {
                    health.set_partition_days_ahead(days);
                }
                let short = days < MIN_PARTITION_DAYS_AHEAD;
                if short && !warned {
                    tracing::warn!(
                        days_ahead = days,
                        "fewer than {MIN_PARTITION_DAYS_AHEAD} days have outbox partitions; \
                         rows of later days go to the default partition until maintenance \
                         creates theirs (`outbox-relay partitions maintain`, or \
                         --partition-maintenance)"
                    );
                }
                warned = short;
            }
            Err(error) => {
                tracing::warn!(%error, "reading the outbox's partitions failed");
            }
        }
        let wait = match &maintenance {
            Some(_) => check.min(next_maintenance.saturating_duration_since(Instant::now())),
            None => check,
        };
        tokio::select! {
            () = stop.requested() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

fn log_maintenance(done: &Maintenance) {
    metrics::record_partitions_dropped(done.dropped.len());
    let dropped: Vec<&str> = done.dropped.iter().map(|d| d.name.as_str()).collect();
    tracing::info!(
        created = done.created,
        dropped = ?dropped,
        "maintained the outbox's partitions"
    );
    for kept in &done.kept {
        tracing::info!(
            partition = %kept.name,
            pending = kept.pending,
            dead_letters = kept.dead_letters,
            "kept a partition past the retention: {}",
            kept.reason
        );
    }
    if done.default_rows > 0 {
        tracing::warn!(
            rows = done.default_rows,
            "rows stay in the catch-all partition: no day partition can hold their creation time"
        );
    }
}

/// What one maintenance did.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Maintenance {
    /// Partitions created (the coming days, and days whose rows waited in
    /// the default partition).
    pub created: i64,
    /// Partitions dropped, each with the rows it held.
    pub dropped: Vec<Dropped>,
    /// Partitions past the retention kept because rows in them are not
    /// published, or because the outbox's lock was not free in time.
    pub kept: Vec<Kept>,
    /// Rows left in the default partition (a creation time no day can
    /// hold, such as `infinity`).
    pub default_rows: i64,
    /// PostgreSQL: the creation time from which claims read the outbox,
    /// the days before it settled (`None`: every day, or not known).
    pub claims_from: Option<DateTime<Utc>>,
}

/// A partition maintenance dropped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dropped {
    /// Its name.
    pub name: String,
    /// The published rows it held (the planner's estimate when known).
    pub rows: i64,
    /// How long the drop took, from waiting for the lock to the files'
    /// removal.
    pub seconds: f64,
    /// How long of that writers waited: the outbox's lock, from waiting for
    /// it to its release (PostgreSQL detaches the day under the lock and
    /// removes its files after).
    pub locked_seconds: f64,
}

/// A partition past the retention that maintenance kept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kept {
    /// Its name.
    pub name: String,
    /// Its pending rows.
    pub pending: i64,
    /// Its dead-lettered rows.
    pub dead_letters: i64,
    /// Why, in words.
    pub reason: String,
}

/// Creates the partitions of today and the `ahead` days after it (and of
/// days whose rows wait in the default partition), then drops each day
/// partition that ended more than `retain` ago and holds only published
/// rows, oldest first.
pub async fn maintain(
    store: &dyn Store,
    retain: Duration,
    ahead: u32,
) -> Result<Maintenance, PartitionError> {
    check_partitioned(store).await?;
    let mut maintenance = Maintenance {
        created: store.create_ahead(ahead).await?,
        ..Maintenance::default()
    };
    let retain = chrono::Duration::from_std(retain).unwrap_or(chrono::Duration::MAX);
    let cutoff = Utc::now()
        .checked_sub_signed(retain)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    for partition in store.list().await? {
        if partition.default {
            maintenance.default_rows = partition.rows;
            continue;
        }
        if partition.to.is_none_or(|to| to > cutoff) {
            continue;
        }
        let started = Instant::now();
        match store.drop_if_published(&partition.name).await? {
            Outcome::Dropped { locked } => maintenance.dropped.push(Dropped {
                name: partition.name,
                rows: partition.rows,
                seconds: started.elapsed().as_secs_f64(),
                locked_seconds: locked.as_secs_f64(),
            }),
            Outcome::Unpublished {
                pending,
                dead_letters,
            } => maintenance.kept.push(Kept {
                name: partition.name,
                pending,
                dead_letters,
                reason: "rows in it are not published".into(),
            }),
            Outcome::Gone => {}
            Outcome::Busy => maintenance.kept.push(Kept {
                name: partition.name,
                pending: partition.pending,
                dead_letters: partition.dead_letters,
                reason: format!(
                    "the outbox's lock was not free within {}; next maintenance tries again",
                    humantime::format_duration(DROP_LOCK_TIMEOUT)
                ),
            }),
        }
    }
    maintenance.claims_from = store.settle_days().await?;
    Ok(maintenance)
}

/// What became of a partition maintenance meant to drop.
pub enum Outcome {
    /// It is gone.
    Dropped {
        /// How long the outbox was locked for it.
        locked: Duration,
    },
    /// It holds rows not published: kept.
    Unpublished {
        /// Its pending rows.
        pending: i64,
        /// Its dead-lettered rows.
        dead_letters: i64,
    },
    /// The outbox's lock was not free in time: kept for the next run.
    Busy,
    /// It no longer exists: another maintenance dropped it since it was
    /// listed.
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(text: &str) -> DateTime<Utc> {
        format!("{text}T00:00:00Z").parse().unwrap()
    }

    fn partition(from: Option<&str>, to: Option<&str>) -> Partition {
        Partition {
            name: "p".into(),
            from: from.map(day),
            to: to.map(day),
            default: false,
            rows: 0,
            rows_estimated: false,
            pending: 0,
            dead_letters: 0,
            bytes: 0,
        }
    }

    fn days_ahead_of(partitions: &[Partition], now: DateTime<Utc>) -> i64 {
        days_ahead(&ranges(partitions), now)
    }

    #[test]
    fn days_ahead_counts_unbroken_days_from_today() {
        let now = "2026-12-03T13:00:00Z".parse().unwrap();
        let days = [
            partition(None, Some("2026-12-04")),
            partition(Some("2026-12-04"), Some("2026-12-05")),
            partition(Some("2026-12-05"), Some("2026-12-06")),
            // a hole on the 6th
            partition(Some("2026-12-07"), Some("2026-12-08")),
        ];
        assert_eq!(days_ahead_of(&days, now), 3);
        assert_eq!(days_ahead_of(&days[1..], now), 0);
        let mut default = partition(None, None);
        default.default = true;
        assert_eq!(days_ahead_of(&[default], now), 0);
    }
}
