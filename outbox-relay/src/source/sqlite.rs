//! SQLite, the embedded default: reads pending rows without holding a
//! transaction (so the application's writers never wait on the broker),
//! settles them in one short transaction, and polls for new rows. One relay
//! per database file.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use super::runs::{Head, head_sql, in_claim_order, runs_sql};
use super::{
    AggregateKey, Backlog, Claim, DEAD_LETTERS_SHOWN, DeadLetter, RunRow, Settlement, Source,
    SourceError, SourceOptions, Status, question_mark_pairs, question_marks, redrive_filter,
};
use crate::record::OutboxRecord;

/// SQLite's `now` in the format of the table's `created_at` default.
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// The columns of a claimed row, as [`OutboxRecord`] reads them.
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
        let mut query = sqlx::query_as::<_, Head>(AssertSqlSafe(head_sql(&exclusion)));
        for key in excluded {
            query = query.bind(&key.aggregate_type).bind(&key.aggregate_id);
        }
        let heads = query.bind(limit as i64).fetch_all(&self.pool).await?;
        let records = if heads.is_empty() {
            Vec::new()
        } else {
            let mut query =
                sqlx::query_as::<_, RunRow>(AssertSqlSafe(runs_sql(COLUMNS, heads.len())));
            for head in &heads {
                query = query
                    .bind(&head.aggregatetype)
                    .bind(&head.aggregateid)
                    .bind(head.n);
            }
            in_claim_order(&heads, query.fetch_all(&self.pool).await?)
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
        let pending_by_type = sqlx::query_as(
            "SELECT aggregatetype, COUNT(*) AS pending, \
               (julianday('now') - julianday(MIN(created_at))) * 86400.0 AS oldest_pending_age_seconds \
             FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
             GROUP BY aggregatetype ORDER BY 2 DESC, 1 LIMIT 50",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(Status {
            backlog: self.backlog().await?,
            published,
            pending_by_type,
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

async fn dead_letters(pool: &SqlitePool) -> Result<Vec<DeadLetter>, SourceError> {
    Ok(sqlx::query_as(
        "SELECT id, aggregatetype, aggregateid, type, attempts, last_error FROM outbox \
         WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at LIMIT ?",
    )
    .bind(DEAD_LETTERS_SHOWN)
    .fetch_all(pool)
    .await?)
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
