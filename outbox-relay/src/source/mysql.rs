//! MariaDB and MySQL: claims in a READ COMMITTED transaction (no gap
//! locks, so the application's inserts never wait for the relay) held until
//! the batch is settled; polls for new rows.
//!
//! A claim takes each aggregate's rows in `aggregate_seq` order (see
//! `source/runs.rs`): it reads the chosen ids without locking, then locks
//! exactly those rows by primary key. InnoDB locks every record a locking
//! scan passes, so a single locking scan filtered by shard would wait on
//! other instances' rows. With shard ownership (the relay's mode), the
//! claim reads this instance's shard rows without locking them (fencing
//! at the mark checks their epochs) and waits (up to the lock wait
//! timeout) for rows a previous owner still holds rather than skipping
//! them. Without shards, rows another claim holds are skipped
//! (`FOR UPDATE SKIP LOCKED`) and an aggregate's run is cut there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, MySql, Row, Transaction};

use super::decode;
use super::runs::{Head, head_sql, in_claim_order, runs_sql};
use super::shards::{self, Fencing, Membership, ShardConfig, ShardStore, Taken};
use super::{
    AggregateKey, Backlog, Claim, DEAD_LETTERS_SHOWN, DeadLetter, RunRow, Settlement, Source,
    SourceError, SourceOptions, Status, owners_or_none, question_mark_pairs, question_marks,
    redrive_filter,
};
use crate::record::OutboxRecord;

/// A zero `created_at` (`0000-00-00`, which MariaDB accepts by default)
/// has age 0.
const COLUMNS: &str = "id, aggregatetype, aggregateid, type, CAST(payload AS CHAR) AS payload, \
     event_version, aggregate_seq, traceparent, seq, attempts, \
     COALESCE(CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS DOUBLE) / 1e6, 0) \
       AS age_at_claim";

const PENDING: &str = "published_at IS NULL AND dead_lettered_at IS NULL";

/// The shard of a row: a stable hash of its aggregate.
const SHARD_OF_ROW: &str = "MOD(CRC32(CONCAT(aggregatetype, '/', aggregateid)), ?)";

/// Pending rows of a MariaDB or MySQL database.
pub struct MySqlSource {
    pool: MySqlPool,
    delete_on_publish: bool,
    sharding: Option<Sharding>,
}

/// This instance's part in shard ownership.
struct Sharding {
    config: ShardConfig,
    store: Arc<MySqlShardStore>,
    membership: Arc<Membership>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl MySqlSource {
    /// Connects a small pool whose sessions use UTC and READ COMMITTED and,
    /// with shards configured, joins their ownership.
    pub async fn connect(url: &str, options: SourceOptions) -> Result<Self, SourceError> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let session = SessionSetup {
            shards: options.shards.as_ref().map(|shards| ShardSessions {
                instance: shards.instance.clone(),
                idle_timeout: shards.batch_timeout.as_secs().max(1),
                net_write_timeout: shards.lease.as_secs().max(1),
            }),
        };
        let claims_session = session.clone();
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _meta| {
                let session = claims_session.clone();
                Box::pin(async move { session.apply(conn).await })
            })
            .connect(&url)
            .await
            .map_err(|source| SourceError::Connect {
                url: crate::redact::redact_url(&url),
                source,
            })?;
        let mut source = Self {
            pool: pool.clone(),
            delete_on_publish: options.delete_on_publish,
            sharding: None,
        };
        if let Some(config) = options.shards {
            source.check_table().await?;
            // A connection of its own: renewals never wait for a claim's.
            let heartbeat_pool = MySqlPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(config.lease / 3)
                .after_connect(move |conn, _meta| {
                    let session = session.clone();
                    Box::pin(async move { session.apply(conn).await })
                })
                .connect_with((*pool.connect_options()).clone())
                .await
                .map_err(|source| SourceError::Connect {
                    url: crate::redact::redact_url(&url),
                    source,
                })?;
            let store = Arc::new(MySqlShardStore {
                pool: heartbeat_pool,
            });
            let (membership, heartbeat) = shards::join(store.clone(), config.clone()).await?;
            source.sharding = Some(Sharding {
                config,
                store,
                membership,
                heartbeat,
            });
        }
        Ok(source)
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

