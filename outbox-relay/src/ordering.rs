//! Per-aggregate order on the read side: the order a claimed batch goes
//! out in, and where an aggregate's run in it must stop.
//!
//! Writers draw an event's `seq` under its aggregate's lock
//! ([`outbox_contract::ordering`]), so within an aggregate `seq` order is
//! `aggregate_seq` order, and a claim of the oldest pending rows by `seq`
//! is already in every aggregate's order. Two rules remain, both here:
//!
//! - **Cut at a hole.** A row the claim read but does not hand over (it
//!   could not be decoded and was dead-lettered, or it could not be
//!   locked) leaves a hole in its aggregate's run: the aggregate's later
//!   rows of the batch are left out, still pending, for the next claim.
//! - **Never silently out of order.** Rows that break the writers' rule (a
//!   foreign writer, rows restored by hand, rows written before the rule)
//!   can have `aggregate_seq` fall while `seq` rises. Such an aggregate's
//!   numbered rows go out in `aggregate_seq` order within the batch, and
//!   each inversion is reported ([`Inversion`]) so that the caller logs it
//!   and counts it.
//!
//! No I/O here: rows in, rows and findings out.

use crate::record::OutboxRecord;
use crate::source::{AggregateKey, FastMap};

/// A claimed row that is not handed over: where its aggregate's run stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hole {
    /// The row's `seq`.
    pub seq: i64,
    /// Its aggregate, when it could be read; `None` stops every aggregate
    /// at the row (nothing after it in the batch is handed over).
    pub aggregate: Option<AggregateKey>,
}

/// Where an aggregate's `aggregate_seq` fell while `seq` rose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inversion {
    /// The aggregate.
    pub aggregate: AggregateKey,
    /// The higher number, at the lower `seq`.
    pub higher: i64,
    /// The lower number, at the higher `seq`.
    pub lower: i64,
}

/// A batch in the order it goes out.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Ordered {
    /// The rows handed over.
    pub records: Vec<OutboxRecord>,
    /// Aggregates cut at a hole: the claim still holds rows of theirs it
    /// does not hand over.
    pub cut: Vec<AggregateKey>,
    /// Rows left out behind holes.
    pub left_out: usize,
    /// The inversions found, each put right within the batch.
    pub inversions: Vec<Inversion>,
}

/// Orders `rows`, the claimed rows in `seq` order, leaving out the rows
/// `holes` stop (see the module's rules).
pub(crate) fn claim_order(rows: Vec<OutboxRecord>, holes: &[Hole]) -> Ordered {
    let mut ordered = Ordered::default();
    let first_hole = |key: (&str, &str)| {
        holes
            .iter()
            .filter(|hole| {
                hole.aggregate
                    .as_ref()
                    .is_none_or(|aggregate| aggregate.as_pair() == key)
            })
            .map(|hole| hole.seq)
            .min()
    };
    // Per aggregate: its first hole, and the highest number handed over
    // so far.
    let mut seen: FastMap<(&str, &str), (Option<i64>, i64)> =
        FastMap::with_capacity_and_hasher(rows.len(), Default::default());
    // Whether each row is handed over, once a row was left out.
    let mut kept: Vec<bool> = Vec::new();
    for (at, row) in rows.iter().enumerate() {
        let key = (row.aggregate_type.as_str(), row.aggregate_id.as_str());
        let state = seen.entry(key).or_insert_with(|| {
            let hole = if holes.is_empty() {
                None
            } else {
                first_hole(key)
            };
            (hole, 0)
        });
        if state.0.is_some_and(|hole| hole < row.seq) {
            if kept.is_empty() {
                kept = vec![true; at];
            }
            kept.push(false);
            ordered.left_out += 1;
            continue;
        }
        if !kept.is_empty() {
            kept.push(true);
        }
        if let Some(number) = row.aggregate_seq {
            if number < state.1 {
                ordered.inversions.push(Inversion {
                    aggregate: AggregateKey::of(row),
                    higher: state.1,
                    lower: number,
                });
            }
            state.1 = state.1.max(number);
        }
    }
    if !holes.is_empty() {
        ordered.cut = seen
            .iter()
            .filter(|(_, (hole, _))| hole.is_some())
            .map(|((aggregate_type, aggregate_id), _)| AggregateKey {
                aggregate_type: (*aggregate_type).to_owned(),
                aggregate_id: (*aggregate_id).to_owned(),
            })
            .collect();
        ordered.cut.sort();
    }
    drop(seen);
    ordered.records = if ordered.left_out == 0 {
        rows
    } else {
        rows.into_iter()
            .zip(kept)
            .filter_map(|(row, kept)| kept.then_some(row))
            .collect()
    };
    let mut fell: Vec<&AggregateKey> = ordered
        .inversions
        .iter()
        .map(|inversion| &inversion.aggregate)
        .collect();
    fell.sort();
    fell.dedup();
    for aggregate in fell {
        renumber_in_place(&mut ordered.records, aggregate);
    }
    ordered
}

