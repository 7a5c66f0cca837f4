//! Per-aggregate order in a claim on MariaDB/MySQL and SQLite: which rows
//! a batch takes, and the check that each aggregate's rows in it form an
//! unbroken run. (PostgreSQL claims the oldest rows by `seq` as they are,
//! in the order [`crate::ordering`] hands them over.)
//!
//! The oldest pending rows by `seq` choose the aggregates of the batch and
//! how many rows each gets; each aggregate then gives that many of its
//! earliest pending rows in `aggregate_seq` order. Writers draw `seq` under
//! the aggregate's lock ([`outbox_contract::ordering`]), so the two are
//! nearly always the same rows; rows that break that rule are still sent
//! in number order. Rows without `aggregate_seq` (written by plain SQL)
//! come first, in `seq` order. The batch goes out aggregate by aggregate,
//! in the order of their oldest rows; each aggregate's run in sequence
//! order.
//!
//! MariaDB/MySQL reads the oldest rows without locking and [`plan`]s: an
//! aggregate whose oldest rows are provably its earliest pending ones
//! (their numbers continue where the aggregate is known to stand) is taken
//! as it is, any other is looked up in `aggregate_seq` order by a second
//! statement; it then locks the chosen rows by primary key and orders them
//! with [`in_claim_order`]. SQLite runs [`head_sql`] and [`runs_sql`] for
//! every aggregate and orders the result with [`in_claim_order`].

use super::FastMap as HashMap;

use sqlx::{AssertSqlSafe, Database, Encode, Executor, Type};

use super::AggregateKey;
use super::dialect::ShardScope;
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
    let mut next_position: HashMap<(String, String), i64> = HashMap::default();
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

/// With `?` placeholders: the oldest `?` (the last parameter) pending rows
/// that pass `filter` (a condition starting with ` AND `, its parameters
/// first), as `columns` (at least [`RUN_COLUMNS`]), in `seq` order.
pub(crate) fn oldest_sql(columns: &str, filter: &str) -> String {
    format!(
        "SELECT {columns} FROM outbox \
         WHERE published_at IS NULL AND dead_lettered_at IS NULL{filter} \
         ORDER BY seq LIMIT ?"
    )
}

/// [`oldest_sql`]'s rows by aggregate, as [`Head`]s.
pub(crate) fn head_sql(filter: &str) -> String {
    format!(
        "SELECT aggregatetype, aggregateid, COUNT(*) AS n, MIN(seq) AS first_seq FROM ({}) AS oldest \
         GROUP BY aggregatetype, aggregateid",
        oldest_sql(RUN_COLUMNS, filter)
    )
}

