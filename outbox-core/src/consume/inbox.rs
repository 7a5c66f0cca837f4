//! [`Inbox`]: applies a consumed event's effect at most once per consumer,
//! in the consumer's own transaction.
//!
//! Three tables (created by the `outbox-migrations` crate) keep what each
//! consumer has applied:
//!
//! - [`INBOX_TABLE`]: the ids of the events applied, per consumer, with
//!   when; retention deletes old ids ([`Inbox::delete_processed`]);
//! - [`INBOX_SEQUENCE_TABLE`]: per consumer, topic and aggregate, the
//!   highest `aggregateSequence` applied, kept for good, so a redelivery
//!   is recognised after its id was deleted;
//! - [`INBOX_GAP_TABLE`]: per consumer, topic and aggregate, the ranges of
//!   sequence numbers the mark moved past without applying them (a gap
//!   under [`GapPolicy::Apply`] or [`GapPolicy::ApplyLate`]), kept for
//!   good, minus the numbers applied late since.
//!
//! # Late events, duplicates and stale redeliveries
//!
//! An event at or below the aggregate's high-water mark is one of three
//! things, and [`Inbox::apply`] tells them apart:
//!
//! - its id is recorded: this consumer applied it, [`Outcome::Duplicate`];
//! - its sequence number lies in a recorded gap: the mark moved past it
//!   while it was missing, so it was never applied. It arrived after a later
//!   event of its aggregate (a reorder upstream, a re-driven dead letter, a
//!   consumer that started mid-stream and is now replaying from the start):
//!   [`Outcome::Late`], or, under [`GapPolicy::ApplyLate`], applied once as
//!   [`Outcome::AppliedLate`];
//! - otherwise: the mark reached it by applying it, so it is a redelivery
//!   whose id retention has deleted, [`Outcome::Stale`].
//!
//! The event ids alone cannot make that distinction: retention deletes them,
//! and an unknown id below the mark is then either a redelivery or an event
//! never seen. The mark only ever moves to an event that is applied, and
//! everything it skips on the way is recorded as a gap, so a number below
//! the mark that is not in a gap was applied. Gaps are kept as ranges, so a
//! consumer that starts reading after an aggregate's first thousand events
//! stores one row, not a thousand. Gaps skipped before the gap table existed
//! are not recorded; events late into them are reported as stale.
//!
//! Concurrency: the aggregate's high-water row is locked (an upsert) before
//! anything is decided, and the event id is inserted under a unique key, so
//! two processes handling one event at once serialize on the database: the
//! second waits for the first transaction and then finds the event applied.
//! The aggregate's gaps are read and written only under that lock.

use std::future::Future;
use std::ops::RangeInclusive;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use super::message::EventMetadata;

/// The table of applied event ids, per consumer.
pub const INBOX_TABLE: &str = "outbox_inbox";
/// The table of the highest applied sequence number per consumer, topic and
/// aggregate.
pub const INBOX_SEQUENCE_TABLE: &str = "outbox_inbox_sequence";
/// The table of the sequence numbers each consumer skipped over at gaps and
/// has not applied since, as ranges per topic and aggregate.
pub const INBOX_GAP_TABLE: &str = "outbox_inbox_gap";

/// Longest consumer name: the width of the tables' `consumer` column.
pub const MAX_CONSUMER_NAME_LEN: usize = 255;

/// Ids deleted per statement by [`Inbox::delete_processed`].
const DELETE_BATCH: u64 = 1000;

