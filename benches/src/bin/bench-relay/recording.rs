//! Sinks of the benchmark, around or instead of the Kafka sink: one that
//! timestamps what passes through it, one that acknowledges without a
//! broker. The relay itself runs unchanged.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_relay::message::{HEADER_ID, Message};
use outbox_relay::sink::{SendError, Sink};

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
    /// When the relay handed the message to the sink: its row was claimed
    /// and turned into a message.
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

/// A sink decorator that records when each message was handed over and
/// acknowledged (the inner sink answered `Ok`), and every call.
pub struct RecordingSink {
    inner: Arc<dyn Sink>,
    recorded: Mutex<Recorded>,
}

impl RecordingSink {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Sink>) -> Self {
        Self {
            inner,
            recorded: Mutex::default(),
        }
    }

    /// Messages acknowledged so far.
    pub fn acknowledged(&self) -> usize {
        self.recorded.lock().expect("recording lock").acks.len()
    }

    /// Takes what was recorded so far.
    pub fn take(&self) -> Recorded {
        std::mem::take(&mut *self.recorded.lock().expect("recording lock"))
    }
}

#[async_trait]
impl Sink for RecordingSink {
    async fn publish(&self, messages: &[Message]) -> Vec<Result<(), SendError>> {
        let started = Instant::now();
        let outcomes = self.inner.publish(messages).await;
        let answered = Instant::now();
        let mut recorded = self.recorded.lock().expect("recording lock");
        recorded.calls.push(Call {
            messages: messages.len(),
            started,
            answered,
        });
        for (message, outcome) in messages.iter().zip(&outcomes) {
            if outcome.is_ok()
                && let Some((_, id)) = message.headers.iter().find(|(name, _)| *name == HEADER_ID)
            {
                recorded.acks.push(Ack {
                    id: id.clone(),
                    handed_over: started,
                    acknowledged: answered,
                });
            }
        }
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
    async fn publish(&self, messages: &[Message]) -> Vec<Result<(), SendError>> {
        vec![Ok(()); messages.len()]
    }

    async fn flush(&self, _timeout: Duration) {}
}
