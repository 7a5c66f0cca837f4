//! PostgreSQL: claims inside a transaction held until the batch is
//! settled, and wakes on `LISTEN outbox` with the poll interval as
//! fallback.
//!
//! The migration's trigger notifies only while a relay waits, so that
//! writers pay for no notification while every relay is busy (or none
//! runs). A waiting relay holds shared advisory locks on the wake-up slots
//! ([`WAKE_LOCK_KEY`], 0 to [`WAKE_SLOTS`] - 1); an inserting statement
//! tries the exclusive lock of one slot, held until its transaction ends,
//! and notifies when the try fails. Before its last claim, a relay about to
//! wait takes the slots, which waits for the writers holding them: every
//! row committed after that claim either comes from a writer the claim
//! waited for, or was notified.
//!
//! A claim takes each aggregate's rows in `aggregate_seq` order (see
//! `source/runs.rs`) in two statements: the oldest pending rows (nothing
//! locked), then the rows the plan takes, locked with a plain `FOR UPDATE`
//! as they are read. With shard ownership (the relay's mode), it first
//! reads this instance's shard rows (`FOR KEY SHARE`). It waits (up to a
//! lock timeout) for rows another claim still holds, such as a previous
//! owner's, never skipping them, since skipping would let a later event of
//! the same aggregate overtake.

mod claim;
mod shards;
mod wakeup;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Postgres};
use tokio::sync::Mutex;

use super::dialect::{ClaimRequest, ClaimedRows, Dialect, Placeholders, ShardStatements};
use super::shards::{ShardConfig, ShardStore};
use super::{FailedRow, FastMap, Marking, SourceError, SourceOptions, SqlSource, Typed};
use crate::database::DatabaseUrl;
use crate::record::{OutboxRecord, Tid};

pub use wakeup::{WAKE_LOCK_KEY, WAKE_SLOTS, take_wake_slots_sql};

/// Opens the source ([`PostgresSource::open`]) and checks that the
/// outbox's `seq` sequence hands out its values in the order they are
/// asked for (`CACHE 1`, see [`outbox_contract::ordering`]).
pub(crate) async fn open_checked(
    url: &str,
    options: SourceOptions,
) -> Result<PostgresSource, SourceError> {
    let source = PostgresSource::open(url, options).await?;
    let cache: Option<i64> = sqlx::query_scalar(
        "SELECT s.seqcache FROM pg_sequence AS s \
         WHERE s.seqrelid = pg_get_serial_sequence('outbox', 'seq')::regclass",
    )
    .fetch_optional(source.pool())
    .await?;
    match cache {
        Some(cache) if cache > 1 => Err(SourceError::SequenceCache { cache }),
        _ => Ok(source),
    }
}

/// Pending rows of a PostgreSQL database.
pub type PostgresSource = SqlSource<PgDialect>;

/// PostgreSQL's part of a [`PostgresSource`]: the claim's plan (see
/// `source/runs.rs`), the wake-up listener and the row locks.
pub struct PgDialect {
    listener: Mutex<Option<wakeup::Listener>>,
    /// Whether the outbox was partitioned when the relay connected: then
    /// claims read each row's partition and marks go there, and rows
    /// published outside a claim (CDC mode) are marked by id and creation
    /// time.
    partitioned: bool,
    /// What claims read beyond the fixed columns: each row's partition (on
    /// a partitioned outbox), its creation time (when asked, see
    /// [`SourceOptions::creation_times`]) and the extra columns.
    read: claim::Read,
    /// On a partitioned outbox with a claim window (migration 0011): the
    /// days claims read.
    window: Option<claim::Window>,
}