/// What to do with an event whose `aggregateSequence` jumps ahead of the
/// last one applied for its aggregate (events in between are missing), and
/// with a missing event that arrives after that: a late event.
///
/// A gap appears when the consumer starts reading a topic after an
/// aggregate's first events, when events were lost upstream, when the
/// relay dead-lettered an event (a re-driven dead letter is published after
/// the aggregate's later events), or when events reach the broker out of
/// order.
///
/// | policy | event after a gap | late event (never applied) |
/// |---|---|---|
/// | [`Apply`](GapPolicy::Apply) | applied, gap reported | not applied: [`Outcome::Late`] |
/// | [`ApplyLate`](GapPolicy::ApplyLate) | applied, gap reported | applied once: [`Outcome::AppliedLate`] |
/// | [`Hold`](GapPolicy::Hold) | not applied: [`Outcome::Held`] | none arise |
///
/// Under every policy a redelivery of an applied event is skipped
/// ([`Outcome::Duplicate`], or [`Outcome::Stale`] once its id was
/// deleted), and no event is ever applied twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapPolicy {
    /// Apply the event, move the high-water mark to it and record the
    /// missing numbers as skipped. A missing event that arrives later is
    /// **not applied**: it is reported as [`Outcome::Late`] and nothing is
    /// recorded, so the caller can log, park or re-route it (a redelivery
    /// is reported late again). Suits effects that only need the latest
    /// state, where applying an older event after a newer one would undo
    /// it. Every other effect loses the late event's effect: choose
    /// [`ApplyLate`](GapPolicy::ApplyLate) or [`Hold`](GapPolicy::Hold).
    Apply,
    /// As [`Apply`](GapPolicy::Apply) at a gap, and a missing event that
    /// arrives later is applied when it arrives, once
    /// ([`Outcome::AppliedLate`]): nothing committed is lost, but the
    /// effect sees the aggregate's events out of order. Suits effects that
    /// do not depend on order: counters, sums, inserting a row per event.
    ApplyLate,
    /// Do not apply it: [`Outcome::Held`] reports the gap and nothing is
    /// recorded, so the caller can wait and retry, park the message for
    /// later, or stop; once the missing events arrive, everything applies
    /// in order. Suits effects that need every event in order. The mark
    /// never skips a number, so no event is late, except one in a gap
    /// recorded while the consumer ran under another policy: that is
    /// reported as [`Outcome::Late`] and not applied.
    Hold,
}

/// Applies events' effects exactly once for one consumer.
///
/// Give each consumer (each effect, typically each Kafka consumer group) its
/// own name; several consumers share the tables. Call [`Inbox::apply`] in a
/// transaction of the database the effect writes to, and commit it before
/// committing the message's offset.
///
/// ```no_run
/// use outbox_core::{EventMetadata, GapPolicy, Inbox, Outcome};
/// use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionTrait};
///
/// async fn handle(db: &DatabaseConnection, inbox: &Inbox, event: &EventMetadata) -> Result<(), DbErr> {
///     let txn = db.begin().await?;
///     let outcome = inbox
///         .apply(&txn, event, |txn| async move {
///             txn.execute_unprepared("UPDATE order_counts SET placed = placed + 1").await
///         })
///         .await?;
///     txn.commit().await?;
///     match outcome {
///         Outcome::Applied { gap: Some(gap), .. } => eprintln!("applied after a gap: {gap}"),
///         Outcome::Late { sequence, last_applied } => {
///             eprintln!("sequence {sequence} arrived after {last_applied}, not applied")
///         }
///         Outcome::Applied { .. }
///         | Outcome::AppliedLate { .. }
///         | Outcome::Duplicate
///         | Outcome::Stale { .. } => {}
///         Outcome::Held { gap } => eprintln!("held: {gap}; park the message"),
///     }
///     Ok(()) // now commit the message's offset
/// }
///
/// let inbox = Inbox::new("order-counts", GapPolicy::Apply);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbox {
    consumer: String,
    on_gap: GapPolicy,
}

/// What [`Inbox::apply`] did with an event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a held event was not applied; the caller must wait, park or stop"]
pub enum Outcome<R> {
    /// The effect ran and the event is recorded as applied, in the
    /// caller's transaction.
    Applied {
        /// What the effect returned.
        value: R,
        /// Events of the aggregate were missing before this one, and the
        /// policy was [`GapPolicy::Apply`].
        gap: Option<Gap>,
    },
    /// A late event applied under [`GapPolicy::ApplyLate`]: it arrived
    /// after a later event of its aggregate, in a gap the mark had skipped,
    /// and was never applied before. The effect ran and the event is
    /// recorded as applied, in the caller's transaction; the mark stays.
    AppliedLate {
        /// What the effect returned.
        value: R,
        /// The event's sequence number.
        sequence: i64,
        /// The highest sequence number applied for the aggregate.
        last_applied: i64,
    },
    /// This consumer applied the event already (same event id): skipped.
    Duplicate,
    /// The event arrived after a later event of its aggregate, in a gap the
    /// mark had skipped, and was never applied: **not applied** (the policy
    /// is [`GapPolicy::Apply`], or [`GapPolicy::Hold`] for a gap recorded
    /// under another policy) and nothing recorded. Its effect is lost
    /// unless the caller handles it: log, park or re-route it, or use
    /// [`GapPolicy::ApplyLate`] to apply such events.
    Late {
        /// The event's sequence number.
        sequence: i64,
        /// The highest sequence number applied for the aggregate.
        last_applied: i64,
    },
    /// The aggregate's high-water mark is at or past the event's sequence
    /// number, the event's id is not recorded, and its number is not in a
    /// gap the mark skipped: a redelivery of an applied event whose id
    /// retention has deleted. Skipped.
    Stale {
        /// The highest sequence number applied for the aggregate.
        last_applied: i64,
    },
    /// A gap before the event and the policy is [`GapPolicy::Hold`]: not
    /// applied, nothing recorded.
    Held {
        /// The missing sequence numbers.
        gap: Gap,
    },
}

