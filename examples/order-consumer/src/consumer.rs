//! The loop: receive a message, decode it, apply its effect through the
//! inbox in a database transaction, commit, and only then store the
//! message's offset for Kafka to commit (or acknowledge it to RabbitMQ or
//! JetStream, in [`crate::rabbitmq`] and [`crate::nats`]).
//!
//! A crash anywhere in between delivers the message again (its offset was
//! not committed); the inbox then finds the event applied, or not, as the
//! transaction left it. Either way its effect is applied once.

use std::fmt;
use std::future::Future;

use anyhow::{Context, bail};
use outbox_core::{DecodeError, EventDecoder, Gap, Inbox, IncomingMessage, Outcome};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;
use sea_orm::{DatabaseConnection, TransactionTrait};

use crate::events::{self, OrderEvent};
use crate::kafka::{self, OrderStreamConsumer};
use crate::summary;

/// Decodes a message and applies its effect through the inbox in a
/// database transaction, whatever broker delivered it: the Kafka loop
/// below, [`crate::rabbitmq`] and [`crate::nats`] share it, and each only
/// acknowledges the message its own way once [`OrderHandler::handle`]
/// returned.
pub struct OrderHandler {
    db: DatabaseConnection,
    decoder: EventDecoder<OrderEvent>,
    inbox: Inbox,
    skip_invalid: bool,
}

/// Keeps `order_summary` from the order events of one Kafka topic.
pub struct OrderConsumer {
    kafka: OrderStreamConsumer,
    handler: OrderHandler,
}

/// What the consumer did, counted per message.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Effects applied.
    pub applied: u64,
    /// Of those, applied after a gap in their order's sequence.
    pub after_gap: u64,
    /// Redeliveries of applied events, skipped.
    pub duplicates: u64,
    /// Events older than their order's last applied one, skipped: stale
    /// redeliveries and late events never applied (`--on-gap apply`).
    pub stale: u64,
    /// Event types this consumer does not handle (recorded, no effect).
    pub ignored: u64,
    /// Messages that could not be decoded, skipped with `--skip-invalid`.
    pub invalid: u64,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} applied ({} after a gap), {} duplicates and {} stale skipped, {} ignored, {} invalid",
            self.applied, self.after_gap, self.duplicates, self.stale, self.ignored, self.invalid
        )
    }
}

/// What happened to one message.
#[derive(Debug)]
pub enum Handled {
    /// Its effect was applied, after a gap in its order's sequence if
    /// `gap` says so.
    Applied {
        /// The events missing before it.
        gap: Option<Gap>,
    },
    /// A redelivery of an applied event, skipped.
    Duplicate,
    /// Older than the last applied event of its order, skipped.
    Stale,
    /// Older than the last applied event of its order and never applied.
    Late {
        /// Its number in its order.
        sequence: i64,
        /// The order's last applied number.
        last_applied: i64,
    },
    /// An event type this consumer does not handle.
    Ignored,
    /// Not decodable, skipped (`--skip-invalid`).
    Invalid,
}

impl Stats {
    /// Counts what happened to one message.
    pub fn count(&mut self, handled: &Handled) {
        match handled {
            Handled::Applied { gap } => {
                self.applied += 1;
                self.after_gap += u64::from(gap.is_some());
            }
            Handled::Duplicate => self.duplicates += 1,
            Handled::Stale | Handled::Late { .. } => self.stale += 1,
            Handled::Ignored => self.ignored += 1,
            Handled::Invalid => self.invalid += 1,
        }
    }
}

impl OrderHandler {
    /// A handler applying effects to `db` through `inbox`. A message that
    /// cannot be decoded is an error, unless `skip_invalid`.
    pub fn new(db: DatabaseConnection, inbox: Inbox, skip_invalid: bool) -> Self {
        Self {
            db,
            decoder: events::decoder(),
            inbox,
            skip_invalid,
        }
    }

