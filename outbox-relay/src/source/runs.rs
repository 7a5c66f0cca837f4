//! Per-aggregate order in a claim: which rows a batch takes, and the check
//! that each aggregate's rows in it form an unbroken run.
//!
//! Every source claims the same way. The oldest pending rows by `seq`
//! choose the aggregates of the batch and how many rows each gets; each
//! aggregate then gives that many of its earliest pending rows in
//! `aggregate_seq` order, numbered 1, 2, ... (`run_position`). The rows
//! that chose an aggregate need not be the ones it gives: a writer that
//! waited for an aggregate's sequence row may insert with a lower `seq`
//! than the writer it waited for, and its later event must not go first.
//! Rows without `aggregate_seq` (written by plain SQL) come first, in `seq`
//! order. The batch goes out aggregate by aggregate, in the order of their
//! oldest rows; each aggregate's run in sequence order.
//!
//! PostgreSQL does it in one statement (`source/postgres.rs`); MariaDB/MySQL
//! and SQLite run [`head_sql`] and [`runs_sql`] and order the result with
//! [`in_claim_order`].

use std::collections::HashMap;

use crate::record::OutboxRecord;

/// A claimed row with its place in its aggregate's run: 1 for the
/// aggregate's earliest pending row (leaving out rows in flight), 2 for
/// the next, and so on, in `aggregate_seq` order.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub(crate) struct RunRow {
    #[sqlx(flatten)]
    pub record: OutboxRecord,
    pub run_position: i64,
}

/// Keeps each aggregate's rows up to the first hole in its run, in the
/// order given.
///
/// A claim chooses, for each aggregate, a run of its earliest pending rows
/// (positions 1, 2, ...), then locks them. A row can go missing between
/// the two: locked by another claim and skipped (`SKIP LOCKED`), published
/// or dead-lettered meanwhile by the aggregate's previous owner, or
/// dead-lettered by the claim itself because it cannot be read
/// (`source/decode.rs`). Sending
/// the rows after such a hole could overtake a pending earlier event, so
/// they are left for the next claim (still pending; rows a claim leaves out
/// are never marked). This is the last line of per-aggregate order: the
/// claim's own ordering already puts each aggregate's rows in sequence.
pub(crate) fn unbroken_runs(rows: Vec<RunRow>) -> Vec<OutboxRecord> {
    let mut next_position: HashMap<(String, String), i64> = HashMap::new();
    let mut kept = Vec::with_capacity(rows.len());
    let mut left_out = 0usize;
    for RunRow {
        record,
        run_position,
    } in rows
    {
        let next = next_position
            .entry((record.aggregate_type.clone(), record.aggregate_id.clone()))
            .or_insert(1);
        if *next > 0 && run_position == *next {
            *next += 1;
            kept.push(record);
        } else {
            // A hole: nothing more of this aggregate in this batch.
            *next = 0;
            left_out += 1;
        }
    }
    if left_out > 0 {
        tracing::debug!(
            left_out,
            "left rows behind a missing earlier event of their aggregate for the next claim"
        );
    }
    kept
}

/// An aggregate chosen by the oldest pending rows: how many rows it gets,
/// and the `seq` of its oldest, which orders the batch.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct Head {
    /// `aggregatetype`.
    pub aggregatetype: String,
    /// `aggregateid`.
    pub aggregateid: String,
    /// Rows of the aggregate among the oldest.
    pub n: i64,
    /// Its oldest pending row's `seq`.
    pub first_seq: i64,
}

/// With `?` placeholders: the aggregates of the oldest `?` (the last
/// parameter) pending rows that pass `filter` (a condition starting with
/// ` AND `, its parameters first).
pub(crate) fn head_sql(filter: &str) -> String {
    format!(
        "SELECT aggregatetype, aggregateid, COUNT(*) AS n, MIN(seq) AS first_seq FROM (\
           SELECT aggregatetype, aggregateid, seq FROM outbox \
           WHERE published_at IS NULL AND dead_lettered_at IS NULL{filter} \
           ORDER BY seq LIMIT ?) AS oldest \
         GROUP BY aggregatetype, aggregateid"
    )
}

