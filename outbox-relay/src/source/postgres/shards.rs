//! Shard ownership on PostgreSQL (see `source/shards/mod.rs`).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::super::SourceError;
use super::super::dialect::ShardStatements;
use super::super::shards::{ShardConfig, ShardStore, Taken, tables};
use super::PgDialect;

/// How claims and `status` read shard ownership. At a claim, only shards
/// with a current lease, `FOR KEY SHARE`: a lock that no renewal or
/// takeover (an `UPDATE` of non-key columns) waits for, so a long or
/// paused claim never holds up the heartbeats. Fencing at the mark keeps a
/// batch whose shard changed owner meanwhile from being marked.
pub(super) const STATEMENTS: ShardStatements = ShardStatements {
    at_claim: "SELECT shard, epoch FROM outbox_relay_shard \
         WHERE owner = $1 AND lease_until > now() ORDER BY shard FOR KEY SHARE",
    at_mark: "SELECT shard, epoch FROM outbox_relay_shard WHERE owner = $1 ORDER BY shard",
    owners: "SELECT owner, COUNT(*) AS shards, \
           EXTRACT(EPOCH FROM MIN(lease_until) - now())::float8 AS lease_expires_in_seconds \
         FROM outbox_relay_shard WHERE owner IS NOT NULL GROUP BY owner ORDER BY owner",
};

/// Shard ownership statements on PostgreSQL.
pub(super) struct PgShardStore {
    pool: PgPool,
}

impl PgShardStore {
    /// A connection of its own, with the claims' connection options, whose
    /// statements time out well within the lease: renewals never wait for
    /// a claim's connection.
    pub(super) async fn connect(pool: &PgPool, config: &ShardConfig) -> Result<Self, sqlx::Error> {
        let statement_timeout = (config.lease / 3).as_millis().max(100);
        let port = pool.connect_options().get_port();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(config.lease / 3)
            .after_connect(move |connection, _meta| {
                Box::pin(async move {
                    crate::nodelay::set_on_database_sockets(port);
                    sqlx::query(AssertSqlSafe(format!(
                        "SET statement_timeout = {statement_timeout}"
                    )))
                    .execute(connection)
                    .await?;
                    Ok(())
                })
            })
            .connect_with((*pool.connect_options()).clone())
            .await?;
        Ok(Self { pool })
    }
}

#[async_trait]
impl ShardStore for PgShardStore {
    async fn prepare(&self, count: u32) -> Result<(), SourceError> {
        sqlx::query(
            "INSERT INTO outbox_relay_shard (shard) SELECT generate_series(0, $1 - 1) \
             ON CONFLICT (shard) DO NOTHING",
        )
        .bind(count as i32)
        .execute(&self.pool)
        .await?;
        tables::check_count(&self.pool, count).await
    }

    async fn heartbeat(&self, instance: &str, lease: Duration) -> Result<usize, SourceError> {
        let register = "INSERT INTO outbox_relay_instance (id, lease_until) \
             VALUES ($1, now() + make_interval(secs => $2)) \
             ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until";
        tables::heartbeat::<PgDialect>(&self.pool, register, instance, lease).await
    }

    async fn renew(&self, instance: &str, lease: Duration) -> Result<Vec<(i32, i64)>, SourceError> {
        Ok(sqlx::query_as(
            "UPDATE outbox_relay_shard SET lease_until = now() + make_interval(secs => $2) \
             WHERE owner = $1 RETURNING shard, epoch",
        )
        .bind(instance)
        .bind(lease.as_secs_f64())
        .fetch_all(&self.pool)
        .await?)
    }

    async fn acquire(&self, config: &ShardConfig, want: usize) -> Result<Vec<Taken>, SourceError> {
        let (instance, lease) = (config.instance.as_str(), config.lease);
        let taken: Vec<(i32, i64, Option<String>)> = sqlx::query_as(
            "WITH free AS (SELECT shard, owner FROM outbox_relay_shard \
               WHERE owner IS NULL OR lease_until < now() \
               ORDER BY shard LIMIT $3 FOR NO KEY UPDATE SKIP LOCKED) \
             UPDATE outbox_relay_shard AS s SET owner = $1, epoch = s.epoch + 1, \
               lease_until = now() + make_interval(secs => $2) \
             FROM free WHERE s.shard = free.shard \
             RETURNING s.shard, s.epoch, free.owner",
        )
        .bind(instance)
        .bind(lease.as_secs_f64())
        .bind(want as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(taken
            .into_iter()
            .map(|(shard, epoch, previous_owner)| Taken {
                shard,
                epoch,
                previous_owner,
            })
            .collect())
    }

    /// The owner's sessions carry its id as `application_name`.
    async fn end_sessions_of(&self, owner: &str) -> Result<u64, SourceError> {
        let ended: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = left($1, 63) AND datname = current_database() \
             AND pid <> pg_backend_pid()",
        )
        .bind(owner)
        .fetch_one(&self.pool)
        .await?;
        Ok(ended as u64)
    }

    async fn release(&self, instance: &str, shards: &[i32]) -> Result<(), SourceError> {
        sqlx::query(
            "UPDATE outbox_relay_shard SET owner = NULL, lease_until = NULL \
             WHERE owner = $1 AND shard = ANY($2)",
        )
        .bind(instance)
        .bind(shards)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn leave(&self, instance: &str) -> Result<(), SourceError> {
        tables::leave::<PgDialect>(&self.pool, instance).await
    }
}
