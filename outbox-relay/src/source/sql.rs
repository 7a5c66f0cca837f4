//! [`SqlSource`]: the source every SQL database shares. It connects and
//! joins shard ownership, drives each claim (transaction, shards, the
//! database's own claim, fencing) and answers `status`, retention and
//! re-drive with its [`Dialect`]'s statements.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};

use super::dialect::{ClaimRequest, ClaimedRows, Connection, Dialect, ShardScope, ShardStatements};
use super::fencing::Fencing;
use super::settle::SqlClaim;
use super::shards::{self, Membership, ShardConfig, ShardStore};
use super::{
    AggregateKey, Backlog, Claim, InFlight, SharedStatements, Source as _, SourceError,
    SourceOptions, Status, missing_table,
};
use crate::database::DatabaseUrl;
use crate::redact::redact_url;

/// Pending rows of a SQL database, claimed and settled the way its
/// [`Dialect`] words it.
pub struct SqlSource<D: Dialect> {
    pool: Pool<D::Db>,
    dialect: D,
    delete_on_publish: bool,
    sharding: Option<Sharding>,
    /// With shards: whether the last claim found this instance owning none
    /// (a standby).
    owns_no_shard: AtomicBool,
}

/// This instance's part in shard ownership.
struct Sharding {
    config: ShardConfig,
    statements: ShardStatements,
    store: Arc<dyn ShardStore>,
    membership: Arc<Membership>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl<D: SharedStatements> SqlSource<D> {
    /// Connects, checks that the server answers and, with shards
    /// configured, joins their ownership (which needs the outbox table).
    pub async fn connect(url: &str, options: SourceOptions) -> Result<Self, SourceError> {
        let connect_error = |source| SourceError::Connect {
            url: redact_url(url),
            source,
        };
        let database = DatabaseUrl::parse(url)?;
        let (pool, dialect) = D::connect(&database, &options)
            .await
            .map_err(connect_error)?;
        let mut source = Self {
            pool,
            dialect,
            delete_on_publish: options.delete_on_publish,
            sharding: None,
            owns_no_shard: AtomicBool::new(false),
        };
        if let (Some(config), Some(statements)) = (options.shards, D::SHARDS) {
            source.check_table().await?;
            if let Some(store) = source
                .dialect
                .shard_store(&source.pool, &config)
                .await
                .map_err(connect_error)?
            {
                let (membership, heartbeat) = shards::join(store.clone(), config.clone()).await?;
                source.sharding = Some(Sharding {
                    config,
                    statements,
                    store,
                    membership,
                    heartbeat,
                });
            }
        }
        Ok(source)
    }

    /// [`SqlSource::connect`], then checks the outbox table: a missing one
    /// is named as such.
    pub async fn open(url: &str, options: SourceOptions) -> Result<Self, SourceError> {
        let source = Self::connect(url, options)
            .await
            .map_err(|error| missing_table(url, error))?;
        source
            .check_table()
            .await
            .map_err(|error| missing_table(url, error))?;
        Ok(source)
    }

    /// The connection pool, for statements outside the row claims.
    pub fn pool(&self) -> &Pool<D::Db> {
        &self.pool
    }

    /// This database's own state.
    pub fn dialect(&self) -> &D {
        &self.dialect
    }

    /// Whether the last claim found this instance owning no shard.
    pub fn owns_no_shard(&self) -> bool {
        self.owns_no_shard.load(Ordering::Relaxed)
    }

    /// Whether settled rows are deleted rather than marked.
    pub fn delete_on_publish(&self) -> bool {
        self.delete_on_publish
    }

    /// Claims up to `limit` rows, leaving out the `excluded` aggregates
    /// and continuing each aggregate of `in_flight` after its rows there;
    /// `None` when a claim `ahead` yields (see [`Dialect::begin_claim`]).
    async fn claim_rows(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
        in_flight: &InFlight,
        ahead: bool,
    ) -> Result<Option<Box<dyn Claim>>, SourceError> {
        let mut txn: Option<Transaction<'static, D::Db>> = None;
        let mut pooled: Option<PoolConnection<D::Db>> = None;
        let conn: &mut Connection<D> = if D::HOLDS_CLAIMS {
            txn.insert(self.pool.begin().await?)
        } else {
            pooled.insert(self.pool.acquire().await?)
        };
        let sharding = self.sharding.as_ref();
        if !D::begin_claim(conn, sharding.map(|sharding| &sharding.config), ahead).await? {
            return Ok(None);
        }
        let mut owned = Vec::new();
        let mut shards = None;
        if let Some(sharding) = sharding {
            owned = D::owned_shards(
                &mut *conn,
                sharding.statements.at_claim,
                &sharding.config.instance,
            )
            .await?;
            self.owns_no_shard
                .store(owned.is_empty(), Ordering::Relaxed);
            shards = Some(ShardScope {
                count: sharding.config.count,
                owned: owned.iter().map(|(shard, _)| *shard).collect(),
            });
        }
        let claimed = if shards.as_ref().is_some_and(|scope| scope.owned.is_empty()) {
            ClaimedRows::default()
        } else {
            let request = ClaimRequest {
                limit,
                excluded,
                in_flight,
                shards,
            };
            D::claim(self, conn, &request).await?
        };
        drop(pooled);
        tracing::debug!(
            rows = claimed.records.len(),
            held = claimed.held.len(),
            owned_shards = ?sharding.map(|_| owned.len()),
            "claimed"
        );
        Ok(Some(Box::new(SqlClaim::<D> {
            txn,
            pool: self.pool.clone(),
            records: claimed.records,
            held: claimed.held,
            delete_on_publish: self.delete_on_publish,
            mark_by_time: self.dialect.marks_by_creation_time(),
            fencing: self.sharding.as_ref().map(|sharding| Fencing {
                instance: sharding.config.instance.clone(),
                at_mark: sharding.statements.at_mark,
                owned,
                membership: sharding.membership.clone(),
            }),
        })))
    }
}

#[async_trait]
impl<D: SharedStatements> super::Source for SqlSource<D> {
    async fn check_table(&self) -> Result<(), SourceError> {
        D::check_table(&self.pool).await
    }

