//! The partitioned outbox on PostgreSQL: declarative partitioning, one
//! partition per day and a default partition. Creating partitions is the
//! database's own function (`outbox_create_partitions`, from the
//! migration), so that the plain SQL file, the SeaORM migration and the
//! relay create them alike; it also moves the rows the default partition
//! caught into their day's partition.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::{
    DROP_LOCK, DROP_LOCK_TIMEOUT, MAINTENANCE_LOCK, Outcome, Partition, PartitionError, Range,
    Store,
};

/// A PostgreSQL database's outbox partitions.
pub struct PgStore(pub PgPool);

/// Whether `result` failed on the lock timeout (55P03, lock_not_available).
fn is_lock_timeout<T>(result: &Result<T, sqlx::Error>) -> bool {
    matches!(result, Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("55P03"))
}

/// Takes the maintenance lock in `conn`'s transaction, within
/// [`DROP_LOCK_TIMEOUT`] (which then bounds every lock the transaction
/// waits for).
async fn take_maintenance_lock(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "SELECT set_config('lock_timeout', $1, true), pg_advisory_xact_lock({})",
        super::outbox_lock_key(2)
    )))
    .bind(format!("{}ms", DROP_LOCK_TIMEOUT.as_millis()))
    .bind(MAINTENANCE_LOCK)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Takes, in `conn`'s transaction and each within [`DROP_LOCK_TIMEOUT`],
/// the maintenance lock and then [`DROP_LOCK`], the order every
/// maintenance takes them in so that two never wait for each other: the
/// claims open now end first, later ones wait for the transaction.
/// `false` when DROP_LOCK stayed busy.
async fn lock_out_claims(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    take_maintenance_lock(conn).await?;
    let drop_lock = sqlx::query(AssertSqlSafe(format!(
        "SELECT pg_advisory_xact_lock({})",
        super::outbox_lock_key(1)
    )))
    .bind(DROP_LOCK)
    .execute(&mut *conn)
    .await;
    if is_lock_timeout(&drop_lock) {
        return Ok(false);
    }
    drop_lock.map(|_| true)
}

#[async_trait]
impl Store for PgStore {
    async fn is_partitioned(&self) -> Result<bool, sqlx::Error> {
        is_partitioned(&self.0).await
    }

    async fn close(&self) {
        self.0.close().await;
    }