    /// Decodes `incoming` (received at `position`, for the log) and
    /// applies its effect once; the caller acknowledges the message to its
    /// broker only after this returned `Ok`. An error means the message
    /// must not be acknowledged: the database failed, it is held at a gap,
    /// or it cannot be decoded (without `skip_invalid`).
    pub async fn handle(
        &self,
        incoming: &IncomingMessage<'_>,
        position: &str,
    ) -> anyhow::Result<Handled> {
        let (metadata, payload) = match incoming.read() {
            Ok(read) => read,
            Err(error) => return self.invalid(position, error),
        };
        // An event type this consumer does not handle still goes through
        // the inbox: it is part of its order's sequence, and skipping it
        // would make the next event look like it follows a gap.
        let event = match self.decoder.decode_payload(&metadata, payload) {
            Ok(event) => Some(event),
            Err(DecodeError::UnknownEventType { .. }) => None,
            Err(error) => return self.invalid(position, error),
        };
        let handles_event = event.is_some();
        let describe = || {
            format!(
                "{} {} of order {} at {}",
                metadata.event_type,
                metadata.id,
                metadata.aggregate_id.as_deref().unwrap_or("?"),
                position
            )
        };

        let txn = self
            .db
            .begin()
            .await
            .context("cannot begin a database transaction")?;
        let outcome = self
            .inbox
            .apply(&txn, &metadata, |txn| async move {
                match &event {
                    Some(event) => summary::apply(txn, event).await,
                    None => Ok(()),
                }
            })
            .await
            .with_context(|| format!("cannot apply {}", describe()))?;
        let handled = match outcome {
            Outcome::Held { gap } => {
                txn.rollback().await.ok();
                bail!(
                    "{gap} before {}; stopping without acknowledging it (restart once the \
                     missing events are published, or run with --on-gap apply)",
                    describe()
                );
            }
            Outcome::Applied { gap, .. } if handles_event => Handled::Applied { gap },
            // Not reached: the consumer does not use `GapPolicy::ApplyLate`.
            Outcome::AppliedLate { .. } if handles_event => Handled::Applied { gap: None },
            Outcome::Applied { .. } | Outcome::AppliedLate { .. } => Handled::Ignored,
            Outcome::Duplicate => Handled::Duplicate,
            Outcome::Stale { .. } => Handled::Stale,
            Outcome::Late {
                sequence,
                last_applied,
            } => Handled::Late {
                sequence,
                last_applied,
            },
        };
        txn.commit()
            .await
            .with_context(|| format!("cannot commit {}", describe()))?;

        match &handled {
            Handled::Applied { gap: Some(gap) } => {
                tracing::warn!("applied {} after a gap: {gap}", describe())
            }
            Handled::Applied { gap: None } => tracing::debug!("applied {}", describe()),
            Handled::Duplicate => {
                tracing::info!("skipped {}: a duplicate of an applied event", describe())
            }
            Handled::Stale => tracing::info!(
                "skipped {}: older than the last applied event of its order",
                describe()
            ),
            Handled::Late {
                sequence,
                last_applied,
            } => tracing::warn!(
                "skipped {}: older than the last applied event of its order \
                 (sequence {sequence} arrived after {last_applied}) and never applied",
                describe()
            ),
            Handled::Ignored => tracing::debug!("ignored {}: not handled here", describe()),
            Handled::Invalid => {}
        }
        Ok(handled)
    }

    fn invalid(&self, position: &str, error: DecodeError) -> anyhow::Result<Handled> {
        if !self.skip_invalid {
            bail!(
                "cannot decode the message at {position}: {error}; it is not acknowledged \
                 (fix the producer, or run with --skip-invalid to skip such messages)"
            );
        }
        tracing::error!("skipped the message at {position}: {error}");
        Ok(Handled::Invalid)
    }
}

impl OrderConsumer {
    /// A consumer reading with `kafka` and handling messages with `handler`.
    pub fn new(kafka: OrderStreamConsumer, handler: OrderHandler) -> Self {
        Self { kafka, handler }
    }

    /// Consumes `topic` until `shutdown` completes (after the message in
    /// hand) or a message cannot be handled; commits the stored offsets
    /// either way.
    pub async fn run(
        &self,
        topic: &str,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<Stats> {
        self.kafka
            .subscribe(&[topic])
            .with_context(|| format!("cannot subscribe to {topic}"))?;
        let mut stats = Stats::default();
        tokio::pin!(shutdown);
        let outcome = loop {
            let received = tokio::select! {
                () = &mut shutdown => break Ok(()),
                received = self.kafka.recv() => received,
            };
            match received {
                // librdkafka retries by itself (broker down, topic not created yet).
                Err(error) => tracing::warn!(%error, "kafka"),
                Ok(message) => match self.handle(&message).await {
                    Ok(handled) => stats.count(&handled),
                    Err(error) => break Err(error),
                },
            }
        };
        self.commit_offsets();
        outcome.map(|()| stats)
    }

    async fn handle(&self, message: &BorrowedMessage<'_>) -> anyhow::Result<Handled> {
        let handled = self
            .handler
            .handle(&kafka::incoming(message), &kafka::position(message))
            .await?;
        self.store_offset(message);
        Ok(handled)
    }

    /// Marks the message done for Kafka; librdkafka commits it later.
    fn store_offset(&self, message: &BorrowedMessage<'_>) {
        if let Err(error) = self.kafka.store_offset_from_message(message) {
            // Its partition was revoked meanwhile: the new owner receives
            // the message again and the inbox skips it.
            tracing::debug!(%error, "offset of {} not stored", kafka::position(message));
        }
    }

    fn commit_offsets(&self) {
        match self.kafka.commit_consumer_state(CommitMode::Sync) {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => tracing::warn!(%error, "cannot commit the consumed offsets"),
        }
    }
}
