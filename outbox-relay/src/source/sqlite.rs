//! SQLite, the embedded default: reads pending rows without holding a
//! transaction (so the application's writers never wait on the broker),
//! settles them in one short transaction, and polls for new rows. One relay
//! per database file.
//!
//! A column's declared type is only an affinity here: a row may hold a BLOB
//! payload (which the `json_valid` check accepts when its bytes are JSON),
//! text in `event_version` or a BLOB key. The claim reads each row on its
//! own and dead-letters those it cannot read (see `source/decode.rs`);
//! `status` shows such values as SQL literals.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteRow};
use sqlx::{AssertSqlSafe, Row};

use super::decode::{self, Undecodable};
use super::runs::{head_sql, in_claim_order, runs_sql};
use super::{
    AggregateKey, Backlog, Claim, DEAD_LETTERS_SHOWN, DeadLetter, Settlement, Source, SourceError,
    SourceOptions, Status, TypeBacklog, question_mark_pairs, question_marks, redrive_filter,
};
use crate::record::OutboxRecord;

/// SQLite's `now` in the format of the table's `created_at` default.
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// The columns of a claimed row, named as [`OutboxRecord`]'s fields.
const COLUMNS: &str = "id, aggregatetype, aggregateid, type, payload, event_version, \
     aggregate_seq, traceparent, seq, attempts, \
     (julianday('now') - julianday(created_at)) * 86400.0 AS age_at_claim";

/// Rows per statement, far below SQLite's bind-parameter limit.
const CHUNK: usize = 500;

/// Pending rows of an SQLite database file.
pub struct SqliteSource {
    pool: SqlitePool,
    delete_on_publish: bool,
}

impl SqliteSource {
    /// Opens the database file; it must exist (`?mode=rwc` creates it).
    pub async fn connect(url: &str, options: SourceOptions) -> Result<Self, sqlx::Error> {
        let connect_options =
            SqliteConnectOptions::from_str(url)?.busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(connect_options)
            .await?;
        Ok(Self {
            pool,
            delete_on_publish: options.delete_on_publish,
        })
    }
}