    /// Moving rows out of the default partition locks them, and attaching
    /// their day's partition then needs the default partition to itself,
    /// which a claim reading it holds until it ends: a claim waiting for
    /// one of the moved rows would deadlock with it. So while the default
    /// partition holds rows to move, this waits for the claims open now
    /// and makes later ones wait ([`lock_out_claims`], as a drop does);
    /// busy, it creates nothing this time.
    async fn create_ahead(&self, ahead: u32) -> Result<i64, PartitionError> {
        let what = "creating the outbox's day partitions";
        // Asked outside the transaction below: a lock held on the default
        // partition there would make a drop's detach wait for it.
        let to_move: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM outbox_default WHERE isfinite(created_at))",
        )
        .fetch_one(&self.0)
        .await
        .map_err(PartitionError::query(what))?;
        let mut tx = self.0.begin().await.map_err(PartitionError::query(what))?;
        // The function takes the maintenance lock too.
        let created = async {
            if to_move && !lock_out_claims(&mut tx).await? {
                return Ok(None);
            }
            sqlx::query_scalar("SELECT outbox_create_partitions($1)")
                .bind(i32::try_from(ahead).unwrap_or(i32::MAX))
                .fetch_one(&mut *tx)
                .await
                .map(Some)
        }
        .await;
        if matches!(created, Ok(None)) || (to_move && is_lock_timeout(&created)) {
            tracing::warn!(
                "the outbox's default partition holds rows to move, and the relays' claims \
                 or another maintenance kept it busy for {DROP_LOCK_TIMEOUT:?}: its days' \
                 partitions are left for the next maintenance"
            );
            return Ok(0);
        }
        let created: i32 = created.map_err(PartitionError::query(what))?.unwrap_or(0);
        tx.commit().await.map_err(PartitionError::query(what))?;
        Ok(i64::from(created))
    }

    async fn list(&self) -> Result<Vec<Partition>, PartitionError> {
        let pool = &self.0;
        let rows = sqlx::query(
            "SELECT p.name, p.lower_bound, p.upper_bound, p.is_default, \
               c.reltuples::bigint AS estimate, pg_total_relation_size(c.oid) AS bytes \
             FROM outbox_partitions() AS p JOIN pg_class AS c ON c.oid = to_regclass(p.name)",
        )
        .fetch_all(pool)
        .await
        .map_err(PartitionError::query("listing the outbox's partitions"))?;
        let mut partitions = Vec::with_capacity(rows.len());
        for row in rows {
            let name: String = row.get("name");
            let estimate: i64 = row.get("estimate");
            // Dropped by another maintenance since it was listed.
            let Some((pending, dead_letters)) = unpublished(pool, &name).await? else {
                continue;
            };
            let (rows, rows_estimated) = if estimate >= 0 {
                (estimate.max(pending + dead_letters), true)
            } else {
                match count(pool, &name).await? {
                    Some(rows) => (rows, false),
                    None => continue,
                }
            };
            partitions.push(Partition {
                name,
                from: row.get("lower_bound"),
                to: row.get("upper_bound"),
                default: row.get("is_default"),
                rows,
                rows_estimated,
                pending,
                dead_letters,
                bytes: row.get("bytes"),
            });
        }
        Ok(partitions)
    }

    async fn coverage(&self) -> Result<(Vec<Range>, i64), PartitionError> {
        let pool = &self.0;
        let what = "reading the outbox's partitions";
        let ranges: Vec<Range> = sqlx::query_as(
            "SELECT lower_bound, upper_bound FROM outbox_partitions() WHERE NOT is_default",
        )
        .fetch_all(pool)
        .await
        .map_err(PartitionError::query(what))?;
        let default_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_default")
            .fetch_one(pool)
            .await
            .map_err(PartitionError::query(what))?;
        Ok((ranges, default_rows))
    }

    async fn settle_days(&self) -> Result<Option<DateTime<Utc>>, PartitionError> {
        let what = "settling the outbox's oldest days";
        let has_window: bool =
            sqlx::query_scalar("SELECT to_regclass('outbox_claim_window') IS NOT NULL")
                .fetch_one(&self.0)
                .await
                .map_err(PartitionError::query(what))?;
        if !has_window {
            return Ok(None);
        }
        let today = Utc::now().date_naive();
        let yesterday = (today - chrono::Days::new(1))
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists")
            .and_utc();
        let mut tx = self.0.begin().await.map_err(PartitionError::query(what))?;
        let settled = Self::settle_days_in(&mut tx, yesterday).await;
        // 40P01: a deadlock with a writer, which PostgreSQL ended here.
        let deadlocked = matches!(&settled, Err(sqlx::Error::Database(error))
            if error.code().as_deref() == Some("40P01"));
        if is_lock_timeout(&settled) || deadlocked {
            tracing::info!(
                "the outbox was busy; its oldest days are settled at the next maintenance"
            );
            return Ok(None);
        }
        match settled.map_err(PartitionError::query(what))? {
            Some(low) => {
                tx.commit().await.map_err(PartitionError::query(what))?;
                Ok(low)
            }
            None => Ok(None),
        }
    }

    /// Checked under the exclusive lock of the outbox's root and of the
    /// partition (so nothing can make a row of it pending before the
    /// drop).
    async fn drop_if_published(&self, partition: &str) -> Result<Outcome, PartitionError> {
        let pool = &self.0;
        let started = std::time::Instant::now();
        let what = "dropping a published day partition";
        let mut tx = pool.begin().await.map_err(PartitionError::query(what))?;
        if !lock_out_claims(&mut tx)
            .await
            .map_err(PartitionError::query(what))?
        {
            return Ok(Outcome::Busy);
        }
        // The root (which every insert through it needs) and this partition
        // only, not every other partition.
        let lock = format!(
            "LOCK TABLE ONLY outbox, {} IN ACCESS EXCLUSIVE MODE",
            quote_ident(partition)
        );
        match sqlx::query(AssertSqlSafe(lock)).execute(&mut *tx).await {
            Ok(_) => {}
            // 55P03: lock_not_available (the lock timeout).
            Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("55P03") => {
                return Ok(Outcome::Busy);
            }
            Err(error) if PartitionError::is_vanished(&error) => return Ok(Outcome::Gone),
            Err(error) => return Err(PartitionError::query(what)(error)),
        }
        // Another maintenance may have detached it after this one listed
        // it, and not dropped it yet (it drops after its commit).
        let attached: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_inherits \
               WHERE inhrelid = to_regclass($1) AND inhparent = 'outbox'::regclass)",
        )
        .bind(quote_ident(partition))
        .fetch_one(&mut *tx)
        .await
        .map_err(PartitionError::query(what))?;
        if !attached {
            return Ok(Outcome::Gone);
        }
        let Some((pending, dead_letters)) = unpublished(&mut *tx, partition).await? else {
            return Ok(Outcome::Gone);
        };
        if pending > 0 || dead_letters > 0 {
            return Ok(Outcome::Unpublished {
                pending,
                dead_letters,
            });
        }
        // Detached under the lock, dropped after it: a drop removes the
        // partition's files when it commits, which takes time with the
        // size of the day, and nothing needs to wait for that. (A process
        // ending between the two leaves the detached table to drop by
        // hand; it holds only published rows.) `partition` comes from the
        // catalog: quoted as an identifier.
        let table = quote_ident(partition);
        sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE outbox DETACH PARTITION {table}"
        )))
        .execute(&mut *tx)
        .await
        .map_err(PartitionError::query(what))?;
        tx.commit().await.map_err(PartitionError::query(what))?;
        let locked = started.elapsed();
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(pool)
            .await
            .map_err(PartitionError::query(what))?;
        Ok(Outcome::Dropped { locked })
    }
}

