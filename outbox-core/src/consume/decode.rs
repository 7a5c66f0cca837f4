//! [`EventDecoder`]: from a consumed message to the typed event, by
//! `eventType` and `eventVersion`, with older versions upcast to the
//! current one.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;

use super::error::DecodeError;
use super::message::{EventMetadata, IncomingMessage};
use crate::DomainEvent;

/// Decodes messages into `T`, the type the consumer handles: one event
/// struct, or an enum of the events it cares about.
///
/// Each (event type, version) the consumer reads is listed once, with the
/// struct that version's payload decodes into: the same
/// `#[derive(DomainEvent)]` structs the producer appends, so their
/// `EVENT_TYPE` and `VERSION` select them. An older version is upcast to
/// the current struct through a `From` conversion declared once:
///
/// ```
/// use outbox_core::{DomainEvent, EventDecoder, IncomingMessage};
/// use serde::{Deserialize, Serialize};
///
/// /// Version 1, kept to read what was published before version 2.
/// #[derive(DomainEvent, Serialize, Deserialize)]
/// #[domain_event(aggregate = "Order", version = 1, name = "OrderPlaced")]
/// struct OrderPlacedV1 { order_id: i64, customer: String }
///
/// /// The current version.
/// #[derive(Debug, PartialEq, DomainEvent, Serialize, Deserialize)]
/// #[domain_event(aggregate = "Order", version = 2)]
/// struct OrderPlaced { order_id: i64, customer: String, currency: String }
///
/// impl From<OrderPlacedV1> for OrderPlaced {
///     fn from(v1: OrderPlacedV1) -> Self {
///         Self { order_id: v1.order_id, customer: v1.customer, currency: "EUR".into() }
///     }
/// }
///
/// #[derive(Debug, PartialEq, DomainEvent, Serialize, Deserialize)]
/// #[domain_event(aggregate = "Order", version = 1)]
/// struct OrderPaid { order_id: i64, amount_cents: i64 }
///
/// /// What this consumer handles.
/// #[derive(Debug, PartialEq)]
/// enum OrderEvent {
///     Placed(OrderPlaced),
///     Paid(OrderPaid),
/// }
/// impl From<OrderPlaced> for OrderEvent {
///     fn from(event: OrderPlaced) -> Self { Self::Placed(event) }
/// }
/// impl From<OrderPaid> for OrderEvent {
///     fn from(event: OrderPaid) -> Self { Self::Paid(event) }
/// }
///
/// let decoder = EventDecoder::<OrderEvent>::new()
///     .event::<OrderPlaced>()
///     .upcast::<OrderPlacedV1, OrderPlaced>()
///     .event::<OrderPaid>();
///
/// let v1 = IncomingMessage::new("outbox.event.Order", Some(br#"{"order_id":7,"customer":"ada"}"#))
///     .key(b"7")
///     .header("id", b"0190a7e8-0000-7000-8000-000000000001")
///     .header("eventType", b"OrderPlaced")
///     .header("eventVersion", b"1");
/// let decoded = decoder.decode(&v1)?;
/// assert_eq!(decoded.metadata.version, 1);
/// assert_eq!(
///     decoded.event,
///     OrderEvent::Placed(OrderPlaced { order_id: 7, customer: "ada".into(), currency: "EUR".into() })
/// );
/// # Ok::<(), outbox_core::DecodeError>(())
/// ```
///
/// Decoding never panics: a missing or malformed header, an event type or
/// version not listed, a tombstone or a payload that does not fit its
/// struct is a [`DecodeError`] the consumer can route (skip an event type
/// it does not handle, park a malformed message, stop on a version it
/// should know).
///
/// A decoder is built once and shared: it is `Send + Sync` and decoding
/// takes `&self`.
pub struct EventDecoder<T> {
    types: BTreeMap<&'static str, BTreeMap<u32, Version<T>>>,
}

/// How one (event type, version) decodes.
struct Version<T> {
    /// The struct its payload is read as, for messages.
    rust_type: &'static str,
    decode: DecodeFn<T>,
}

/// Reads a payload as the version's struct and converts it into `T`.
type DecodeFn<T> = Box<dyn Fn(&[u8]) -> Result<T, serde_json::Error> + Send + Sync>;

