//! MariaDB and MySQL: claims in a READ COMMITTED transaction (no gap
//! locks, so the application's inserts never wait for the relay) held until
//! the batch is settled; polls for new rows.
//!
//! A claim takes the oldest pending rows by `seq`, each aggregate's order
//! (see `crate::ordering`): it reads their ids without locking, then locks
//! exactly those rows by primary key. InnoDB locks every record a locking
//! scan passes, so a single locking scan filtered by shard would wait on
//! other instances' rows. With shard ownership (the relay's mode), the
//! claim reads this instance's shard rows without locking them (fencing
//! at the mark checks their epochs) and waits (up to the lock wait
//! timeout) for rows a previous owner still holds rather than skipping
//! them. Without shards, rows another claim holds are skipped
//! (`FOR UPDATE SKIP LOCKED`) and an aggregate's run is cut there.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, FromRow, MySql};

use super::dead_letters::park;
use super::decode;
use super::dialect::{ClaimRequest, ClaimedRows, Dialect, ShardStatements};
use super::extra::{self, ExtraSelect};
use super::oldest::{RunKey, exclusion, oldest_sql, read_heads};
use super::shards::{ShardConfig, ShardStore, Taken, tables};
use super::{
    AggregateKey, FailedRow, FastMap, FastSet, IdLists, Marking, SourceError, SourceOptions,
    SqlSource, Typed, question_mark_pairs, question_marks,
};
use crate::database::DatabaseUrl;
use crate::ordering::{self, Hole};
use crate::record::OutboxRecord;

/// A zero `created_at` (`0000-00-00`, which MariaDB accepts by default)
/// has age 0.
const COLUMNS: &str = "id, aggregatetype, aggregateid, type, CAST(payload AS CHAR) AS payload, \
     event_version, aggregate_seq, traceparent, seq, attempts, \
     COALESCE(CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS DOUBLE) / 1e6, 0) \
       AS age_at_claim, CAST(created_at AS CHAR) AS created_at";

const PENDING: &str = "published_at IS NULL AND dead_lettered_at IS NULL";

/// A claim's oldest rows: what a [`RunKey`] holds, the creation
/// time, exactly as [`COLUMNS`] reads it.
const RUN_KEY_COLUMNS: &str = "id, aggregatetype, aggregateid, aggregate_seq, seq, \
     CAST(created_at AS CHAR) AS created_at";

/// The shard of a row: a stable hash of its aggregate.
const SHARD_OF_ROW: &str = "MOD(CRC32(CONCAT(aggregatetype, '/', aggregateid)), ?)";

/// Pending rows of a MariaDB or MySQL database.
pub type MySqlSource = SqlSource<MySqlDialect>;

/// MariaDB's and MySQL's part of a [`MySqlSource`]: how its sessions are
/// set up.
pub struct MySqlDialect {
    session: SessionSetup,
    /// The extra columns' select items.
    extra: ExtraSelect,
    /// Whether the outbox was partitioned when the relay connected.
    partitioned: bool,
}

#[async_trait]
impl Dialect for MySqlDialect {
    type Db = MySql;
    type Age = u64;
    type Marking = Self;
    type StatusRows = Typed;

