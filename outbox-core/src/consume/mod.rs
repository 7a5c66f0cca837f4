//! The consumer's half: decoding messages the relay published into typed
//! events, and applying their effects exactly once.
//!
//! - [`IncomingMessage`] is a consumed message, whatever the client, and
//!   [`EventMetadata`] what its headers and key say (module [`message`]),
//!   in Debezium's shape or as a CloudEvent, binary or structured (module
//!   [`cloudevents`]);
//! - [`EventDecoder`] decodes it by event type and version, with upcasts
//!   (module [`decode`]); either step fails with a [`DecodeError`] (module
//!   [`error`]);
//! - [`Inbox`] deduplicates by event id and keeps a per-aggregate
//!   high-water mark, in the consumer's own transaction (module [`inbox`]).
//!
//! Delivery from the relay is at-least-once: a crash between the broker's
//! acknowledgement and the mark, a consumer that dies before committing its
//! offset, or a rebalance deliver some events again. The inbox turns those
//! repetitions into one effect, provided the consumer commits its offsets
//! only after the transaction that applied the event.

pub mod cloudevents;
pub mod decode;
pub mod error;
pub mod inbox;
pub mod message;

pub use decode::{Decoded, EventDecoder};
pub use error::DecodeError;
pub use inbox::{Gap, GapPolicy, Inbox, Outcome};
pub use message::{EventMetadata, IncomingMessage, headers};