    async fn claim(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
    ) -> Result<Box<dyn Claim>, SourceError> {
        let exclusion = if excluded.is_empty() {
            String::new()
        } else {
            format!(
                " AND (aggregatetype, aggregateid) NOT IN ({})",
                question_mark_pairs(excluded.len())
            )
        };
        let mut txn = self.pool.begin().await?;
        let (records, owned) = match &self.sharding {
            None => {
                // Rows another claim holds are skipped; a run that loses a
                // row that way is cut there by `in_claim_order`.
                let records = claim_runs(
                    &mut txn,
                    &exclusion,
                    excluded,
                    &[],
                    0,
                    limit,
                    " SKIP LOCKED",
                )
                .await?;
                (records, Vec::new())
            }
            Some(sharding) => {
                let owned =
                    owned_shards(&mut txn, &sharding.config.instance, ShardCheck::Claim).await?;
                if owned.is_empty() {
                    (Vec::new(), owned)
                } else {
                    let filter = format!(
                        "{exclusion} AND {SHARD_OF_ROW} IN ({})",
                        question_marks(owned.len())
                    );
                    let shards: Vec<i64> = owned.iter().map(|(shard, _)| *shard).collect();
                    let records = claim_runs(
                        &mut txn,
                        &filter,
                        excluded,
                        &shards,
                        sharding.config.count,
                        limit,
                        "",
                    )
                    .await?;
                    (records, owned)
                }
            }
        };
        Ok(Box::new(MySqlClaim {
            txn,
            records,
            delete_on_publish: self.delete_on_publish,
            fencing: self.sharding.as_ref().map(|sharding| Fencing {
                instance: sharding.config.instance.clone(),
                owned,
                membership: sharding.membership.clone(),
            }),
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

    async fn backlog(&self) -> Result<Backlog, SourceError> {
        let (pending, oldest_pending_age_seconds): (i64, Option<f64>) = sqlx::query_as(
            "SELECT COUNT(*), \
               CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) AS DOUBLE) / 1e6 \
             FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        // Dead letters are never published: the pending index covers them.
        let dead_letters: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NOT NULL",
        )
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
               CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) AS DOUBLE) / 1e6 \
                 AS oldest_pending_age_seconds \
             FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
             GROUP BY aggregatetype ORDER BY 2 DESC, 1 LIMIT 50",
        )
        .fetch_all(&self.pool)
        .await?;
        let owners = sqlx::query_as(
            "SELECT owner, COUNT(*) AS shards, \
               CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(lease_until)) AS DOUBLE) / 1e6 \
                 AS lease_expires_in_seconds \
             FROM outbox_relay_shard WHERE owner IS NOT NULL GROUP BY owner ORDER BY owner",
        )
        .fetch_all(&self.pool)
        .await;
        Ok(Status {
            backlog: self.backlog().await?,
            published,
            pending_by_type,
            dead_letter_rows: dead_letters(&self.pool).await?,
            shard_owners: owners_or_none(owners)?,
        })
    }

    async fn close(&self) {
        if let Some(sharding) = &self.sharding {
            sharding.heartbeat.abort();
            shards::leave(sharding.store.as_ref(), &sharding.config).await;
        }
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
            "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0 WHERE {filter} LIMIT {limit}"
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

/// Claims up to `limit` rows in aggregate order (see `source/runs.rs`):
/// reads the aggregates of the oldest pending rows passing `filter` (its
/// parameters: the `excluded` pairs, then the shard count and `shards` when
/// sharded), then their runs, without locking; then locks exactly those
/// rows by primary key (`lock` appended to `FOR UPDATE`). InnoDB locks
/// every record a locking scan passes, so a locking scan filtered by shard
/// would wait on other instances' rows.
async fn claim_runs(
    txn: &mut Transaction<'static, MySql>,
    filter: &str,
    excluded: &[AggregateKey],
    shards: &[i64],
    shard_count: u32,
    limit: usize,
    lock: &str,
) -> Result<Vec<OutboxRecord>, SourceError> {
    let head_sql = head_sql(filter);
    let mut query = sqlx::query_as::<_, Head>(AssertSqlSafe(head_sql));
    for key in excluded {
        query = query.bind(&key.aggregate_type).bind(&key.aggregate_id);
    }
    if !shards.is_empty() {
        query = query.bind(shard_count);
        for shard in shards {
            query = query.bind(shard);
        }
    }
    let heads = query.bind(limit as u64).fetch_all(&mut **txn).await?;
    if heads.is_empty() {
        return Ok(Vec::new());
    }

    let runs_sql = runs_sql("id", heads.len());
    let mut query = sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(runs_sql));
    for head in &heads {
        query = query
            .bind(&head.aggregatetype)
            .bind(&head.aggregateid)
            .bind(head.n);
    }
    let positions: HashMap<String, i64> = query.fetch_all(&mut **txn).await?.into_iter().collect();
    if positions.is_empty() {
        return Ok(Vec::new());
    }

    let lock_sql = format!(
        "SELECT {COLUMNS} FROM outbox WHERE id IN ({}) AND {PENDING} FOR UPDATE{lock}",
        question_marks(positions.len())
    );
    let mut query = sqlx::query(AssertSqlSafe(lock_sql));
    for id in positions.keys() {
        query = query.bind(id);
    }
    let locked = query.fetch_all(&mut **txn).await?;
    // A row that cannot be read is dead-lettered in this transaction and
    // left out; the rows of its aggregate after it wait for the next claim
    // (see `source/decode.rs`).
    let decoded = decode::records(&locked)?;
    for row in &decoded.undecodable {
        sqlx::query(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?, \
             dead_lettered_at = UTC_TIMESTAMP(6) \
             WHERE seq = ? AND published_at IS NULL AND dead_lettered_at IS NULL",
        )
        .bind(&row.reason)
        .bind(row.seq)
        .execute(&mut **txn)
        .await?;
        row.log();
    }
    let rows = decoded
        .rows
        .into_iter()
        .map(|record| RunRow {
            run_position: positions[&record.id],
            record,
        })
        .collect();
    Ok(in_claim_order(&heads, rows))
}

async fn dead_letters(pool: &MySqlPool) -> Result<Vec<DeadLetter>, SourceError> {
    Ok(sqlx::query_as(
        "SELECT id, aggregatetype, aggregateid, type, attempts, last_error FROM outbox \
         WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at LIMIT ?",
    )
    .bind(DEAD_LETTERS_SHOWN)
    .fetch_all(pool)
    .await?)
}

/// Why [`owned_shards`] reads the shard rows.
#[derive(Debug, Clone, Copy)]
enum ShardCheck {
    /// At a claim: the shards with a current lease, unlocked, so that no
    /// renewal or takeover ever waits for a claim (a long send, a paused
    /// relay); fencing at the mark covers a change of owner meanwhile.
    Claim,
    /// At the mark: every shard this instance owns, unlocked, so that a
    /// relay paused in the middle of its mark holds up no takeover. A
    /// takeover between the epoch check and the commit is harmless: the
    /// new owner's claim waits for this claim's row locks and then finds
    /// the rows marked.
    Mark,
}

/// This instance's shards and their epochs.
async fn owned_shards(
    txn: &mut Transaction<'static, MySql>,
    instance: &str,
    check: ShardCheck,
) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    let sql = match check {
        ShardCheck::Claim => {
            "SELECT shard, epoch FROM outbox_relay_shard \
             WHERE owner = ? AND lease_until > UTC_TIMESTAMP(6) ORDER BY shard"
        }
        ShardCheck::Mark => {
            "SELECT shard, epoch FROM outbox_relay_shard WHERE owner = ? ORDER BY shard"
        }
    };
    let rows = sqlx::query(sql)
        .bind(instance)
        .fetch_all(&mut **txn)
        .await?;
    rows.iter()
        .map(|row| Ok((i64::from(row.try_get::<i32, _>(0)?), row.try_get(1)?)))
        .collect()
}

struct MySqlClaim {
    txn: Transaction<'static, MySql>,
    records: Vec<OutboxRecord>,
    delete_on_publish: bool,
    fencing: Option<Fencing>,
}

#[async_trait]
impl Claim for MySqlClaim {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    fn lease_valid(&self) -> bool {
        self.fencing.as_ref().is_none_or(Fencing::lease_valid)
    }