/// Puts the numbered rows of one aggregate in `aggregate_seq` order (ties
/// by `seq`), in the places they hold in `records`.
fn renumber_in_place(records: &mut [OutboxRecord], aggregate: &AggregateKey) {
    let places: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, record)| {
            record.aggregate_seq.is_some()
                && record.aggregate_type == aggregate.aggregate_type
                && record.aggregate_id == aggregate.aggregate_id
        })
        .map(|(at, _)| at)
        .collect();
    // Rare (rows that break the writers' rule): copies are fine.
    let mut rows: Vec<OutboxRecord> = places.iter().map(|&at| records[at].clone()).collect();
    rows.sort_by_key(|record| (record.aggregate_seq, record.seq));
    for (at, row) in places.into_iter().zip(rows) {
        records[at] = row;
    }
}

/// Logs each inversion at WARN and counts it.
pub(crate) fn report(inversions: &[Inversion]) {
    for inversion in inversions {
        tracing::warn!(
            aggregate_type = %inversion.aggregate.aggregate_type,
            aggregate_id = %inversion.aggregate.aggregate_id,
            higher = inversion.higher,
            lower = inversion.lower,
            "an aggregate's aggregate_seq falls as seq rises (a writer that does not lock the \
             aggregate's outbox_sequence row before it inserts); sending its rows of this batch \
             in aggregate_seq order"
        );
    }
    if !inversions.is_empty() {
        crate::metrics::record_order_inversions(inversions.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::test_record;

    fn row(aggregate: &str, aggregate_seq: Option<i64>, seq: i64) -> OutboxRecord {
        OutboxRecord {
            aggregate_seq,
            seq,
            ..test_record(&format!("{aggregate}@{seq}"), aggregate, 0)
        }
    }

    fn ids(ordered: &Ordered) -> Vec<&str> {
        ordered
            .records
            .iter()
            .map(|record| record.id.as_str())
            .collect()
    }

    fn key(aggregate: &str) -> AggregateKey {
        AggregateKey::of(&test_record("", aggregate, 0))
    }

    #[test]
    fn rows_in_order_go_out_as_claimed() {
        let rows = vec![
            row("a", Some(1), 1),
            row("b", None, 2),
            row("a", Some(2), 3),
            row("b", None, 4),
        ];
        let ordered = claim_order(rows.clone(), &[]);
        assert_eq!(ordered.records, rows);
        assert!(ordered.inversions.is_empty() && ordered.cut.is_empty());
    }

    #[test]
    fn an_aggregate_stops_at_its_first_hole() {
        let rows = vec![
            row("a", Some(1), 1),
            row("b", Some(1), 2),
            // a@3 was dead-lettered: a@4 and a@6 wait, b goes on.
            row("a", Some(3), 4),
            row("b", Some(2), 5),
            row("a", Some(4), 6),
        ];
        let holes = [Hole {
            seq: 3,
            aggregate: Some(key("a")),
        }];
        let ordered = claim_order(rows, &holes);
        assert_eq!(ids(&ordered), ["a@1", "b@2", "b@5"]);
        assert_eq!(ordered.left_out, 2);
        assert_eq!(ordered.cut, [key("a")]);
    }

    #[test]
    fn a_hole_of_no_known_aggregate_stops_everything_after_it() {
        let rows = vec![row("a", Some(1), 1), row("b", Some(1), 3)];
        let holes = [Hole {
            seq: 2,
            aggregate: None,
        }];
        let ordered = claim_order(rows, &holes);
        assert_eq!(ids(&ordered), ["a@1"]);
        assert_eq!(ordered.cut, [key("a"), key("b")]);
    }

    #[test]
    fn a_falling_number_is_put_right_within_the_batch_and_reported() {
        let rows = vec![
            row("a", Some(2), 1),
            row("b", Some(1), 2),
            row("a", Some(1), 3),
            row("a", None, 4),
            row("a", Some(3), 5),
        ];
        let ordered = claim_order(rows, &[]);
        assert_eq!(ids(&ordered), ["a@3", "b@2", "a@1", "a@4", "a@5"]);
        assert_eq!(
            ordered.inversions,
            [Inversion {
                aggregate: key("a"),
                higher: 2,
                lower: 1
            }]
        );
    }
}
