//! The partitioned outbox on MariaDB/MySQL: `PARTITION BY RANGE COLUMNS
//! (created_at)`, one partition per day (`pYYYYMMDD`, less than the next
//! day's midnight, UTC), the first partition taking every earlier row and
//! `p_future` (MAXVALUE) every later one. New days are split out of
//! `p_future` (`REORGANIZE PARTITION`, which moves the rows it caught into
//! their days); a published day's rows are swapped out into a table of
//! their own (`EXCHANGE PARTITION`) and the emptied day dropped (`DROP
//! PARTITION`) under `LOCK TABLES outbox WRITE`, and that table dropped
//! after. One maintenance at a time holds a named lock
//! ([`MAINTENANCE_LOCK_NAME`]).

use async_trait::async_trait;
use chrono::{DateTime, Days, NaiveDate, NaiveDateTime, Utc};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{AssertSqlSafe, Connection, Row};

use super::{
    DROP_LOCK_TIMEOUT, MAINTENANCE_LOCK_NAME, Outcome, Partition, PartitionError, Range, Store,
};

/// The catch-all partition of the days after the last day partition.
const FUTURE: &str = "p_future";

/// Longest a maintenance waits for another one (the named lock) and for
/// the table's metadata lock when it splits `p_future`.
const MAINTENANCE_WAIT_SECONDS: u64 = 10;

/// A MariaDB/MySQL database's outbox partitions.
pub struct MySqlStore(pub MySqlPool);

/// A partition as `information_schema.partitions` describes it.
struct Described {
    name: String,
    /// `VALUES LESS THAN`: `None` for MAXVALUE.
    to: Option<DateTime<Utc>>,
    rows: i64,
    bytes: i64,
}

impl MySqlStore {
    async fn described(&self) -> Result<Vec<Described>, PartitionError> {
        let rows = sqlx::query(
            "SELECT CAST(partition_name AS CHAR) AS name, \
               CAST(partition_description AS CHAR) AS description, \
               CAST(COALESCE(table_rows, 0) AS SIGNED) AS estimate, \
               CAST(COALESCE(data_length, 0) + COALESCE(index_length, 0) AS SIGNED) AS bytes \
             FROM information_schema.partitions \
             WHERE table_schema = DATABASE() AND table_name = 'outbox' \
               AND partition_name IS NOT NULL \
             ORDER BY partition_ordinal_position",
        )
        .fetch_all(&self.0)
        .await
        .map_err(PartitionError::query("listing the outbox's partitions"))?;
        rows.iter()
            .map(|row| {
                let description: String = row.get("description");
                Ok(Described {
                    name: row.get("name"),
                    to: bound(&description)?,
                    rows: row.get("estimate"),
                    bytes: row.get("bytes"),
                })
            })
            .collect()
    }

    /// A connection of its own (closed after use, so no session setting or
    /// table lock goes back to the pool), holding the maintenance lock.
    async fn locked_connection(&self) -> Result<MySqlConnection, PartitionError> {
        let what = "taking the partition maintenance lock";
        let mut conn = self
            .0
            .acquire()
            .await
            .map_err(PartitionError::query(what))?
            .detach();
        let taken: Option<i64> =
            sqlx::query_scalar("SELECT GET_LOCK(CONCAT(?, MD5(DATABASE())), ?)")
                .bind(MAINTENANCE_LOCK_NAME)
                .bind(MAINTENANCE_WAIT_SECONDS)
                .fetch_one(&mut conn)
                .await
                .map_err(PartitionError::query(what))?;
        if taken != Some(1) {
            return Err(PartitionError::query(what)(sqlx::Error::Protocol(format!(
                "another maintenance held it for {MAINTENANCE_WAIT_SECONDS}s"
            ))));
        }
        Ok(conn)
    }
}

/// A partition's `partition_description`: `'2026-12-04 00:00:00'` or
/// `MAXVALUE`.
fn bound(description: &str) -> Result<Option<DateTime<Utc>>, PartitionError> {
    if description == "MAXVALUE" {
        return Ok(None);
    }
    let text = description.trim_matches('\'');
    NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
        .map(|at| Some(at.and_utc()))
        .map_err(|_| {
            PartitionError::query("reading the outbox's partitions")(sqlx::Error::Protocol(
                format!("a partition bound that is not a day: {description}"),
            ))
        })
}

/// The day partitions to split out of `p_future` so that days up to
/// `today + ahead` have one: from where the last day partition ends (or
/// today) on.
fn days_to_create(last_end: Option<NaiveDate>, today: NaiveDate, ahead: u32) -> Vec<NaiveDate> {
    let Some(end) = today.checked_add_days(Days::new(u64::from(ahead) + 1)) else {
        return Vec::new();
    };
    let mut day = last_end.unwrap_or(today);
    let mut days = Vec::new();
    while day < end {
        days.push(day);
        day = day.succ_opt().expect("a day after");
    }
    days
}

