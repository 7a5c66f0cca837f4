//! PostgreSQL: claims inside a transaction held until the batch is
//! settled, and wakes on `LISTEN outbox` with the poll interval as
//! fallback.
//!
//! The migration's trigger notifies only while a relay waits, so that
//! writers pay for no notification while every relay is busy (or none
//! runs). A waiting relay holds shared advisory locks on the wake-up slots
//! ([`WAKE_LOCK_KEY`], 0 to [`WAKE_SLOTS`] - 1); an inserting statement
//! tries the exclusive lock of one slot, held until its transaction ends,
//! and notifies when the try fails. Before its last claim, a relay about to
//! wait takes the slots, which waits for the writers holding them: every
//! row committed after that claim either comes from a writer the claim
//! waited for, or was notified.
//!
//! A claim takes each aggregate's rows in `aggregate_seq` order (see
//! `source/runs.rs`) in two statements: the oldest pending rows (nothing
//! locked), then the rows the plan takes, locked with a plain `FOR UPDATE`
//! as they are read. With shard ownership (the relay's mode), it first
//! reads this instance's shard rows (`FOR KEY SHARE`). It waits (up to a
//! lock timeout) for rows another claim still holds, such as a previous
//! owner's, never skipping them, since skipping would let a later event of
//! the same aggregate overtake.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};
use tokio::sync::Mutex;

use super::decode;
use super::runs::{self, HeadRow, Plan, Settled};
use super::shards::{self, Fencing, Membership, ShardConfig, ShardStore, Taken};
use super::{
    AggregateKey, Backlog, Claim, DEAD_LETTERS_SHOWN, DeadLetter, InFlight, Settlement, Source,
    SourceError, SourceOptions, Status, owners_or_none, redrive_filter,
};
use crate::record::OutboxRecord;

use outbox_contract::wakeup::CHANNEL;

/// The first key of the wake-up advisory locks (`outb` in ASCII), as the
/// migration's trigger uses it.
pub use outbox_contract::wakeup::LOCK_KEY as WAKE_LOCK_KEY;

/// How long a relay about to wait waits for the writers holding wake-up
/// slots. A transaction that holds one longer (it wrote to the outbox and
/// has not committed yet) makes the relay poll at this pace until it ends,
/// rather than leave other writers' rows unpublished meanwhile.
const MAX_WAIT_FOR_WRITERS: Duration = Duration::from_millis(100);

/// The number of wake-up slots; an inserting transaction tries the slot of
/// its backend's process id modulo this.
pub use outbox_contract::wakeup::SLOTS as WAKE_SLOTS;

/// The statement with which a waiting relay takes every wake-up slot
/// (shared session locks; `pg_advisory_unlock_all()` releases them).
pub fn take_wake_slots_sql() -> String {
    format!(
        "SELECT pg_advisory_lock_shared({WAKE_LOCK_KEY}, slot) \
         FROM generate_series(0, {}) AS slot",
        WAKE_SLOTS - 1
    )
}

/// The columns of a claimed row (the id as `uuid`, converted at the end).
/// An infinite `created_at` (which cannot be subtracted) has age 0.
const CLAIMED_COLUMNS: &str = "id, aggregatetype, aggregateid, type, \
     payload::text AS payload, event_version, aggregate_seq, traceparent, seq, attempts, \
     CASE WHEN isfinite(created_at) \
       THEN EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8 ELSE 0 END AS age_at_claim";

/// The names of [`CLAIMED_COLUMNS`].
const CLAIMED_NAMES: &str = "id, aggregatetype, aggregateid, type, payload, event_version, \
     aggregate_seq, traceparent, seq, attempts, age_at_claim";

/// A pending row of `table` (an alias of `outbox`).
fn pending(table: &str) -> String {
    format!("{table}.published_at IS NULL AND {table}.dead_lettered_at IS NULL")
}

/// The oldest pending rows by `seq` (the pending index), up to `$1`,
/// leaving out the excluded aggregates `$2`/`$3`, `filter` and the rows of
/// this relay's open claim (`$4`, by `seq`): what [`runs::plan`] decides
/// the claim from. Nothing is locked here. Both exclusions are hashed
/// lists the scan of the pending index filters by, whatever the table's
/// statistics (a join there may become a nested loop over the rows in
/// flight for every pending row when the table was never analyzed).
fn head_sql(filter: &str) -> String {
    format!(
        "SELECT aggregatetype, aggregateid, aggregate_seq, seq, ctid::text AS place \
         FROM outbox WHERE {pending} \
         AND (aggregatetype, aggregateid) NOT IN \
           (SELECT t, i FROM unnest($2::text[], $3::text[]) AS excluded(t, i)){filter} \
         AND seq NOT IN (SELECT unnest($4::bigint[])) \
         ORDER BY seq LIMIT $1",
        pending = pending("outbox"),
    )
}

