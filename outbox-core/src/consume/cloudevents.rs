//! Reading CloudEvents 1.0, as the relay publishes them with `--format
//! cloudevents` (binary content mode) or `cloudevents-structured`, into
//! the same [`EventMetadata`](super::EventMetadata) and payload as
//! Debezium's shape.
//!
//! - **Binary**: the attributes are headers under the binding's prefix:
//!   Kafka `ce_`, NATS `ce-`, AMQP `cloudEvents_` (or `cloudEvents:`); the
//!   value is the payload. A message is binary when it has a
//!   `<prefix>specversion` header.
//! - **Structured**: the value is the JSON envelope, the payload its `data`
//!   member. A message is structured when its `content-type` header starts
//!   with `application/cloudevents`, or when it has neither Debezium's
//!   `id` header nor a binary CloudEvents header and its value is a JSON
//!   object with a `specversion` member (on RabbitMQ the content type is a
//!   property, not a header: either pass it as a `content-type` header or
//!   rely on this).
//!
//! The attributes read: `id` (a UUID), `eventtype` if present else `type`
//! (the event type), `eventversion` (1 when absent), `subject` (the
//! aggregate id, when the message has no key), `aggregatesequence`,
//! `traceparent` and `replayid`.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::value::RawValue;

use super::error::DecodeError;
use super::message::{IncomingMessage, headers};

/// The header prefixes of the bindings, in the order they are looked for.
pub const BINARY_PREFIXES: [&str; 4] = ["ce_", "ce-", "cloudEvents_", "cloudEvents:"];

/// The content type of a structured CloudEvent, without parameters.
pub const STRUCTURED: &str = "application/cloudevents";

/// The prefix of the binary CloudEvent `message` is, if it is one.
pub fn binary_prefix(message: &IncomingMessage<'_>) -> Option<&'static str> {
    BINARY_PREFIXES.into_iter().find(|prefix| {
        message
            .headers
            .iter()
            .any(|(name, _)| name.strip_prefix(prefix) == Some("specversion"))
    })
}

/// A structured CloudEvent's envelope: its members, borrowed from the value.
#[derive(Debug)]
pub struct Envelope<'a> {
    members: HashMap<Cow<'a, str>, &'a RawValue>,
}

impl<'a> Envelope<'a> {
    /// The envelope of `message` if it is a structured CloudEvent (see the
    /// module's documentation); an error if it says it is one and its value
    /// is not an envelope.
    pub fn of(message: &IncomingMessage<'a>) -> Result<Option<Self>, DecodeError> {
        let declared = message
            .header_value("content-type")
            .and_then(|value| std::str::from_utf8(value).ok())
            .is_some_and(|value| value.trim().starts_with(STRUCTURED));
        let Some(value) = message.payload else {
            return match declared {
                true => Err(invalid_envelope("the value is null")),
                false => Ok(None),
            };
        };
        if !declared
            && (message.header_value(headers::ID).is_some()
                || !value.trim_ascii_start().starts_with(b"{"))
        {
            return Ok(None);
        }
        let members = match serde_json::from_slice::<HashMap<Cow<'a, str>, &'a RawValue>>(value) {
            Ok(members) => members,
            Err(_) if !declared => return Ok(None),
            Err(error) => return Err(invalid_envelope(&error.to_string())),
        };
        if !members.contains_key("specversion") {
            return match declared {
                true => Err(invalid_envelope("it has no `specversion`")),
                false => Ok(None),
            };
        }
        Ok(Some(Self { members }))
    }

    /// The attribute `name` as text: a string's value, another JSON value's
    /// text; `None` when absent or null.
    pub fn attribute(&self, name: &'static str) -> Result<Option<Cow<'a, str>>, DecodeError> {
        let Some(raw) = self.members.get(name) else {
            return Ok(None);
        };
        let text: &'a str = raw.get();
        if text == "null" {
            return Ok(None);
        }
        if text.starts_with('"') {
            let value = serde_json::from_str::<String>(text).map_err(|_| {
                DecodeError::InvalidAttribute {
                    attribute: name,
                    value: text.to_owned(),
                    reason: "not a JSON string",
                }
            })?;
            return Ok(Some(Cow::Owned(value)));
        }
        Ok(Some(Cow::Borrowed(text)))
    }

    /// The payload: `data` as it is in the value (`None` when absent or
    /// null). `data_base64` is refused: the outbox's payloads are JSON.
    pub fn data(&self) -> Result<Option<&'a [u8]>, DecodeError> {
        if self.members.contains_key("data_base64") {
            return Err(invalid_envelope(
                "it carries `data_base64`; outbox payloads are JSON, carried as `data`",
            ));
        }
        Ok(self
            .members
            .get("data")
            .map(|raw| raw.get())
            .filter(|text| *text != "null")
            .map(str::as_bytes))
    }
}