/// Whether the outbox of the connection's database is partitioned (false
/// when there is none).
pub async fn is_partitioned<'c, E>(executor: E) -> Result<bool, sqlx::Error>
where
    E: sqlx::MySqlExecutor<'c>,
{
    let partitions: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.partitions \
         WHERE table_schema = DATABASE() AND table_name = 'outbox' \
           AND partition_name IS NOT NULL",
    )
    .fetch_one(executor)
    .await?;
    Ok(partitions > 0)
}

/// Error 1205: lock wait timeout exceeded.
fn is_lock_wait_timeout(error: &dyn sqlx::error::DatabaseError) -> bool {
    error
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .is_some_and(|error| error.number() == 1205)
}

/// The rows of `partition` that are pending and dead-lettered, in two
/// statements (under `LOCK TABLES` one statement may name the table once).
async fn unpublished(
    conn: &mut MySqlConnection,
    partition: &str,
) -> Result<Option<(i64, i64)>, PartitionError> {
    let table = format!("outbox PARTITION ({})", quote(partition));
    let mut counts = [0i64; 2];
    for (count, dead) in counts.iter_mut().zip(["IS NULL", "IS NOT NULL"]) {
        let counted = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {table} WHERE published_at IS NULL AND dead_lettered_at {dead}"
        )))
        .fetch_one(&mut *conn)
        .await;
        *count = match counted {
            Err(error) if PartitionError::is_vanished(&error) => return Ok(None),
            other => other.map_err(PartitionError::query(
                "counting a partition's unpublished rows",
            ))?,
        };
    }
    Ok(Some((counts[0], counts[1])))
}

#[async_trait]
impl Store for MySqlStore {
    async fn is_partitioned(&self) -> Result<bool, sqlx::Error> {
        is_partitioned(&self.0).await
    }

    async fn close(&self) {
        self.0.close().await;
    }

    async fn create_ahead(&self, ahead: u32) -> Result<i64, PartitionError> {
        let mut conn = self.locked_connection().await?;
        let last_end = self
            .described()
            .await?
            .iter()
            .filter_map(|partition| partition.to)
            .max()
            .map(|end| end.date_naive());
        let days = days_to_create(last_end, Utc::now().date_naive(), ahead);
        if days.is_empty() {
            conn.close().await.ok();
            return Ok(0);
        }
        let mut split: Vec<String> = days
            .iter()
            .map(|day| {
                let next = day.succ_opt().expect("a day after");
                format!(
                    "PARTITION p{} VALUES LESS THAN ('{} 00:00:00')",
                    day.format("%Y%m%d"),
                    next.format("%Y-%m-%d")
                )
            })
            .collect();
        split.push(format!("PARTITION {FUTURE} VALUES LESS THAN (MAXVALUE)"));
        let what = "creating the outbox's day partitions";
        sqlx::query(AssertSqlSafe(format!(
            "SET SESSION lock_wait_timeout = {MAINTENANCE_WAIT_SECONDS}"
        )))
        .execute(&mut conn)
        .await
        .map_err(PartitionError::query(what))?;
        sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE outbox REORGANIZE PARTITION {FUTURE} INTO ({})",
            split.join(", ")
        )))
        .execute(&mut conn)
        .await
        .map_err(PartitionError::query(what))?;
        conn.close().await.ok();
        Ok(days.len() as i64)
    }

    async fn list(&self) -> Result<Vec<Partition>, PartitionError> {
        let mut conn = self
            .0
            .acquire()
            .await
            .map_err(PartitionError::query("listing the outbox's partitions"))?;
        let mut from = None;
        let mut partitions = Vec::new();
        for described in self.described().await? {
            // Dropped by another maintenance since it was described.
            let Some((pending, dead_letters)) = unpublished(&mut conn, &described.name).await?
            else {
                continue;
            };
            partitions.push(Partition {
                from,
                to: described.to,
                default: described.to.is_none(),
                rows: described.rows.max(pending + dead_letters),
                rows_estimated: true,
                pending,
                dead_letters,
                bytes: described.bytes,
                name: described.name,
            });
            from = described.to;
        }
        Ok(partitions)
    }

    async fn coverage(&self) -> Result<(Vec<Range>, i64), PartitionError> {
        let mut from = None;
        let mut ranges = Vec::new();
        for described in self.described().await? {
            if described.to.is_some() {
                ranges.push(Range {
                    from,
                    to: described.to,
                });
            }
            from = described.to;
        }
        let future: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM outbox PARTITION ({FUTURE})"
        )))
        .fetch_one(&self.0)
        .await
        .map_err(PartitionError::query("reading the outbox's partitions"))?;
        Ok((ranges, future))
    }

    /// Checked under `LOCK TABLES outbox WRITE`, waited for at most
    /// [`DROP_LOCK_TIMEOUT`] (whole seconds, at least one). Under the lock
    /// the day's rows are swapped with an empty table
    /// (`EXCHANGE PARTITION`, which renames files) and the emptied
    /// partition dropped; the swapped-out table, with the day's files, is
    /// dropped after the lock's release, so writers wait for neither.
    async fn drop_if_published(&self, partition: &str) -> Result<Outcome, PartitionError> {
        let what = "dropping a published day partition";
        let mut conn = self.locked_connection().await?;
        let retired = retired_table(partition);
        let outcome = match empty_copy(&mut conn, &retired).await {
            Ok(()) => retire_if_published(&mut conn, partition, &retired).await,
            Err(error) => Err(PartitionError::query(what)(error)),
        };
        let removed = async {
            sqlx::query("UNLOCK TABLES").execute(&mut conn).await?;
            sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {retired}")))
                .execute(&mut conn)
                .await
        }
        .await;
        // Closing ends the named lock with the session.
        conn.close().await.ok();
        let outcome = outcome?;
        removed.map_err(PartitionError::query("removing a dropped day's rows"))?;
        Ok(outcome)
    }
}