/// A partition as [`PgStore::settle_days`] sees it.
#[derive(sqlx::FromRow)]
struct Day {
    name: String,
    /// `None`: unbounded below.
    lower_bound: Option<DateTime<Utc>>,
    /// `None`: unbounded above.
    upper_bound: Option<DateTime<Utc>>,
    /// The default partition.
    is_default: bool,
    /// Whether it has the trigger that reopens the claim window.
    watched: bool,
}

impl PgStore {
    /// [`Store::settle_days`] in `tx`: `None` when a row became pending in
    /// a day it meant to settle, or the window changed meanwhile.
    async fn settle_days_in(
        tx: &mut PgConnection,
        yesterday: DateTime<Utc>,
    ) -> Result<Option<Option<DateTime<Utc>>>, sqlx::Error> {
        // One maintenance at a time; the window's row is read (and later
        // updated only if unchanged) under it.
        take_maintenance_lock(tx).await?;
        let version: i64 = sqlx::query_scalar("SELECT version FROM outbox_claim_window")
            .fetch_one(&mut *tx)
            .await?;
        // In range order, the default partition last.
        let mut days: Vec<Day> = sqlx::query_as(
            "SELECT p.name, p.lower_bound, p.upper_bound, p.is_default, \
               EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgrelid = to_regclass(p.name) \
                 AND t.tgname = 'outbox_claim_window') AS watched \
             FROM outbox_partitions() AS p ORDER BY p.is_default, p.lower_bound NULLS FIRST",
        )
        .fetch_all(&mut *tx)
        .await?;
        let default = days
            .last()
            .is_some_and(|day| day.is_default)
            .then(|| days.pop())
            .flatten();
        // The oldest days, up to the first with a pending row, among those
        // ended by the start of yesterday: a transaction that began before
        // midnight writes into yesterday.
        let mut settled = Vec::new();
        let mut low = yesterday;
        for day in &days {
            let ended = day.upper_bound.is_some_and(|upper| upper <= yesterday);
            if !ended || pending_in(&mut *tx, &day.name).await? {
                low = low.min(day.lower_bound.unwrap_or(DateTime::<Utc>::MIN_UTC));
                break;
            }
            settled.push(day);
        }
        if low == DateTime::<Utc>::MIN_UTC {
            // A partition unbounded below (a converted outbox's) stays open.
            return Ok(Some(None));
        }
        // A day is watched before the window leaves it out: under a lock
        // that keeps writers out of it, none of its rows is pending, and
        // from then on its trigger bumps the window's version for any that
        // becomes pending, so the update below finds it changed. A table
        // watched already needs no lock: a row made pending there since the
        // version was read changed it.
        for table in settled
            .into_iter()
            .chain(&default)
            .filter(|day| !day.watched)
            .map(|day| day.name.as_str())
        {
            sqlx::query(AssertSqlSafe(format!(
                "LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE",
                quote_ident(table)
            )))
            .execute(&mut *tx)
            .await?;
            if table != "outbox_default" && pending_in(&mut *tx, table).await? {
                return Ok(None);
            }
            sqlx::query("SELECT outbox_claim_window_watch($1)")
                .bind(table)
                .execute(&mut *tx)
                .await?;
        }
        // Rows of the default partition before the window would be missed:
        // none may be pending now (a row written since the version was
        // read bumped it), and its trigger reopens the window for new ones.
        let default_pending: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM outbox_default WHERE created_at < $1 \
               AND published_at IS NULL AND dead_lettered_at IS NULL)",
        )
        .bind(low)
        .fetch_one(&mut *tx)
        .await?;
        if default_pending {
            return Ok(None);
        }
        // Unchanged since read: no trigger reopened the window meanwhile.
        // The version moves only with the bound.
        let moved = sqlx::query(
            "UPDATE outbox_claim_window SET low = $1, \
               version = version + CASE WHEN low IS DISTINCT FROM $1 THEN 1 ELSE 0 END \
             WHERE version = $2",
        )
        .bind(low)
        .bind(version)
        .execute(&mut *tx)
        .await?;
        Ok((moved.rows_affected() == 1).then_some(Some(low)))
    }
}