fn invalid_envelope(reason: &str) -> DecodeError {
    DecodeError::InvalidEnvelope {
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DecodeError;

    const ID: &str = "0190a7e8-0000-7000-8000-000000000001";

    /// The JSON event format specification's example, with a UUID as id
    /// (outbox event ids are UUIDs) and the outbox's extensions.
    fn spec_example() -> String {
        format!(
            r#"{{
                "specversion" : "1.0",
                "type" : "com.example.someevent",
                "source" : "/mycontext",
                "subject": "order-7",
                "id" : "{ID}",
                "time" : "2018-04-05T17:31:00Z",
                "comexampleextension1" : "value",
                "comexampleothervalue" : 5,
                "eventversion": "3",
                "aggregatesequence": 12,
                "datacontenttype" : "application/json",
                "data" : {{ "appinfoA" : "abc", "appinfoB" : 123, "appinfoC" : true }}
            }}"#
        )
    }

    #[test]
    fn the_json_formats_example_reads_as_a_structured_event() {
        let value = spec_example();
        for message in [
            IncomingMessage::new("t", Some(value.as_bytes())),
            IncomingMessage::new("t", Some(value.as_bytes())).header(
                "content-type",
                b"application/cloudevents+json; charset=UTF-8",
            ),
        ] {
            let (metadata, payload) = message.read().unwrap();
            assert_eq!(metadata.id.to_string(), ID);
            assert_eq!(metadata.event_type, "com.example.someevent");
            assert_eq!(metadata.version, 3);
            assert_eq!(metadata.aggregate_id.as_deref(), Some("order-7"));
            assert_eq!(metadata.aggregate_sequence, Some(12));
            let data: serde_json::Value = serde_json::from_slice(payload.unwrap()).unwrap();
            assert_eq!(
                data,
                serde_json::json!({ "appinfoA": "abc", "appinfoB": 123, "appinfoC": true })
            );
        }
    }

    #[test]
    fn binary_events_are_read_under_every_bindings_prefix() {
        for prefix in BINARY_PREFIXES {
            let names: Vec<String> = ["specversion", "id", "type", "source", "subject", "replayid"]
                .iter()
                .map(|name| format!("{prefix}{name}"))
                .collect();
            let values: [&[u8]; 6] = [b"1.0", ID.as_bytes(), b"OrderPlaced", b"/s", b"7", b"r-1"];
            let message = IncomingMessage::new("t", Some(b"{\"n\":1}"))
                .header("content-type", b"application/json")
                .headers(names.iter().zip(values));
            let (metadata, payload) = message.read().unwrap();
            assert_eq!(metadata.event_type, "OrderPlaced", "{prefix}");
            assert_eq!(metadata.version, 1, "no eventversion is version 1");
            assert_eq!(metadata.aggregate_id.as_deref(), Some("7"));
            assert_eq!(metadata.replay_id.as_deref(), Some("r-1"));
            assert_eq!(payload, Some(&b"{\"n\":1}"[..]));
            let keyed = message.clone().key(b"key-wins").metadata().unwrap();
            assert_eq!(keyed.aggregate_id.as_deref(), Some("key-wins"));
        }
    }

    #[test]
    fn the_eventtype_attribute_wins_over_a_templated_type() {
        let message = IncomingMessage::new("t", Some(b"{}"))
            .header("ce_specversion", b"1.0")
            .header("ce_id", ID.as_bytes())
            .header("ce_type", b"com.acme.OrderPlaced.v2")
            .header("ce_eventtype", b"OrderPlaced")
            .header("ce_eventversion", b"2");
        let metadata = message.metadata().unwrap();
        assert_eq!(
            (metadata.event_type.as_str(), metadata.version),
            ("OrderPlaced", 2)
        );
    }

    #[test]
    fn broken_cloudevents_are_errors_never_panics() {
        let missing_id = IncomingMessage::new("t", Some(b"{}"))
            .header("ce_specversion", b"1.0")
            .header("ce_type", b"E");
        assert!(matches!(
            missing_id.metadata(),
            Err(DecodeError::MissingAttribute { attribute: "id" })
        ));
        let cases: [(&str, &[u8]); 4] = [
            ("ce_id", b"42"),
            ("ce_eventversion", b"0"),
            ("ce_aggregatesequence", b"x"),
            ("ce_type", b"\xff"),
        ];
        for (header, value) in cases {
            let message = IncomingMessage::new("t", Some(b"{}"))
                .header("ce_specversion", b"1.0")
                .header("ce_id", ID.as_bytes())
                .header("ce_type", b"E")
                .header(header, value);
            assert!(
                matches!(
                    message.metadata(),
                    Err(DecodeError::InvalidAttribute { .. })
                ),
                "{header}: {:?}",
                message.metadata()
            );
        }
        let declared = |value: &'static [u8]| {
            IncomingMessage::new("t", Some(value))
                .header("content-type", b"application/cloudevents+json")
        };
        for value in [&b"not json"[..], b"{\"id\":\"x\"}", b"[1]"] {
            assert!(matches!(
                declared(value).read(),
                Err(DecodeError::InvalidEnvelope { .. })
            ));
        }
        let base64 = format!(
            r#"{{"specversion":"1.0","id":"{ID}","type":"E","source":"/s","data_base64":"e30="}}"#
        );
        let error = IncomingMessage::new("t", Some(base64.as_bytes()))
            .read()
            .unwrap_err();
        assert!(error.to_string().contains("data_base64"), "{error}");
    }

    #[test]
    fn debeziums_shape_is_read_as_before() {
        // A payload that looks like an envelope stays a payload when the
        // message carries Debezium's headers.
        let value = spec_example();
        let message = IncomingMessage::new("t", Some(value.as_bytes()))
            .header("id", ID.as_bytes())
            .header("eventType", b"OrderPlaced")
            .header("eventVersion", b"1");
        let (metadata, payload) = message.read().unwrap();
        assert_eq!(metadata.event_type, "OrderPlaced");
        assert_eq!(payload, Some(value.as_bytes()));
        let plain = IncomingMessage::new("t", Some(b"{\"specversion\":1}"));
        assert!(matches!(
            plain.read(),
            Err(DecodeError::MissingAttribute { .. } | DecodeError::MissingHeader { .. })
        ));
    }
}
