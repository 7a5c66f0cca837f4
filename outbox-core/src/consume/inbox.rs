//! [`Inbox`]: applies a consumed event's effect at most once per consumer,
//! in the consumer's own transaction.
//!
//! Two tables (created by the `outbox-migrations` crate) keep what each
//! consumer has applied:
//!
//! - [`INBOX_TABLE`]: the ids of the events applied, per consumer, with
//!   when; retention deletes old ids ([`Inbox::delete_processed`]);
//! - [`INBOX_SEQUENCE_TABLE`]: per consumer, topic and aggregate, the
//!   highest `aggregateSequence` applied, kept for good, so a redelivery
//!   is recognised after its id was deleted.
//!
//! Concurrency: the aggregate's high-water row is locked (an upsert) before
//! anything is decided, and the event id is inserted under a unique key, so
//! two processes handling one event at once serialize on the database: the
//! second waits for the first transaction and then finds the event applied.

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

/// Longest consumer name: the width of the tables' `consumer` column.
pub const MAX_CONSUMER_NAME_LEN: usize = 255;

/// Ids deleted per statement by [`Inbox::delete_processed`].
const DELETE_BATCH: u64 = 1000;

/// What to do with an event whose `aggregateSequence` jumps ahead of the
/// last one applied for its aggregate (events in between are missing).
///
/// A gap appears when the consumer starts reading a topic after an
/// aggregate's first events, when events were lost upstream, or when the
/// relay dead-lettered an event (a re-driven dead letter is published after
/// the aggregate's later events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapPolicy {
    /// Apply the event and move the high-water mark to it. A missing event
    /// that arrives later is then older than the mark and skipped as
    /// [`Outcome::Stale`]. Suits effects that only need the latest state.
    Apply,
    /// Do not apply it: [`Outcome::Held`] reports the gap and nothing is
    /// recorded, so the caller can wait and retry, park the message for
    /// later, or stop. Suits effects that need every event in order.
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
///         Outcome::Applied { .. } | Outcome::Duplicate | Outcome::Stale { .. } => {}
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
    /// This consumer applied the event already (same event id): skipped.
    Duplicate,
    /// The aggregate's high-water mark is at or past the event's sequence
    /// number: an event that arrived after a later one of its aggregate
    /// had been applied, or a redelivery whose id retention has deleted.
    /// Skipped.
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
        matches!(self, Outcome::Applied { .. })
    }

    /// What the effect returned, if it ran.
    pub fn into_value(self) -> Option<R> {
        match self {
            Outcome::Applied { value, .. } => Some(value),
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
    /// consumer applied it already ([`Outcome::Duplicate`]), applied a later
    /// event of its aggregate ([`Outcome::Stale`]), or it follows a gap and
    /// the policy is [`GapPolicy::Hold`] ([`Outcome::Held`]).
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
                    return Ok(if self.is_recorded(txn, event.id).await? {
                        Outcome::Duplicate
                    } else {
                        Outcome::Stale { last_applied }
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

    /// Deletes the ids of events this consumer applied more than
    /// `older_than` ago, in batches of a thousand; returns how many.
    ///
    /// The high-water marks stay, so redeliveries of deleted events that
    /// carry an `aggregateSequence` are still skipped (as
    /// [`Outcome::Stale`]); an event without one would be applied again,
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
    fn placeholders_follow_the_backend() {
        assert_eq!(placeholders::<2>(DbBackend::Postgres), ["$1", "$2"]);
        assert_eq!(placeholders::<2>(DbBackend::MySql), ["?", "?"]);
    }
}