/// Whether `partition` holds a pending row (through its pending index).
async fn pending_in(conn: &mut PgConnection, partition: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT 1 FROM {} WHERE published_at IS NULL AND dead_lettered_at IS NULL)",
        quote_ident(partition)
    )))
    .fetch_one(conn)
    .await
}

/// The pending and the dead-lettered rows of `partition` (both read
/// through partial indexes); `None` when it no longer exists.
async fn unpublished<'c, E>(
    executor: E,
    partition: &str,
) -> Result<Option<(i64, i64)>, PartitionError>
where
    E: sqlx::PgExecutor<'c>,
{
    let table = quote_ident(partition);
    let counted = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM {table} \
                 WHERE published_at IS NULL AND dead_lettered_at IS NULL), \
                (SELECT count(*) FROM {table} WHERE dead_lettered_at IS NOT NULL)"
    )))
    .fetch_one(executor)
    .await;
    match counted {
        Ok(counts) => Ok(Some(counts)),
        Err(error) if PartitionError::is_vanished(&error) => Ok(None),
        Err(error) => Err(PartitionError::query(
            "counting a partition's unpublished rows",
        )(error)),
    }
}

/// The rows of `partition`, counted; `None` when it no longer exists.
async fn count(pool: &PgPool, partition: &str) -> Result<Option<i64>, PartitionError> {
    let counted = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        quote_ident(partition)
    )))
    .fetch_one(pool)
    .await;
    match counted {
        Ok(rows) => Ok(Some(rows)),
        Err(error) if PartitionError::is_vanished(&error) => Ok(None),
        Err(error) => Err(PartitionError::query("counting a partition's rows")(error)),
    }
}

/// Whether the outbox the search path finds is a partitioned table (false
/// when there is none).
pub async fn is_partitioned<'c, E>(executor: E) -> Result<bool, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    let kind: Option<String> = sqlx::query_scalar(
        "SELECT c.relkind::text FROM pg_class AS c WHERE c.oid = to_regclass('outbox')",
    )
    .fetch_optional(executor)
    .await?;
    Ok(kind.as_deref() == Some("p"))
}

/// `name` as a PostgreSQL identifier, quoted.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_tests::{Backend, TestDb};
    use sea_orm::ConnectionTrait;
    use sea_orm_migration::MigratorTrait;

    /// Two maintenances listed the same published day; the first detached
    /// it and has not dropped it yet (it drops after its commit) when the
    /// second gets the lock: the second finds it gone instead of failing
    /// on a detach of a table that is no longer a partition.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_day_another_maintenance_detached_is_gone() {
        let t = TestDb::new(Backend::Postgres).await;
        outbox_migrations::PartitionedMigrator::up(&t.db, None)
            .await
            .expect("partition the outbox");
        t.db.execute_unprepared(
            "SELECT outbox_create_day_partition(((now() AT TIME ZONE 'UTC')::date - 5))",
        )
        .await
        .expect("a past day");
        let day: String = {
            let row =
                t.db.query_one_raw(sea_orm::Statement::from_string(
                    t.db_backend(),
                    "SELECT 'outbox_p' || to_char((now() AT TIME ZONE 'UTC')::date - 5, 'YYYYMMDD')",
                ))
                .await
                .expect("the day's name")
                .expect("a row");
            row.try_get_by_index(0).expect("a name")
        };
        t.db.execute_unprepared(&format!("ALTER TABLE outbox DETACH PARTITION {day}"))
            .await
            .expect("the first maintenance's detach");
        let pool = PgPool::connect(&t.url).await.expect("a pool");
        let outcome = PgStore(pool.clone())
            .drop_if_published(&day)
            .await
            .expect("no error for a day detached meanwhile");
        assert!(matches!(outcome, Outcome::Gone), "the day is gone");
        pool.close().await;
        t.drop().await;
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("outbox_p20261203"), "\"outbox_p20261203\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
