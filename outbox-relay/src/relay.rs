//! The publishing loop: claim a batch, send it, settle it, repeat.
//!
//! Rows are marked only after the sink acknowledged them, so a crash at any
//! point causes duplicates at worst, never a loss. Per aggregate, rows are
//! marked up to the first failure only: later ones stay pending and are sent
//! again after it, so an aggregate's events are never published out of order
//! by a retry.
//!
//! A failing aggregate cools down (exponential backoff of its own, up to
//! `max_backoff`) and is left out of the claims meanwhile, so one poison
//! message slows only its own aggregate; the whole relay pauses only when a
//! batch published nothing at all (an outage).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::message::{Message, TopicTemplate};
use crate::metrics::BatchObservation;
use crate::record::OutboxRecord;
use crate::shutdown::Shutdown;
use crate::sink::{FailureKind, SendError, Sink};

use crate::source::{AggregateKey, Claim, FailedRow, InFlight, Settlement, Source, SourceError};

/// How the relay runs.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Rows claimed and sent at once.
    pub batch_size: usize,
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
            poll_interval: Duration::from_millis(500),
            max_attempts: 10,
            max_backoff: Duration::from_secs(30),
            drain: false,
            retention: Some(Retention::default()),
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// Deletion of published rows older than a window.
#[derive(Debug, Clone)]
pub struct Retention {
    /// Keep published rows this long.
    pub keep_for: Duration,
    /// Run the deletion this often.
    pub interval: Duration,
    /// Rows per `DELETE`, so no statement holds locks for long.
    pub batch_size: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            keep_for: Duration::from_secs(7 * 24 * 3600),
            interval: Duration::from_secs(600),
            batch_size: 1000,
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
}

/// Publishes committed outbox rows from a source to a sink.
pub struct Relay {
    source: Arc<dyn Source>,
    sink: Arc<dyn Sink>,
    topics: TopicTemplate,
    options: RelayOptions,
    stats: Arc<RelayStats>,
    cooldown: Mutex<Cooldown>,
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
        let mut backoff = Backoff::new(INITIAL_BACKOFF, self.options.max_backoff);
        let mut outcome = Ok(());
        // The batch the sink answered last, until its settle commits.
        let mut answered: Option<Answered> = None;
        // The batch claimed while `answered` was at the sink.
        let mut ahead: Option<Claimed> = None;
        let mut next = Next::Claim;
        while !shutdown.is_requested() {
            let batch = match ahead.take() {
                Some(batch) => batch,
                None => {
                    // The last batch settles while the loop waits.
                    let (settled, ()) = tokio::join!(
                        self.commit_if_any(answered.take()),
                        self.pause(next, &shutdown)
                    );
                    if let Err(error) = settled {
                        next = Next::Sleep(database_failed(&mut backoff, &error));
                        continue;
                    }
                    if shutdown.is_requested() {
                        break;
                    }
                    let batch = match self.claim().await {
                        Ok(batch) => batch,
                        Err(error) => {
                            next = Next::Sleep(database_failed(&mut backoff, &error));
                            continue;
                        }
                    };
                    if batch.claim.records().is_empty() {
                        if let Err(error) = batch.claim.settle(&Settlement::default()).await {
                            next = Next::Sleep(database_failed(&mut backoff, &error));
                            continue;
                        }
                        // Other instances' shards (or shards whose dead
                        // owner's lease has not expired yet) may still hold
                        // rows.
                        if self.options.drain && self.nothing_pending().await {
                            break;
                        }
                        backoff.reset();
                        next = Next::WaitForRows;
                        continue;
                    }
                    batch
                }
            };

            // A full batch suggests more rows: claim the next one while this
            // one is at the sink, once the previous batch has settled.
            let in_flight = if batch.claim.records().len() == self.options.batch_size {
                InFlight::of(batch.claim.records())
            } else {
                InFlight::default()
            };
            let previous = answered.take();
            let database = async {
                let settled = self.commit_if_any(previous).await;
                let ahead = match &settled {
                    Ok(()) if !in_flight.is_empty() => self.claim_ahead(&in_flight).await,
                    _ => Ok(None),
                };
                (settled, ahead)
            };
            let (sent, (settled, claimed_ahead)) = tokio::join!(self.send(batch), database);
            if let Err(error) = settled {
                // Both batches stay pending, so no aggregate has a later
                // event marked while an earlier one is not.
                next = Next::Sleep(database_failed(&mut backoff, &error));
                continue;
            }
            let claimed_ahead = claimed_ahead.unwrap_or_else(|error| {
                tracing::warn!(%error, "cannot claim the next batch ahead; claiming after the settle");
                None
            });
            let sent = match sent {
                Sent::Answered(sent) => sent,
                Sent::Abandoned => {
                    next = Next::Claim;
                    continue;
                }
            };
            let report = &sent.report;
            if let Some(reason) = report.sink_closed.clone() {
                if let Err(error) = self.commit(sent).await {
                    tracing::error!(%error, "cannot mark the acknowledged rows; they stay pending");
                }
                outcome = Err(RelayError::SinkClosed(reason));
                break;
            }
            next = if report.failed > 0 && report.published == 0 {
                // Nothing got through: an outage, not a poison message.
                Next::Sleep(backoff.next())
            } else {
                backoff.reset();
                if report.claimed == self.options.batch_size || self.options.drain {
                    Next::Claim
                } else {
                    Next::WaitForRows
                }
            };
            if report.published == report.claimed {
                ahead = claimed_ahead;
            }
            answered = Some(sent);
        }
        drop(ahead);
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

