//! [`IncomingMessage`], a consumed message as the decoder and the inbox see
//! it, and [`EventMetadata`], what its headers and key say about the event.
//!
//! The relay publishes each outbox row in the shape of Debezium's Outbox
//! Event Router: key = `aggregateid`, value = the payload's JSON bytes,
//! headers [`headers::ID`], [`headers::EVENT_TYPE`],
//! [`headers::EVENT_VERSION`] and, when the row has them,
//! [`headers::AGGREGATE_SEQUENCE`] and [`headers::TRACEPARENT`]; on
//! RabbitMQ and NATS JetStream, which have no message key, the headers also
//! carry [`headers::AGGREGATE_TYPE`] and [`headers::AGGREGATE_ID`]. Nothing
//! here depends on a broker's client: build an [`IncomingMessage`] from the
//! headers and body whatever client received them.
//!
//! | broker | `topic` | key | headers |
//! |---|---|---|---|
//! | Kafka (rdkafka) | the topic, `outbox.event.Order` | the message key | every header with a value |
//! | RabbitMQ (lapin) | the routing key, `outbox.event.Order` | none: the `aggregateId` header | the `LongString` values of the `headers` table |
//! | NATS JetStream (async-nats) | the subject without its last token (the aggregate id), `outbox.event.Order` | none: the `aggregateId` header | every value of the `HeaderMap` |
//!
//! The same event thus has the same topic and aggregate id on every broker,
//! and the [`Inbox`](super::Inbox) keeps the same high-water marks for it.

use std::borrow::Cow;

use uuid::Uuid;

use super::cloudevents::{self, Envelope};
use super::error::DecodeError;

/// The header names of the message contract, from [`outbox_contract`].
pub use outbox_contract::headers;

/// A consumed message: topic, key, value and headers, borrowed from the
/// Kafka client's message.
///
/// ```
/// use outbox_core::IncomingMessage;
///
/// let message = IncomingMessage::new("outbox.event.Order", Some(br#"{"order_id":7}"#))
///     .key(b"7")
///     .header("id", b"0190a7e8-0000-7000-8000-000000000001")
///     .header("eventType", b"OrderPlaced")
///     .header("eventVersion", b"1")
///     .header("aggregateSequence", b"1");
/// assert_eq!(message.header_value("eventType"), Some(&b"OrderPlaced"[..]));
/// ```
///
/// [`IncomingMessage::headers`] takes a client's headers as they come, so
/// each broker adapts in a few lines: see `incoming` in
/// `examples/order-consumer/src/kafka.rs`, `src/rabbitmq.rs` and
/// `src/nats.rs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingMessage<'a> {
    /// The topic it was read from. The inbox keeps per-aggregate sequence
    /// numbers per topic, since aggregate ids are only unique within an
    /// aggregate type (one topic per aggregate type).
    pub topic: &'a str,
    /// The key: the aggregate id. Without one (RabbitMQ, NATS), the
    /// [`headers::AGGREGATE_ID`] header names the aggregate.
    pub key: Option<&'a [u8]>,
    /// The value: the payload's JSON bytes; `None` for a tombstone.
    pub payload: Option<&'a [u8]>,
    /// Headers in the order received; a name given twice counts with its
    /// last value.
    pub headers: Vec<(&'a str, &'a [u8])>,
}

impl<'a> IncomingMessage<'a> {
    /// A message read from `topic` with `payload` as its value, without key
    /// or headers yet.
    pub fn new(topic: &'a str, payload: Option<&'a [u8]>) -> Self {
        Self {
            topic,
            key: None,
            payload,
            headers: Vec::new(),
        }
    }

