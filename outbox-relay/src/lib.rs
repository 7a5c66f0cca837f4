//! The outbox relay: publishes committed outbox rows to Kafka (or standard
//! output) in the message shape of Debezium's Outbox Event Router.
//!
//! Data flows one way: a [`source`] claims pending rows
//! ([`record::OutboxRecord`]), each becomes a [`message::Message`], a
//! [`sink`] publishes the batch and answers per message, and the
//! [`relay`] settles the claim, marking rows only after their
//! acknowledgement. The `outbox-relay` binary wires these from its
//! [`cli`] and [`config`]. In [`cdc`] mode, PostgreSQL's write-ahead log
//! takes the place of the claims. The names shared with writers and
//! consumers (table, columns, headers, topic template, wake-up channel) are
//! in [`contract`].

/// The wire contract shared with `outbox-core` and consumers.
pub use outbox_contract as contract;

pub mod cdc;
pub mod cli;
pub mod cloudevents;
pub mod commands;
pub mod config;
pub mod database;
pub mod health;
pub mod message;
pub mod metrics;
mod nodelay;
pub mod ordering;
pub mod partitions;
pub mod progress;
pub mod record;
pub mod redact;
pub mod relay;
pub mod replay;
pub mod router;
pub mod server;
pub mod shutdown;
pub mod sink;
pub mod source;
pub mod tls;
