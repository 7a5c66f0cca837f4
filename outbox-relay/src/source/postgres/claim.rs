//! The PostgreSQL claim: the oldest pending rows read without locks, a
//! plan from them (`source/runs.rs`), then the planned rows locked by place
//! and the other aggregates looked up in `aggregate_seq` order.

use std::collections::HashSet;

use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{AssertSqlSafe, Row};

use super::super::dead_letters::park;
use super::super::decode;
use super::super::dialect::ClaimRequest;
use super::super::runs::{self, HeadRow, Plan, Settled};
use super::super::shards::ShardConfig;
use super::super::{InFlight, SourceError};
use super::PgDialect;
use crate::record::OutboxRecord;

/// Sets the claim's transaction-local timeouts. Rows another claim holds
/// are waited for, never skipped, for at most a few seconds: one instance
/// leaves its own open claim's aggregates out, so this waits only for a
/// second instance misconfigured without shards; with shards, for rows a
/// previous owner still holds. With shards, a paused relay's claim ends
/// after the batch timeout.
pub(super) async fn begin(
    conn: &mut PgConnection,
    sharding: Option<&ShardConfig>,
) -> Result<(), sqlx::Error> {
    match sharding {
        None => {
            sqlx::query("SELECT set_config('lock_timeout', '5s', true)")
                .execute(conn)
                .await?;
        }
        Some(config) => {
            sqlx::query(
                "SELECT set_config('idle_in_transaction_session_timeout', $1, true), \
                 set_config('lock_timeout', '5s', true)",
            )
            .bind(config.batch_timeout.as_millis().to_string())
            .execute(conn)
            .await?;
        }
    }
    Ok(())
}

/// Claims up to `request.limit` pending rows, leaving out the excluded
/// aggregates and the rows of this relay's other open claim (`in_flight`),
/// which a plain `FOR UPDATE` would otherwise wait for: each aggregate
/// continues after its rows there. The filters run below the row locks, so
/// left-out rows are not locked.
pub(super) async fn claim(
    conn: &mut PgConnection,
    request: &ClaimRequest<'_>,
    settled: &Settled,
) -> Result<Vec<OutboxRecord>, SourceError> {
    let types: Vec<&str> = request
        .excluded
        .iter()
        .map(|key| key.aggregate_type.as_str())
        .collect();
    let ids: Vec<&str> = request
        .excluded
        .iter()
        .map(|key| key.aggregate_id.as_str())
        .collect();
    let in_flight = request.in_flight;
    let head = match &request.shards {
        None => {
            sqlx::query_as::<_, HeadRow>(AssertSqlSafe(head_sql("")))
                .bind(request.limit as i64)
                .bind(&types)
                .bind(&ids)
                .bind(&in_flight.seqs)
                .fetch_all(&mut *conn)
                .await?
        }
        Some(shards) => {
            let sql = head_sql(&format!(" AND {SHARD_OF_ROW} = ANY($6::bigint[])"));
            sqlx::query_as::<_, HeadRow>(AssertSqlSafe(sql))
                .bind(request.limit as i64)
                .bind(&types)
                .bind(&ids)
                .bind(&in_flight.seqs)
                .bind(i64::from(shards.count))
                .bind(&shards.owned)
                .fetch_all(&mut *conn)
                .await?
        }
    };
    let (plan, rows) = lock_planned(conn, &head, in_flight, settled).await?;
    // A row that cannot be read is dead-lettered in this transaction and
    // left out; the rows of its aggregate after it wait for the next claim
    // (see `source/decode.rs`).
    let decoded = decode::records(&rows)?;
    park::<PgDialect>(conn, &decoded.undecodable, false).await?;
    let mut records = decoded.rows;
    runs::claim_order(&plan, &mut records);
    Ok(records)
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

/// Plans the claim from the oldest pending rows `head` and locks the
/// rows it takes.
async fn lock_planned(
    conn: &mut PgConnection,
    head: &[HeadRow],
    in_flight: &InFlight,
    settled: &Settled,
) -> Result<(Plan, Vec<PgRow>), SourceError> {
    let plan = runs::plan(head, in_flight, settled);
    if plan.rows.is_empty() && plan.lookups.is_empty() {
        return Ok((plan, Vec::new()));
    }
    let mut rows = Vec::new();
    if !plan.rows.is_empty() {
        rows = sqlx::query(AssertSqlSafe(lock_sql(Part::Rows)))
            .bind(&plan.rows)
            .bind(&plan.places)
            .fetch_all(&mut *conn)
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
        .fetch_one(&mut *conn)
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
                .fetch_all(&mut *conn)
                .await?,
        );
        sqlx::query("SELECT set_config('enable_sort', $1, true)")
            .bind(sort)
            .execute(&mut *conn)
            .await?;
    }
    // A planned row that did not come back was changed meanwhile (by a
    // previous owner of its shard, or `retry`): its aggregate's later
    // rows must not go without it, and they are locked now. Nothing of
    // this claim is taken; the next one reads the rows afresh.
    let planned: HashSet<i64> = plan.rows.iter().copied().collect();
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
