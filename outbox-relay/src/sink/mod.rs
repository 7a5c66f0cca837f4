//! Sinks: where messages go. [`kafka`] publishes to a Kafka-API broker,
//! [`rabbitmq`] to a RabbitMQ exchange, [`nats`] to a NATS JetStream
//! stream, [`stdout`] prints JSON lines.
//!
//! A sink receives a whole batch, sends it concurrently and answers once per
//! message after every acknowledgement is in. Messages with the same topic
//! and key are sent in the order given; once one of them fails to be handed
//! to the broker, the later ones are held back, so an aggregate's events
//! never overtake each other.

pub mod kafka;
pub mod nats;
pub mod rabbitmq;
pub mod stdout;

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::message::Message;

/// A destination for messages.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Publishes `messages` and returns one outcome per message, in order,
    /// once each is acknowledged or has failed.
    async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>>;

    /// Like [`publish`](Self::publish), but hands no message to the broker
    /// after `fresh_until`: those fail as transient ([`SendError::stale`]),
    /// to be sent again once the caller has checked that it may still send
    /// them (CDC mode: that it still holds the replication slot, which a
    /// process paused past the check may have lost). This one checks once,
    /// before the batch; a sink handing messages over one by one checks
    /// before each.
    async fn publish_until(
        &self,
        messages: &[Message<'_>],
        fresh_until: Instant,
    ) -> Vec<Result<(), SendError>> {
        if Instant::now() >= fresh_until {
            return vec![Err(SendError::stale()); messages.len()];
        }
        self.publish(messages).await
    }

    /// Waits up to `timeout` for messages still in flight.
    async fn flush(&self, timeout: Duration);

    /// Whether the destination answers right now (for `/readyz`).
    async fn probe(&self) -> bool {
        true
    }
}

/// Why a message was not published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct SendError {
    /// What went wrong, for `last_error` and the logs.
    pub reason: String,
    /// Whether retrying can help.
    pub kind: FailureKind,
}

/// How a failed message is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The broker or network may recover (outage, timeout, missing topic):
    /// retried without limit.
    Transient,
    /// The broker refuses this message for good (too large, invalid topic):
    /// retried up to the attempt limit, then dead-lettered.
    Permanent,
    /// Not sent because an earlier message of the same key failed.
    HeldBack,
    /// The sink can take no more messages (its output was closed): the
    /// relay stops with an error, leaving the rows pending.
    Closed,
}

impl SendError {
    /// A failure retrying may cure.
    pub fn transient(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            kind: FailureKind::Transient,
        }
    }

    /// A failure retrying will not cure.
    pub fn permanent(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            kind: FailureKind::Permanent,
        }
    }

    /// The sink's output is gone for good.
    pub fn closed(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            kind: FailureKind::Closed,
        }
    }

    /// Not sent: past the moment until which the caller may send
    /// ([`Sink::publish_until`]).
    pub fn stale() -> Self {
        Self::transient("not sent: the right to send it was confirmed too long ago")
    }

    /// Not sent, behind an earlier failure of the same key.
    pub fn held_back() -> Self {
        Self {
            reason: "held back behind an earlier failed event of the same aggregate".into(),
            kind: FailureKind::HeldBack,
        }
    }
}
