//! The publishing loop: claim a batch, send it, settle it, repeat.
//!
//! Rows are marked only after the sink acknowledged them, so a crash at any
//! point causes duplicates at worst, never a loss. Per aggregate, rows are
//! marked up to the first failure only: later ones stay pending and are sent
//! again after it, so an aggregate's events are never published out of order
//! by a retry.
//!
//! The loop's decisions (what follows an empty claim, a failed send, a
//! refused settle, a shutdown) are in `relay/cycle.rs`, without I/O;
//! [`Relay::run`] performs what they say.
//!
//! A batch is bounded in bytes as well as in rows (`relay/byte_bound.rs`):
//! a backlog of large payloads is claimed a few rows at a time, and the
//! rows past the bound are cut off the end of a claim, left pending for
//! the next one.
//!
//! A failing aggregate cools down (exponential backoff of its own, up to
//! `max_backoff`) and is left out of the claims meanwhile, so one poison
//! message slows only its own aggregate; the whole relay pauses only when a
//! batch published nothing at all (an outage).

mod backoff;
mod byte_bound;
mod cycle;
mod retention;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::message::TopicTemplate;
use crate::metrics::BatchObservation;
use crate::record::OutboxRecord;
use crate::shutdown::Shutdown;
use crate::sink::{FailureKind, SendError, Sink};
use crate::source::{AggregateKey, Claim, FailedRow, InFlight, Settlement, Source, SourceError};

use backoff::Cooldown;
pub(crate) use backoff::{Backoff, INITIAL_BACKOFF};
use byte_bound::ByteBound;
pub use byte_bound::{DEFAULT_MAX_BATCH_BYTES, Shortened};
use cycle::{Answer, Batch, Cycle, Sent, Step, Wait};
pub(crate) use retention::run_retention;
pub use retention::{Retention, delete_published};

/// How the relay runs.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Rows claimed and sent at once.
    pub batch_size: usize,
    /// Bytes of rows claimed and sent at once, about (payloads and the
    /// other columns): a batch stops short of `batch_size` rows at this
    /// bound, always taking at least one row.
    pub max_batch_bytes: usize,
    /// Longest wait for new rows between claims.
    pub poll_interval: Duration,
    /// Attempts before a message the broker refuses for good is dead-lettered.
    pub max_attempts: i32,
    /// Longest pause after failures (outage, refused messages).
    pub max_backoff: Duration,
    /// Exit once no row is pending, instead of waiting for more.
    pub drain: bool,
    /// Periodic deletion of published rows; `None` keeps them.
    pub retention: Option<Retention>,
    /// How long to wait for messages in flight at shutdown.
    pub shutdown_timeout: Duration,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            batch_size: 500,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            poll_interval: Duration::from_millis(500),
            max_attempts: 10,
            max_backoff: Duration::from_secs(30),
            drain: false,
            retention: Some(Retention::default()),
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// Counts of one run.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Rows acknowledged and marked.
    pub published: AtomicU64,
    /// Failed sends (each failure of each attempt).
    pub failed: AtomicU64,
    /// Rows parked as dead letters.
    pub dead_lettered: AtomicU64,
}

/// Why a run ended early.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The sink can take no more messages; unpublished rows stay pending.
    #[error("the sink was closed ({0}); unpublished events stay pending")]
    SinkClosed(String),
}

/// What one cycle did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows marked published.
    pub published: usize,
    /// Rows whose send failed.
    pub failed: usize,
    /// Rows dead-lettered.
    pub dead_lettered: usize,
    /// Set when the sink can take no more messages.
    pub sink_closed: Option<String>,
    /// How the byte bound shortened the claim, if it did: more rows may
    /// be pending.
    pub shortened: Option<Shortened>,
}

/// Publishes committed outbox rows from a source to a sink.
pub struct Relay {
    source: Arc<dyn Source>,
    sink: Arc<dyn Sink>,
    topics: TopicTemplate,
    options: RelayOptions,
    stats: Arc<RelayStats>,
    cooldown: Mutex<Cooldown>,
    bytes: ByteBound,
}

impl Relay {
    /// A relay from `source` to `sink`.
    pub fn new(
        source: Arc<dyn Source>,
        sink: Arc<dyn Sink>,
        topics: TopicTemplate,
        options: RelayOptions,
    ) -> Self {
        Self {
            source,
            sink,
            topics,
            cooldown: Mutex::new(Cooldown::new(INITIAL_BACKOFF, options.max_backoff)),
            bytes: ByteBound::new(options.max_batch_bytes),
            options,
            stats: Arc::default(),
        }
    }

