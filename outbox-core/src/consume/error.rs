//! [`DecodeError`]: why a consumed message could not be read, from its
//! headers ([`super::message`]) or its payload ([`super::decode`]).

/// Why a message could not be decoded. Every variant is permanent: the same
/// message fails the same way again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// A required header (`id`, `eventType`, `eventVersion`) is missing.
    #[error(
        "the message has no `{header}` header; outbox messages carry `id`, `eventType` and \
         `eventVersion` (is it from the outbox relay?)"
    )]
    MissingHeader {
        /// The header's name.
        header: &'static str,
    },
    /// A header's value cannot be read.
    #[error("the message's `{header}` header {value:?} is invalid: {reason}")]
    InvalidHeader {
        /// The header's name.
        header: &'static str,
        /// Its value (lossily as text).
        value: String,
        /// What was expected.
        reason: &'static str,
    },
    /// A CloudEvent lacks a required attribute (`id`, `type`).
    #[error(
        "the CloudEvent has no `{attribute}` attribute; outbox CloudEvents carry `id`, `type` \
         and `eventversion`"
    )]
    MissingAttribute {
        /// The attribute's name.
        attribute: &'static str,
    },
    /// A CloudEvent attribute's value cannot be read.
    #[error("the CloudEvent's `{attribute}` attribute {value:?} is invalid: {reason}")]
    InvalidAttribute {
        /// The attribute's name.
        attribute: &'static str,
        /// Its value (lossily as text).
        value: String,
        /// What was expected.
        reason: &'static str,
    },
    /// A structured CloudEvent's value is not an envelope the consumer can
    /// read.
    #[error("the structured CloudEvent cannot be read: {reason}")]
    InvalidEnvelope {
        /// Why.
        reason: String,
    },
    /// The key (the aggregate id) is not UTF-8.
    #[error("the message key {key:?} is not UTF-8; outbox keys are aggregate ids")]
    InvalidKey {
        /// The key, lossily as text.
        key: String,
    },
    /// No version of the event type is listed in the decoder: typically an
    /// event this consumer does not handle.
    #[error("event type `{event_type}` is not listed in this decoder")]
    UnknownEventType {
        /// The `eventType` header.
        event_type: String,
    },
    /// The event type is listed, but not this version: a newer version than
    /// the consumer knows, or an old one without an upcast.
    #[error(
        "`{event_type}` version {version} is not listed in this decoder (it lists versions \
         {known:?}); add its struct with `.event::<..>()` or `.upcast::<..>()`"
    )]
    UnknownVersion {
        /// The `eventType` header.
        event_type: String,
        /// The `eventVersion` header.
        version: u32,
        /// The versions listed for the event type.
        known: Vec<u32>,
    },
    /// The message has no value (a tombstone).
    #[error("`{event_type}` version {version} has no payload (a tombstone)")]
    MissingPayload {
        /// The `eventType` header.
        event_type: String,
        /// The `eventVersion` header.
        version: u32,
    },
    /// The payload is not JSON, or does not fit the version's struct.
    #[error("`{event_type}` version {version} does not decode as `{rust_type}`: {source}")]
    Payload {
        /// The `eventType` header.
        event_type: String,
        /// The `eventVersion` header.
        version: u32,
        /// The struct listed for the version.
        rust_type: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
}