    /// Sets the key.
    pub fn key(mut self, key: &'a [u8]) -> Self {
        self.key = Some(key);
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: &'a str, value: &'a [u8]) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Adds headers as a client hands them over: pairs of a name (`&str`,
    /// `&String`, async-nats' `&HeaderName`, ...) and a value (`&[u8]`,
    /// `&str`, `&Vec<u8>`, async-nats' `&HeaderValue`, ...).
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use outbox_core::IncomingMessage;
    ///
    /// // Headers as a client may hold them: text names, text values.
    /// let received: BTreeMap<String, String> = [
    ///     ("id", "0190a7e8-0000-7000-8000-000000000001"),
    ///     ("eventType", "OrderPlaced"),
    ///     ("eventVersion", "1"),
    ///     ("aggregateId", "7"),
    /// ]
    /// .into_iter()
    /// .map(|(name, value)| (name.to_owned(), value.to_owned()))
    /// .collect();
    /// let message = IncomingMessage::new("outbox.event.Order", Some(b"{}")).headers(&received);
    /// let metadata = message.metadata()?;
    /// assert_eq!(metadata.event_type, "OrderPlaced");
    /// assert_eq!(metadata.aggregate_id.as_deref(), Some("7"));
    /// # Ok::<(), outbox_core::DecodeError>(())
    /// ```
    pub fn headers<N, V>(mut self, headers: impl IntoIterator<Item = (&'a N, &'a V)>) -> Self
    where
        N: AsRef<str> + ?Sized + 'a,
        V: AsRef<[u8]> + ?Sized + 'a,
    {
        self.headers.extend(
            headers
                .into_iter()
                .map(|(name, value)| (name.as_ref(), value.as_ref())),
        );
        self
    }

    /// The last value of the header `name`.
    pub fn header_value(&self, name: &str) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .rev()
            .find(|(header, _)| *header == name)
            .map(|(_, value)| *value)
    }

    /// Reads the event's metadata from the headers and key; see
    /// [`EventMetadata::from_message`].
    pub fn metadata(&self) -> Result<EventMetadata, DecodeError> {
        EventMetadata::from_message(self)
    }

    /// Reads the event's metadata and its payload, whatever the message's
    /// form: in Debezium's shape and as a binary CloudEvent the payload is
    /// the value; in a structured CloudEvent it is the envelope's `data`
    /// (see [`super::cloudevents`]). `None` for a tombstone.
    ///
    /// ```
    /// use outbox_core::IncomingMessage;
    ///
    /// let value = br#"{"specversion":"1.0","id":"0190a7e8-0000-7000-8000-000000000001",
    ///     "source":"/shop/Order","type":"OrderPlaced","subject":"7",
    ///     "eventversion":"2","data":{"order_id":7}}"#;
    /// let message = IncomingMessage::new("outbox.event.Order", Some(value))
    ///     .header("content-type", b"application/cloudevents+json; charset=UTF-8");
    /// let (metadata, payload) = message.read()?;
    /// assert_eq!((metadata.event_type.as_str(), metadata.version), ("OrderPlaced", 2));
    /// assert_eq!(metadata.aggregate_id.as_deref(), Some("7"));
    /// assert_eq!(payload, Some(&br#"{"order_id":7}"#[..]));
    /// # Ok::<(), outbox_core::DecodeError>(())
    /// ```
    pub fn read(&self) -> Result<(EventMetadata, Option<&'a [u8]>), DecodeError> {
        read(self)
    }
}

/// What a message's headers and key say about its event: the identity the
/// inbox deduplicates by, and the type and version the decoder chooses a
/// struct by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMetadata {
    /// The event id (`id` header).
    pub id: Uuid,
    /// The event type (`eventType` header).
    pub event_type: String,
    /// The payload version (`eventVersion` header).
    pub version: u32,
    /// The topic the message was read from.
    pub topic: String,
    /// The aggregate id: the message key, else the `aggregateId` header,
    /// if the message has either.
    pub aggregate_id: Option<String>,
    /// The event's number within its aggregate (`aggregateSequence`
    /// header), if present.
    pub aggregate_sequence: Option<i64>,
    /// The W3C trace context (`traceparent` header), if present.
    pub traceparent: Option<String>,
    /// The replay that sent this copy of the event again (`replayId`
    /// header), if it is one: `outbox-relay replay` re-sends published
    /// events with their own ids, so an inbox that applied the event
    /// reports the copy as a duplicate; a consumer rebuilding its state
    /// from a replay applies it like the original.
    pub replay_id: Option<String>,
}