impl<R> Outcome<R> {
    /// Whether the effect ran.
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied { .. } | Outcome::AppliedLate { .. })
    }

    /// What the effect returned, if it ran.
    pub fn into_value(self) -> Option<R> {
        match self {
            Outcome::Applied { value, .. } | Outcome::AppliedLate { value, .. } => Some(value),
            _ => None,
        }
    }
}

/// Missing events of an aggregate: the event at `sequence` arrived while
/// the last one applied was `last_applied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The highest sequence number applied before (0: none yet).
    pub last_applied: i64,
    /// The arriving event's sequence number.
    pub sequence: i64,
}

impl Gap {
    /// The sequence numbers of the missing events.
    ///
    /// ```
    /// let gap = outbox_core::Gap { last_applied: 2, sequence: 5 };
    /// assert_eq!(gap.missing(), 3..=4);
    /// ```
    pub fn missing(&self) -> RangeInclusive<i64> {
        self.last_applied + 1..=self.sequence - 1
    }
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let missing = self.missing();
        if missing.start() == missing.end() {
            write!(f, "sequence {} is missing", missing.start())
        } else {
            write!(
                f,
                "sequences {} to {} are missing",
                missing.start(),
                missing.end()
            )
        }
    }
}

impl Inbox {
    /// The inbox of the consumer `consumer`, with a policy for gaps.
    ///
    /// # Panics
    ///
    /// If `consumer` is empty or longer than [`MAX_CONSUMER_NAME_LEN`]
    /// characters.
    pub fn new(consumer: impl Into<String>, on_gap: GapPolicy) -> Self {
        let consumer = consumer.into();
        let length = consumer.chars().count();
        assert!(
            (1..=MAX_CONSUMER_NAME_LEN).contains(&length),
            "an inbox consumer name has 1 to {MAX_CONSUMER_NAME_LEN} characters, {consumer:?} has {length}"
        );
        Self { consumer, on_gap }
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The gap policy.
    pub fn gap_policy(&self) -> GapPolicy {
        self.on_gap
    }

    /// Runs `effect` in `txn` and records the event as applied, unless this
    /// consumer applied it already ([`Outcome::Duplicate`], or
    /// [`Outcome::Stale`] once its id was deleted), it arrived after a later
    /// event of its aggregate and the policy is not [`GapPolicy::ApplyLate`]
    /// ([`Outcome::Late`]), or it follows a gap and the policy is
    /// [`GapPolicy::Hold`] ([`Outcome::Held`]).
    ///
    /// Events with an aggregate id (the key) and an `aggregateSequence` are
    /// checked against the aggregate's high-water mark, and their ids
    /// recorded; events without are deduplicated by id only, so only
    /// within the retention of [`Inbox::delete_processed`].
    ///
    /// Everything is written in `txn`: commit it to keep the effect and the
    /// record together, and commit the message's offset only after that. If
    /// the effect fails its error is returned; roll `txn` back (dropping it
    /// does), and the event can be applied again later. The high-water row
    /// of the aggregate stays locked until `txn` ends, so keep the
    /// transaction short.
    pub async fn apply<'t, F, Fut, R, E>(
        &self,
        txn: &'t DatabaseTransaction,
        event: &EventMetadata,
        effect: F,
    ) -> Result<Outcome<R>, E>
    where
        F: FnOnce(&'t DatabaseTransaction) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        E: From<DbErr>,
    {
        let gap = match (&event.aggregate_id, event.aggregate_sequence) {
            (Some(aggregate_id), Some(sequence)) => {
                let last_applied = self
                    .lock_high_water(txn, &event.topic, aggregate_id)
                    .await?;
                if sequence <= last_applied {
                    if self.is_recorded(txn, event.id).await? {
                        return Ok(Outcome::Duplicate);
                    }
                    let Some(skipped) = self
                        .skipped_range(txn, &event.topic, aggregate_id, sequence)
                        .await?
                    else {
                        return Ok(Outcome::Stale { last_applied });
                    };
                    if self.on_gap != GapPolicy::ApplyLate {
                        return Ok(Outcome::Late {
                            sequence,
                            last_applied,
                        });
                    }
                    if !self.record(txn, event.id).await? {
                        return Ok(Outcome::Duplicate);
                    }
                    self.fill_skipped(txn, &event.topic, aggregate_id, skipped, sequence)
                        .await?;
                    let value = effect(txn).await?;
                    return Ok(Outcome::AppliedLate {
                        value,
                        sequence,
                        last_applied,
                    });
                }
                let gap = (sequence > last_applied + 1).then_some(Gap {
                    last_applied,
                    sequence,
                });
                if let Some(gap) = gap
                    && self.on_gap == GapPolicy::Hold
                {
                    return Ok(Outcome::Held { gap });
                }
                if !self.record(txn, event.id).await? {
                    return Ok(Outcome::Duplicate);
                }
                if let Some(gap) = gap {
                    self.insert_skipped(txn, &event.topic, aggregate_id, gap.missing())
                        .await?;
                }
                self.set_high_water(txn, &event.topic, aggregate_id, sequence)
                    .await?;
                gap
            }
            _ => {
                if !self.record(txn, event.id).await? {
                    return Ok(Outcome::Duplicate);
                }
                None
            }
        };
        let value = effect(txn).await?;
        Ok(Outcome::Applied { value, gap })
    }

    /// The highest sequence number this consumer applied for the aggregate
    /// `aggregate_id` read from `topic`, if any.
    pub async fn last_applied<C: ConnectionTrait>(
        &self,
        db: &C,
        topic: &str,
        aggregate_id: &str,
    ) -> Result<Option<i64>, DbErr> {
        let backend = db.get_database_backend();
        let [p1, p2, p3] = placeholders(backend);
        let sql = format!(
            "SELECT last_seq FROM {INBOX_SEQUENCE_TABLE} \
             WHERE consumer = {p1} AND topic = {p2} AND aggregateid = {p3}"
        );
        let row = db
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                sql,
                [
                    self.consumer.as_str().into(),
                    topic.into(),
                    aggregate_id.into(),
                ],
            ))
            .await?;
        let last = match row {
            Some(row) => Some(row.try_get_by_index::<i64>(0)?),
            None => None,
        };
        Ok(last.filter(|last| *last > 0))
    }

    /// The sequence numbers of the aggregate `aggregate_id` read from
    /// `topic` that this consumer's mark skipped over at gaps and that it
    /// has not applied since, in order: the events that would be late.
    ///
    /// ```no_run
    /// # async fn run(db: &sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
    /// let inbox = outbox_core::Inbox::new("order-summary", outbox_core::GapPolicy::Apply);
    /// for missing in inbox.skipped(db, "outbox.event.Order", "7").await? {
    ///     eprintln!("order 7: sequences {missing:?} were never applied");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn skipped<C: ConnectionTrait>(
        &self,
        db: &C,
        topic: &str,
        aggregate_id: &str,
    ) -> Result<Vec<RangeInclusive<i64>>, DbErr> {
        let backend = db.get_database_backend();
        let [p1, p2, p3] = placeholders(backend);
        let sql = format!(
            "SELECT first_seq, last_seq FROM {INBOX_GAP_TABLE} \
             WHERE consumer = {p1} AND topic = {p2} AND aggregateid = {p3} ORDER BY first_seq"
        );
        let rows = db
            .query_all_raw(Statement::from_sql_and_values(
                backend,
                sql,
                [
                    self.consumer.as_str().into(),
                    topic.into(),
                    aggregate_id.into(),
                ],
            ))
            .await?;
        rows.iter()
            .map(|row| Ok(row.try_get_by_index::<i64>(0)?..=row.try_get_by_index::<i64>(1)?))
            .collect()
    }

    /// Deletes the ids of events this consumer applied more than
    /// `older_than` ago, in batches of a thousand; returns how many.
    ///
    /// The high-water marks and the recorded gaps stay, so redeliveries of
    /// deleted events that carry an `aggregateSequence` are still skipped
    /// (as [`Outcome::Stale`]); an event without one would be applied again,
    /// so keep ids longer than any redelivery can take (the broker's
    /// retention, or the longest a consumer group may lag).
    ///
    /// ```no_run
    /// # async fn run(db: &sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
    /// use std::time::Duration;
    /// let inbox = outbox_core::Inbox::new("order-summary", outbox_core::GapPolicy::Apply);
    /// let deleted = inbox.delete_processed(db, Duration::from_secs(7 * 24 * 3600)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_processed<C: ConnectionTrait>(
        &self,
        db: &C,
        older_than: Duration,
    ) -> Result<u64, DbErr> {
        let backend = db.get_database_backend();
        let (sql, cutoff): (String, Value) = match backend {
            DbBackend::Postgres => (
                format!(
                    "DELETE FROM {INBOX_TABLE} WHERE consumer = $1 AND event_id IN \
                     (SELECT event_id FROM {INBOX_TABLE} WHERE consumer = $1 \
                      AND processed_at < now() - make_interval(secs => $2) \
                      ORDER BY processed_at LIMIT $3)"
                ),
                older_than.as_secs_f64().into(),
            ),
            DbBackend::MySql => (
                format!(
                    "DELETE FROM {INBOX_TABLE} WHERE consumer = ? \
                     AND processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                     ORDER BY processed_at LIMIT ?"
                ),
                i64::try_from(older_than.as_micros())
                    .unwrap_or(i64::MAX)
                    .into(),
            ),
            _ => (
                format!(
                    "DELETE FROM {INBOX_TABLE} WHERE rowid IN \
                     (SELECT rowid FROM {INBOX_TABLE} WHERE consumer = ? \
                      AND processed_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) \
                      ORDER BY processed_at LIMIT ?)"
                ),
                format!("-{:.3} seconds", older_than.as_secs_f64()).into(),
            ),
        };
        let mut deleted = 0;
        loop {
            let values: Vec<Value> = vec![
                self.consumer.as_str().into(),
                cutoff.clone(),
                (DELETE_BATCH as i64).into(),
            ];
            let batch = db
                .execute_raw(Statement::from_sql_and_values(backend, &sql, values))
                .await?
                .rows_affected();
            deleted += batch;
            if batch < DELETE_BATCH {
                return Ok(deleted);
            }
        }
    }

    /// Creates the aggregate's high-water row if missing, locks it until
    /// the transaction ends, and returns its sequence number (0: none
    /// applied yet).
    async fn lock_high_water(
        &self,
        txn: &DatabaseTransaction,
        topic: &str,
        aggregate_id: &str,
    ) -> Result<i64, DbErr> {
        let backend = txn.get_database_backend();
        let key = || -> Vec<Value> {
            vec![
                self.consumer.as_str().into(),
                topic.into(),
                aggregate_id.into(),
            ]
        };
        let row = match backend {
            DbBackend::MySql => {
                let upsert = format!(
                    "INSERT INTO {INBOX_SEQUENCE_TABLE} (consumer, topic, aggregateid, last_seq) \
                     VALUES (?, ?, ?, 0) ON DUPLICATE KEY UPDATE last_seq = last_seq"
                );
                txn.execute_raw(Statement::from_sql_and_values(backend, upsert, key()))
                    .await?;
                let select = format!(
                    "SELECT last_seq FROM {INBOX_SEQUENCE_TABLE} \
                     WHERE consumer = ? AND topic = ? AND aggregateid = ? FOR UPDATE"
                );
                txn.query_one_raw(Statement::from_sql_and_values(backend, select, key()))
                    .await?
            }
            _ => {
                // The no-op update takes the row lock, and RETURNING reads
                // the value the last committed transaction left.
                let [p1, p2, p3] = placeholders(backend);
                let upsert = format!(
                    "INSERT INTO {INBOX_SEQUENCE_TABLE} (consumer, topic, aggregateid, last_seq) \
                     VALUES ({p1}, {p2}, {p3}, 0) \
                     ON CONFLICT (consumer, topic, aggregateid) \
                     DO UPDATE SET last_seq = {INBOX_SEQUENCE_TABLE}.last_seq \
                     RETURNING last_seq"
                );
                txn.query_one_raw(Statement::from_sql_and_values(backend, upsert, key()))
                    .await?
            }
        };
        let row = row.ok_or_else(|| {
            DbErr::RecordNotFound(format!(
                "{INBOX_SEQUENCE_TABLE} row of consumer {} for {topic} {aggregate_id}",
                self.consumer
            ))
        })?;
        row.try_get_by_index::<i64>(0)
    }

    async fn set_high_water(
        &self,
        txn: &DatabaseTransaction,
        topic: &str,
        aggregate_id: &str,
        sequence: i64,
    ) -> Result<(), DbErr> {
        let backend = txn.get_database_backend();
        let [p1, p2, p3, p4] = placeholders(backend);
        let update = format!(
            "UPDATE {INBOX_SEQUENCE_TABLE} SET last_seq = {p1} \
             WHERE consumer = {p2} AND topic = {p3} AND aggregateid = {p4}"
        );
        txn.execute_raw(Statement::from_sql_and_values(
            backend,
            update,
            [
                sequence.into(),
                self.consumer.as_str().into(),
                topic.into(),
                aggregate_id.into(),
            ],
        ))
        .await?;
        Ok(())
    }

    /// Records `missing` as skipped over by the aggregate's mark.
    async fn insert_skipped(
        &self,
        txn: &DatabaseTransaction,
        topic: &str,
        aggregate_id: &str,
        missing: RangeInclusive<i64>,
    ) -> Result<(), DbErr> {
        let backend = txn.get_database_backend();
        let [p1, p2, p3, p4, p5] = placeholders(backend);
        let insert = format!(
            "INSERT INTO {INBOX_GAP_TABLE} (consumer, topic, aggregateid, first_seq, last_seq) \
             VALUES ({p1}, {p2}, {p3}, {p4}, {p5})"
        );
        txn.execute_raw(Statement::from_sql_and_values(
            backend,
            insert,
            [
                self.consumer.as_str().into(),
                topic.into(),
                aggregate_id.into(),
                (*missing.start()).into(),
                (*missing.end()).into(),
            ],
        ))
        .await?;
        Ok(())
    }

    /// The recorded gap of the aggregate that holds `sequence`, if any.
    /// Gaps do not overlap, so it is the last one starting at or before
    /// `sequence`, if it reaches that far.
    async fn skipped_range(
        &self,
        txn: &DatabaseTransaction,
        topic: &str,
        aggregate_id: &str,
        sequence: i64,
    ) -> Result<Option<RangeInclusive<i64>>, DbErr> {
        let backend = txn.get_database_backend();
        let [p1, p2, p3, p4] = placeholders(backend);
        let select = format!(
            "SELECT first_seq, last_seq FROM {INBOX_GAP_TABLE} \
             WHERE consumer = {p1} AND topic = {p2} AND aggregateid = {p3} AND first_seq <= {p4} \
             ORDER BY first_seq DESC LIMIT 1"
        );
        let row = txn
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                select,
                [
                    self.consumer.as_str().into(),
                    topic.into(),
                    aggregate_id.into(),
                    sequence.into(),
                ],
            ))
            .await?;
        let Some(row) = row else { return Ok(None) };
        let range = row.try_get_by_index::<i64>(0)?..=row.try_get_by_index::<i64>(1)?;
        Ok(range.contains(&sequence).then_some(range))
    }

    /// Takes `sequence`, applied late, out of the recorded gap `skipped`.
    async fn fill_skipped(
        &self,
        txn: &DatabaseTransaction,
        topic: &str,
        aggregate_id: &str,
        skipped: RangeInclusive<i64>,
        sequence: i64,
    ) -> Result<(), DbErr> {
        let backend = txn.get_database_backend();
        let [p1, p2, p3, p4] = placeholders(backend);
        let delete = format!(
            "DELETE FROM {INBOX_GAP_TABLE} \
             WHERE consumer = {p1} AND topic = {p2} AND aggregateid = {p3} AND first_seq = {p4}"
        );
        txn.execute_raw(Statement::from_sql_and_values(
            backend,
            delete,
            [
                self.consumer.as_str().into(),
                topic.into(),
                aggregate_id.into(),
                (*skipped.start()).into(),
            ],
        ))
        .await?;
        for rest in split_around(skipped, sequence) {
            self.insert_skipped(txn, topic, aggregate_id, rest).await?;
        }
        Ok(())
    }

    /// Inserts the event id; `false` if this consumer has it already. A
    /// concurrent transaction inserting the same id makes this one wait
    /// for its outcome.
    async fn record(&self, txn: &DatabaseTransaction, event_id: Uuid) -> Result<bool, DbErr> {
        let backend = txn.get_database_backend();
        let insert = match backend {
            // The values are bounded (a UUID, a checked consumer name), so
            // IGNORE only skips the duplicate key.
            DbBackend::MySql => {
                format!("INSERT IGNORE INTO {INBOX_TABLE} (consumer, event_id) VALUES (?, ?)")
            }
            _ => {
                let [p1, p2] = placeholders(backend);
                format!(
                    "INSERT INTO {INBOX_TABLE} (consumer, event_id) VALUES ({p1}, {p2}) \
                     ON CONFLICT DO NOTHING"
                )
            }
        };
        let values = vec![
            self.consumer.as_str().into(),
            event_id_value(backend, event_id),
        ];
        let inserted = txn
            .execute_raw(Statement::from_sql_and_values(backend, insert, values))
            .await?
            .rows_affected();
        Ok(inserted == 1)
    }

    async fn is_recorded(&self, txn: &DatabaseTransaction, event_id: Uuid) -> Result<bool, DbErr> {
        let backend = txn.get_database_backend();
        let [p1, p2] = placeholders(backend);
        let select =
            format!("SELECT 1 FROM {INBOX_TABLE} WHERE consumer = {p1} AND event_id = {p2}");
        let values = vec![
            self.consumer.as_str().into(),
            event_id_value(backend, event_id),
        ];
        Ok(txn
            .query_one_raw(Statement::from_sql_and_values(backend, select, values))
            .await?
            .is_some())
    }
}