/// With `?` placeholders: for each of `aggregates` aggregates (bound as
/// type, id, count), that many of its earliest pending rows in
/// `aggregate_seq` order, as `columns`, plus `run_position` when
/// `numbered`.
///
/// Numbered rows are numbered after the limit: a window over the
/// aggregate's pending rows would read all of them where the pending
/// aggregate index yields just the first `count`. Unnumbered, each part
/// is a parenthesized `SELECT` (MariaDB/MySQL, not SQLite): no derived
/// table to materialize per aggregate, and [`run_positions`] numbers the
/// rows.
pub(crate) fn runs_sql(columns: &str, aggregates: usize, numbered: bool) -> String {
    let lookup = format!(
        "SELECT {columns} FROM outbox \
           WHERE aggregatetype = ? AND aggregateid = ? \
           AND published_at IS NULL AND dead_lettered_at IS NULL \
           ORDER BY aggregate_seq, seq LIMIT ?"
    );
    (0..aggregates)
        .map(|n| {
            if numbered {
                format!(
                    "SELECT *, ROW_NUMBER() OVER (ORDER BY run_aggregate_seq, run_seq) \
                       AS run_position FROM (\
                       {}) AS run{n}",
                    lookup.replacen(
                        " FROM outbox",
                        ", aggregate_seq AS run_aggregate_seq, seq AS run_seq FROM outbox",
                        1
                    )
                )
            } else {
                format!("({lookup})")
            }
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// The columns of a [`RunKey`].
pub(crate) const RUN_COLUMNS: &str = "id, aggregatetype, aggregateid, aggregate_seq, seq";

/// Where a pending row stands: what places it in its aggregate's run.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct RunKey {
    pub id: String,
    pub aggregatetype: String,
    pub aggregateid: String,
    pub aggregate_seq: Option<i64>,
    pub seq: i64,
    /// `created_at` as text, where read.
    #[sqlx(default)]
    pub created_at: Option<String>,
}

/// Each row's place in its aggregate's run, by id: 1, 2, ... per aggregate
/// in `aggregate_seq` order, rows without one first, ties by `seq` (the
/// order [`runs_sql`] reads in).
pub(crate) fn run_positions(mut rows: Vec<RunKey>) -> HashMap<String, i64> {
    rows.sort_unstable_by(|a, b| {
        (&a.aggregatetype, &a.aggregateid, a.aggregate_seq, a.seq).cmp(&(
            &b.aggregatetype,
            &b.aggregateid,
            b.aggregate_seq,
            b.seq,
        ))
    });
    let mut positions = HashMap::default();
    positions.reserve(rows.len());
    let mut position = 0;
    for (n, row) in rows.iter().enumerate() {
        let same = n > 0
            && rows[n - 1].aggregatetype == row.aggregatetype
            && rows[n - 1].aggregateid == row.aggregateid;
        position = if same { position + 1 } else { 1 };
        positions.insert(row.id.clone(), position);
    }
    positions
}

/// A pending row as [`plan`] sees it.
pub(crate) trait Placed {
    /// Its aggregate's type and id.
    fn aggregate(&self) -> (&str, &str);
    /// `aggregate_seq`.
    fn aggregate_seq(&self) -> Option<i64>;
    /// `seq`.
    fn seq(&self) -> i64;
}

impl Placed for OutboxRecord {
    fn aggregate(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }
    fn aggregate_seq(&self) -> Option<i64> {
        self.aggregate_seq
    }
    fn seq(&self) -> i64 {
        self.seq
    }
}

impl Placed for RunKey {
    fn aggregate(&self) -> (&str, &str) {
        (&self.aggregatetype, &self.aggregateid)
    }
    fn aggregate_seq(&self) -> Option<i64> {
        self.aggregate_seq
    }
    fn seq(&self) -> i64 {
        self.seq
    }
}

/// ` AND (aggregatetype, aggregateid) NOT IN (...)` with a `(?, ?)` pair
/// per excluded aggregate (a `VALUES` list with `values`), or nothing.
pub(crate) fn exclusion(excluded: usize, values: bool) -> String {
    if excluded == 0 {
        return String::new();
    }
    let pairs = super::question_mark_pairs(excluded);
    let list = if values {
        format!("VALUES {pairs}")
    } else {
        pairs
    };
    format!(" AND (aggregatetype, aggregateid) NOT IN ({list})")
}

/// Runs `sql` ([`head_sql`] or [`oldest_sql`] with a filter from
/// [`exclusion`], then with `shards` a condition on the shard count and
/// the owned shards).
pub(crate) async fn read_heads<DB>(
    conn: &mut DB::Connection,
    sql: &str,
    excluded: &[AggregateKey],
    shards: Option<&ShardScope>,
    limit: usize,
) -> Result<Vec<DB::Row>, sqlx::Error>
where
    DB: Database,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> u32: Encode<'q, DB> + Type<DB>,
{
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for key in excluded {
        query = query
            .bind(key.aggregate_type.as_str())
            .bind(key.aggregate_id.as_str());
    }
    if let Some(shards) = shards {
        query = query.bind(shards.count);
        for shard in &shards.owned {
            query = query.bind(*shard);
        }
    }
    query.bind(limit as i64).fetch_all(conn).await
}

/// Runs [`runs_sql`] for `heads`, selecting `columns`, `numbered` or not.
pub(crate) async fn read_runs<DB>(
    conn: &mut DB::Connection,
    columns: &str,
    heads: &[Head],
    numbered: bool,
) -> Result<Vec<DB::Row>, sqlx::Error>
where
    DB: Database,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let mut query = sqlx::query(AssertSqlSafe(runs_sql(columns, heads.len(), numbered)));
    for head in heads {
        query = query
            .bind(head.aggregatetype.as_str())
            .bind(head.aggregateid.as_str())
            .bind(head.n);
    }
    query.fetch_all(conn).await
}

/// Puts `rows` in claim order: aggregate by aggregate in the order of their
/// oldest rows (`heads`), each by `run_position`; then keeps the unbroken
/// runs.
pub(crate) fn in_claim_order(heads: &[Head], rows: Vec<RunRow>) -> Vec<OutboxRecord> {
    let first_seq: HashMap<(&str, &str), i64> = heads
        .iter()
        .map(|head| {
            (
                (head.aggregatetype.as_str(), head.aggregateid.as_str()),
                head.first_seq,
            )
        })
        .collect();
    by_first_seq(&first_seq, rows)
}

/// [`in_claim_order`] with each aggregate's oldest `seq` given by
/// aggregate (a [`Plan`]'s `first_seq`).
pub(crate) fn by_first_seq(
    first_seq: &HashMap<(&str, &str), i64>,
    mut rows: Vec<RunRow>,
) -> Vec<OutboxRecord> {
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

/// Which rows a claim takes, decided from the oldest pending rows.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// Rows known to be the earliest pending rows of their aggregates
    /// (after those in flight), by `seq`: taken as they are.
    pub rows: Vec<i64>,
    /// Aggregates whose earliest pending rows must be looked up in
    /// `aggregate_seq` order.
    pub lookups: Vec<Lookup>,
    /// For each row of the head the plan was made from, in the head's
    /// order, the `seq` of its aggregate's oldest row: the batch goes out
    /// aggregate by aggregate in this order.
    pub first_seqs: Vec<i64>,
}

impl Plan {
    /// Each aggregate's oldest `seq` by aggregate, for the rows of `head`
    /// (the rows the plan was made from).
    pub(crate) fn first_seq_by_aggregate<R: Placed>(
        &self,
        head: &[R],
    ) -> HashMap<AggregateKey, i64> {
        let mut by_aggregate = HashMap::default();
        for (row, first_seq) in head.iter().zip(&self.first_seqs) {
            let (aggregate_type, aggregate_id) = row.aggregate();
            by_aggregate
                .entry(AggregateKey {
                    aggregate_type: aggregate_type.to_owned(),
                    aggregate_id: aggregate_id.to_owned(),
                })
                .or_insert(*first_seq);
        }
        by_aggregate
    }
}

/// An aggregate whose rows a claim looks up: its `n` earliest pending rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lookup {
    /// The aggregate.
    pub key: AggregateKey,
    /// How many rows it gets.
    pub n: i64,
    /// The `seq` of its oldest row in the head.
    pub first_seq: i64,
}

