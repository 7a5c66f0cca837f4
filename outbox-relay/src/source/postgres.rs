//! PostgreSQL: claims with `FOR UPDATE SKIP LOCKED` inside a transaction
//! held until the batch is settled, and wakes on `LISTEN outbox` (the
//! migration's trigger notifies on every committed insert) with the poll
//! interval as fallback.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::{Postgres, Row, Transaction};
use tokio::sync::Mutex;

use super::{Claim, Settlement, Source, SourceError, SourceOptions, Status};
use crate::record::OutboxRecord;

/// The channel the migration's trigger notifies.
const CHANNEL: &str = "outbox";

const CLAIM: &str = "SELECT id::text, aggregatetype, aggregateid, type, payload::text, \
     event_version, aggregate_seq, traceparent, seq, attempts \
     FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
     ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED";

/// Pending rows of a PostgreSQL database.
pub struct PostgresSource {
    pool: PgPool,
    listener: Mutex<Option<PgListener>>,
    options: SourceOptions,
}

impl PostgresSource {
    /// Connects a small pool and checks that the server answers.
    pub async fn connect(url: &str, options: SourceOptions) -> Result<Self, sqlx::Error> {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await?;
        Ok(Self {
            pool,
            listener: Mutex::new(None),
            options,
        })
    }

    async fn listen(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(listener)
    }
}

#[async_trait]
impl Source for PostgresSource {
    async fn check_table(&self) -> Result<(), SourceError> {
        sqlx::query("SELECT 1 FROM outbox LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(())
    }

    async fn claim(&self, limit: usize) -> Result<Box<dyn Claim>, SourceError> {
        let mut txn = self.pool.begin().await?;
        let rows = sqlx::query(CLAIM)
            .bind(limit as i64)
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
        Ok(Box::new(PostgresClaim {
            txn,
            records,
            options: self.options,
        }))
    }

    async fn wait_for_rows(&self, timeout: Duration) {
        let mut slot = self.listener.lock().await;
        if slot.is_none() {
            match self.listen().await {
                Ok(listener) => *slot = Some(listener),
                Err(error) => {
                    tracing::warn!(%error, "cannot LISTEN for new outbox rows; polling instead");
                    tokio::time::sleep(timeout).await;
                    return;
                }
            }
        }
        let listener = slot.as_mut().expect("listener was just set");
        match tokio::time::timeout(timeout, listener.recv()).await {
            Ok(Ok(_)) => while listener.next_buffered().is_some() {},
            Ok(Err(error)) => {
                tracing::warn!(%error, "lost the LISTEN connection; reconnecting");
                *slot = None;
                tokio::time::sleep(timeout).await;
            }
            Err(_elapsed) => {}
        }
    }

    async fn delete_published(&self, older_than: Duration, limit: u64) -> Result<u64, SourceError> {
        let deleted = sqlx::query(
            "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox \
             WHERE published_at < now() - make_interval(secs => $1) \
             ORDER BY published_at LIMIT $2)",
        )
        .bind(older_than.as_secs_f64())
        .bind(limit as i64)
        .execute(&self.pool)
        .await?;
        Ok(deleted.rows_affected())
    }

    async fn status(&self) -> Result<Status, SourceError> {
        let row = sqlx::query(
            "SELECT \
               COUNT(*) FILTER (WHERE published_at IS NULL AND dead_lettered_at IS NULL), \
               EXTRACT(EPOCH FROM now() - MIN(created_at) \
                 FILTER (WHERE published_at IS NULL AND dead_lettered_at IS NULL))::float8, \
               COUNT(*) FILTER (WHERE dead_lettered_at IS NOT NULL), \
               COUNT(*) FILTER (WHERE published_at IS NOT NULL) \
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

struct PostgresClaim {
    txn: Transaction<'static, Postgres>,
    records: Vec<OutboxRecord>,
    options: SourceOptions,
}

#[async_trait]
impl Claim for PostgresClaim {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    async fn settle(mut self: Box<Self>, settlement: &Settlement) -> Result<(), SourceError> {
        if !settlement.published.is_empty() {
            let sql = if self.options.delete_on_publish {
                "DELETE FROM outbox WHERE id = ANY($1::uuid[])"
            } else {
                "UPDATE outbox SET published_at = now() WHERE id = ANY($1::uuid[])"
            };
            sqlx::query(sql)
                .bind(&settlement.published)
                .execute(&mut *self.txn)
                .await?;
        }
        if !settlement.failed.is_empty() {
            let ids: Vec<&str> = settlement
                .failed
                .iter()
                .map(|row| row.id.as_str())
                .collect();
            let errors: Vec<&str> = settlement
                .failed
                .iter()
                .map(|row| row.error.as_str())
                .collect();
            let dead: Vec<bool> = settlement
                .failed
                .iter()
                .map(|row| row.dead_letter)
                .collect();
            sqlx::query(
                "UPDATE outbox AS o SET attempts = o.attempts + 1, last_error = f.error, \
                 dead_lettered_at = CASE WHEN f.dead THEN now() END \
                 FROM unnest($1::uuid[], $2::text[], $3::bool[]) AS f(id, error, dead) \
                 WHERE o.id = f.id",
            )
            .bind(&ids)
            .bind(&errors)
            .bind(&dead)
            .execute(&mut *self.txn)
            .await?;
        }
        self.txn.commit().await?;
        Ok(())
    }
}