impl EventMetadata {
    /// Reads the metadata of `message`.
    ///
    /// `id`, `eventType` and `eventVersion` are required; `id` must be a
    /// UUID, `eventVersion` a positive number, `aggregateSequence` (when
    /// present) a positive number, and the key and every header read must
    /// be UTF-8. Anything else is a [`DecodeError`], never a panic. The
    /// aggregate id is the key, or without a key the `aggregateId` header.
    ///
    /// ```
    /// use outbox_core::{DecodeError, IncomingMessage};
    ///
    /// let message = IncomingMessage::new("outbox.event.Order", Some(b"{}"))
    ///     .key(b"7")
    ///     .header("id", b"0190a7e8-0000-7000-8000-000000000001")
    ///     .header("eventType", b"OrderPlaced")
    ///     .header("eventVersion", b"2");
    /// let metadata = message.metadata()?;
    /// assert_eq!(metadata.version, 2);
    /// assert_eq!(metadata.aggregate_id.as_deref(), Some("7"));
    /// assert_eq!(metadata.aggregate_sequence, None);
    ///
    /// let unversioned = IncomingMessage::new("outbox.event.Order", Some(b"{}"))
    ///     .header("id", b"0190a7e8-0000-7000-8000-000000000001")
    ///     .header("eventType", b"OrderPlaced");
    /// assert!(matches!(
    ///     unversioned.metadata(),
    ///     Err(DecodeError::MissingHeader { header: "eventVersion" })
    /// ));
    /// # Ok::<(), DecodeError>(())
    /// ```
    pub fn from_message(message: &IncomingMessage<'_>) -> Result<Self, DecodeError> {
        Ok(read(message)?.0)
    }

    /// Reads the metadata of `message` in Debezium's shape.
    fn from_headers(message: &IncomingMessage<'_>) -> Result<Self, DecodeError> {
        let id = required_text(message, headers::ID)?;
        let id = Uuid::parse_str(id).map_err(|_| invalid(headers::ID, id, "expected a UUID"))?;
        let event_type = required_text(message, headers::EVENT_TYPE)?.to_owned();
        let version = required_text(message, headers::EVENT_VERSION)?;
        let version = version
            .parse::<u32>()
            .ok()
            .filter(|version| *version > 0)
            .ok_or_else(|| invalid(headers::EVENT_VERSION, version, "expected a number from 1"))?;
        let aggregate_sequence = optional_text(message, headers::AGGREGATE_SEQUENCE)?
            .map(|sequence| {
                sequence
                    .parse::<i64>()
                    .ok()
                    .filter(|sequence| *sequence > 0)
                    .ok_or_else(|| {
                        invalid(
                            headers::AGGREGATE_SEQUENCE,
                            sequence,
                            "expected a number from 1",
                        )
                    })
            })
            .transpose()?;
        let traceparent = optional_text(message, headers::TRACEPARENT)?.map(str::to_owned);
        let replay_id = optional_text(message, headers::REPLAY_ID)?.map(str::to_owned);
        let aggregate_id = match key(message)? {
            Some(key) => Some(key),
            None => optional_text(message, headers::AGGREGATE_ID)?.map(str::to_owned),
        };
        Ok(Self {
            id,
            event_type,
            version,
            topic: message.topic.to_owned(),
            aggregate_id,
            aggregate_sequence,
            traceparent,
            replay_id,
        })
    }
}

/// The metadata and payload of `message`, in whichever form it comes:
/// a binary CloudEvent, a structured one (the payload its `data`), or
/// Debezium's shape.
pub(crate) fn read<'a>(
    message: &IncomingMessage<'a>,
) -> Result<(EventMetadata, Option<&'a [u8]>), DecodeError> {
    if let Some(prefix) = cloudevents::binary_prefix(message) {
        let attribute = |name: &'static str| {
            let header = format!("{prefix}{name}");
            message
                .header_value(&header)
                .map(|value| {
                    std::str::from_utf8(value).map(Cow::Borrowed).map_err(|_| {
                        DecodeError::InvalidAttribute {
                            attribute: name,
                            value: String::from_utf8_lossy(value).into_owned(),
                            reason: "not UTF-8",
                        }
                    })
                })
                .transpose()
        };
        return Ok((from_attributes(message, attribute)?, message.payload));
    }
    if let Some(envelope) = Envelope::of(message)? {
        let metadata = from_attributes(message, |name| envelope.attribute(name))?;
        return Ok((metadata, envelope.data()?));
    }
    Ok((EventMetadata::from_headers(message)?, message.payload))
}