    /// The counters of this relay.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Publishes until `shutdown` is requested (or, with `drain`, until no
    /// row is pending), then flushes the sink. Fails when the sink closed.
    ///
    /// Where the source can hold two claims at once (PostgreSQL), the
    /// database work overlaps the broker's: while a full batch is at the
    /// sink, the previous batch's settle commits and the next batch is
    /// claimed, each aggregate after its rows in flight. A batch claimed ahead is sent
    /// only once the sink acknowledged every row before it; otherwise it is
    /// released and claimed again after the settle, so an aggregate's events
    /// never overtake one another.
    pub async fn run(&self, shutdown: Shutdown) -> Result<(), RelayError> {
        let cleanup = self.options.retention.clone().map(|retention| {
            tokio::spawn(run_retention(
                self.source.clone(),
                retention,
                shutdown.clone(),
            ))
        });
        let mut cycle = Cycle::new(&self.options);
        let mut step = cycle::start();
        let (answered, outcome) = loop {
            step = match step {
                Step::Wait { answered, wait } => {
                    let (settled, ()) =
                        tokio::join!(self.commit_if_any(answered), self.pause(wait, &shutdown));
                    cycle.waited(settled, shutdown.is_requested())
                }
                Step::Claim => cycle.claimed(self.claim().await),
                Step::ReleaseEmpty(batch) => {
                    cycle.released(batch.claim.settle(&Settlement::default()).await)
                }
                Step::CheckDrained => cycle.checked_drained(self.nothing_pending().await),
                Step::Send {
                    batch,
                    answered,
                    claim_ahead,
                } => {
                    let (sent, settled, ahead) =
                        self.send_and_settle(batch, answered, claim_ahead).await;
                    cycle.sent(sent, settled, ahead, shutdown.is_requested())
                }
                Step::Stop { answered, outcome } => break (answered, outcome),
            };
        };
        if let Some(answered) = answered
            && let Err(error) = self.commit(answered).await
        {
            tracing::error!(%error, "cannot mark the last acknowledged rows; they stay pending");
        }
        self.sink.flush(self.options.shutdown_timeout).await;
        if let Some(cleanup) = cleanup {
            cleanup.abort();
        }
        tracing::info!(
            published = self.stats.published.load(Ordering::Relaxed),
            failed = self.stats.failed.load(Ordering::Relaxed),
            dead_lettered = self.stats.dead_lettered.load(Ordering::Relaxed),
            "relay stopped"
        );
        outcome
    }

    /// Sends `batch` while the database settles the batch `answered` before
    /// it and then, if `claim_ahead`, claims the next batch, each aggregate
    /// after its rows in `batch`.
    async fn send_and_settle(
        &self,
        batch: Claimed,
        answered: Option<Answered>,
        claim_ahead: bool,
    ) -> (
        Sent<Answered>,
        Result<(), SourceError>,
        Result<Option<Claimed>, SourceError>,
    ) {
        let in_flight = if claim_ahead {
            batch.claim.in_flight()
        } else {
            InFlight::default()
        };
        let database = async {
            let settled = self.commit_if_any(answered).await;
            let ahead = match &settled {
                Ok(()) if !in_flight.is_empty() => self.claim_ahead(&in_flight).await,
                _ => Ok(None),
            };
            (settled, ahead)
        };
        let (sent, (settled, ahead)) = tokio::join!(self.send(batch), database);
        (sent, settled, ahead)
    }

    /// Settles `answered`, if there is a batch waiting.
    async fn commit_if_any(&self, answered: Option<Answered>) -> Result<(), SourceError> {
        match answered {
            Some(answered) => self.commit(answered).await.map(drop),
            None => Ok(()),
        }
    }

    /// Waits as `wait` says, or until shutdown is requested.
    async fn pause(&self, wait: Wait, shutdown: &Shutdown) {
        let wait = async {
            match wait {
                Wait::Skip => {}
                Wait::ForRows => self.source.wait_for_rows(self.options.poll_interval).await,
                Wait::Backoff(pause) => tokio::time::sleep(pause).await,
            }
        };
        tokio::select! {
            () = shutdown.requested() => {}
            () = wait => {}
        }
    }