/// The table a day's rows are swapped into before its partition is dropped:
/// `outbox_retired_<partition>`, quoted. One maintenance runs at a time, so
/// one name per partition is enough; a table left by an interrupted drop
/// holds only rows checked published, and the next drop replaces it.
fn retired_table(partition: &str) -> String {
    quote(&format!("outbox_retired_{partition}"))
}

/// `name` quoted as an identifier.
fn quote(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// Creates `retired` as an empty, unpartitioned copy of the outbox's
/// layout, the shape `EXCHANGE PARTITION` requires.
async fn empty_copy(conn: &mut MySqlConnection, retired: &str) -> Result<(), sqlx::Error> {
    for statement in [
        format!("DROP TABLE IF EXISTS {retired}"),
        format!("CREATE TABLE {retired} LIKE outbox"),
        format!("ALTER TABLE {retired} REMOVE PARTITIONING"),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Locks the outbox and `retired` and, when `partition` holds no pending
/// and no dead-lettered row, swaps its rows into `retired` and drops it.
/// The tables stay locked: the caller unlocks them.
async fn retire_if_published(
    conn: &mut MySqlConnection,
    partition: &str,
    retired: &str,
) -> Result<Outcome, PartitionError> {
    let what = "dropping a published day partition";
    let started = std::time::Instant::now();
    let wait = DROP_LOCK_TIMEOUT.as_secs().max(1);
    sqlx::query(AssertSqlSafe(format!(
        "SET SESSION lock_wait_timeout = {wait}"
    )))
    .execute(&mut *conn)
    .await
    .map_err(PartitionError::query(what))?;
    let locked = sqlx::query(AssertSqlSafe(format!(
        "LOCK TABLES outbox WRITE, {retired} WRITE"
    )))
    .execute(&mut *conn)
    .await;
    match locked {
        Err(sqlx::Error::Database(error)) if is_lock_wait_timeout(error.as_ref()) => {
            return Ok(Outcome::Busy);
        }
        Err(error) => return Err(PartitionError::query(what)(error)),
        Ok(_) => {}
    }
    match unpublished(conn, partition).await? {
        None => Ok(Outcome::Gone),
        Some((0, 0)) => {
            let quoted = quote(partition);
            for statement in [
                format!("ALTER TABLE outbox EXCHANGE PARTITION {quoted} WITH TABLE {retired}"),
                format!("ALTER TABLE outbox DROP PARTITION {quoted}"),
            ] {
                sqlx::query(AssertSqlSafe(statement))
                    .execute(&mut *conn)
                    .await
                    .map_err(PartitionError::query(what))?;
            }
            Ok(Outcome::Dropped {
                locked: started.elapsed(),
            })
        }
        Some((pending, dead_letters)) => Ok(Outcome::Unpublished {
            pending,
            dead_letters,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn date(text: &str) -> NaiveDate {
        text.parse().unwrap()
    }

    #[test]
    fn bounds_are_read_as_days_or_unbounded() {
        assert_eq!(bound("MAXVALUE").unwrap(), None);
        assert_eq!(
            bound("'2026-12-04 00:00:00'").unwrap(),
            Some("2026-12-04T00:00:00Z".parse().unwrap())
        );
        assert!(bound("'soon'").is_err());
    }

    #[test]
    fn the_coming_days_are_split_from_where_the_last_day_ends() {
        let today = date("2026-12-03");
        // Partitions up to the 11th: one more day for ahead = 8.
        assert_eq!(
            days_to_create(Some(date("2026-12-11")), today, 8),
            [date("2026-12-11")]
        );
        assert!(days_to_create(Some(date("2026-12-11")), today, 7).is_empty());
        // A table not maintained for a while: the missed days too, so the
        // rows `p_future` caught move into their days.
        assert_eq!(days_to_create(Some(date("2026-12-01")), today, 1).len(), 4);
        assert_eq!(days_to_create(None, today, 0), [today]);
    }
}