impl PostgresSource {
    /// Marks rows published outside a claim (CDC mode reads them from the
    /// write-ahead log), or deletes them with `--delete-on-publish`. Rows
    /// already gone, such as those of the insert+delete idiom, are skipped.
    /// `created_at` holds each row's creation time as PostgreSQL wrote it,
    /// where known (see [`OutboxRecord::created_at`]).
    pub(crate) async fn mark_published(
        &self,
        ids: &[String],
        created_at: &FastMap<&str, &str>,
    ) -> Result<(), SourceError> {
        if !self.dialect().partitioned {
            // On a plain outbox the primary key is the id alone.
            let mut conn = self.pool().acquire().await?;
            return mark_published(&mut *conn, ids, self.delete_on_publish()).await;
        }
        // A partitioned outbox's statements keep the generic plan made when
        // they first ran, maybe on nearly empty partitions: planned by
        // index alone, as in a claim, the mark never scans a partition.
        let mut txn = self.pool().begin().await?;
        sqlx::query(concat!("SELECT ", claim::planned_by_index!()))
            .execute(&mut *txn)
            .await?;
        mark_rows(&mut txn, ids, created_at, self.delete_on_publish()).await?;
        txn.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl Dialect for PgDialect {
    type Db = Postgres;
    type Age = f64;
    type Marking = Self;
    type StatusRows = Typed;

    async fn connect(
        url: &DatabaseUrl,
        options: &SourceOptions,
    ) -> Result<(PgPool, Self), sqlx::Error> {
        // Every session of the relay carries its instance id (unless the
        // URL names the application), so that an instance taking over
        // shards whose owner stopped renewing can end that owner's sessions
        // and free the rows they hold.
        let mut connect_options = url.as_str().parse::<PgConnectOptions>()?;
        if connect_options.get_application_name().is_none() {
            let application_name = options
                .shards
                .as_ref()
                .map_or("outbox-relay", |shards| shards.instance.as_str());
            connect_options = connect_options.application_name(application_name);
        }
        // A partitioned outbox: every statement's generic plan, which
        // prunes partitions at run time; a plan made for each statement's
        // values cannot prune (no statement names a creation time but the
        // mark), costs planning over every partition each time, and for
        // the mark's arrays becomes a hash join over all their rows.
        let mut probe = PgConnection::connect_with(&connect_options).await?;
        let partitioned = crate::partitions::is_partitioned(&mut probe).await?;
        probe.close().await.ok();
        if partitioned {
            connect_options = connect_options.options([("plan_cache_mode", "force_generic_plan")]);
        }
        let port = connect_options.get_port();
        let pool = crate::nodelay::pool_options(PgPoolOptions::new(), port)
            // Two open claims (one at the broker, one claimed ahead), and
            // retention and backlog sampling; the listener and the shard
            // heartbeat have connections of their own.
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(connect_options)
            .await?;
        let extra =
            crate::source::extra::select(&pool, &options.extra, &crate::source::extra::POSTGRES)
                .await?;
        let window = if partitioned {
            sqlx::query_scalar("SELECT to_regclass('outbox_claim_window') IS NOT NULL")
                .fetch_one(&pool)
                .await?
        } else {
            false
        };
        let dialect = Self {
            window: window.then(claim::Window::default),
            listener: Mutex::new(None),
            partitioned,
            read: claim::Read {
                created_at: options.creation_times,
                partition: partitioned.then(claim::PartitionNames::default),
                extra,
            },
        };
        Ok((pool, dialect))
    }

    async fn shard_store(
        &self,
        pool: &PgPool,
        config: &ShardConfig,
    ) -> Result<Option<Arc<dyn ShardStore>>, sqlx::Error> {
        Ok(Some(Arc::new(
            shards::PgShardStore::connect(pool, config).await?,
        )))
    }

    const SHARDS: Option<ShardStatements> = Some(shards::STATEMENTS);

    const CLAIMS_AHEAD: bool = true;

    async fn begin_claim(
        conn: &mut PgConnection,
        sharding: Option<&ShardConfig>,
        ahead: bool,
    ) -> Result<bool, sqlx::Error> {
        claim::begin(conn, sharding, ahead).await
    }

    async fn claim(
        source: &PostgresSource,
        conn: &mut PgConnection,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimedRows, SourceError> {
        let dialect = source.dialect();
        let claimed = claim::claim(conn, request, &dialect.read, dialect.window.as_ref()).await?;
        if !claimed.records.is_empty() {
            source.dialect().stop_watching().await;
        }
        Ok(claimed)
    }

    async fn wait_for_rows(source: &PostgresSource, timeout: Duration) {
        source.dialect().wait_for_rows(source, timeout).await;
    }

    const PLACEHOLDERS: Placeholders = Placeholders::Numbered;

    const NOW: &'static str = "now()";

    const DELETE_PUBLISHED: &'static str = "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox \
         WHERE published_at < now() - make_interval(secs => $1) \
         ORDER BY published_at LIMIT $2)";

    fn age(older_than: Duration) -> f64 {
        older_than.as_secs_f64()
    }

    const BACKLOG: &'static str = "SELECT COUNT(*), \
           EXTRACT(EPOCH FROM now() - MIN(created_at) FILTER (WHERE isfinite(created_at)))::float8 \
         FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL";

    const DEAD_LETTER_COUNT: &'static str =
        "SELECT COUNT(*) FROM outbox WHERE dead_lettered_at IS NOT NULL";

    const PENDING_BY_TYPE: &'static str = "SELECT aggregatetype, COUNT(*) AS pending, \
           EXTRACT(EPOCH FROM now() - MIN(created_at) FILTER (WHERE isfinite(created_at)))::float8 \
             AS oldest_pending_age_seconds \
         FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
         GROUP BY aggregatetype ORDER BY 2 DESC, 1 LIMIT 50";

    const DEAD_LETTERS: &'static str = "SELECT id::text AS id, aggregatetype, aggregateid, type, \
           attempts, last_error FROM outbox \
         WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at LIMIT $1";

    const ID_AS_TEXT: &'static str = "id::text";

    fn redrive_sql(filter: &str, limit: u64) -> String {
        format!(
            "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0 \
             WHERE id IN (SELECT id FROM outbox WHERE {filter} LIMIT {limit})"
        )
    }
}

/// Ids bound as uuid[] and joined through unnest: a text[] compared with
/// `= ANY` lets a generic plan, made while the table was small or
/// unanalyzed, scan the table and cast per row.
#[async_trait]
impl Marking<PgDialect> for PgDialect {
    /// Each row where the claim locked it (its `ctid`, in its partition on
    /// a partitioned outbox), checked by id: see [`mark_locked`].
    async fn mark_published(
        conn: &mut PgConnection,
        ids: &[String],
        records: &[OutboxRecord],
        _by_time: bool,
        delete: bool,
    ) -> Result<(), SourceError> {
        let (rows, unmatched) = published_rows(records, ids);
        mark_locked(conn, rows.into_iter(), delete).await?;
        if !unmatched.is_empty() {
            mark_published(conn, unmatched, delete).await?;
        }
        Ok(())
    }

    async fn record_failures(
        conn: &mut PgConnection,
        failed: &[FailedRow],
    ) -> Result<(), SourceError> {
        let ids = uuids(failed.iter().map(|row| &row.id))?;
        let errors: Vec<&str> = failed.iter().map(|row| row.error.as_str()).collect();
        let dead: Vec<bool> = failed.iter().map(|row| row.dead_letter).collect();
        sqlx::query(
            "UPDATE outbox AS o SET attempts = o.attempts + 1, last_error = f.error, \
             dead_lettered_at = CASE WHEN f.dead THEN now() END \
             FROM unnest($1::uuid[], $2::text[], $3::bool[]) AS f(id, error, dead) \
             WHERE o.id = f.id",
        )
        .bind(&ids)
        .bind(&errors)
        .bind(&dead)
        .execute(conn)
        .await?;
        Ok(())
    }
}

/// The claimed `records` that `ids` name, and the ids that name none.
/// `ids` lists published rows in claim order (see
/// [`Settlement::published`](super::Settlement::published)), so each is
/// matched with the next claimed row of its id, by position: on a
/// partitioned outbox two claimed rows may share an id, and only the one
/// published is marked. An id found out of that order is left to be
/// marked by id.
fn published_rows<'a>(
    records: &'a [OutboxRecord],
    ids: &'a [String],
) -> (Vec<&'a OutboxRecord>, Vec<&'a String>) {
    let mut rows = Vec::with_capacity(ids.len());
    let mut next = ids.iter().peekable();
    for record in records {
        if next.next_if(|id| **id == record.id).is_some() {
            rows.push(record);
        }
    }
    (rows, next.collect())
}

/// Marks the claimed `rows` published, or deletes them with `delete`,
/// where the claim locked them: by their `ctid` (a TID scan, where marking
/// by id looks each row up in the primary key), in their partition on a
/// partitioned outbox (through the partitioned table, a row is looked up
/// in every partition). The lock keeps each row there until the claim's
/// transaction, which marks, ends: no other transaction updates, deletes
/// or moves a locked row (nor detaches or drops its partition).
///
/// Each row is found by its place and checked by its id (a nested loop
/// of TID scans, whatever the statistics), and the statement must change
/// exactly as many rows as it was given: otherwise it fails, and the
/// claim's transaction with it, so that nothing is marked (the rows stay
/// pending and are sent again) rather than one row marked in another's
/// place. Rows read without a `ctid` are marked by id.
async fn mark_locked<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a OutboxRecord>,
    delete: bool,
) -> Result<(), SourceError> {
    // Per table: the partition's name, or `None` for the outbox itself.
    let mut tables: Vec<(Option<&str>, Vec<Tid>, Vec<&String>)> = Vec::new();
    let mut by_id = Vec::new();
    for row in rows {
        let Some(ctid) = row.ctid else {
            by_id.push(&row.id);
            continue;
        };
        let table = match &row.partition {
            Some(partition) => match partition.name.as_deref() {
                Some(name) => Some(name),
                None => {
                    by_id.push(&row.id);
                    continue;
                }
            },
            None => None,
        };
        match tables.iter_mut().find(|(name, ..)| *name == table) {
            Some((_, ctids, ids)) => {
                ctids.push(ctid);
                ids.push(&row.id);
            }
            None => tables.push((table, vec![ctid], vec![&row.id])),
        }
    }
    for (table, ctids, ids) in tables {
        let table = table.unwrap_or("outbox");
        let sql = if delete {
            format!(
                "DELETE FROM {table} AS o USING unnest($1::tid[], $2::uuid[]) AS p(ctid, id) \
                 WHERE o.ctid = p.ctid AND o.id = p.id"
            )
        } else {
            format!(
                "UPDATE {table} AS o SET published_at = now() \
                 FROM unnest($1::tid[], $2::uuid[]) AS p(ctid, id) \
                 WHERE o.ctid = p.ctid AND o.id = p.id"
            )
        };
        let changed = sqlx::query(AssertSqlSafe(sql))
            .bind(&ctids)
            .bind(uuids(ids.into_iter())?)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if changed != ctids.len() as u64 {
            return Err(SourceError::NotWhereClaimed {
                claimed: ctids.len(),
                changed,
            });
        }
    }
    if !by_id.is_empty() {
        mark_published(conn, by_id, delete).await?;
    }
    Ok(())
}

/// Where a row to mark outside a claim is, as far as known beyond its id:
/// created at this time, as PostgreSQL wrote it (CDC mode reads it from
/// the write-ahead log), so that it is marked through the partitioned
/// table by id and time, which names the partition.
type CreatedAt<'a> = &'a str;

/// Marks the rows `ids` published, or deletes them with `delete`: those
/// whose creation time `created_at` knows by id and time (on a
/// partitioned outbox the time names the partition, while an id alone is
/// looked up in every one); the others by id.
async fn mark_rows(
    conn: &mut PgConnection,
    ids: &[String],
    created_at: &FastMap<&str, CreatedAt<'_>>,
    delete: bool,
) -> Result<(), SourceError> {
    let mut timed: (Vec<&String>, Vec<&str>) = Default::default();
    let mut untimed = Vec::new();
    for id in ids {
        match created_at.get(id.as_str()) {
            Some(created_at) => {
                timed.0.push(id);
                timed.1.push(created_at);
            }
            None => untimed.push(id),
        }
    }
    if !timed.0.is_empty() {
        let sql = if delete {
            "DELETE FROM outbox AS o USING unnest($1::uuid[], $2::timestamptz[]) \
             AS p(id, created_at) WHERE o.id = p.id AND o.created_at = p.created_at"
        } else {
            "UPDATE outbox AS o SET published_at = now() \
             FROM unnest($1::uuid[], $2::timestamptz[]) AS p(id, created_at) \
             WHERE o.id = p.id AND o.created_at = p.created_at"
        };
        sqlx::query(sql)
            .bind(uuids(timed.0.into_iter())?)
            .bind(timed.1)
            .execute(&mut *conn)
            .await?;
    }
    if !untimed.is_empty() {
        mark_published(conn, untimed, delete).await?;
    }
    Ok(())
}

/// Marks the rows `ids` published, or deletes them with `delete`.
async fn mark_published<'e, 'a>(
    executor: impl sqlx::PgExecutor<'e>,
    ids: impl IntoIterator<Item = &'a String>,
    delete: bool,
) -> Result<(), SourceError> {
    let sql = if delete {
        "DELETE FROM outbox AS o USING unnest($1::uuid[]) AS p(id) WHERE o.id = p.id"
    } else {
        "UPDATE outbox AS o SET published_at = now() \
         FROM unnest($1::uuid[]) AS p(id) WHERE o.id = p.id"
    };
    sqlx::query(sql)
        .bind(uuids(ids.into_iter())?)
        .execute(executor)
        .await?;
    Ok(())
}

/// Claimed ids (read as `id::text`) back as UUIDs.
fn uuids<'a>(ids: impl Iterator<Item = &'a String>) -> Result<Vec<uuid::Uuid>, SourceError> {
    ids.map(|id| {
        uuid::Uuid::parse_str(id)
            .map_err(|error| SourceError::Query(sqlx::Error::Decode(Box::new(error))))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_tests::{Backend, TestDb};
    use sea_orm::ConnectionTrait;
    use sea_orm_migration::MigratorTrait;
    use sqlx::Row;

    /// A partitioned outbox's mark keeps the generic plan made the first
    /// time it ran; made on a nearly empty day's partition that nothing
    /// analyzed, that plan must still find each row by its primary key
    /// once the day holds thousands of rows, never scan the partition.
    /// The witness is the server's own count of the partition's
    /// sequential scans in the marking transaction.
    #[tokio::test(flavor = "multi_thread")]
    async fn marks_on_a_partition_that_grew_after_the_plan_never_scan_it() {
        let t = TestDb::new(Backend::Postgres).await;
        outbox_migrations::PartitionedMigrator::up(&t.db, None)
            .await
            .expect("partition the outbox");
        let partition: String = {
            let row =
                t.db.query_one_raw(sea_orm::Statement::from_string(
                    t.db_backend(),
                    "SELECT 'outbox_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')",
                ))
                .await
                .expect("today's partition")
                .expect("a row");
            row.try_get_by_index(0).expect("a name")
        };
        // No automatic ANALYZE to replace the plan while the test runs.
        let insert = |n: usize| {
            format!(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 SELECT gen_random_uuid(), 'Ledger', 'l-' || (g % 100), 'LedgerPosted', '{{}}' \
                 FROM generate_series(1, {n}) AS g"
            )
        };
        t.db.execute_unprepared(&format!(
            "ALTER TABLE {partition} SET (autovacuum_enabled = off); {}",
            insert(1)
        ))
        .await
        .expect("the first row");

        let url = DatabaseUrl::parse(&t.url).expect("a PostgreSQL URL");
        let (pool, dialect) = PgDialect::connect(&url, &SourceOptions::default())
            .await
            .expect("connect as the relay does");
        assert!(dialect.partitioned);
        let mut conn = pool.acquire().await.expect("a connection");
        // Marks `n` pending rows in a claim's transaction; returns the
        // partition's sequential scans in it.
        let mut mark = async |n: i64| -> i64 {
            let mut txn = conn.begin().await.expect("begin");
            claim::begin(&mut txn, None, false).await.expect("settings");
            let rows = sqlx::query(
                "SELECT id::text AS id, ctid, tableoid::int8 AS oid, \
                   tableoid::regclass::text AS partition FROM outbox \
                 WHERE published_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE",
            )
            .bind(n)
            .fetch_all(&mut *txn)
            .await
            .expect("pending rows");
            let records = locked(&rows);
            let scans_before = sequential_scans(&mut txn, &partition).await;
            mark_locked(&mut txn, records.iter(), false)
                .await
                .expect("mark");
            let scans = sequential_scans(&mut txn, &partition).await;
            txn.commit().await.expect("commit");
            scans - scans_before
        };
        // The plan is made now, on one row.
        mark(1).await;
        t.db.execute_unprepared(&insert(20_000))
            .await
            .expect("a day's rows");
        assert_eq!(mark(50).await, 0, "the mark scanned {partition}");
        let published = t.count("outbox WHERE published_at IS NOT NULL").await;
        assert_eq!(published, 51);
        drop(conn);
        pool.close().await;
        t.drop().await;
    }

    /// The published ids pick the claimed rows by position, in claim
    /// order: of two rows sharing an id, the one published.
    #[test]
    fn published_ids_pick_claimed_rows_by_position() {
        let row = |id: &str, block: u32| OutboxRecord {
            ctid: Some(Tid { block, offset: 1 }),
            ..crate::record::test_record(id, "a", 0)
        };
        let records = [row("a", 0), row("b", 1), row("a", 2), row("c", 3)];
        let picked = |ids: &[&str]| {
            let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
            let (rows, unmatched) = published_rows(&records, &ids);
            let blocks: Vec<u32> = rows.iter().map(|row| row.ctid.unwrap().block).collect();
            let unmatched: Vec<String> = unmatched.into_iter().cloned().collect();
            (blocks, unmatched)
        };
        assert_eq!(picked(&["a", "b", "a", "c"]), (vec![0, 1, 2, 3], vec![]));
        assert_eq!(picked(&["a"]), (vec![0], vec![]));
        assert_eq!(picked(&["a", "b"]), (vec![0, 1], vec![]));
        assert_eq!(picked(&["b", "a"]), (vec![1, 2], vec![]));
        assert_eq!(picked(&["c"]), (vec![3], vec![]));
        assert_eq!(picked(&[]), (vec![], vec![]));
        // Out of claim order: left to be marked by id.
        assert_eq!(picked(&["c", "b"]), (vec![3], vec!["b".to_string()]));
    }

    /// Claimed records of `rows` (`id`, `ctid`, and the partition as `oid`
    /// and `partition` where read).
    fn locked(rows: &[sqlx::postgres::PgRow]) -> Vec<OutboxRecord> {
        rows.iter()
            .map(|row| {
                let id: String = row.get("id");
                let name: Option<String> = row.try_get("partition").ok();
                OutboxRecord {
                    ctid: Some(row.get("ctid")),
                    partition: name.map(|name| crate::record::Partition {
                        oid: row.get("oid"),
                        name: Some(Arc::from(name)),
                    }),
                    ..crate::record::test_record(&id, "l", 0)
                }
            })
            .collect()
    }

    /// The mark changes the claimed rows where the claim locked them and
    /// nothing else: given one place that holds another pending row, it
    /// fails, and the claim's transaction marks nothing. The witness is
    /// the table, by id.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_mark_changes_the_locked_rows_or_nothing() {
        let t = TestDb::new(Backend::Postgres).await;
        outbox_migrations::Migrator::up(&t.db, None)
            .await
            .expect("migrate");
        t.db.execute_unprepared(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'Ledger', 'l-' || g, 'LedgerPosted', '{}' \
             FROM generate_series(1, 5) AS g",
        )
        .await
        .expect("pending rows");
        let url = DatabaseUrl::parse(&t.url).expect("a PostgreSQL URL");
        let (pool, dialect) = PgDialect::connect(&url, &SourceOptions::default())
            .await
            .expect("connect as the relay does");
        assert!(!dialect.partitioned);
        let pending = "SELECT id::text AS id, ctid FROM outbox \
             WHERE published_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE";
        let mut conn = pool.acquire().await.expect("a connection");

        // Three rows locked; the first one's place swapped for the fourth
        // (pending, not claimed) row's.
        let mut txn = conn.begin().await.expect("begin");
        let rows = sqlx::query(pending)
            .bind(4_i64)
            .fetch_all(&mut *txn)
            .await
            .expect("pending rows");
        let mut records = locked(&rows[..3]);
        records[0].ctid = Some(rows[3].get("ctid"));
        let failed = mark_locked(&mut txn, records.iter(), false).await;
        assert!(
            matches!(
                failed,
                Err(SourceError::NotWhereClaimed {
                    claimed: 3,
                    changed: 2
                })
            ),
            "{failed:?}"
        );
        txn.rollback().await.expect("rollback");
        assert_eq!(t.count("outbox WHERE published_at IS NOT NULL").await, 0);

        // The same three rows, each at its place: exactly they are marked.
        let mut txn = conn.begin().await.expect("begin");
        let rows = sqlx::query(pending)
            .bind(3_i64)
            .fetch_all(&mut *txn)
            .await
            .expect("pending rows");
        let records = locked(&rows);
        mark_locked(&mut txn, records.iter(), false)
            .await
            .expect("mark");
        txn.commit().await.expect("commit");
        let published: Vec<String> = sqlx::query_scalar(
            "SELECT id::text FROM outbox WHERE published_at IS NOT NULL ORDER BY seq",
        )
        .fetch_all(&mut *conn)
        .await
        .expect("published rows");
        let claimed: Vec<String> = records.iter().map(|record| record.id.clone()).collect();
        assert_eq!(published, claimed);
        drop(conn);
        pool.close().await;
        t.drop().await;
    }

    /// The sequential scans of `table` in the current transaction.
    async fn sequential_scans(conn: &mut PgConnection, table: &str) -> i64 {
        sqlx::query_scalar("SELECT pg_stat_get_xact_numscans($1::regclass)")
            .bind(table)
            .fetch_one(conn)
            .await
            .expect("the table's scans")
    }
}
