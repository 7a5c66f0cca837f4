//! An example consumer of the order service's events: it keeps one
//! `order_summary` row per order (lines, items, total, amount paid) from
//! the messages the outbox relay publishes to Kafka, RabbitMQ or NATS
//! JetStream, applying each event's effect exactly once although the relay
//! and the brokers deliver at least once.
//!
//! - [`events`]: what it reads, and the decoder for every version;
//! - [`summary`]: the `order_summary` entity and the effect of each event;
//! - [`kafka`]: the rdkafka consumer and the adapter to
//!   [`outbox_core::IncomingMessage`];
//! - [`rabbitmq`] and [`nats`]: the lapin and async-nats consumers and
//!   their adapters to [`outbox_core::IncomingMessage`], from the headers
//!   and body;
//! - [`consumer`]: the handler shared by all three (decode, apply in a
//!   database transaction through the inbox, commit) and the Kafka loop,
//!   which only then stores the message's offset for Kafka to commit.

pub mod consumer;
pub mod events;
pub mod kafka;
pub mod nats;
pub mod rabbitmq;
pub mod summary;
