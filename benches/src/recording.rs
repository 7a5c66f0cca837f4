//! Sinks of the benchmarks, around or instead of the Kafka sink: one that
//! timestamps what passes through it, one that acknowledges without a
//! broker. The relays run unchanged (the polling relay and the CDC relay
//! call the same `Sink::publish`). [`CommitToAck`] turns the timestamps and
//! the commits of a fixed-rate run into latencies.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_relay::message::{HEADER_ID, Message};
use outbox_relay::sink::{SendError, Sink};

use crate::stats::{self, LatencySummary};

/// One `publish` call.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// Messages in the call.
    pub messages: usize,
    /// When the relay handed the batch over.
    pub started: Instant,
    /// When the sink answered.
    pub answered: Instant,
}

impl Call {
    /// How long the sink took.
    pub fn took(&self) -> Duration {
        self.answered - self.started
    }
}

/// An acknowledged message.
#[derive(Debug, Clone)]
pub struct Ack {
    /// The event id (the `id` header).
    pub id: String,
    /// When the relay handed the message to the sink.
    pub handed_over: Instant,
    /// When the sink answered `Ok` for it.
    pub acknowledged: Instant,
}

/// What a [`RecordingSink`] saw, taken out of it.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Every acknowledged message.
    pub acks: Vec<Ack>,
    /// Every call, in order.
    pub calls: Vec<Call>,
}

/// Records when each message was handed over and acknowledged (the inner
/// sink answered `Ok`), and every call.
pub struct RecordingSink {
    inner: Arc<dyn Sink>,
    recorded: Mutex<Recorded>,
    /// Acknowledged messages so far, readable without the lock.
    acknowledged: AtomicUsize,
    /// Refused sends so far.
    refused: AtomicUsize,
}

impl RecordingSink {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Sink>) -> Self {
        Self {
            inner,
            recorded: Mutex::default(),
            acknowledged: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
        }
    }

    /// Messages acknowledged so far.
    pub fn acknowledged(&self) -> usize {
        self.acknowledged.load(Ordering::Acquire)
    }

    /// Sends the inner sink answered with an error so far.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::Acquire)
    }

    /// Takes what was recorded so far.
    pub fn take(&self) -> Recorded {
        std::mem::take(&mut *self.recorded.lock().expect("recording lock"))
    }
}

#[async_trait]
impl Sink for RecordingSink {
    async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>> {
        let started = Instant::now();
        let outcomes = self.inner.publish(messages).await;
        let answered = Instant::now();
        let mut recorded = self.recorded.lock().expect("recording lock");
        recorded.calls.push(Call {
            messages: messages.len(),
            started,
            answered,
        });
        let (mut acked, mut refused) = (0, 0);
        for (message, outcome) in messages.iter().zip(&outcomes) {
            if outcome.is_err() {
                refused += 1;
                continue;
            }
            if let Some((_, id)) = message.headers.iter().find(|(name, _)| *name == HEADER_ID) {
                acked += 1;
                recorded.acks.push(Ack {
                    id: id.to_string(),
                    handed_over: started,
                    acknowledged: answered,
                });
            }
        }
        drop(recorded);
        self.refused.fetch_add(refused, Ordering::AcqRel);
        self.acknowledged.fetch_add(acked, Ordering::AcqRel);
        outcomes
    }

    async fn flush(&self, timeout: Duration) {
        self.inner.flush(timeout).await;
    }
}

/// A sink without a broker: acknowledges every message at once. The relay
/// publishing to it runs only its own claim and settle SQL (and builds the
/// messages): the database's ceiling.
pub struct NoBrokerSink;

#[async_trait]
impl Sink for NoBrokerSink {
    async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>> {
        vec![Ok(()); messages.len()]
    }

    async fn flush(&self, _timeout: Duration) {}
}