    /// Whether no row is pending in the whole table (dead letters aside).
    async fn nothing_pending(&self) -> bool {
        match self.source.backlog().await {
            Ok(backlog) => backlog.pending == 0,
            Err(error) => {
                tracing::warn!(%error, "cannot count pending rows");
                false
            }
        }
    }

    /// One cycle: claims a batch (leaving out cooling-down aggregates),
    /// publishes it and settles it.
    pub async fn publish_batch(&self) -> Result<BatchReport, SourceError> {
        let batch = self.claim().await?;
        let claimed = batch.claim.records().len();
        if claimed == 0 {
            batch.claim.settle(&Settlement::default()).await?;
            return Ok(BatchReport::default());
        }
        match self.send(batch).await {
            Sent::Answered(answered) => self.commit(answered).await,
            Sent::Abandoned => Ok(BatchReport {
                claimed,
                ..BatchReport::default()
            }),
        }
    }

    /// Claims a batch, leaving out cooling-down aggregates.
    async fn claim(&self) -> Result<Claimed, SourceError> {
        let excluded = self.cooling();
        let claimed_at = Instant::now();
        let limit = self.bytes.limit(self.options.batch_size);
        let claim = self.source.claim(limit, &excluded).await?;
        Ok(self.bounded(claim, limit, claimed_at))
    }

    /// A claim made with `limit` rows, cut to the byte bound.
    fn bounded(&self, mut claim: Box<dyn Claim>, limit: usize, claimed_at: Instant) -> Claimed {
        let (kept, shortened) = self
            .bytes
            .cut(claim.records(), limit, self.options.batch_size);
        if shortened == Some(Shortened::Cut) {
            tracing::debug!(
                claimed = claim.records().len(),
                kept,
                max_batch_bytes = self.options.max_batch_bytes,
                "cut the batch at the byte bound; the rest stays pending"
            );
            claim.truncate(kept);
        }
        Claimed {
            claim,
            claimed_at,
            shortened,
        }
    }

    /// Claims the next batch while the rows `in_flight` are at the sink;
    /// `None` when the source cannot, or finds nothing.
    async fn claim_ahead(&self, in_flight: &InFlight) -> Result<Option<Claimed>, SourceError> {
        let excluded = self.cooling();
        let claimed_at = Instant::now();
        let limit = self.bytes.limit(self.options.batch_size);
        let claim = self.source.claim_ahead(limit, &excluded, in_flight).await?;
        Ok(claim
            .filter(|claim| !claim.records().is_empty())
            .map(|claim| self.bounded(claim, limit, claimed_at)))
    }

    /// The aggregates cooling down now.
    fn cooling(&self) -> Vec<AggregateKey> {
        self.cooldown
            .lock()
            .expect("cooldown lock")
            .cooling(Instant::now())
    }

    /// Publishes a claimed batch and decides each row's fate.
    async fn send(&self, batch: Claimed) -> Sent<Answered> {
        let Claimed {
            claim,
            claimed_at,
            shortened,
        } = batch;
        let records = claim.records();
        let send_until = claim.send_until();
        if send_until.is_some_and(|until| Instant::now() >= until) {
            tracing::warn!(
                claimed = records.len(),
                "the shard lease ran out before publishing (was the relay paused?); \
                 abandoning the batch to the shards' next owner"
            );
            return Sent::Abandoned;
        }
        let messages = self.topics.messages(records);
        // A pause may come at any point from here on: the sink checks the
        // lease's end before each message it hands to the broker.
        let outcomes = match send_until {
            Some(until) => self.sink.publish_until(&messages, until).await,
            None => self.sink.publish(&messages).await,
        };
        let settlement = settle(records, &outcomes, self.options.max_attempts);
        let report = BatchReport {
            claimed: records.len(),
            published: settlement.published.len(),
            failed: settlement.failed.len(),
            dead_lettered: settlement
                .failed
                .iter()
                .filter(|row| row.dead_letter)
                .count(),
            sink_closed: outcomes.iter().find_map(|outcome| match outcome {
                Err(error) if error.kind == FailureKind::Closed => Some(error.reason.clone()),
                _ => None,
            }),
            shortened,
        };
        if let Some(first) = settlement.failed.first() {
            tracing::warn!(
                failed = report.failed,
                dead_lettered = report.dead_lettered,
                held_back = report.claimed - report.published - report.failed,
                first_error = %first.error,
                "events not published; retrying with backoff"
            );
        }
        // Cooldowns are a pacing hint: updating them before the settle
        // commits is harmless even if it then fails.
        self.cooldown
            .lock()
            .expect("cooldown lock")
            .record(records, &settlement, Instant::now());
        let observation = settlement.observe(records, claimed_at);
        Sent::Answered(Answered {
            claim,
            settlement,
            observation,
            report,
        })
    }