/// Decides, for each aggregate of the oldest pending rows `head` (in `seq`
/// order), whether those rows are already its earliest pending ones, so
/// they can be claimed as they are, or whether its rows must be looked up
/// in `aggregate_seq` order (MariaDB/MySQL).
///
/// The head holds every pending row up to its last `seq`, so for an
/// aggregate:
/// - rows written by plain SQL are the earliest of their kind, and come
///   first: taken as they are;
/// - numbered rows are its earliest when their `aggregate_seq` are exactly
///   the numbers after the last one known not to be pending: the last one
///   this relay settled (`settled`), else 0 when the head holds number 1
///   (the aggregate's first event). Numbers are given one by one per
///   aggregate, so no pending row can lie between; anything else (an
///   unknown start, a gap, a number given twice, rows of both kinds) is
///   looked up.
pub(crate) fn plan<R: Placed>(head: &[R], settled: &Settled) -> Plan {
    // The head's aggregates in the order of their oldest rows (borrowed:
    // no key is copied per row) with the `seq` of that row, and the head's
    // rows aggregate by aggregate, each aggregate's in `seq` order (a
    // stable sort).
    let mut aggregates: Vec<((&str, &str), i64)> = Vec::new();
    let mut index: HashMap<(&str, &str), usize> =
        HashMap::with_capacity_and_hasher(head.len(), Default::default());
    let mut plan = Plan {
        first_seqs: Vec::with_capacity(head.len()),
        ..Plan::default()
    };
    let mut grouped: Vec<(usize, &R)> = head
        .iter()
        .map(|row| {
            let key = row.aggregate();
            // The head is in `seq` order: an aggregate's first row is its
            // oldest.
            let at = *index.entry(key).or_insert_with(|| {
                aggregates.push((key, row.seq()));
                aggregates.len() - 1
            });
            plan.first_seqs.push(aggregates[at].1);
            (at, row)
        })
        .collect();
    grouped.sort_by_key(|(at, _)| *at);
    let mut rows: Vec<&R> = Vec::new();
    let mut numbers: Vec<i64> = Vec::new();
    for group in grouped.chunk_by(|a, b| a.0 == b.0) {
        let (key, first_seq) = aggregates[group[0].0];
        rows.clear();
        rows.extend(group.iter().map(|(_, row)| *row));
        numbers.clear();
        numbers.extend(rows.iter().filter_map(|row| row.aggregate_seq()));
        let earliest = if numbers.is_empty() {
            true
        } else if numbers.len() == rows.len() {
            numbers.sort_unstable();
            let start = settled
                .last_of(key)
                .or((numbers.first() == Some(&1)).then_some(0));
            start.is_some_and(|start| {
                numbers
                    .iter()
                    .enumerate()
                    .all(|(offset, &number)| Some(number) == start.checked_add(offset as i64 + 1))
            })
        } else {
            false
        };
        if earliest {
            plan.rows.extend(rows.iter().map(|row| row.seq()));
        } else {
            plan.lookups.push(Lookup {
                key: AggregateKey {
                    aggregate_type: key.0.to_owned(),
                    aggregate_id: key.1.to_owned(),
                },
                n: rows.len() as i64,
                first_seq,
            });
        }
    }
    plan
}