/// One committed transaction of a fixed-rate run.
pub struct Commit {
    /// Its number in the run.
    pub n: usize,
    /// The ids of its events.
    pub ids: Vec<String>,
    /// When the schedule wanted it committed.
    pub due: Instant,
    /// When `commit()` returned.
    pub committed: Instant,
}

/// Latencies of the commits from number `warmup` on, matched with the
/// acknowledgements a [`RecordingSink`] recorded.
pub struct CommitToAck {
    /// Events committed in the measured window.
    pub events: usize,
    /// Events committed in the measured window per second of it.
    pub achieved_rate: f64,
    /// Measured events never acknowledged.
    pub unacknowledged: usize,
    /// From `commit()` returning to the sink answering `Ok`.
    pub commit_to_ack: LatencySummary,
    /// From `commit()` returning to the relay handing the event over.
    pub commit_to_handover: LatencySummary,
    /// From the hand-over to the sink answering `Ok`.
    pub handover_to_ack: LatencySummary,
    /// How late each commit returned against its schedule.
    pub commit_lag: LatencySummary,
    /// Sink calls in the measured window.
    pub batches: usize,
    /// Messages per sink call in the window.
    pub mean_batch_size: f64,
    /// Duration of the sink calls in the window.
    pub sink_call: LatencySummary,
    /// Acknowledgements timestamped before their `commit()` returned.
    pub acked_before_commit_returned: usize,
}

impl CommitToAck {
    /// Measures `commits` numbered `warmup` and later, the first of which
    /// was due at `window_start`, against `recorded`.
    pub fn measure(
        commits: &[Commit],
        recorded: Recorded,
        warmup: usize,
        window_start: Instant,
    ) -> Self {
        let Recorded { acks, calls } = recorded;
        let acks: HashMap<&str, &Ack> = acks.iter().map(|ack| (ack.id.as_str(), ack)).collect();
        let measured: Vec<&Commit> = commits.iter().filter(|commit| commit.n >= warmup).collect();
        let last_commit = measured.iter().map(|commit| commit.committed).max();
        let mut commit_to_ack = Vec::new();
        let mut commit_to_handover = Vec::new();
        let mut handover_to_ack = Vec::new();
        let mut commit_lag = Vec::new();
        let mut acked_early = 0;
        let mut events = 0;
        for commit in &measured {
            commit_lag.push(commit.committed.saturating_duration_since(commit.due));
            events += commit.ids.len();
            for id in &commit.ids {
                let Some(ack) = acks.get(id.as_str()) else {
                    continue;
                };
                if ack.acknowledged < commit.committed {
                    acked_early += 1;
                }
                commit_to_ack.push(ack.acknowledged.saturating_duration_since(commit.committed));
                commit_to_handover
                    .push(ack.handed_over.saturating_duration_since(commit.committed));
                handover_to_ack.push(ack.acknowledged - ack.handed_over);
            }
        }
        let sink_calls: Vec<Call> = calls
            .into_iter()
            .filter(|call| call.started >= window_start && call.messages > 0)
            .collect();
        let batches = sink_calls.len();
        let mean_batch_size = if batches == 0 {
            0.0
        } else {
            sink_calls.iter().map(|call| call.messages).sum::<usize>() as f64 / batches as f64
        };
        let mut sink_times: Vec<Duration> = sink_calls.iter().map(Call::took).collect();
        Self {
            events,
            achieved_rate: last_commit.map_or(0.0, |last| {
                stats::per_second(events, last.saturating_duration_since(window_start))
            }),
            unacknowledged: events - commit_to_ack.len(),
            commit_to_ack: LatencySummary::of(&mut commit_to_ack),
            commit_to_handover: LatencySummary::of(&mut commit_to_handover),
            handover_to_ack: LatencySummary::of(&mut handover_to_ack),
            commit_lag: LatencySummary::of(&mut commit_lag),
            batches,
            mean_batch_size,
            sink_call: LatencySummary::of(&mut sink_times),
            acked_before_commit_returned: acked_early,
        }
    }
}