    async fn claim(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
    ) -> Result<Box<dyn Claim>, SourceError> {
        self.claim_rows(limit, excluded, &InFlight::default(), false)
            .await?
            .ok_or_else(|| {
                SourceError::Query(sqlx::Error::Protocol(
                    "a claim that is not ahead never yields".into(),
                ))
            })
    }

    async fn claim_ahead(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
        in_flight: &InFlight,
    ) -> Result<Option<Box<dyn Claim>>, SourceError> {
        if !D::CLAIMS_AHEAD {
            return Ok(None);
        }
        self.claim_rows(limit, excluded, in_flight, true).await
    }

    async fn wait_for_rows(&self, timeout: Duration) {
        D::wait_for_rows(self, timeout).await;
    }

    async fn delete_published(&self, older_than: Duration, limit: u64) -> Result<u64, SourceError> {
        D::delete_published(&self.pool, older_than, limit).await
    }

    async fn backlog(&self) -> Result<Backlog, SourceError> {
        D::backlog(&self.pool).await
    }

    async fn status(&self) -> Result<Status, SourceError> {
        D::status(&self.pool).await
    }

    async fn redrive(
        &self,
        ids: &[String],
        aggregate_type: Option<&str>,
        limit: u64,
    ) -> Result<u64, SourceError> {
        D::redrive(&self.pool, ids, aggregate_type, limit).await
    }

    async fn close(&self) {
        if let Some(sharding) = &self.sharding {
            sharding.heartbeat.abort();
            shards::leave(sharding.store.as_ref(), &sharding.config).await;
        }
    }
}
