//! A decorator around the Kafka sink that timestamps what passes through
//! it. Both relays publish through it unchanged: the polling relay and the
//! CDC relay call the same `Sink::publish`.

use std::sync::atomic::{AtomicUsize, Ordering};
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
        let (mut acked, mut refused) = (0, 0);
        for (message, outcome) in messages.iter().zip(&outcomes) {
            if outcome.is_err() {
                refused += 1;
                continue;
            }
            if let Some((_, id)) = message.headers.iter().find(|(name, _)| *name == HEADER_ID) {
                acked += 1;
                recorded.acks.push(Ack {
                    id: id.clone(),
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