/// An event id as its column stores it: `UUID` on PostgreSQL, hyphenated
/// text elsewhere (as in the outbox table).
fn event_id_value(backend: DbBackend, id: Uuid) -> Value {
    match backend {
        DbBackend::Postgres => id.into(),
        _ => id.hyphenated().to_string().into(),
    }
}

/// What remains of `range` without `sequence`: the numbers before it and
/// those after it, each if not empty.
fn split_around(range: RangeInclusive<i64>, sequence: i64) -> Vec<RangeInclusive<i64>> {
    [*range.start()..=sequence - 1, sequence + 1..=*range.end()]
        .into_iter()
        .filter(|rest| !rest.is_empty())
        .collect()
}

/// Bind placeholders `$1..$N` on PostgreSQL, `?` elsewhere.
fn placeholders<const N: usize>(backend: DbBackend) -> [String; N] {
    std::array::from_fn(|index| match backend {
        DbBackend::Postgres => format!("${}", index + 1),
        _ => "?".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_name_the_missing_sequences() {
        let one = Gap {
            last_applied: 2,
            sequence: 4,
        };
        assert_eq!(one.to_string(), "sequence 3 is missing");
        let first_events = Gap {
            last_applied: 0,
            sequence: 4,
        };
        assert_eq!(first_events.to_string(), "sequences 1 to 3 are missing");
    }

    #[test]
    #[should_panic(expected = "an inbox consumer name has 1 to 255 characters")]
    fn consumer_names_fit_the_column() {
        let _ = Inbox::new("x".repeat(256), GapPolicy::Apply);
    }

    #[test]
    fn a_late_sequence_splits_its_gap() {
        assert_eq!(split_around(3..=7, 5), [3..=4, 6..=7]);
        assert_eq!(split_around(3..=7, 3), [4..=7]);
        assert_eq!(split_around(3..=7, 7), [3..=6]);
        assert!(split_around(4..=4, 4).is_empty());
    }

    #[test]
    fn placeholders_follow_the_backend() {
        assert_eq!(placeholders::<2>(DbBackend::Postgres), ["$1", "$2"]);
        assert_eq!(placeholders::<2>(DbBackend::MySql), ["?", "?"]);
    }
}