    /// Settles `answered`, if there is a batch waiting.
    async fn commit_if_any(&self, answered: Option<Answered>) -> Result<(), SourceError> {
        match answered {
            Some(answered) => self.commit(answered).await.map(drop),
            None => Ok(()),
        }
    }

    /// Waits as `next` says, or until shutdown is requested.
    async fn pause(&self, next: Next, shutdown: &Shutdown) {
        let wait = async {
            match next {
                Next::Claim => {}
                Next::WaitForRows => self.source.wait_for_rows(self.options.poll_interval).await,
                Next::Sleep(pause) => tokio::time::sleep(pause).await,
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
        let claim = self
            .source
            .claim(self.options.batch_size, &excluded)
            .await?;
        Ok(Claimed { claim, claimed_at })
    }

    /// Claims the next batch while the rows `in_flight` are at the sink;
    /// `None` when the source cannot, or finds nothing.
    async fn claim_ahead(&self, in_flight: &InFlight) -> Result<Option<Claimed>, SourceError> {
        let excluded = self.cooling();
        let claimed_at = Instant::now();
        let claim = self
            .source
            .claim_ahead(self.options.batch_size, &excluded, in_flight)
            .await?;
        Ok(claim
            .filter(|claim| !claim.records().is_empty())
            .map(|claim| Claimed { claim, claimed_at }))
    }

    /// The aggregates cooling down now.
    fn cooling(&self) -> Vec<AggregateKey> {
        self.cooldown
            .lock()
            .expect("cooldown lock")
            .cooling(Instant::now())
    }

    /// Publishes a claimed batch and decides each row's fate.
    async fn send(&self, batch: Claimed) -> Sent {
        let Claimed { claim, claimed_at } = batch;
        let records = claim.records();
        if !claim.lease_valid() {
            tracing::warn!(
                claimed = records.len(),
                "the shard lease ran out before publishing (was the relay paused?); \
                 abandoning the batch to the shards' next owner"
            );
            return Sent::Abandoned;
        }
        let messages: Vec<Message> = records
            .iter()
            .map(|record| self.topics.message(record))
            .collect();
        let outcomes = self.sink.publish(&messages).await;
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
}

/// What sending a batch came to.
enum Sent {
    /// The sink answered every row.
    Answered(Answered),
    /// The shard lease ran out: nothing was sent, the claim is released.
    Abandoned,
}

/// A batch the sink answered, waiting for its settle.
struct Answered {
    claim: Box<dyn Claim>,
    settlement: Settlement,
    observation: BatchObservation,
    report: BatchReport,
}

/// What the loop does before its next claim.
#[derive(Debug, Clone, Copy)]
enum Next {
    /// Claim at once: the last batch was full.
    Claim,
    /// Wait for new rows, at most the poll interval.
    WaitForRows,
    /// Pause after a failure.
    Sleep(Duration),
}

/// Logs a failed claim or settle and returns the pause before the next try.
fn database_failed(backoff: &mut Backoff, error: &SourceError) -> Duration {
    let pause = backoff.next();
    tracing::error!(%error, retry_in = ?pause, "cannot claim or mark outbox rows");
    pause
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

/// Deletes old published rows every `retention.interval`.
pub(crate) async fn run_retention(
    source: Arc<dyn Source>,
    retention: Retention,
    shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            () = shutdown.requested() => return,
            () = tokio::time::sleep(retention.interval) => {}
        }
        match delete_published(source.as_ref(), &retention, &shutdown, |_| {}).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted published rows past retention"),
            Err(error) => {
                tracing::warn!(%error, "retention cleanup failed; retrying next interval")
            }
        }
    }
}

/// Deletes published rows older than the window in batches, reporting
/// each batch to `progress`; returns how many.
pub async fn delete_published(
    source: &dyn Source,
    retention: &Retention,
    shutdown: &Shutdown,
    mut progress: impl FnMut(u64),
) -> Result<u64, SourceError> {
    let mut total = 0;
    loop {
        let deleted = source
            .delete_published(retention.keep_for, retention.batch_size)
            .await?;
        total += deleted;
        progress(deleted);
        if deleted < retention.batch_size || shutdown.is_requested() {
            return Ok(total);
        }
    }
}

/// The first pause after a failure, for the relay and for an aggregate.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// Aggregates whose last attempt failed, with when they may be tried again.
#[derive(Debug)]
struct Cooldown {
    initial: Duration,
    max: Duration,
    aggregates: HashMap<AggregateKey, (Instant, Duration)>,
}

impl Cooldown {
    fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            aggregates: HashMap::new(),
        }
    }

    /// Aggregates still cooling down at `now`, to leave out of the claim.
    fn cooling(&self, now: Instant) -> Vec<AggregateKey> {
        let mut cooling: Vec<AggregateKey> = self
            .aggregates
            .iter()
            .filter(|(_, (until, _))| *until > now)
            .map(|(key, _)| key.clone())
            .collect();
        cooling.sort();
        cooling
    }

    /// A published row ends its aggregate's cooldown; a failed one starts
    /// or doubles it; a dead-lettered one ends it, so later events proceed.
    fn record(&mut self, records: &[OutboxRecord], settlement: &Settlement, now: Instant) {
        let published: HashSet<&str> = settlement.published.iter().map(String::as_str).collect();
        let failed: HashMap<&str, &FailedRow> = settlement
            .failed
            .iter()
            .map(|row| (row.id.as_str(), row))
            .collect();
        for record in records {
            let key = AggregateKey::of(record);
            if published.contains(record.id.as_str()) {
                self.aggregates.remove(&key);
            } else if let Some(row) = failed.get(record.id.as_str()) {
                if row.dead_letter {
                    self.aggregates.remove(&key);
                } else {
                    let pause = match self.aggregates.get(&key) {
                        Some((_, previous)) => (*previous * 2).min(self.max),
                        None => self.initial,
                    };
                    self.aggregates.insert(key, (now + pause, pause));
                }
            }
        }
    }
}