/// Aggregates per generation of [`Settled`]: two generations of about
/// 40 bytes an entry stay within a few megabytes.
const SETTLED_PER_GENERATION: usize = 50_000;

/// The last numbered row this relay settled (published or parked) of each
/// aggregate it worked on recently: where the aggregate's pending rows
/// start, so a claim need not look them up.
///
/// Two generations: when the current one is full it becomes the previous
/// one, and the one before is forgotten; a forgotten aggregate is looked
/// up once. Keys are 128-bit hashes of the aggregate.
#[derive(Debug, Default)]
pub struct Settled {
    generations: std::sync::Mutex<[HashMap<u128, i64>; 2]>,
}

impl Settled {
    /// The hash of an aggregate, as (type, id).
    fn hash(key: (&str, &str)) -> u128 {
        use std::hash::{Hash, Hasher};
        let half = |salt: u8| {
            let mut hasher = std::hash::DefaultHasher::new();
            salt.hash(&mut hasher);
            key.hash(&mut hasher);
            hasher.finish()
        };
        (u128::from(half(0)) << 64) | u128::from(half(1))
    }

    /// The `aggregate_seq` of the last row of `key` this relay settled.
    pub fn last(&self, key: &AggregateKey) -> Option<i64> {
        self.last_of(key.as_pair())
    }

    /// [`Settled::last`] of the aggregate (type, id).
    pub(crate) fn last_of(&self, key: (&str, &str)) -> Option<i64> {
        let hash = Self::hash(key);
        let generations = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        generations[0]
            .get(&hash)
            .or_else(|| generations[1].get(&hash))
            .copied()
    }