#[async_trait]
impl Source for SqliteSource {
    async fn check_table(&self) -> Result<(), SourceError> {
        sqlx::query("SELECT 1 FROM outbox LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(())
    }

    async fn claim(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
    ) -> Result<Box<dyn Claim>, SourceError> {
        let exclusion = if excluded.is_empty() {
            String::new()
        } else {
            format!(
                " AND (aggregatetype, aggregateid) NOT IN (VALUES {})",
                question_mark_pairs(excluded.len())
            )
        };
        let records = loop {
            let mut query = sqlx::query(AssertSqlSafe(head_sql(&exclusion)));
            for key in excluded {
                query = query.bind(&key.aggregate_type).bind(&key.aggregate_id);
            }
            let rows = query.bind(limit as i64).fetch_all(&self.pool).await?;
            let heads = decode::heads(&rows)?;
            // A key that cannot be read is every row of its aggregate's.
            let mut dead_lettered = self.dead_letter(&heads.undecodable, true).await?;
            let heads = heads.rows;
            let records = if heads.is_empty() {
                Vec::new()
            } else {
                let mut query = sqlx::query(AssertSqlSafe(runs_sql(COLUMNS, heads.len())));
                for head in &heads {
                    query = query
                        .bind(&head.aggregatetype)
                        .bind(&head.aggregateid)
                        .bind(head.n);
                }
                let rows = query.fetch_all(&self.pool).await?;
                let runs = decode::runs(&rows)?;
                dead_lettered += self.dead_letter(&runs.undecodable, false).await?;
                // A dead letter leaves a hole in its aggregate's run: the
                // rows after it wait for the next claim.
                in_claim_order(&heads, runs.rows)
            };
            // Claim again at once rather than after a poll interval when
            // only rows that cannot be read were found; each round parks
            // at least one, so this ends.
            if !records.is_empty() || dead_lettered == 0 {
                break records;
            }
        };
        Ok(Box::new(SqliteClaim {
            pool: self.pool.clone(),
            records,
            delete_on_publish: self.delete_on_publish,
        }))
    }

    async fn wait_for_rows(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await;
    }

    async fn delete_published(&self, older_than: Duration, limit: u64) -> Result<u64, SourceError> {
        let deleted = sqlx::query(
            "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox \
             WHERE published_at IS NOT NULL \
             AND published_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) \
             ORDER BY published_at LIMIT ?)",
        )
        .bind(format!("-{:.3} seconds", older_than.as_secs_f64()))
        .bind(limit as i64)
        .execute(&self.pool)
        .await?;
        Ok(deleted.rows_affected())
    }

    async fn backlog(&self) -> Result<Backlog, SourceError> {
        let (pending, oldest_pending_age_seconds): (i64, Option<f64>) = sqlx::query_as(
            "SELECT COUNT(*), (julianday('now') - julianday(MIN(created_at))) * 86400.0 \
             FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        let dead_letters: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE dead_lettered_at IS NOT NULL")
                .fetch_one(&self.pool)
                .await?;
        Ok(Backlog {
            pending,
            oldest_pending_age_seconds,
            dead_letters,
        })
    }

    async fn status(&self) -> Result<Status, SourceError> {
        let published: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE published_at IS NOT NULL")
                .fetch_one(&self.pool)
                .await?;
        Ok(Status {
            backlog: self.backlog().await?,
            published,
            pending_by_type: pending_by_type(&self.pool).await?,
            dead_letter_rows: dead_letters(&self.pool).await?,
            shard_owners: Vec::new(),
        })
    }

    async fn redrive(
        &self,
        ids: &[String],
        aggregate_type: Option<&str>,
        limit: u64,
    ) -> Result<u64, SourceError> {
        let filter = redrive_filter("id", ids.len(), aggregate_type.is_some(), |_| {
            "?".to_owned()
        });
        let sql = format!(
            "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0 \
             WHERE seq IN (SELECT seq FROM outbox WHERE {filter} LIMIT {limit})"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for id in ids {
            query = query.bind(id);
        }
        if let Some(aggregate_type) = aggregate_type {
            query = query.bind(aggregate_type);
        }
        Ok(query.execute(&self.pool).await?.rows_affected())
    }
}

impl SqliteSource {
    /// Dead-letters rows that cannot be read, by `seq`, while still
    /// pending: each alone, or with `whole_aggregate` every pending row
    /// sharing its aggregate key (a key that cannot be read). Returns how
    /// many rows it parked.
    async fn dead_letter(
        &self,
        undecodable: &[Undecodable],
        whole_aggregate: bool,
    ) -> Result<u64, SourceError> {
        if undecodable.is_empty() {
            return Ok(0);
        }
        let rows = if whole_aggregate {
            "(aggregatetype, aggregateid) = \
             (SELECT aggregatetype, aggregateid FROM outbox WHERE seq = ?)"
        } else {
            "seq = ?"
        };
        let sql = format!(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?, dead_lettered_at = {NOW} \
             WHERE {rows} AND published_at IS NULL AND dead_lettered_at IS NULL"
        );
        let mut txn = self.pool.begin().await?;
        let mut parked = 0;
        for row in undecodable {
            parked += sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(&row.reason)
                .bind(row.seq)
                .execute(&mut *txn)
                .await?
                .rows_affected();
        }
        txn.commit().await?;
        undecodable.iter().for_each(Undecodable::log);
        Ok(parked)
    }
}

/// `column` as text whatever it holds: a value that is not text as its SQL
/// literal (`X'00FF'`, `42`), so that `status` can show any row.
fn as_text(column: &str) -> String {
    format!("CASE typeof({column}) WHEN 'text' THEN {column} ELSE quote({column}) END AS {column}")
}

/// A column of [`as_text`], with bytes that are not UTF-8 replaced.
fn lossy(row: &SqliteRow, column: &str) -> Result<String, sqlx::Error> {
    let bytes: Option<Vec<u8>> = row.try_get(column)?;
    Ok(String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned())
}

async fn pending_by_type(pool: &SqlitePool) -> Result<Vec<TypeBacklog>, SourceError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {}, COUNT(*) AS pending, \
           (julianday('now') - julianday(MIN(created_at))) * 86400.0 AS oldest_pending_age_seconds \
         FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
         GROUP BY aggregatetype ORDER BY 2 DESC, 1 LIMIT 50",
        as_text("aggregatetype")
    )))
    .fetch_all(pool)
    .await?;
    let by_type = rows
        .iter()
        .map(|row| {
            Ok(TypeBacklog {
                aggregate_type: lossy(row, "aggregatetype")?,
                pending: row.try_get("pending")?,
                oldest_pending_age_seconds: row.try_get("oldest_pending_age_seconds")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(by_type)
}

async fn dead_letters(pool: &SqlitePool) -> Result<Vec<DeadLetter>, SourceError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {}, {}, {}, {}, CAST(attempts AS INTEGER) AS attempts, \
           CAST(last_error AS TEXT) AS last_error FROM outbox \
         WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at LIMIT ?",
        as_text("id"),
        as_text("aggregatetype"),
        as_text("aggregateid"),
        as_text("type"),
    )))
    .bind(DEAD_LETTERS_SHOWN)
    .fetch_all(pool)
    .await?;
    let dead_letters = rows
        .iter()
        .map(|row| {
            let last_error: Option<Vec<u8>> = row.try_get("last_error")?;
            Ok(DeadLetter {
                id: lossy(row, "id")?,
                aggregate_type: lossy(row, "aggregatetype")?,
                aggregate_id: lossy(row, "aggregateid")?,
                event_type: lossy(row, "type")?,
                attempts: row.try_get::<Option<i64>, _>("attempts")?.unwrap_or(0) as i32,
                last_error: last_error.map(|text| String::from_utf8_lossy(&text).into_owned()),
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(dead_letters)
}

struct SqliteClaim {
    pool: SqlitePool,
    records: Vec<OutboxRecord>,
    delete_on_publish: bool,
}

#[async_trait]
impl Claim for SqliteClaim {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    async fn settle(self: Box<Self>, settlement: &Settlement) -> Result<(), SourceError> {
        if settlement.is_empty() {
            return Ok(());
        }
        let mut txn = self.pool.begin().await?;
        let action = if self.delete_on_publish {
            "DELETE FROM outbox".to_owned()
        } else {
            format!("UPDATE outbox SET published_at = {NOW}")
        };
        for ids in settlement.published.chunks(CHUNK) {
            let sql = format!("{action} WHERE id IN ({})", question_marks(ids.len()));
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in ids {
                query = query.bind(id);
            }
            query.execute(&mut *txn).await?;
        }
        for failed in &settlement.failed {
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, \
                 dead_lettered_at = CASE WHEN ? THEN {NOW} END WHERE id = ?"
            )))
            .bind(&failed.error)
            .bind(failed.dead_letter)
            .bind(&failed.id)
            .execute(&mut *txn)
            .await?;
        }
        txn.commit().await?;
        Ok(())
    }
}