/// The metadata of a CloudEvent whose attributes `attribute` reads.
fn from_attributes<'a>(
    message: &IncomingMessage<'a>,
    attribute: impl Fn(&'static str) -> Result<Option<Cow<'a, str>>, DecodeError>,
) -> Result<EventMetadata, DecodeError> {
    let required = |name: &'static str| {
        attribute(name)?.ok_or(DecodeError::MissingAttribute { attribute: name })
    };
    let positive = |name: &'static str, text: Cow<'a, str>| {
        text.parse::<i64>()
            .ok()
            .filter(|number| *number > 0)
            .ok_or_else(|| DecodeError::InvalidAttribute {
                attribute: name,
                value: text.into_owned(),
                reason: "expected a number from 1",
            })
    };
    let id = required("id")?;
    let id = Uuid::parse_str(&id).map_err(|_| DecodeError::InvalidAttribute {
        attribute: "id",
        value: id.clone().into_owned(),
        reason: "expected a UUID",
    })?;
    let event_type = match attribute("eventtype")? {
        Some(event_type) => event_type,
        None => required("type")?,
    };
    let version = match attribute("eventversion")? {
        Some(text) => u32::try_from(positive("eventversion", text)?).map_err(|_| {
            DecodeError::InvalidAttribute {
                attribute: "eventversion",
                value: String::new(),
                reason: "too large",
            }
        })?,
        None => 1,
    };
    let aggregate_sequence = attribute("aggregatesequence")?
        .map(|text| positive("aggregatesequence", text))
        .transpose()?;
    let aggregate_id = match key(message)? {
        Some(key) => Some(key),
        None => attribute("subject")?.map(Cow::into_owned),
    };
    Ok(EventMetadata {
        id,
        event_type: event_type.into_owned(),
        version,
        topic: message.topic.to_owned(),
        aggregate_id,
        aggregate_sequence,
        traceparent: attribute("traceparent")?.map(Cow::into_owned),
        replay_id: attribute("replayid")?.map(Cow::into_owned),
    })
}

/// The message key as text, if there is one.
fn key(message: &IncomingMessage<'_>) -> Result<Option<String>, DecodeError> {
    message
        .key
        .map(|key| {
            std::str::from_utf8(key)
                .map(str::to_owned)
                .map_err(|_| DecodeError::InvalidKey {
                    key: String::from_utf8_lossy(key).into_owned(),
                })
        })
        .transpose()
}

fn required_text<'a>(
    message: &IncomingMessage<'a>,
    header: &'static str,
) -> Result<&'a str, DecodeError> {
    optional_text(message, header)?.ok_or(DecodeError::MissingHeader { header })
}

fn optional_text<'a>(
    message: &IncomingMessage<'a>,
    header: &'static str,
) -> Result<Option<&'a str>, DecodeError> {
    message
        .header_value(header)
        .map(|value| {
            std::str::from_utf8(value)
                .map_err(|_| invalid(header, &String::from_utf8_lossy(value), "not UTF-8"))
        })
        .transpose()
}

