//! Filling the outbox table fast, with rows shaped like the library's
//! (UUIDv7 ids, `OrderPlaced` payloads, per-aggregate sequence numbers) but
//! inserted with `unnest` in large statements: the append path has its own
//! benchmark, and loading must not dominate the run.

use sqlx::PgPool;
use uuid::Uuid;

use crate::order::order_placed;

/// Rows per `INSERT`.
const ROWS_PER_STATEMENT: usize = 10_000;

/// Whether loaded rows wait for the relay or are history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowState {
    /// Pending: the relay will claim them.
    Pending,
    /// Already published a day ago.
    Published,
}

/// Inserts `count` rows spread round-robin over `aggregates` aggregates;
/// published rows were written and published a day ago.
pub async fn load(
    pool: &PgPool,
    count: usize,
    aggregates: usize,
    state: RowState,
) -> Result<(), sqlx::Error> {
    load_over_days(pool, count, aggregates, state, 1, 0).await
}

/// As [`load`], the rows written 1 to `days` days ago, round-robin (one
/// day partition each on a partitioned outbox): published history of
/// `days` days. Each aggregate's rows are numbered (`aggregate_seq`) from
/// `after` + 1.
pub async fn load_over_days(
    pool: &PgPool,
    count: usize,
    aggregates: usize,
    state: RowState,
    days: usize,
    after: i64,
) -> Result<(), sqlx::Error> {
    let aggregates = aggregates.max(1);
    let days = days.max(1);
    for start in (0..count).step_by(ROWS_PER_STATEMENT) {
        let end = (start + ROWS_PER_STATEMENT).min(count);
        let mut ids = Vec::with_capacity(end - start);
        let mut aggregate_ids = Vec::with_capacity(end - start);
        let mut payloads = Vec::with_capacity(end - start);
        let mut sequences = Vec::with_capacity(end - start);
        let mut ages = Vec::with_capacity(end - start);
        for n in start..end {
            ages.push((n % days) as i32 + 1);
            ids.push(Uuid::now_v7());
            aggregate_ids.push((n % aggregates).to_string());
            payloads
                .push(serde_json::to_string(&order_placed(n as i64)).expect("an order serializes"));
            sequences.push(after + (n / aggregates) as i64 + 1);
        }
        sqlx::query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, event_version, \
               aggregate_seq, created_at, published_at) \
             SELECT id, 'Order', aggregateid, 'OrderPlaced', payload::jsonb, 1, aggregate_seq, \
               CASE WHEN $5 THEN now() - make_interval(days => age) ELSE now() END, \
               CASE WHEN $5 THEN now() - make_interval(days => age) END \
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int8[], $6::int4[]) \
               AS t(id, aggregateid, payload, aggregate_seq, age)",
        )
        .bind(&ids)
        .bind(&aggregate_ids)
        .bind(&payloads)
        .bind(&sequences)
        .bind(state == RowState::Published)
        .bind(&ages)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Empties the outbox table.
pub async fn truncate(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("TRUNCATE outbox").execute(pool).await?;
    Ok(())
}

/// Refreshes the planner's statistics, as autovacuum eventually would, so
/// every phase starts from the same plans.
pub async fn analyze(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("ANALYZE outbox").execute(pool).await?;
    Ok(())
}

/// Removes dead rows and refreshes statistics.
pub async fn vacuum(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("VACUUM ANALYZE outbox").execute(pool).await?;
    Ok(())
}

/// The `seq` of the newest row, 0 for an empty table.
pub async fn last_seq(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM outbox")
        .fetch_one(pool)
        .await
}

/// Deletes the rows inserted after the one numbered `seq`.
pub async fn delete_after(pool: &PgPool, seq: i64) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM outbox WHERE seq > $1")
        .bind(seq)
        .execute(pool)
        .await?;
    Ok(())
}