impl<T: 'static> EventDecoder<T> {
    /// A decoder that knows no event yet.
    pub fn new() -> Self {
        Self {
            types: BTreeMap::new(),
        }
    }

    /// Decodes `E::EVENT_TYPE` version `E::VERSION` as `E`, then converts
    /// it into `T` (for `T = E` itself, or an enum with `From<E>`).
    ///
    /// # Panics
    ///
    /// If that event type and version is already listed: each version has
    /// one struct.
    pub fn event<E>(self) -> Self
    where
        E: DomainEvent + DeserializeOwned + Into<T> + 'static,
    {
        self.event_with::<E>(Into::into)
    }

    /// Decodes an older version as `Old`, upcasts it with
    /// `From<Old> for New`, then converts the `New` into `T`: list every
    /// old version of an event this way next to its current struct.
    ///
    /// # Panics
    ///
    /// If that event type and version is already listed.
    pub fn upcast<Old, New>(self) -> Self
    where
        Old: DomainEvent + DeserializeOwned + 'static,
        New: From<Old> + Into<T> + 'static,
    {
        self.event_with::<Old>(|old| New::from(old).into())
    }

    /// Decodes `E::EVENT_TYPE` version `E::VERSION` as `E` and turns it
    /// into `T` with `convert`: for conversions `From` cannot express, such
    /// as a chain of upcasts ending in one variant of an enum.
    ///
    /// # Panics
    ///
    /// If that event type and version is already listed.
    pub fn event_with<E>(mut self, convert: impl Fn(E) -> T + Send + Sync + 'static) -> Self
    where
        E: DomainEvent + DeserializeOwned + 'static,
    {
        let rust_type = std::any::type_name::<E>();
        let versions = self.types.entry(E::EVENT_TYPE).or_default();
        if let Some(listed) = versions.get(&E::VERSION) {
            panic!(
                "EventDecoder: `{}` version {} is listed twice, as `{}` and as `{rust_type}`; \
                 list each version once",
                E::EVENT_TYPE,
                E::VERSION,
                listed.rust_type
            );
        }
        versions.insert(
            E::VERSION,
            Version {
                rust_type,
                decode: Box::new(move |payload| serde_json::from_slice::<E>(payload).map(&convert)),
            },
        );
        self
    }

    /// Whether `event_type` in `version` is listed.
    pub fn knows(&self, event_type: &str, version: u32) -> bool {
        self.types
            .get(event_type)
            .is_some_and(|versions| versions.contains_key(&version))
    }

    /// Reads the message's metadata and decodes its payload.
    pub fn decode(&self, message: &IncomingMessage<'_>) -> Result<Decoded<T>, DecodeError> {
        let (metadata, payload) = super::message::read(message)?;
        let event = self.decode_payload(&metadata, payload)?;
        Ok(Decoded { metadata, event })
    }

    /// Decodes a payload whose metadata was read already, for consumers
    /// that look at the metadata first.
    pub fn decode_payload(
        &self,
        metadata: &EventMetadata,
        payload: Option<&[u8]>,
    ) -> Result<T, DecodeError> {
        let versions = self
            .types
            .get(metadata.event_type.as_str())
            .ok_or_else(|| DecodeError::UnknownEventType {
                event_type: metadata.event_type.clone(),
            })?;
        let version =
            versions
                .get(&metadata.version)
                .ok_or_else(|| DecodeError::UnknownVersion {
                    event_type: metadata.event_type.clone(),
                    version: metadata.version,
                    known: versions.keys().copied().collect(),
                })?;
        let payload = payload.ok_or_else(|| DecodeError::MissingPayload {
            event_type: metadata.event_type.clone(),
            version: metadata.version,
        })?;
        (version.decode)(payload).map_err(|source| DecodeError::Payload {
            event_type: metadata.event_type.clone(),
            version: metadata.version,
            rust_type: version.rust_type,
            source,
        })
    }
}

impl<T: 'static> Default for EventDecoder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for EventDecoder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (event_type, versions) in &self.types {
            for (version, entry) in versions {
                map.entry(&format_args!("{event_type} v{version}"), &entry.rust_type);
            }
        }
        map.finish()
    }
}

/// A decoded message: its metadata and its event.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded<T> {
    /// Id, type, version, aggregate and sequence, for the inbox.
    pub metadata: EventMetadata,
    /// The event, upcast to the type the consumer handles.
    pub event: T,
}