fn invalid(header: &'static str, value: &str, reason: &'static str) -> DecodeError {
    DecodeError::InvalidHeader {
        header,
        value: value.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &[u8] = b"0190a7e8-0000-7000-8000-000000000001";

    fn message() -> IncomingMessage<'static> {
        IncomingMessage::new("outbox.event.Order", Some(b"{}"))
            .key(b"42")
            .header("id", ID)
            .header("eventType", b"OrderPlaced")
            .header("eventVersion", b"2")
            .header("aggregateSequence", b"7")
            .header(
                "traceparent",
                b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
    }

    #[test]
    fn reads_every_header_of_the_contract() {
        let metadata = message().metadata().unwrap();
        assert_eq!(metadata.id.to_string().as_bytes(), ID);
        assert_eq!(metadata.event_type, "OrderPlaced");
        assert_eq!(metadata.version, 2);
        assert_eq!(metadata.topic, "outbox.event.Order");
        assert_eq!(metadata.aggregate_id.as_deref(), Some("42"));
        assert_eq!(metadata.aggregate_sequence, Some(7));
        assert!(metadata.traceparent.unwrap().starts_with("00-4bf9"));
    }

    #[test]
    fn the_last_of_repeated_headers_counts() {
        let metadata = message().header("eventVersion", b"3").metadata().unwrap();
        assert_eq!(metadata.version, 3);
    }

    #[test]
    fn required_headers_must_be_present() {
        for required in ["id", "eventType", "eventVersion"] {
            let mut message = message();
            message.headers.retain(|(name, _)| *name != required);
            match message.metadata() {
                Err(DecodeError::MissingHeader { header }) => assert_eq!(header, required),
                other => panic!("{required}: {other:?}"),
            }
        }
    }

    #[test]
    fn malformed_headers_are_errors() {
        let cases: [(&str, &[u8]); 6] = [
            ("id", b"42"),
            ("eventVersion", b"two"),
            ("eventVersion", b"0"),
            ("aggregateSequence", b"-1"),
            ("aggregateSequence", b"x"),
            ("eventType", b"\xff\xfe"),
        ];
        for (name, value) in cases {
            match message().header(name, value).metadata() {
                Err(DecodeError::InvalidHeader { header, .. }) => assert_eq!(header, name),
                other => panic!("{name}={value:?}: {other:?}"),
            }
        }
        let mut bad_key = message();
        bad_key.key = Some(b"\xff");
        assert!(matches!(
            bad_key.metadata(),
            Err(DecodeError::InvalidKey { .. })
        ));
    }

    #[test]
    fn without_a_key_the_aggregate_id_header_names_the_aggregate() {
        let mut message = message().header("aggregateId", b"from-header");
        assert_eq!(
            message.metadata().unwrap().aggregate_id.as_deref(),
            Some("42"),
            "the key wins"
        );
        message.key = None;
        assert_eq!(
            message.metadata().unwrap().aggregate_id.as_deref(),
            Some("from-header")
        );
        let bad = IncomingMessage::new("t", None)
            .header("id", ID)
            .header("eventType", b"E")
            .header("eventVersion", b"1")
            .header("aggregateId", b"\xff");
        assert!(matches!(
            bad.metadata(),
            Err(DecodeError::InvalidHeader {
                header: "aggregateId",
                ..
            })
        ));
    }

    #[test]
    fn headers_are_taken_as_clients_hand_them_over() {
        let owned: Vec<(String, Vec<u8>)> = vec![
            ("id".into(), ID.to_vec()),
            ("eventType".into(), b"OrderPlaced".to_vec()),
            ("eventVersion".into(), b"1".to_vec()),
        ];
        let message = IncomingMessage::new("t", None).headers(owned.iter().map(|(n, v)| (n, v)));
        assert_eq!(message.metadata().unwrap().event_type, "OrderPlaced");
        let text: [(&str, &str); 1] = [("eventVersion", "4")];
        let message = message.headers(text.iter().map(|(n, v)| (*n, *v)));
        assert_eq!(message.metadata().unwrap().version, 4);
    }

    #[test]
    fn key_sequence_and_traceparent_are_optional() {
        let mut message = message();
        message.key = None;
        message
            .headers
            .retain(|(name, _)| !matches!(*name, "aggregateSequence" | "traceparent"));
        let metadata = message.metadata().unwrap();
        assert_eq!(metadata.aggregate_id, None);
        assert_eq!(metadata.aggregate_sequence, None);
        assert_eq!(metadata.traceparent, None);
    }
}