    /// A small pool whose sessions use UTC and READ COMMITTED.
    async fn connect(
        url: &DatabaseUrl,
        options: &SourceOptions,
    ) -> Result<(MySqlPool, Self), sqlx::Error> {
        let driver_url = url.driver_url();
        let session = SessionSetup {
            port: driver_url.parse::<MySqlConnectOptions>()?.get_port(),
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
            .connect(&driver_url)
            .await?;
        let extra = extra::select(&pool, &options.extra, &extra::MYSQL).await?;
        let partitioned = crate::partitions::mysql::is_partitioned(&pool).await?;
        Ok((
            pool,
            Self {
                session,
                extra,
                partitioned,
            },
        ))
    }

    /// On a partitioned outbox. A relay started before a live conversion
    /// to the partitioned layout goes on by id until it is restarted.
    fn marks_by_creation_time(&self) -> bool {
        self.partitioned
    }

    async fn shard_store(
        &self,
        pool: &MySqlPool,
        config: &ShardConfig,
    ) -> Result<Option<Arc<dyn ShardStore>>, sqlx::Error> {
        let store = MySqlShardStore::connect(pool, self.session.clone(), config.lease).await?;
        Ok(Some(Arc::new(store)))
    }

    const SHARDS: Option<ShardStatements> = Some(SHARD_STATEMENTS);

    /// With shards, rows a previous owner still holds are waited for;
    /// without, rows another claim holds are skipped (`SKIP LOCKED`) and a
    /// run that loses a row that way is cut there ([`crate::ordering`]).
    async fn claim(
        source: &MySqlSource,
        conn: &mut MySqlConnection,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimedRows, SourceError> {
        let mut filter = exclusion(request.excluded.len(), false);
        let lock = match &request.shards {
            None => " SKIP LOCKED",
            Some(shards) => {
                filter.push_str(&format!(
                    " AND {SHARD_OF_ROW} IN ({})",
                    question_marks(shards.owned.len())
                ));
                ""
            }
        };
        let dialect = source.dialect();
        claim_runs(conn, &filter, request, lock, dialect).await
    }

    const NOW: &'static str = "UTC_TIMESTAMP(6)";

    const DELETE_PUBLISHED: &'static str = "DELETE FROM outbox WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
         ORDER BY published_at LIMIT ?";

    fn age(older_than: Duration) -> u64 {
        older_than.as_micros() as u64
    }

    const BACKLOG: &'static str = "SELECT COUNT(*), \
           CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) AS DOUBLE) / 1e6 \
         FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL";

    /// Dead letters are never published: the pending index covers them.
    const DEAD_LETTER_COUNT: &'static str =
        "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NOT NULL";

    const PENDING_BY_TYPE: &'static str = "SELECT aggregatetype, COUNT(*) AS pending, \
           CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) AS DOUBLE) / 1e6 \
             AS oldest_pending_age_seconds \
         FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
         GROUP BY aggregatetype ORDER BY 2 DESC, 1 LIMIT 50";

    const DEAD_LETTERS: &'static str = "SELECT id, aggregatetype, aggregateid, type, attempts, last_error FROM outbox \
         WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at LIMIT ?";

    const ID_AS_TEXT: &'static str = "id";

    fn redrive_sql(filter: &str, limit: u64) -> String {
        format!(
            "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0 WHERE {filter} LIMIT {limit}"
        )
    }
}

/// Claims up to `limit` rows: reads the oldest pending rows by `seq`
/// passing `filter` (its parameters: the excluded pairs, then the shard
/// count and the shards when sharded), without locking, then locks exactly
/// those rows by primary key (`lock` appended to `FOR UPDATE`), on a
/// partitioned outbox with their creation times, which name their
/// partitions (see [`Dialect::marks_by_creation_time`]). InnoDB locks
/// every record a locking scan passes, so a locking scan filtered by shard
/// would wait on other instances' rows.
///
/// The oldest rows are one consistent read: each writer draws an event's
/// `seq` under its aggregate's lock and holds it until it commits, so a
/// numbered row it shows has every earlier one of its aggregate committed.
/// A row read but not locked (skipped as locked, or no longer pending) or
/// not readable (dead-lettered here) cuts its aggregate's run
/// ([`crate::ordering`]).
async fn claim_runs(
    conn: &mut MySqlConnection,
    filter: &str,
    request: &ClaimRequest<'_>,
    lock: &str,
    dialect: &MySqlDialect,
) -> Result<ClaimedRows, SourceError> {
    let oldest = read_heads::<MySql>(
        conn,
        &oldest_sql(RUN_KEY_COLUMNS, filter),
        request.excluded,
        request.shards.as_ref(),
        request.limit,
    )
    .await?
    .iter()
    .map(RunKey::from_row)
    .collect::<Result<Vec<_>, _>>()?;
    if oldest.is_empty() {
        return Ok(ClaimedRows::default());
    }
    let extra = &dialect.extra.items;
    let (key, placeholders) = if dialect.partitioned {
        ("(id, created_at)", question_mark_pairs(oldest.len()))
    } else {
        ("id", question_marks(oldest.len()))
    };
    let lock_sql = format!(
        "SELECT {COLUMNS}{extra} FROM outbox WHERE {key} IN ({placeholders}) \
         AND {PENDING} FOR UPDATE{lock}"
    );
    let mut query = sqlx::query(AssertSqlSafe(lock_sql));
    for row in &oldest {
        query = query.bind(&row.id);
        if dialect.partitioned {
            query = query.bind(row.created_at.as_deref().unwrap_or_default());
        }
    }
    let locked = query.fetch_all(&mut *conn).await?;
    // A row that cannot be read is dead-lettered in this transaction and
    // left out (see `source/decode.rs`).
    let decoded = decode::records(&locked, |_, _| Ok(()))?;
    park::<MySqlDialect>(conn, &decoded.undecodable).await?;
    let mut records = decoded.rows;
    records.sort_unstable_by_key(|record| record.seq);
    let holes = if records.len() == oldest.len() {
        Vec::new()
    } else {
        let taken: FastSet<i64> = records.iter().map(|record| record.seq).collect();
        oldest
            .into_iter()
            .filter(|row| !taken.contains(&row.seq))
            .map(|row| Hole {
                seq: row.seq,
                aggregate: Some(AggregateKey {
                    aggregate_type: row.aggregatetype,
                    aggregate_id: row.aggregateid,
                }),
            })
            .collect()
    };
    let ordered = ordering::claim_order(records, &holes);
    ordering::report(&ordered.inversions);
    Ok(ClaimedRows {
        records: ordered.records,
        held: ordered.cut,
    })
}

/// On a partitioned outbox by id and creation time, as its claims lock
/// (see [`Dialect::marks_by_creation_time`]), on a plain one by id (its
/// primary key); failures, which are rare, by id.
#[async_trait]
impl Marking<MySqlDialect> for MySqlDialect {
    async fn mark_published(
        conn: &mut MySqlConnection,
        ids: &[String],
        records: &[OutboxRecord],
        by_time: bool,
        delete: bool,
    ) -> Result<(), SourceError> {
        if !by_time {
            return <IdLists<{ usize::MAX }> as Marking<Self>>::mark_published(
                conn, ids, records, false, delete,
            )
            .await;
        }
        let created_at: FastMap<&str, &str> = records
            .iter()
            .filter_map(|record| Some((record.id.as_str(), record.created_at.as_deref()?)))
            .collect();
        let (timed, untimed): (Vec<&String>, Vec<&String>) = ids
            .iter()
            .partition(|id| created_at.contains_key(id.as_str()));
        if !timed.is_empty() {
            let action = if delete {
                "DELETE FROM outbox"
            } else {
                "UPDATE outbox SET published_at = UTC_TIMESTAMP(6)"
            };
            let sql = format!(
                "{action} WHERE (id, created_at) IN ({})",
                question_mark_pairs(timed.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in timed {
                query = query.bind(id.as_str()).bind(created_at[id.as_str()]);
            }
            query.execute(&mut *conn).await?;
        }
        if !untimed.is_empty() {
            let untimed: Vec<String> = untimed.into_iter().cloned().collect();
            <IdLists<{ usize::MAX }> as Marking<Self>>::mark_published(
                conn, &untimed, records, false, delete,
            )
            .await?;
        }
        Ok(())
    }

    async fn record_failures(
        conn: &mut MySqlConnection,
        failed: &[FailedRow],
    ) -> Result<(), SourceError> {
        <IdLists<{ usize::MAX }> as Marking<Self>>::record_failures(conn, failed).await
    }
}

/// How claims and `status` read shard ownership, unlocked. At a claim, so
/// that no renewal or takeover ever waits for a claim (a long send, a
/// paused relay); fencing at the mark covers a change of owner meanwhile.
/// At the mark, so that a relay paused in the middle of its mark holds up
/// no takeover. A takeover between the epoch check and the commit is
/// harmless: the new owner's claim waits for this claim's row locks and
/// then finds the rows marked.
const SHARD_STATEMENTS: ShardStatements = ShardStatements {
    at_claim: "SELECT shard, epoch FROM outbox_relay_shard \
         WHERE owner = ? AND lease_until > UTC_TIMESTAMP(6) ORDER BY shard",
    at_mark: "SELECT shard, epoch FROM outbox_relay_shard WHERE owner = ? ORDER BY shard",
    owners: "SELECT owner, COUNT(*) AS shards, \
           CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(lease_until)) AS DOUBLE) / 1e6 \
             AS lease_expires_in_seconds \
         FROM outbox_relay_shard WHERE owner IS NOT NULL GROUP BY owner ORDER BY owner",
};

/// Shard ownership statements on MariaDB and MySQL.
struct MySqlShardStore {
    pool: MySqlPool,
}

impl MySqlShardStore {
    /// A connection of its own, set up as the claims' are: renewals never
    /// wait for a claim's.
    async fn connect(
        pool: &MySqlPool,
        session: SessionSetup,
        lease: Duration,
    ) -> Result<Self, sqlx::Error> {
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(lease / 3)
            .after_connect(move |conn, _meta| {
                let session = session.clone();
                Box::pin(async move { session.apply(conn).await })
            })
            .connect_with((*pool.connect_options()).clone())
            .await?;
        Ok(Self { pool })
    }
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
        tables::check_count(&self.pool, count).await
    }

    async fn heartbeat(&self, instance: &str, lease: Duration) -> Result<usize, SourceError> {
        let register = format!(
            "INSERT INTO outbox_relay_instance (id, lease_until) VALUES (?, {LEASE_END}) \
             ON DUPLICATE KEY UPDATE lease_until = VALUES(lease_until)"
        );
        tables::heartbeat::<MySqlDialect>(&self.pool, &register, instance, lease).await
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

    async fn acquire(&self, config: &ShardConfig, want: usize) -> Result<Vec<Taken>, SourceError> {
        let (instance, lease) = (config.instance.as_str(), config.lease);
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
        tables::leave::<MySqlDialect>(&self.pool, instance).await?;
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
    /// The database's TCP port (see `nodelay.rs`).
    port: u16,
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
        crate::nodelay::set_on_database_sockets(self.port);
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