    /// Settles a batch the sink answered: marks its published rows and
    /// records its failures in one commit.
    async fn commit(&self, answered: Answered) -> Result<BatchReport, SourceError> {
        let Answered {
            claim,
            settlement,
            observation,
            report,
        } = answered;
        claim.settle(&settlement).await?;
        observation.record();
        self.stats
            .published
            .fetch_add(report.published as u64, Ordering::Relaxed);
        self.stats
            .failed
            .fetch_add(report.failed as u64, Ordering::Relaxed);
        self.stats
            .dead_lettered
            .fetch_add(report.dead_lettered as u64, Ordering::Relaxed);
        tracing::debug!(?report, "batch settled");
        Ok(report)
    }
}

/// A claimed batch, not sent yet.
struct Claimed {
    claim: Box<dyn Claim>,
    claimed_at: Instant,
    shortened: Option<Shortened>,
}

/// A batch the sink answered, waiting for its settle.
struct Answered {
    claim: Box<dyn Claim>,
    settlement: Settlement,
    observation: BatchObservation,
    report: BatchReport,
}

impl Batch for Claimed {
    fn rows(&self) -> usize {
        self.claim.records().len()
    }

    fn shortened(&self) -> Option<Shortened> {
        self.shortened
    }
}

impl Answer for Answered {
    fn report(&self) -> &BatchReport {
        &self.report
    }
}