/// Locks and reads the rows a [`runs::Plan`] takes, still pending once
/// locked: [`Part::Rows`], the rows at the places `$2` (a TID scan,
/// whatever the table's statistics say) that are still the rows `$1` by
/// `seq`, and [`Part::Lookups`], for each aggregate `$1`/`$2` its `$3`
/// earliest pending rows in `aggregate_seq` order after the place `$4`/`$5`
/// where its rows in flight end (the aggregate index, which the caller
/// makes the planner take even without statistics; the place is a filter
/// of the index scan, below the lock, so rows in flight are never waited
/// for).
///
/// A row another transaction changed meanwhile is read again once locked:
/// one no longer pending (published or parked by a previous owner of its
/// shard) is passed over, and a lookup takes the aggregate's next row,
/// which may follow it. A row of `rows` that does not come back (changed
/// or moved since the head read it) makes the caller drop the whole claim
/// (see `lock_planned`). Rows are never skipped as locked (a claim waits,
/// up to its lock timeout), so no earlier pending row can be left behind a
/// later one.
fn lock_sql(part: Part) -> String {
    let claimed = match part {
        // Locked by place alone, then kept while still the planned,
        // pending row: a condition on pending rows next to the place would
        // let a plan made without statistics scan a pending index instead
        // of the places.
        Part::Rows => format!(
            "WITH by_place AS MATERIALIZED (\
               SELECT {CLAIMED_COLUMNS}, published_at, dead_lettered_at FROM outbox \
               WHERE ctid = ANY($2::text[]::tid[]) FOR UPDATE) \
             SELECT {CLAIMED_NAMES} FROM by_place WHERE seq = ANY($1::bigint[]) AND {pending}",
            pending = pending("by_place"),
        ),
        Part::Lookups => format!(
            "SELECT run.* FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[]) \
               AS lookup(aggregatetype, aggregateid, n, after_aggregate_seq, after_seq) \
             CROSS JOIN LATERAL (\
               SELECT {CLAIMED_COLUMNS} FROM outbox AS later \
               WHERE later.aggregatetype = lookup.aggregatetype \
               AND later.aggregateid = lookup.aggregateid AND {pending} \
               AND (COALESCE(later.aggregate_seq, 0), later.seq) \
                 > (lookup.after_aggregate_seq, lookup.after_seq) \
               ORDER BY later.aggregate_seq NULLS FIRST, later.seq \
               LIMIT lookup.n FOR UPDATE) AS run",
            pending = pending("later"),
        ),
    };
    format!(
        "SELECT id::text AS id, aggregatetype, aggregateid, type, payload, event_version, \
           aggregate_seq, traceparent, seq, attempts, age_at_claim FROM ({claimed}) AS claimed"
    )
}

/// A part of a claim's locking statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The planned rows, by place (`$2`) and `seq` (`$1`).
    Rows,
    /// The aggregates looked up (`$1` .. `$5`).
    Lookups,
}

/// The shard of a row: a stable hash of its aggregate.
const SHARD_OF_ROW: &str =
    "((hashtextextended(aggregatetype || '/' || aggregateid, 0) % $5) + $5) % $5";

/// Pending rows of a PostgreSQL database.
pub struct PostgresSource {
    pool: PgPool,
    listener: Mutex<Option<Listener>>,
    /// With shards: whether the last claim found this instance owning none
    /// (a standby), which then polls rather than hold the wake-up slots
    /// and make every writer notify it.
    owns_no_shard: AtomicBool,
    delete_on_publish: bool,
    sharding: Option<Sharding>,
    /// Where the aggregates this relay settled continue.
    settled: Arc<Settled>,
}

