//! A transactional outbox for SeaORM.
//!
//! Domain events are written as rows of an `outbox` table in the same
//! database transaction as the aggregate they belong to, so they commit or
//! roll back together; the `outbox-relay` binary then publishes committed
//! rows to Kafka in the message shape of Debezium's Outbox Event Router.
//!
//! - [`DomainEvent`] (with `#[derive(DomainEvent)]`) describes a versioned
//!   event, checked at compile time against the crate's `outbox.lock`;
//!   [`EventPayload`] describes the types nested in its payload.
//! - [`ActiveModelOutboxExt`] saves an ActiveModel and appends its events in one call.
//! - [`EmitEvents`] with [`active_model_behavior!`] appends the events that
//!   follow from a saved row from SeaORM's hooks.
//! - [`append`] appends events on their own; [`append_transient`] deletes
//!   their rows again in the same transaction, for a relay reading
//!   PostgreSQL's write-ahead log (the insert+delete idiom).
//!
//! On the consumer's side ([`consume`]):
//!
//! - [`EventDecoder`] decodes a consumed message ([`IncomingMessage`]) into
//!   the typed event by `eventType` and `eventVersion`, upcasting older
//!   versions through `From` conversions;
//! - [`Inbox`] applies an event's effect in the consumer's transaction at
//!   most once: duplicates by event id, and events older than the
//!   aggregate's last applied one, are skipped; gaps are reported.
//!
//! Every event of an aggregate gets a sequence number (1, 2, 3, ...) in the
//! writing transaction; concurrent writers of one aggregate receive them in
//! commit order.
//!
//! The tables (outbox and inbox) come from the `outbox-migrations` crate;
//! the names the writer, the relay and consumers agree on (table, columns,
//! headers, topic template) are in [`contract`].

/// The wire contract: table and column names, message headers, topic
/// template and wake-up channel, shared with the relay.
pub use outbox_contract as contract;

mod active_model;
mod append;
pub mod consume;
mod error;
mod event;
pub mod hooks;
mod outbox_event;
mod transaction;
mod well_known;

pub use active_model::ActiveModelOutboxExt;
pub use append::{AppendedEvent, OUTBOX_TABLE, SEQUENCE_TABLE, append, append_transient};
pub use consume::inbox::{INBOX_SEQUENCE_TABLE, INBOX_TABLE};
pub use consume::{
    DecodeError, Decoded, EventDecoder, EventMetadata, Gap, GapPolicy, Inbox, IncomingMessage,
    Outcome, headers,
};
pub use error::{OutboxError, OutboxErrorKind};
pub use event::{DomainEvent, EventPayload, EventSchema, FieldSchema};
pub use hooks::{Change, EmitEvents};
pub use outbox_event::OutboxEvent;

/// Derives [`DomainEvent`] for a struct with named fields.
///
/// Attributes, in `#[domain_event(..)]`: `aggregate = "Order"` (required),
/// `version = 1` (required, at least 1), `name = "OrderPlaced"` (optional,
/// defaults to the struct name). Serde's `rename`, `rename_all`, `default`,
/// `skip` and `flatten` are read for the schema description. On a field,
/// `#[domain_event(opaque)]` compares a type from another crate by name.
///
/// Every event is checked against `outbox.lock` at the crate root (see the
/// README's "Event schemas" section): a payload change that old readers
/// cannot handle fails the build until the version is bumped and recorded
/// with `cargo outbox lock`. Events in doctests are not checked.
pub use outbox_derive::DomainEvent;

/// Derives [`EventPayload`] for a struct or enum nested in event payloads.
pub use outbox_derive::EventPayload;

/// Payload shapes and the rules of compatible change, as constants; the
/// code `#[derive(DomainEvent)]` and `#[derive(EventPayload)]` generate uses
/// them.
pub mod shape {
    pub use outbox_schema::shape::*;
}

/// The imports a module saving aggregates with events needs.
pub mod prelude {
    pub use crate::{
        ActiveModelOutboxExt, Change, DomainEvent, EmitEvents, EventPayload, OutboxError,
        OutboxEvent,
    };
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

#[doc(hidden)]
pub mod __private {
    pub use sea_orm;
}
