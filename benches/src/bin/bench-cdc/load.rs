//! Filling the outbox table with a backlog shaped like an application's:
//! many small committed transactions (one order's events each), because
//! CDC mode reads transactions from the write-ahead log and a handful of
//! huge ones would not be the load it sees. Rows are shaped like the
//! library's (UUIDv7 ids, `OrderPlaced` payloads, per-aggregate sequence
//! numbers) but inserted with `unnest`, several transactions at a time:
//! the append path has its own benchmark.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};
use tokio::task::JoinSet;
use uuid::Uuid;

use outbox_bench::order::order_placed;

/// Connections loading at once.
const LOADERS: usize = 4;

/// Rows per `INSERT` of history.
const HISTORY_ROWS_PER_STATEMENT: usize = 10_000;

/// The shape of a backlog.
#[derive(Debug, Clone, Copy)]
pub struct Backlog {
    /// Events in all.
    pub events: usize,
    /// Aggregates the transactions go round.
    pub aggregates: usize,
    /// Events per transaction, all of one aggregate.
    pub per_transaction: usize,
    /// Delete the rows in the transaction that inserted them (the
    /// insert+delete idiom): only a CDC relay publishes them.
    pub transient: bool,
}

/// Commits `backlog.events` pending events in transactions of
/// `backlog.per_transaction`, on connections with `synchronous_commit =
/// off` (the WAL's content is the same; loading just does not wait for
/// each flush), then runs `ANALYZE` with an ordinary commit, which also
/// flushes the WAL of every loaded transaction.
pub async fn backlog(url: &str, pool: &PgPool, backlog: Backlog) -> anyhow::Result<()> {
    let loaders = PgPoolOptions::new()
        .max_connections(LOADERS as u32)
        .after_connect(|connection, _| {
            Box::pin(async move {
                connection.execute("SET synchronous_commit = off").await?;
                Ok(())
            })
        })
        .connect(url)
        .await?;
    let per_txn = backlog.per_transaction.max(1);
    let transactions = backlog.events.div_ceil(per_txn);
    let aggregates = backlog.aggregates.max(1);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..LOADERS {
        let (loaders, next) = (loaders.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= transactions {
                    return anyhow::Ok(());
                }
                let first = n * per_txn;
                let last = (first + per_txn).min(backlog.events);
                let ids: Vec<Uuid> = (first..last).map(|_| Uuid::now_v7()).collect();
                let payloads: Vec<String> = (first..last)
                    .map(|event| {
                        serde_json::to_string(&order_placed(event as i64))
                            .expect("an order serializes")
                    })
                    .collect();
                // The aggregate's transactions are n, n + aggregates, ...
                let round = (n / aggregates) * per_txn;
                let sequences: Vec<i64> = (0..ids.len())
                    .map(|index| (round + index + 1) as i64)
                    .collect();
                let mut txn = loaders.begin().await?;
                sqlx::query(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, \
                       event_version, aggregate_seq) \
                     SELECT id, 'Order', $2, 'OrderPlaced', payload::jsonb, 1, aggregate_seq \
                     FROM unnest($1::uuid[], $3::text[], $4::int8[]) \
                       AS t(id, payload, aggregate_seq)",
                )
                .bind(&ids)
                .bind((n % aggregates).to_string())
                .bind(&payloads)
                .bind(&sequences)
                .execute(&mut *txn)
                .await?;
                if backlog.transient {
                    sqlx::query("DELETE FROM outbox WHERE id = ANY($1::uuid[])")
                        .bind(&ids)
                        .execute(&mut *txn)
                        .await?;
                }
                txn.commit().await?;
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task??;
    }
    loaders.close().await;
    sqlx::raw_sql("ANALYZE outbox").execute(pool).await?;
    Ok(())
}

/// Inserts `count` rows published a day ago (a relay's steady state with
/// retention), then vacuums and analyzes the table.
pub async fn history(pool: &PgPool, count: usize, aggregates: usize) -> anyhow::Result<()> {
    let aggregates = aggregates.max(1);
    for start in (0..count).step_by(HISTORY_ROWS_PER_STATEMENT) {
        let end = (start + HISTORY_ROWS_PER_STATEMENT).min(count);
        let ids: Vec<Uuid> = (start..end).map(|_| Uuid::now_v7()).collect();
        let aggregate_ids: Vec<String> =
            (start..end).map(|n| (n % aggregates).to_string()).collect();
        let payloads: Vec<String> = (start..end)
            .map(|n| serde_json::to_string(&order_placed(n as i64)).expect("an order serializes"))
            .collect();
        let sequences: Vec<i64> = (start..end).map(|n| (n / aggregates) as i64 + 1).collect();
        sqlx::query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, event_version, \
               aggregate_seq, created_at, published_at) \
             SELECT id, 'Order', aggregateid, 'OrderPlaced', payload::jsonb, 1, aggregate_seq, \
               now() - interval '1 day', now() - interval '1 day' \
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int8[]) \
               AS t(id, aggregateid, payload, aggregate_seq)",
        )
        .bind(&ids)
        .bind(&aggregate_ids)
        .bind(&payloads)
        .bind(&sequences)
        .execute(pool)
        .await?;
    }
    sqlx::raw_sql("VACUUM ANALYZE outbox").execute(pool).await?;
    Ok(())
}

/// Empties the outbox table (CDC mode does not publish truncations).
pub async fn truncate(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::raw_sql("TRUNCATE outbox").execute(pool).await?;
    Ok(())
}

/// Rows still pending (neither published nor dead-lettered).
pub async fn pending(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
    )
    .fetch_one(pool)
    .await?)
}