/// Decides the fate of each claimed row from the sink's outcomes.
///
/// Per aggregate, rows are published up to the first failure; the failed
/// row is charged an attempt (and dead-lettered when the broker refuses it
/// for good and attempts are used up); the aggregate's later rows stay
/// pending untouched, whatever their outcome, so they are re-sent after it.
pub fn settle(
    records: &[OutboxRecord],
    outcomes: &[Result<(), SendError>],
    max_attempts: i32,
) -> Settlement {
    let mut settlement = Settlement::default();
    let mut stopped: HashSet<(&str, &str)> = HashSet::new();
    for (record, outcome) in records.iter().zip(outcomes) {
        let aggregate = (record.aggregate_type.as_str(), record.aggregate_id.as_str());
        if stopped.contains(&aggregate) {
            continue;
        }
        match outcome {
            Ok(()) => settlement.published.push(record.id.clone()),
            Err(error) => {
                stopped.insert(aggregate);
                if matches!(error.kind, FailureKind::HeldBack | FailureKind::Closed) {
                    continue;
                }
                let dead_letter =
                    error.kind == FailureKind::Permanent && record.attempts + 1 >= max_attempts;
                settlement.failed.push(FailedRow {
                    id: record.id.clone(),
                    error: error.reason.clone(),
                    dead_letter,
                });
            }
        }
    }
    settlement
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::record::test_record as record;
    use crate::source::SourceOptions;
    use crate::source::sqlite::SqliteSource;

    /// A claim made under a shard lease that ends at `until`.
    struct Leased {
        records: Vec<OutboxRecord>,
        until: Instant,
    }

    #[async_trait::async_trait]
    impl Claim for Leased {
        fn records(&self) -> &[OutboxRecord] {
            &self.records
        }

        fn send_until(&self) -> Option<Instant> {
            Some(self.until)
        }

        fn truncate(&mut self, len: usize) {
            self.records.truncate(len);
        }

        async fn settle(self: Box<Self>, _: &Settlement) -> Result<(), SourceError> {
            Ok(())
        }
    }

    /// A sink that hands messages over one at a time, as the brokers'
    /// sinks do, and stops for `pause` (as a relay stopped with SIGSTOP)
    /// after the first one; it records every message it handed over.
    struct Pausing {
        pause: Duration,
        handed_over: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl Sink for Pausing {
        async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>> {
            self.publish_until(messages, Instant::now() + Duration::from_secs(3600))
                .await
        }

        async fn publish_until(
            &self,
            messages: &[Message<'_>],
            fresh_until: Instant,
        ) -> Vec<Result<(), SendError>> {
            let mut outcomes = Vec::new();
            for (index, message) in messages.iter().enumerate() {
                if index == 1 {
                    std::thread::sleep(self.pause);
                }
                if Instant::now() >= fresh_until {
                    outcomes.push(Err(SendError::stale()));
                    continue;
                }
                self.handed_over
                    .lock()
                    .unwrap()
                    .push(message.key.to_string());
                outcomes.push(Ok(()));
            }
            outcomes
        }

        async fn flush(&self, _: Duration) {}
    }

    async fn relay_to(sink: Arc<Pausing>) -> Relay {
        let source = SqliteSource::connect("sqlite::memory:", SourceOptions::default())
            .await
            .expect("in-memory SQLite");
        Relay::new(
            Arc::new(source),
            sink,
            TopicTemplate::new("t"),
            RelayOptions::default(),
        )
    }

    fn leased(until: Instant) -> Claimed {
        Claimed {
            claim: Box::new(Leased {
                records: vec![
                    record("a1", "a", 0),
                    record("b1", "b", 0),
                    record("c1", "c", 0),
                ],
                until,
            }),
            claimed_at: Instant::now(),
            shortened: None,
        }
    }

    /// A relay paused in the middle of a batch, past its shard lease,
    /// hands none of the batch's remaining messages to the broker once
    /// resumed: another relay owns those shards by then.
    #[tokio::test]
    async fn a_batch_stops_at_the_end_of_its_lease() {
        let sink = Arc::new(Pausing {
            pause: Duration::from_millis(300),
            handed_over: Mutex::default(),
        });
        let relay = relay_to(sink.clone()).await;
        let Sent::Answered(answered) = relay
            .send(leased(Instant::now() + Duration::from_millis(200)))
            .await
        else {
            panic!("a batch under a valid lease is sent");
        };
        assert_eq!(*sink.handed_over.lock().unwrap(), ["a"]);
        assert_eq!(answered.settlement.published, ["a1"]);
        assert_eq!(answered.report.failed, 2, "the rest stays pending");
    }

    /// A batch whose lease ran out before the send is abandoned whole.
    #[tokio::test]
    async fn a_batch_past_its_lease_is_abandoned() {
        let sink = Arc::new(Pausing {
            pause: Duration::ZERO,
            handed_over: Mutex::default(),
        });
        let relay = relay_to(sink.clone()).await;
        let sent = relay.send(leased(Instant::now())).await;
        assert!(matches!(sent, Sent::Abandoned));
        assert!(sink.handed_over.lock().unwrap().is_empty());
    }

    #[test]
    fn an_aggregate_stops_at_its_first_failure() {
        let records = [
            record("a1", "a", 0),
            record("b1", "b", 0),
            record("a2", "a", 0),
            record("b2", "b", 0),
            record("a3", "a", 0),
        ];
        let outcomes = [
            Ok(()),
            Err(SendError::transient("down")),
            Ok(()),
            Ok(()), // acknowledged, but b1 failed: must be sent again after it
            Ok(()),
        ];
        let settlement = settle(&records, &outcomes, 3);
        assert_eq!(settlement.published, ["a1", "a2", "a3"]);
        assert_eq!(
            settlement.failed,
            [FailedRow {
                id: "b1".into(),
                error: "down".into(),
                dead_letter: false
            }]
        );
    }

    #[test]
    fn held_back_rows_are_not_charged() {
        let records = [record("a1", "a", 0), record("a2", "a", 0)];
        let outcomes = [Err(SendError::held_back()), Err(SendError::held_back())];
        assert!(settle(&records, &outcomes, 3).is_empty());
    }

    #[test]
    fn only_permanent_failures_are_dead_lettered_at_the_limit() {
        let records = [
            record("a1", "a", 2),
            record("b1", "b", 2),
            record("c1", "c", 0),
        ];
        let outcomes = [
            Err(SendError::permanent("too large")),
            Err(SendError::transient("down")),
            Err(SendError::permanent("too large")),
        ];
        let dead: Vec<_> = settle(&records, &outcomes, 3)
            .failed
            .iter()
            .map(|row| (row.id.clone(), row.dead_letter))
            .collect();
        assert_eq!(
            dead,
            [
                ("a1".into(), true),
                ("b1".into(), false),
                ("c1".into(), false)
            ]
        );
    }
}