/// Exponential backoff with a cap.
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            current: initial,
        }
    }

    pub(crate) fn next(&mut self) -> Duration {
        let pause = self.current;
        self.current = (self.current * 2).min(self.max);
        pause
    }

    pub(crate) fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, aggregate: &str, attempts: i32) -> OutboxRecord {
        OutboxRecord {
            id: id.into(),
            aggregate_type: "Order".into(),
            aggregate_id: aggregate.into(),
            event_type: "E".into(),
            payload: Some("{}".into()),
            event_version: 1,
            aggregate_seq: None,
            traceparent: None,
            seq: 0,
            attempts,
            age_at_claim: 0.0,
        }
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

    #[test]
    fn failing_aggregates_cool_down_and_recover() {
        let mut cooldown = Cooldown::new(Duration::from_millis(100), Duration::from_millis(300));
        let records = [record("a1", "a", 0), record("b1", "b", 0)];
        let failed_a = Settlement {
            published: vec!["b1".into()],
            failed: vec![FailedRow {
                id: "a1".into(),
                error: "refused".into(),
                dead_letter: false,
            }],
        };
        let start = Instant::now();
        cooldown.record(&records, &failed_a, start);
        let keys = |keys: Vec<AggregateKey>| -> Vec<String> {
            keys.into_iter().map(|key| key.aggregate_id).collect()
        };
        assert_eq!(keys(cooldown.cooling(start)), ["a"]);
        assert!(
            cooldown
                .cooling(start + Duration::from_millis(150))
                .is_empty()
        );
        // Failing again doubles the pause, up to the cap.
        cooldown.record(&records, &failed_a, start);
        cooldown.record(&records, &failed_a, start);
        cooldown.record(&records, &failed_a, start);
        assert_eq!(
            keys(cooldown.cooling(start + Duration::from_millis(250))),
            ["a"]
        );
        assert!(
            cooldown
                .cooling(start + Duration::from_millis(350))
                .is_empty()
        );
        // Success or a dead letter ends it.
        let a_published = Settlement {
            published: vec!["a1".into()],
            failed: vec![],
        };
        cooldown.record(&records, &a_published, start);
        assert!(cooldown.cooling(start).is_empty());
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let pauses: Vec<_> = (0..4).map(|_| backoff.next().as_millis()).collect();
        assert_eq!(pauses, [100, 200, 350, 350]);
        backoff.reset();
        assert_eq!(backoff.next().as_millis(), 100);
    }
}