    async fn settle(mut self: Box<Self>, settlement: &Settlement) -> Result<(), SourceError> {
        if let Some(fencing) = &self.fencing {
            fencing
                .check(&owned_shards(&mut self.txn, &fencing.instance, ShardCheck::Mark).await?)?;
        }
        if !settlement.published.is_empty() {
            let action = if self.delete_on_publish {
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

/// Shard ownership statements on MariaDB and MySQL.
struct MySqlShardStore {
    pool: MySqlPool,
}

/// `UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND`, bound to a lease.
const LEASE_END: &str = "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND";

fn micros(lease: Duration) -> u64 {
    lease.as_micros() as u64
}

#[async_trait]
impl ShardStore for MySqlShardStore {
    async fn prepare(&self, count: u32) -> Result<(), SourceError> {
        let sql = format!(
            "INSERT IGNORE INTO outbox_relay_shard (shard) VALUES {}",
            vec!["(?)"; count as usize].join(", ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for shard in 0..count {
            query = query.bind(shard);
        }
        query.execute(&self.pool).await?;
        let highest: Option<i32> = sqlx::query_scalar("SELECT MAX(shard) FROM outbox_relay_shard")
            .fetch_one(&self.pool)
            .await?;
        match highest {
            Some(highest) if i64::from(highest) + 1 > i64::from(count) => {
                Err(SourceError::ShardCount {
                    configured: count,
                    found: i64::from(highest) + 1,
                })
            }
            _ => Ok(()),
        }
    }

    async fn heartbeat(&self, instance: &str, lease: Duration) -> Result<usize, SourceError> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO outbox_relay_instance (id, lease_until) VALUES (?, {LEASE_END}) \
             ON DUPLICATE KEY UPDATE lease_until = VALUES(lease_until)"
        )))
        .bind(instance)
        .bind(micros(lease))
        .execute(&self.pool)
        .await?;
        sqlx::query("DELETE FROM outbox_relay_instance WHERE lease_until < UTC_TIMESTAMP(6)")
            .execute(&self.pool)
            .await?;
        let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_relay_instance")
            .fetch_one(&self.pool)
            .await?;
        Ok(live as usize)
    }

    async fn renew(&self, instance: &str, lease: Duration) -> Result<Vec<(i32, i64)>, SourceError> {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE outbox_relay_shard SET lease_until = {LEASE_END} WHERE owner = ?"
        )))
        .bind(micros(lease))
        .bind(instance)
        .execute(&self.pool)
        .await?;
        Ok(
            sqlx::query_as("SELECT shard, epoch FROM outbox_relay_shard WHERE owner = ?")
                .bind(instance)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn acquire(
        &self,
        instance: &str,
        lease: Duration,
        want: usize,
    ) -> Result<Vec<Taken>, SourceError> {
        let mut txn = self.pool.begin().await?;
        let free: Vec<(i32, i64, Option<String>)> = sqlx::query_as(
            "SELECT shard, epoch, owner FROM outbox_relay_shard \
             WHERE owner IS NULL OR lease_until < UTC_TIMESTAMP(6) \
             ORDER BY shard LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(want as u64)
        .fetch_all(&mut *txn)
        .await?;
        if !free.is_empty() {
            let sql = format!(
                "UPDATE outbox_relay_shard SET owner = ?, epoch = epoch + 1, lease_until = {LEASE_END} \
                 WHERE shard IN ({})",
                question_marks(free.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql))
                .bind(instance)
                .bind(micros(lease));
            for (shard, _, _) in &free {
                query = query.bind(shard);
            }
            query.execute(&mut *txn).await?;
        }
        txn.commit().await?;
        Ok(free
            .into_iter()
            .map(|(shard, epoch, previous_owner)| Taken {
                shard,
                epoch: epoch + 1,
                previous_owner,
            })
            .collect())
    }

    /// The owner's sessions recorded in `outbox_relay_session`, of the
    /// current server run (connection ids restart with the server), this
    /// user and this database.
    async fn end_sessions_of(&self, owner: &str) -> Result<u64, SourceError> {
        let sessions: Vec<u64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT s.connection_id FROM outbox_relay_session AS s \
             JOIN information_schema.PROCESSLIST AS p ON p.ID = s.connection_id \
             WHERE s.instance = ? AND p.ID <> CONNECTION_ID() \
             AND p.USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1) AND p.DB <=> DATABASE() \
             AND ABS(TIMESTAMPDIFF(SECOND, s.server_started, {SERVER_STARTED})) <= 2"
        )))
        .bind(owner)
        .fetch_all(&self.pool)
        .await?;
        let mut ended = 0;
        for session in &sessions {
            // KILL takes no parameters; the id is a number read above.
            match sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {session}")))
                .execute(&self.pool)
                .await
            {
                Ok(_) => ended += 1,
                Err(error) => tracing::debug!(%error, session, "cannot end a session"),
            }
        }
        sqlx::query("DELETE FROM outbox_relay_session WHERE instance = ?")
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(ended)
    }

    async fn release(&self, instance: &str, shards: &[i32]) -> Result<(), SourceError> {
        let sql = format!(
            "UPDATE outbox_relay_shard SET owner = NULL, lease_until = NULL \
             WHERE owner = ? AND shard IN ({})",
            question_marks(shards.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(instance);
        for shard in shards {
            query = query.bind(shard);
        }
        query.execute(&self.pool).await?;
        Ok(())
    }

    async fn leave(&self, instance: &str) -> Result<(), SourceError> {
        sqlx::query(
            "UPDATE outbox_relay_shard SET owner = NULL, lease_until = NULL WHERE owner = ?",
        )
        .bind(instance)
        .execute(&self.pool)
        .await?;
        sqlx::query("DELETE FROM outbox_relay_instance WHERE id = ?")
            .bind(instance)
            .execute(&self.pool)
            .await?;
        // Absent before migration 0007: nothing to forget then.
        let _ = sqlx::query("DELETE FROM outbox_relay_session WHERE instance = ?")
            .bind(instance)
            .execute(&self.pool)
            .await;
        Ok(())
    }
}

/// How every session of the relay is set up.
#[derive(Debug, Clone)]
struct SessionSetup {
    /// With shard ownership.
    shards: Option<ShardSessions>,
}

/// Session settings of a relay sharing shards.
#[derive(Debug, Clone)]
struct ShardSessions {
    instance: String,
    /// Seconds a claim may stay idle: the batch timeout.
    idle_timeout: u64,
    /// Seconds the server waits to write to the relay: the lease.
    net_write_timeout: u64,
}

impl SessionSetup {
    /// UTC and READ COMMITTED (no gap locks, so the application's inserts
    /// never wait for the relay) and, with shards, the timeouts that end a
    /// paused relay's claims and the session's registration.
    async fn apply(&self, conn: &mut sqlx::MySqlConnection) -> Result<(), sqlx::Error> {
        sqlx::query("SET SESSION time_zone = '+00:00'")
            .execute(&mut *conn)
            .await?;
        sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await?;
        if let Some(shards) = &self.shards {
            register_session(conn, &shards.instance).await;
            sqlx::query("SET SESSION innodb_lock_wait_timeout = 5")
                .execute(&mut *conn)
                .await?;
            // A relay paused while the server sends it a claim's rows
            // blocks the server's write: the server gives up after this
            // long and ends the claim, freeing its rows.
            sqlx::query(AssertSqlSafe(format!(
                "SET SESSION net_write_timeout = {}",
                shards.net_write_timeout
            )))
            .execute(&mut *conn)
            .await?;
            // MariaDB ends a paused relay's idle claim, releasing its rows;
            // MySQL has no such variable.
            let _ = sqlx::query(AssertSqlSafe(format!(
                "SET SESSION idle_transaction_timeout = {}",
                shards.idle_timeout
            )))
            .execute(&mut *conn)
            .await;
        }
        Ok(())
    }
}

/// When the server started (UTC), to tell its connection ids from those of
/// an earlier run, which restarted from 1.
const SERVER_STARTED: &str = "(SELECT UTC_TIMESTAMP() - INTERVAL VARIABLE_VALUE SECOND \
     FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME')";

/// Records a new session of `instance` in `outbox_relay_session`, so that
/// an instance taking over its shards can end it. Best effort: without the
/// table (before migration 0007) or the server's uptime (MySQL keeps it in
/// performance_schema), a paused relay's claims end with the server's
/// timeouts instead.
async fn register_session(connection: &mut sqlx::MySqlConnection, instance: &str) {
    let registered = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO outbox_relay_session (instance, connection_id, server_started) \
         SELECT ?, CONNECTION_ID(), started FROM (SELECT {SERVER_STARTED} AS started) AS server \
         WHERE started IS NOT NULL \
         ON DUPLICATE KEY UPDATE server_started = VALUES(server_started)"
    )))
    .bind(instance)
    .execute(connection)
    .await;
    if let Err(error) = registered {
        tracing::debug!(%error, "cannot record this database session for takeovers");
    }
}
