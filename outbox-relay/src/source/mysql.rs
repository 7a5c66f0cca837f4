//! MariaDB and MySQL: claims with `FOR UPDATE SKIP LOCKED` in a READ
//! COMMITTED transaction (no gap locks, so the application's inserts never
//! wait for the relay) held until the batch is settled; polls for new rows.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, MySql, Row, Transaction};

use super::{Claim, Settlement, Source, SourceError, SourceOptions, Status, question_marks};
use crate::record::OutboxRecord;

const CLAIM: &str = "SELECT id, aggregatetype, aggregateid, type, CAST(payload AS CHAR), \
     event_version, aggregate_seq, traceparent, seq, attempts \
     FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
     ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED";

/// Pending rows of a MariaDB or MySQL database.
pub struct MySqlSource {
    pool: MySqlPool,
    options: SourceOptions,
}

impl MySqlSource {
    /// Connects a small pool whose sessions use UTC and READ COMMITTED.
    pub async fn connect(url: &str, options: SourceOptions) -> Result<Self, sqlx::Error> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    sqlx::query("SET SESSION time_zone = '+00:00'")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            })
            .connect(&url)
            .await?;
        Ok(Self { pool, options })
    }
}

#[async_trait]
impl Source for MySqlSource {
    async fn check_table(&self) -> Result<(), SourceError> {
        sqlx::query("SELECT 1 FROM outbox LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(())
    }

    async fn claim(&self, limit: usize) -> Result<Box<dyn Claim>, SourceError> {
        let mut txn = self.pool.begin().await?;
        let rows = sqlx::query(CLAIM)
            .bind(limit as u64)
            .fetch_all(&mut *txn)
            .await?;
        let records = rows
            .iter()
            .map(|row| {
                Ok(OutboxRecord {
                    id: row.try_get(0)?,
                    aggregate_type: row.try_get(1)?,
                    aggregate_id: row.try_get(2)?,
                    event_type: row.try_get(3)?,
                    payload: row.try_get(4)?,
                    event_version: row.try_get(5)?,
                    aggregate_seq: row.try_get(6)?,
                    traceparent: row.try_get(7)?,
                    seq: row.try_get(8)?,
                    attempts: row.try_get(9)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(Box::new(MySqlClaim {
            txn,
            records,
            options: self.options,
        }))
    }

    async fn wait_for_rows(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await;
    }

    async fn delete_published(&self, older_than: Duration, limit: u64) -> Result<u64, SourceError> {
        let deleted = sqlx::query(
            "DELETE FROM outbox WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
             ORDER BY published_at LIMIT ?",
        )
        .bind(older_than.as_micros() as u64)
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(deleted.rows_affected())
    }

    async fn status(&self) -> Result<Status, SourceError> {
        let row = sqlx::query(
            "SELECT \
               CAST(COALESCE(SUM(published_at IS NULL AND dead_lettered_at IS NULL), 0) AS SIGNED), \
               CAST(TIMESTAMPDIFF(MICROSECOND, \
                 MIN(CASE WHEN published_at IS NULL AND dead_lettered_at IS NULL THEN created_at END), \
                 UTC_TIMESTAMP(6)) AS DOUBLE) / 1e6, \
               CAST(COALESCE(SUM(dead_lettered_at IS NOT NULL), 0) AS SIGNED), \
               CAST(COALESCE(SUM(published_at IS NOT NULL), 0) AS SIGNED) \
             FROM outbox",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Status {
            pending: row.try_get(0)?,
            oldest_pending_age_seconds: row.try_get(1)?,
            dead_letters: row.try_get(2)?,
            published: row.try_get(3)?,
        })
    }
}

struct MySqlClaim {
    txn: Transaction<'static, MySql>,
    records: Vec<OutboxRecord>,
    options: SourceOptions,
}

#[async_trait]
impl Claim for MySqlClaim {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    async fn settle(mut self: Box<Self>, settlement: &Settlement) -> Result<(), SourceError> {
        if !settlement.published.is_empty() {
            let action = if self.options.delete_on_publish {
                "DELETE FROM outbox"
            } else {
                "UPDATE outbox SET published_at = UTC_TIMESTAMP(6)"
            };
            let sql = format!(
                "{action} WHERE id IN ({})",
                question_marks(settlement.published.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in &settlement.published {
                query = query.bind(id);
            }
            query.execute(&mut *self.txn).await?;
        }
        for failed in &settlement.failed {
            sqlx::query(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, \
                 dead_lettered_at = CASE WHEN ? THEN UTC_TIMESTAMP(6) END WHERE id = ?",
            )
            .bind(&failed.error)
            .bind(failed.dead_letter)
            .bind(&failed.id)
            .execute(&mut *self.txn)
            .await?;
        }
        self.txn.commit().await?;
        Ok(())
    }
}