/// With `?` placeholders: for each of `aggregates` aggregates (bound as
/// type, id, count), that many of its earliest pending rows in
/// `aggregate_seq` order, as `columns` plus `run_position`.
pub(crate) fn runs_sql(columns: &str, aggregates: usize) -> String {
    let run = format!(
        "SELECT * FROM (SELECT {columns}, \
           ROW_NUMBER() OVER (ORDER BY aggregate_seq, seq) AS run_position FROM outbox \
           WHERE aggregatetype = ? AND aggregateid = ? \
           AND published_at IS NULL AND dead_lettered_at IS NULL \
           ORDER BY aggregate_seq, seq LIMIT ?) AS run"
    );
    (0..aggregates)
        .map(|n| format!("{run}{n}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// Puts `rows` in claim order: aggregate by aggregate in the order of their
/// oldest rows (`heads`), each by `run_position`; then keeps the unbroken
/// runs.
pub(crate) fn in_claim_order(heads: &[Head], mut rows: Vec<RunRow>) -> Vec<OutboxRecord> {
    let first_seq: HashMap<(&str, &str), i64> = heads
        .iter()
        .map(|head| {
            (
                (head.aggregatetype.as_str(), head.aggregateid.as_str()),
                head.first_seq,
            )
        })
        .collect();
    let rank = |row: &RunRow| {
        let key = (
            row.record.aggregate_type.as_str(),
            row.record.aggregate_id.as_str(),
        );
        (
            first_seq.get(&key).copied().unwrap_or(i64::MAX),
            key.0.to_owned(),
            key.1.to_owned(),
            row.run_position,
        )
    };
    rows.sort_by_cached_key(rank);
    unbroken_runs(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(aggregate: &str, id: &str, run_position: i64) -> RunRow {
        RunRow {
            record: OutboxRecord {
                id: id.into(),
                aggregate_type: "Order".into(),
                aggregate_id: aggregate.into(),
                event_type: "E".into(),
                payload: None,
                event_version: 1,
                aggregate_seq: None,
                traceparent: None,
                seq: 0,
                attempts: 0,
                age_at_claim: 0.0,
            },
            run_position,
        }
    }

    fn ids(records: Vec<OutboxRecord>) -> Vec<String> {
        records.into_iter().map(|record| record.id).collect()
    }

    #[test]
    fn whole_runs_are_kept_in_the_order_given() {
        let rows = vec![row("a", "a1", 1), row("b", "b1", 1), row("a", "a2", 2)];
        assert_eq!(ids(unbroken_runs(rows)), ["a1", "b1", "a2"]);
    }

    #[test]
    fn an_aggregate_stops_at_the_first_hole_in_its_run() {
        // a2 went missing (locked elsewhere, or published meanwhile): a3
        // must not overtake it; b is not affected.
        let rows = vec![
            row("a", "a1", 1),
            row("b", "b1", 1),
            row("a", "a3", 3),
            row("b", "b2", 2),
            row("a", "a4", 4),
        ];
        assert_eq!(ids(unbroken_runs(rows)), ["a1", "b1", "b2"]);
        // Without its first row, nothing of the aggregate is sent.
        let rows = vec![row("a", "a2", 2), row("a", "a3", 3), row("c", "c1", 1)];
        assert_eq!(ids(unbroken_runs(rows)), ["c1"]);
    }

    #[test]
    fn rows_go_out_by_their_aggregates_oldest_row() {
        let heads = [
            Head {
                aggregatetype: "Order".into(),
                aggregateid: "b".into(),
                n: 1,
                first_seq: 3,
            },
            Head {
                aggregatetype: "Order".into(),
                aggregateid: "a".into(),
                n: 2,
                first_seq: 7,
            },
        ];
        let rows = vec![row("a", "a2", 2), row("a", "a1", 1), row("b", "b1", 1)];
        assert_eq!(ids(in_claim_order(&heads, rows)), ["b1", "a1", "a2"]);
    }

    #[test]
    fn runs_statements_have_one_part_per_aggregate() {
        let sql = runs_sql("id", 2);
        assert_eq!(sql.matches("UNION ALL").count(), 1);
        assert_eq!(sql.matches('?').count(), 6);
        assert!(sql.contains("AS run0 UNION ALL SELECT"), "{sql}");
    }
}