/// This instance's part in shard ownership.
struct Sharding {
    config: ShardConfig,
    store: Arc<PgShardStore>,
    membership: Arc<Membership>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl PostgresSource {
    /// Connects a small pool, checks that the server answers and, with
    /// shards configured, joins their ownership.
    pub async fn connect(url: &str, options: SourceOptions) -> Result<Self, SourceError> {
        let connect_error = |source| SourceError::Connect {
            url: crate::redact::redact_url(url),
            source,
        };
        // Every session of the relay carries its instance id (unless the
        // URL names the application), so that an instance taking over
        // shards whose owner stopped renewing can end that owner's sessions
        // and free the rows they hold.
        let mut connect_options = url.parse::<PgConnectOptions>().map_err(connect_error)?;
        if connect_options.get_application_name().is_none() {
            let application_name = options
                .shards
                .as_ref()
                .map_or("outbox-relay", |shards| shards.instance.as_str());
            connect_options = connect_options.application_name(application_name);
        }
        let pool = PgPoolOptions::new()
            // Two open claims (one at the broker, one claimed ahead), and
            // retention and backlog sampling; the listener and the shard
            // heartbeat have connections of their own.
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(connect_options.clone())
            .await
            .map_err(connect_error)?;
        let mut source = Self {
            pool: pool.clone(),
            listener: Mutex::new(None),
            owns_no_shard: AtomicBool::new(false),
            delete_on_publish: options.delete_on_publish,
            sharding: None,
            settled: Arc::default(),
        };
        if let Some(config) = options.shards {
            source.check_table().await?;
            // A connection of its own, whose statements time out well within
            // the lease: renewals never wait for a claim's connection.
            let statement_timeout = (config.lease / 3).as_millis().max(100);
            let heartbeat_pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(config.lease / 3)
                .after_connect(move |connection, _meta| {
                    Box::pin(async move {
                        sqlx::query(AssertSqlSafe(format!(
                            "SET statement_timeout = {statement_timeout}"
                        )))
                        .execute(connection)
                        .await?;
                        Ok(())
                    })
                })
                .connect_with(connect_options)
                .await
                .map_err(connect_error)?;
            let store = Arc::new(PgShardStore {
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

    /// The connection pool, for statements outside the row claims.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Marks rows published outside a claim (CDC mode reads them from the
    /// write-ahead log), or deletes them with `--delete-on-publish`. Rows
    /// already gone, such as those of the insert+delete idiom, are skipped.
    pub async fn mark_published(&self, ids: &[String]) -> Result<(), SourceError> {
        mark_published(&self.pool, ids, self.delete_on_publish).await
    }

    /// Claims up to `limit` pending rows, leaving out the `excluded`
    /// aggregates and the rows of this relay's other open claim
    /// (`in_flight`), which a plain `FOR UPDATE` would otherwise wait for:
    /// each aggregate continues after its rows there. The filters run below
    /// the row locks, so left-out rows are not locked.
    async fn claim_rows(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
        in_flight: &InFlight,
    ) -> Result<Box<dyn Claim>, SourceError> {
        let types: Vec<&str> = excluded
            .iter()
            .map(|key| key.aggregate_type.as_str())
            .collect();
        let ids: Vec<&str> = excluded
            .iter()
            .map(|key| key.aggregate_id.as_str())
            .collect();
        let mut txn = self.pool.begin().await?;
        let (plan, rows, owned) = match &self.sharding {
            None => {
                // One instance: its own open claim's aggregates are left
                // out, so a lock held by another claim is waited for (a
                // second instance misconfigured without shards) for at most
                // a few seconds, never skipped.
                sqlx::query("SELECT set_config('lock_timeout', '5s', true)")
                    .execute(&mut *txn)
                    .await?;
                let head = sqlx::query_as::<_, HeadRow>(AssertSqlSafe(head_sql("")))
                    .bind(limit as i64)
                    .bind(&types)
                    .bind(&ids)
                    .bind(&in_flight.seqs)
                    .fetch_all(&mut *txn)
                    .await?;
                let (plan, rows) = self.lock_planned(&mut txn, &head, in_flight).await?;
                (plan, rows, Vec::new())
            }
            Some(sharding) => {
                // Transaction-local: a paused relay's claim ends after the
                // batch timeout, and rows a previous owner still holds are
                // waited for, not skipped, for at most a few seconds.
                sqlx::query(
                    "SELECT set_config('idle_in_transaction_session_timeout', $1, true), \
                     set_config('lock_timeout', '5s', true)",
                )
                .bind(sharding.config.batch_timeout.as_millis().to_string())
                .execute(&mut *txn)
                .await?;
                let owned = owned_shards(&mut txn, &sharding.config.instance, true).await?;
                self.owns_no_shard
                    .store(owned.is_empty(), Ordering::Relaxed);
                if owned.is_empty() {
                    (Plan::default(), Vec::new(), owned)
                } else {
                    let shards: Vec<i64> = owned.iter().map(|(shard, _)| *shard).collect();
                    let sql = head_sql(&format!(" AND {SHARD_OF_ROW} = ANY($6::bigint[])"));
                    let head = sqlx::query_as::<_, HeadRow>(AssertSqlSafe(sql))
                        .bind(limit as i64)
                        .bind(&types)
                        .bind(&ids)
                        .bind(&in_flight.seqs)
                        .bind(i64::from(sharding.config.count))
                        .bind(&shards)
                        .fetch_all(&mut *txn)
                        .await?;
                    let (plan, rows) = self.lock_planned(&mut txn, &head, in_flight).await?;
                    (plan, rows, owned)
                }
            }
        };
        // A row that cannot be read is dead-lettered in this transaction
        // and left out; the rows of its aggregate after it wait for the
        // next claim (see `source/decode.rs`).
        let decoded = decode::records(&rows)?;
        for row in &decoded.undecodable {
            sqlx::query(
                "UPDATE outbox SET attempts = attempts + 1, last_error = $1, \
                 dead_lettered_at = now() \
                 WHERE seq = $2 AND published_at IS NULL AND dead_lettered_at IS NULL",
            )
            .bind(&row.reason)
            .bind(row.seq)
            .execute(&mut *txn)
            .await?;
            row.log();
        }
        let mut records = decoded.rows;
        runs::claim_order(&plan, &mut records);
        if !records.is_empty() {
            self.stop_watching().await;
        }
        Ok(Box::new(PostgresClaim {
            txn,
            records,
            settled: self.settled.clone(),
            delete_on_publish: self.delete_on_publish,
            fencing: self.sharding.as_ref().map(|sharding| Fencing {
                instance: sharding.config.instance.clone(),
                owned,
                membership: sharding.membership.clone(),
            }),
        }))
    }

    /// Plans the claim from the oldest pending rows `head` and locks the
    /// rows it takes.
    async fn lock_planned(
        &self,
        txn: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        head: &[HeadRow],
        in_flight: &InFlight,
    ) -> Result<(Plan, Vec<PgRow>), SourceError> {
        let plan = runs::plan(head, in_flight, &self.settled);
        if plan.rows.is_empty() && plan.lookups.is_empty() {
            return Ok((plan, Vec::new()));
        }
        let mut rows = Vec::new();
        if !plan.rows.is_empty() {
            rows = sqlx::query(AssertSqlSafe(lock_sql(Part::Rows)))
                .bind(&plan.rows)
                .bind(&plan.places)
                .fetch_all(&mut **txn)
                .await?;
        }
        let lookups = &plan.lookups;
        if !lookups.is_empty() {
            // Without statistics (a table never analyzed) both pending
            // indexes look nearly empty, and the planner may scan every
            // pending row by `seq` and sort them, once per aggregate: no
            // sort for this statement, the aggregate index gives the order.
            let (sort,): (String,) = sqlx::query_as(
                "SELECT current_setting('enable_sort'), set_config('enable_sort', 'off', true)",
            )
            .fetch_one(&mut **txn)
            .await?;
            rows.extend(
                sqlx::query(AssertSqlSafe(lock_sql(Part::Lookups)))
                    .bind(
                        lookups
                            .iter()
                            .map(|l| l.key.aggregate_type.as_str())
                            .collect::<Vec<_>>(),
                    )
                    .bind(
                        lookups
                            .iter()
                            .map(|l| l.key.aggregate_id.as_str())
                            .collect::<Vec<_>>(),
                    )
                    .bind(lookups.iter().map(|l| l.n).collect::<Vec<_>>())
                    .bind(
                        lookups
                            .iter()
                            .map(|l| l.after.aggregate_seq)
                            .collect::<Vec<_>>(),
                    )
                    .bind(lookups.iter().map(|l| l.after.seq).collect::<Vec<_>>())
                    .fetch_all(&mut **txn)
                    .await?,
            );
            sqlx::query("SELECT set_config('enable_sort', $1, true)")
                .bind(sort)
                .execute(&mut **txn)
                .await?;
        }
        // A planned row that did not come back was changed meanwhile (by a
        // previous owner of its shard, or `retry`): its aggregate's later
        // rows must not go without it, and they are locked now. Nothing of
        // this claim is taken; the next one reads the rows afresh.
        let planned: std::collections::HashSet<i64> = plan.rows.iter().copied().collect();
        let found = rows
            .iter()
            .filter(|row| {
                row.try_get::<i64, _>("seq")
                    .is_ok_and(|seq| planned.contains(&seq))
            })
            .count();
        if found < planned.len() {
            tracing::debug!(
                missing = planned.len() - found,
                "rows changed between reading and locking them; claiming again"
            );
            return Ok((Plan::default(), Vec::new()));
        }
        Ok((plan, rows))
    }

    async fn listen(&self) -> Result<Listener, sqlx::Error> {
        // A connection of its own, outside the claims' pool: the session
        // locks it may hold go with it when it is dropped, never to a claim.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .connect_with((*self.pool.connect_options()).clone())
            .await?;
        let mut connection = PgListener::connect_with(&own).await?;
        // A lost connection is reported at once, not replaced behind the
        // relay's back by one holding no slots.
        connection.eager_reconnect(false);
        connection.listen(CHANNEL).await?;
        Ok(Listener {
            connection,
            watching: false,
        })
    }

    /// Releases the wake-up slots once a claim found rows: writers stop
    /// notifying while the relay is busy. Skipped while the listener is in
    /// use (the relay loop never claims during its wait): the slots then
    /// stay held, which costs writers notifications, not correctness.
    async fn stop_watching(&self) {
        let Ok(mut slot) = self.listener.try_lock() else {
            return;
        };
        if let Some(listener) = slot.as_mut().filter(|listener| listener.watching)
            && let Err(error) = listener.release().await
        {
            tracing::warn!(%error, "cannot release the wake-up locks; reconnecting");
            *slot = None;
        }
    }
}

/// The `LISTEN` connection, which also holds the wake-up slots while the
/// relay waits.
struct Listener {
    connection: PgListener,
    /// Whether this connection holds every wake-up slot, taken before the
    /// last claim.
    watching: bool,
}

impl Listener {
    /// Takes every wake-up slot, waiting up to `timeout` in all for the
    /// writers that hold one; if they hold them longer, takes none (and the
    /// caller polls).
    async fn watch(&mut self, timeout: Duration) -> Result<(), sqlx::Error> {
        // One round trip, in one implicit transaction, so the timeout
        // applies to this statement only.
        let sql = format!(
            "SET LOCAL statement_timeout = '{}ms'; {}",
            timeout.as_millis().max(1),
            take_wake_slots_sql()
        );
        let taken = sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut self.connection)
            .await;
        match taken {
            Ok(_) => {
                self.watching = true;
                Ok(())
            }
            // Session locks taken before an error stay held: release them.
            Err(sqlx::Error::Database(error))
                if matches!(error.code().as_deref(), Some("57014" | "55P03")) =>
            {
                self.release().await
            }
            Err(error) => {
                self.release().await.ok();
                Err(error)
            }
        }
    }

    /// Releases the wake-up slots.
    async fn release(&mut self) -> Result<(), sqlx::Error> {
        self.watching = false;
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut self.connection)
            .await?;
        Ok(())
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

    async fn claim(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
    ) -> Result<Box<dyn Claim>, SourceError> {
        self.claim_rows(limit, excluded, &InFlight::default()).await
    }

    async fn claim_ahead(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
        in_flight: &InFlight,
    ) -> Result<Option<Box<dyn Claim>>, SourceError> {
        self.claim_rows(limit, excluded, in_flight).await.map(Some)
    }

    /// Takes the wake-up slots and returns at once, so that the caller's
    /// next claim is the last before the wait; once they are held, waits
    /// for a notification or `timeout`. The slots stay held until a claim
    /// finds rows.
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
        if self.owns_no_shard.load(Ordering::Relaxed) {
            // A standby: nothing to claim until it owns a shard.
            if listener.watching && listener.release().await.is_err() {
                *slot = None;
            }
            tokio::time::sleep(timeout).await;
            return;
        }
        if !listener.watching {
            match listener.watch(timeout.min(MAX_WAIT_FOR_WRITERS)).await {
                // Either the slots are held and rows of the writers waited
                // for may be pending, or a writer held a slot for the
                // whole interval: claim again in both cases.
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(%error, "cannot take the wake-up locks; reconnecting");
                    *slot = None;
                    tokio::time::sleep(timeout).await;
                    return;
                }
            }
        }
        match tokio::time::timeout(timeout, listener.connection.try_recv()).await {
            Ok(Ok(Some(_))) => while listener.connection.next_buffered().is_some() {},
            Ok(Ok(None)) => {
                // The slots went with the connection: listen and take them
                // again on a new one next time.
                tracing::warn!("lost the LISTEN connection; reconnecting");
                *slot = None;
            }
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

    async fn backlog(&self) -> Result<Backlog, SourceError> {
        let (pending, oldest_pending_age_seconds): (i64, Option<f64>) = sqlx::query_as(
            "SELECT COUNT(*), \
               EXTRACT(EPOCH FROM now() - MIN(created_at) FILTER (WHERE isfinite(created_at)))::float8 \
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
               EXTRACT(EPOCH FROM now() - MIN(created_at) FILTER (WHERE isfinite(created_at)))::float8 \
                 AS oldest_pending_age_seconds \
             FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
             GROUP BY aggregatetype ORDER BY 2 DESC, 1 LIMIT 50",
        )
        .fetch_all(&self.pool)
        .await?;
        let owners = sqlx::query_as(
            "SELECT owner, COUNT(*) AS shards, \
               EXTRACT(EPOCH FROM MIN(lease_until) - now())::float8 AS lease_expires_in_seconds \
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
        let filter = redrive_filter("id::text", ids.len(), aggregate_type.is_some(), |n| {
            format!("${n}")
        });
        let sql = format!(
            "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0 \
             WHERE id IN (SELECT id FROM outbox WHERE {filter} LIMIT {limit})"
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

async fn dead_letters(pool: &PgPool) -> Result<Vec<DeadLetter>, SourceError> {
    Ok(sqlx::query_as(
        "SELECT id::text AS id, aggregatetype, aggregateid, type, attempts, last_error FROM outbox \
         WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at LIMIT $1",
    )
    .bind(DEAD_LETTERS_SHOWN)
    .fetch_all(pool)
    .await?)
}

/// This instance's shards and their epochs; when claiming, only those with
/// a current lease, `FOR KEY SHARE`: a lock that no renewal or takeover
/// (an `UPDATE` of non-key columns) waits for, so a long or paused claim
/// never holds up the heartbeats. Fencing at the mark keeps a batch whose
/// shard changed owner meanwhile from being marked.
async fn owned_shards(
    txn: &mut Transaction<'static, Postgres>,
    instance: &str,
    lock: bool,
) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    let sql = if lock {
        "SELECT shard::bigint, epoch FROM outbox_relay_shard \
         WHERE owner = $1 AND lease_until > now() ORDER BY shard FOR KEY SHARE"
    } else {
        "SELECT shard::bigint, epoch FROM outbox_relay_shard WHERE owner = $1 ORDER BY shard"
    };
    let rows = sqlx::query(sql)
        .bind(instance)
        .fetch_all(&mut **txn)
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

struct PostgresClaim {
    txn: Transaction<'static, Postgres>,
    records: Vec<OutboxRecord>,
    delete_on_publish: bool,
    fencing: Option<Fencing>,
    settled: Arc<Settled>,
}

#[async_trait]
impl Claim for PostgresClaim {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    fn lease_valid(&self) -> bool {
        self.fencing.as_ref().is_none_or(Fencing::lease_valid)
    }

    async fn settle(mut self: Box<Self>, settlement: &Settlement) -> Result<(), SourceError> {
        if let Some(fencing) = &self.fencing {
            fencing.check(&owned_shards(&mut self.txn, &fencing.instance, false).await?)?;
        }
        // The ids are bound as uuid[] and joined through unnest: a text[]
        // compared with `= ANY` lets a generic plan, made while the table
        // was small or unanalyzed, scan the table and cast per row.
        if !settlement.published.is_empty() {
            mark_published(
                &mut *self.txn,
                &settlement.published,
                self.delete_on_publish,
            )
            .await?;
        }
        if !settlement.failed.is_empty() {
            let ids = uuids(settlement.failed.iter().map(|row| &row.id))?;
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
        settled_rows(&self.settled, &self.records, settlement);
        Ok(())
    }
}

/// Records in `settled` where each aggregate of a committed settlement
/// continues.
fn settled_rows(settled: &Settled, records: &[OutboxRecord], settlement: &Settlement) {
    let done: std::collections::HashSet<&str> = settlement
        .published
        .iter()
        .map(String::as_str)
        .chain(
            settlement
                .failed
                .iter()
                .filter(|row| row.dead_letter)
                .map(|row| row.id.as_str()),
        )
        .collect();
    settled.record(records, |record| !done.contains(record.id.as_str()));
}

/// Marks the rows `ids` published, or deletes them with `delete`.
async fn mark_published<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    ids: &[String],
    delete: bool,
) -> Result<(), SourceError> {
    let sql = if delete {
        "DELETE FROM outbox AS o USING unnest($1::uuid[]) AS p(id) WHERE o.id = p.id"
    } else {
        "UPDATE outbox AS o SET published_at = now() \
         FROM unnest($1::uuid[]) AS p(id) WHERE o.id = p.id"
    };
    sqlx::query(sql)
        .bind(uuids(ids.iter())?)
        .execute(executor)
        .await?;
    Ok(())
}

/// Claimed ids (read as `id::text`) back as UUIDs.
fn uuids<'a>(ids: impl Iterator<Item = &'a String>) -> Result<Vec<uuid::Uuid>, SourceError> {
    ids.map(|id| {
        uuid::Uuid::parse_str(id)
            .map_err(|error| SourceError::Query(sqlx::Error::Decode(Box::new(error))))
    })
    .collect()
}

/// Shard ownership statements on PostgreSQL.
struct PgShardStore {
    pool: PgPool,
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
        let highest: Option<i32> = sqlx::query_scalar("SELECT max(shard) FROM outbox_relay_shard")
            .fetch_one(&self.pool)
            .await?;
        match highest {
            Some(highest) if highest as i64 + 1 > i64::from(count) => {
                Err(SourceError::ShardCount {
                    configured: count,
                    found: highest as i64 + 1,
                })
            }
            _ => Ok(()),
        }
    }

    async fn heartbeat(&self, instance: &str, lease: Duration) -> Result<usize, SourceError> {
        sqlx::query(
            "INSERT INTO outbox_relay_instance (id, lease_until) \
             VALUES ($1, now() + make_interval(secs => $2)) \
             ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until",
        )
        .bind(instance)
        .bind(lease.as_secs_f64())
        .execute(&self.pool)
        .await?;
        sqlx::query("DELETE FROM outbox_relay_instance WHERE lease_until < now()")
            .execute(&self.pool)
            .await?;
        let live: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_relay_instance")
            .fetch_one(&self.pool)
            .await?;
        Ok(live as usize)
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

    async fn acquire(
        &self,
        instance: &str,
        lease: Duration,
        want: usize,
    ) -> Result<Vec<Taken>, SourceError> {
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
        sqlx::query(
            "UPDATE outbox_relay_shard SET owner = NULL, lease_until = NULL WHERE owner = $1",
        )
        .bind(instance)
        .execute(&self.pool)
        .await?;
        sqlx::query("DELETE FROM outbox_relay_instance WHERE id = $1")
            .bind(instance)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Part, head_sql, lock_sql};

    #[test]
    fn the_head_locks_nothing() {
        let sql = head_sql(" AND shard_filter");
        assert!(!sql.contains("FOR UPDATE"), "{sql}");
        assert!(
            sql.contains("AND shard_filter AND seq NOT IN (SELECT unnest($4::bigint[]))"),
            "{sql}"
        );
    }

    #[test]
    fn claims_lock_rows_as_they_are_read_never_skipping_any() {
        let rows = lock_sql(Part::Rows);
        let lookups = lock_sql(Part::Lookups);
        for sql in [&rows, &lookups] {
            assert!(!sql.contains("SKIP LOCKED"), "{sql}");
        }
        // Planned rows are locked by place alone (a TID scan whatever the
        // statistics), and checked once locked.
        assert!(
            rows.contains("FROM outbox WHERE ctid = ANY($2::text[]::tid[]) FOR UPDATE)"),
            "{rows}"
        );
        assert!(rows.contains("WHERE seq = ANY($1::bigint[])"), "{rows}");
        assert!(
            lookups.contains(
                "ORDER BY later.aggregate_seq NULLS FIRST, later.seq LIMIT lookup.n FOR UPDATE"
            ),
            "{lookups}"
        );
    }
}