    /// Records what a committed settle of `records` (in claim order) left
    /// behind: for each aggregate, its last numbered row up to its first
    /// row left pending (`pending`).
    pub fn record(&self, records: &[OutboxRecord], pending: impl Fn(&OutboxRecord) -> bool) {
        // Per aggregate: its last settled number, and whether a row of it
        // stays pending (nothing after that row counts).
        let mut last: HashMap<u128, (i64, bool)> = HashMap::default();
        // Records come aggregate by aggregate: hash each aggregate once.
        let mut current: Option<(&str, &str, u128)> = None;
        for record in records {
            let hash = match current {
                Some((aggregate_type, aggregate_id, hash))
                    if aggregate_type == record.aggregate_type
                        && aggregate_id == record.aggregate_id =>
                {
                    hash
                }
                _ => {
                    let hash = Self::hash((&record.aggregate_type, &record.aggregate_id));
                    current = Some((&record.aggregate_type, &record.aggregate_id, hash));
                    hash
                }
            };
            let (number, stopped) = last.entry(hash).or_insert((0, false));
            if *stopped {
                continue;
            }
            if pending(record) {
                *stopped = true;
            } else if let Some(settled) = record.aggregate_seq {
                *number = settled;
            }
        }
        let mut generations = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        for (hash, (number, _)) in last {
            if number == 0 {
                continue;
            }
            if generations[0].len() >= SETTLED_PER_GENERATION {
                let current = std::mem::take(&mut generations[0]);
                generations[1] = current;
            }
            generations[0].insert(hash, number);
        }
    }
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
                created_at: None,
                partition: None,
                ctid: None,
                extra: Vec::new(),
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
        let sql = runs_sql("id", 2, true);
        assert_eq!(sql.matches("UNION ALL").count(), 1);
        assert_eq!(sql.matches('?').count(), 6);
        assert!(sql.contains("AS run0 UNION ALL SELECT"), "{sql}");
        let sql = runs_sql(RUN_COLUMNS, 2, false);
        assert_eq!(sql.matches("UNION ALL").count(), 1);
        assert_eq!(sql.matches('?').count(), 6);
        assert!(sql.starts_with("(SELECT id, aggregatetype"), "{sql}");
        assert!(sql.contains("LIMIT ?) UNION ALL (SELECT"), "{sql}");
    }

    #[test]
    fn runs_are_numbered_per_aggregate_in_sequence_order() {
        let row = |id: &str, aggregate: &str, aggregate_seq: Option<i64>, seq: i64| RunKey {
            id: id.to_owned(),
            aggregatetype: "Invoice".to_owned(),
            aggregateid: aggregate.to_owned(),
            aggregate_seq,
            seq,
            created_at: None,
        };
        let positions = run_positions(vec![
            row("a3", "a", Some(3), 2),
            row("b1", "b", None, 9),
            row("a2", "a", Some(2), 5),
            row("b2", "b", Some(1), 1),
            row("a1", "a", None, 7),
            row("b0", "b", None, 4),
        ]);
        let place = |id: &str| positions[id];
        assert_eq!(
            ["a1", "a2", "a3", "b0", "b1", "b2"].map(place),
            [1, 2, 3, 1, 2, 3]
        );
    }

    fn head(rows: &[(&str, Option<i64>, i64)]) -> Vec<OutboxRecord> {
        rows.iter()
            .map(|&(aggregate, aggregate_seq, seq)| OutboxRecord {
                seq,
                ..record(aggregate, &format!("{aggregate}{seq}"), aggregate_seq)
            })
            .collect()
    }

    fn key(aggregate: &str) -> AggregateKey {
        AggregateKey {
            aggregate_type: "Order".into(),
            aggregate_id: aggregate.into(),
        }
    }

    fn record(aggregate: &str, id: &str, aggregate_seq: Option<i64>) -> OutboxRecord {
        OutboxRecord {
            aggregate_seq,
            ..row(aggregate, id, 0).record
        }
    }

    fn looked_up(plan: &Plan) -> Vec<(String, i64)> {
        plan.lookups
            .iter()
            .map(|lookup| (lookup.key.aggregate_id.clone(), lookup.n))
            .collect()
    }

    #[test]
    fn an_aggregates_first_events_are_taken_as_they_are() {
        let plan = plan(
            &head(&[("a", Some(1), 10), ("b", None, 11), ("a", Some(2), 12)]),
            &Settled::default(),
        );
        assert_eq!(plan.rows, [10, 12, 11]);
        assert!(plan.lookups.is_empty());
        assert_eq!(plan.first_seqs, [10, 11, 10]);
    }

    #[test]
    fn an_unknown_start_a_gap_or_a_repeated_number_is_looked_up() {
        let plan = plan(
            &head(&[
                ("unknown", Some(5), 1),
                ("gap", Some(1), 2),
                ("gap", Some(3), 3),
                ("twice", Some(1), 4),
                ("twice", Some(1), 5),
                ("mixed", None, 6),
                ("mixed", Some(1), 7),
            ]),
            &Settled::default(),
        );
        assert!(plan.rows.is_empty(), "{plan:?}");
        assert_eq!(
            looked_up(&plan),
            [
                ("unknown".to_owned(), 1),
                ("gap".to_owned(), 2),
                ("twice".to_owned(), 2),
                ("mixed".to_owned(), 2),
            ]
        );
    }

    #[test]
    fn numbers_continue_where_this_relay_settled_the_aggregate() {
        let settled = Settled::default();
        settled.record(
            &[
                record("a", "a4", Some(4)),
                record("a", "a5", Some(5)),
                record("b", "b1", Some(1)),
                record("b", "b2", Some(2)),
            ],
            // b2 failed and stays pending: b continues after b1.
            |record| record.id == "b2",
        );
        assert_eq!(settled.last(&key("a")), Some(5));
        assert_eq!(settled.last(&key("b")), Some(1));
        let plan = plan(
            &head(&[("a", Some(7), 20), ("a", Some(6), 21), ("b", Some(2), 22)]),
            &settled,
        );
        assert_eq!(plan.rows, [20, 21, 22]);
        // 7 is not among the oldest rows (a writer that waited for 7's
        // writer inserted 8 first): looked up.
        let plan = super::plan(&head(&[("a", Some(8), 20), ("a", Some(6), 21)]), &settled);
        assert_eq!(looked_up(&plan), [("a".to_owned(), 2)]);
    }
}
