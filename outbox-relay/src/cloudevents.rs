//! CloudEvents 1.0: `--format cloudevents` (binary content mode) and
//! `--format cloudevents-structured` (the JSON event format).
//!
//! Every row becomes a CloudEvent with these attributes:
//!
//! | attribute | value |
//! |---|---|
//! | `specversion` | `1.0` |
//! | `id` | the event id |
//! | `source` | `--ce-source`, default `/{service}/{aggregatetype}` |
//! | `type` | `--ce-type`, default `{eventtype}` |
//! | `subject` | the aggregate id |
//! | `time` | the row's creation time (RFC 3339, UTC), when known |
//! | `datacontenttype` | `application/json` |
//! | `eventtype` | the event type, only when `--ce-type` is not the default |
//! | `eventversion` | the payload version |
//! | `aggregatetype` | the aggregate type |
//! | `aggregatesequence` | the event's number within its aggregate, when known |
//! | `traceparent` | the W3C trace context, when the row has one |
//! | `replayid` | on a copy sent by `outbox-relay replay` |
//!
//! In binary mode the attributes are headers under each binding's prefix
//! (Kafka `ce_`, AMQP `cloudEvents_`, NATS `ce-`), `datacontenttype` is the
//! content type (Kafka's and NATS' `content-type` header, AMQP's
//! `content_type` property), and the value is the payload as stored. In
//! structured mode the value is the JSON envelope with the payload as its
//! `data` member, and the content type is `application/cloudevents+json`.
//! A NULL payload is a tombstone in both modes: a null value (an empty body
//! on RabbitMQ and NATS) with the attributes as headers, since the Kafka
//! binding has no structured form of a tombstone.

use std::fmt;

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use outbox_contract::headers;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::message::Message;
use crate::record::OutboxRecord;

/// The CloudEvents version the relay writes.
pub const SPEC_VERSION: &str = "1.0";
/// The content type of the payload (`datacontenttype`).
pub const JSON: &str = "application/json";
/// The content type of a structured message.
pub const STRUCTURED: &str = "application/cloudevents+json; charset=UTF-8";
/// The default `source` template.
pub const DEFAULT_SOURCE: &str = "/{service}/{aggregatetype}";
/// The default `type` template: the event type alone.
pub const DEFAULT_TYPE: &str = "{eventtype}";

/// The header prefix of the Kafka binding.
pub const KAFKA_PREFIX: &str = "ce_";
/// The application-property prefix of the AMQP binding.
pub const AMQP_PREFIX: &str = "cloudEvents_";
/// The header prefix of the NATS binding.
pub const NATS_PREFIX: &str = "ce-";

/// What each published message looks like.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// Debezium's Outbox Event Router: the payload as the value, the event
    /// id, type and version as headers.
    #[default]
    Debezium,
    /// CloudEvents 1.0 in binary content mode: the payload as the value,
    /// the attributes as headers.
    Cloudevents,
    /// CloudEvents 1.0 in structured content mode: a JSON envelope with the
    /// payload as `data`.
    CloudeventsStructured,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Debezium => "debezium",
            Self::Cloudevents => "cloudevents",
            Self::CloudeventsStructured => "cloudevents-structured",
        })
    }
}

/// How rows become CloudEvents: the content mode and the `source` and
/// `type` templates, in which `{service}`, `{aggregatetype}`,
/// `{eventtype}` and `{version}` are replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    /// Structured content mode (else binary).
    pub structured: bool,
    /// The `source` template.
    pub source: String,
    /// The `type` template.
    pub ty: String,
    /// What `{service}` stands for.
    pub service: String,
}

/// Placeholders the templates may use.
const PLACEHOLDERS: [&str; 4] = ["{service}", "{aggregatetype}", "{eventtype}", "{version}"];

impl CloudEvents {
    /// Checks a template: not empty, and every `{..}` a known placeholder.
    pub fn check_template(flag: &str, template: &str) -> Result<(), String> {
        if template.trim().is_empty() {
            return Err(format!("{flag} is empty"));
        }
        let mut rest = template;
        while let Some(start) = rest.find('{') {
            let end = rest[start..].find('}').map(|end| start + end + 1);
            let Some(end) = end else {
                return Err(format!("{flag} {template:?} has an unclosed {{"));
            };
            let placeholder = &rest[start..end];
            if !PLACEHOLDERS.contains(&placeholder) {
                return Err(format!(
                    "{flag} {template:?}: unknown placeholder {placeholder}; known: {}",
                    PLACEHOLDERS.join(", ")
                ));
            }
            rest = &rest[end..];
        }
        Ok(())
    }

    fn fill(&self, template: &str, record: &OutboxRecord) -> String {
        template
            .replace("{service}", &self.service)
            .replace("{aggregatetype}", &record.aggregate_type)
            .replace("{eventtype}", &record.event_type)
            .replace("{version}", &record.event_version.to_string())
    }

    /// The attributes of `record` that its headers do not carry.
    pub fn event(&self, record: &OutboxRecord) -> CloudEvent {
        let ty = self.fill(&self.ty, record);
        CloudEvent {
            structured: self.structured,
            source: self.fill(&self.source, record),
            event_type: (ty != record.event_type).then(|| record.event_type.clone()),
            ty,
            time: record.created_at.as_deref().and_then(rfc3339),
        }
    }
}

/// The CloudEvents attributes of one message beyond what its headers
/// carry (id, version, sequence, trace context and replay id are read from
/// them when the message is sent, so a replay's header counts too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvent {
    /// Structured content mode (else binary).
    pub structured: bool,
    /// `source`.
    pub source: String,
    /// `type`.
    pub ty: String,
    /// The `eventtype` extension: the event type, when `type` is not it.
    pub event_type: Option<String>,
    /// `time`, RFC 3339 in UTC.
    pub time: Option<String>,
}

impl CloudEvent {
    /// Every attribute of `message` but `datacontenttype`, in a fixed
    /// order, as (name, value).
    pub fn attributes<'a>(&'a self, message: &'a Message<'_>) -> Vec<(&'static str, &'a str)> {
        let header = |name: &str| {
            message
                .headers
                .iter()
                .rev()
                .find(|(header, _)| *header == name)
                .map(|(_, value)| value.as_ref())
        };
        let mut attributes = vec![
            ("specversion", SPEC_VERSION),
            ("id", header(headers::ID).unwrap_or_default()),
            ("source", self.source.as_str()),
            ("type", self.ty.as_str()),
            ("subject", &*message.key),
        ];
        if let Some(time) = &self.time {
            attributes.push(("time", time));
        }
        if let Some(event_type) = &self.event_type {
            attributes.push(("eventtype", event_type));
        }
        let extensions = [
            ("eventversion", header(headers::EVENT_VERSION)),
            ("aggregatetype", Some(&*message.aggregate_type)),
            ("aggregatesequence", header(headers::AGGREGATE_SEQUENCE)),
            ("traceparent", header(headers::TRACEPARENT)),
            ("replayid", header(headers::REPLAY_ID)),
        ];
        attributes.extend(
            extensions
                .into_iter()
                .filter_map(|(name, value)| Some((name, value?))),
        );
        attributes
    }

    /// Whether `message` goes in structured mode: structured was asked for
    /// and it has a payload (a tombstone is always binary).
    pub fn is_structured(&self, message: &Message<'_>) -> bool {
        self.structured && message.payload.is_some()
    }

    /// The headers of `message` in binary mode, under `prefix`, and its
    /// content type (`datacontenttype`).
    pub fn binary_headers(&self, message: &Message<'_>, prefix: &str) -> Vec<(String, String)> {
        self.attributes(message)
            .into_iter()
            .map(|(name, value)| (format!("{prefix}{name}"), value.to_owned()))
            .collect()
    }

    /// The structured value of `message`: the JSON envelope with the
    /// payload as `data`; `None` for a tombstone. Fails when the payload
    /// is not JSON.
    pub fn structured_value(&self, message: &Message<'_>) -> Result<Option<String>, String> {
        let Some(payload) = &message.payload else {
            return Ok(None);
        };
        let data: &RawValue = serde_json::from_str(payload)
            .map_err(|error| format!("the payload is not JSON: {error}"))?;
        let mut envelope = serde_json::Map::new();
        for (name, value) in self.attributes(message) {
            envelope.insert(name.to_owned(), value.into());
        }
        envelope.insert("datacontenttype".to_owned(), JSON.into());
        let mut text = serde_json::to_string(&envelope).map_err(|error| error.to_string())?;
        // `data` goes in as stored, byte for byte, after the attributes.
        text.pop();
        text.push_str(",\"data\":");
        text.push_str(data.get());
        text.push('}');
        Ok(Some(text))
    }
}

/// A creation time as a database writes it (PostgreSQL's text form with
/// its offset, MariaDB's and SQLite's UTC forms) in RFC 3339, UTC; `None`
/// for what is not a time (PostgreSQL's `infinity`).
pub fn rfc3339(text: &str) -> Option<String> {
    let utc = parse_time(text)?;
    Some(utc.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

/// A time as a database writes it (see [`rfc3339`]), in UTC.
pub fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    let text = text.trim();
    DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z")
        .or_else(|_| DateTime::parse_from_rfc3339(text))
        .map(|time| time.with_timezone(&Utc))
        .or_else(|_| {
            NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
                .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f"))
                .map(|time| time.and_utc())
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::TopicTemplate;
    use crate::record::test_record;

    fn settings(structured: bool, ty: &str) -> CloudEvents {
        CloudEvents {
            structured,
            source: DEFAULT_SOURCE.into(),
            ty: ty.into(),
            service: "billing".into(),
        }
    }

    fn record() -> OutboxRecord {
        let mut record = test_record("0190a7e8-0000-7000-8000-000000000001", "42", 0);
        record.event_type = "OrderPlaced".into();
        record.event_version = 2;
        record.aggregate_seq = Some(7);
        record.payload = Some(r#"{"order_id": 42, "note": "a\"b"}"#.into());
        record.created_at = Some("2026-12-03 15:57:31.123456+00".into());
        record
    }

    #[test]
    fn database_times_become_rfc3339_in_utc() {
        let cases = [
            (
                "2026-12-03 15:57:31.123456+00",
                "2026-12-03T15:57:31.123456Z",
            ),
            ("2026-12-03 17:57:31+02", "2026-12-03T15:57:31Z"),
            ("2026-12-03 10:27:31.5-05:30", "2026-12-03T15:57:31.500Z"),
            ("2026-12-03 15:57:31.123456", "2026-12-03T15:57:31.123456Z"),
            ("2026-12-03T15:57:31.123Z", "2026-12-03T15:57:31.123Z"),
        ];
        for (stored, expected) in cases {
            assert_eq!(rfc3339(stored).as_deref(), Some(expected), "{stored}");
        }
        assert_eq!(rfc3339("infinity"), None);
        assert_eq!(rfc3339("-infinity"), None);
    }

    #[test]
    fn binary_headers_carry_every_attribute() {
        let topics = TopicTemplate::default().with_cloudevents(settings(false, DEFAULT_TYPE));
        let record = record();
        let message = topics.message(&record);
        let event = message.cloudevent.as_ref().unwrap();
        assert_eq!(
            event.binary_headers(&message, KAFKA_PREFIX),
            [
                ("ce_specversion", "1.0"),
                ("ce_id", "0190a7e8-0000-7000-8000-000000000001"),
                ("ce_source", "/billing/Order"),
                ("ce_type", "OrderPlaced"),
                ("ce_subject", "42"),
                ("ce_time", "2026-12-03T15:57:31.123456Z"),
                ("ce_eventversion", "2"),
                ("ce_aggregatetype", "Order"),
                ("ce_aggregatesequence", "7"),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
        );
        assert!(!event.is_structured(&message));
    }

    #[test]
    fn a_type_template_keeps_the_event_type_as_an_extension() {
        let topics = TopicTemplate::default()
            .with_cloudevents(settings(false, "com.acme.{eventtype}.v{version}"));
        let record = record();
        let message = topics.message(&record);
        let event = message.cloudevent.as_ref().unwrap();
        let attributes = event.attributes(&message);
        assert!(attributes.contains(&("type", "com.acme.OrderPlaced.v2")));
        assert!(attributes.contains(&("eventtype", "OrderPlaced")));
    }

    #[test]
    fn the_structured_envelope_holds_the_payload_as_data() {
        let topics = TopicTemplate::default().with_cloudevents(settings(true, DEFAULT_TYPE));
        let record = record();
        let mut message = topics.message(&record);
        message.headers.push((headers::REPLAY_ID, "r-1".into()));
        let event = message.cloudevent.clone().unwrap();
        assert!(event.is_structured(&message));
        let value = event.structured_value(&message).unwrap().unwrap();
        assert!(
            value.ends_with(r#","data":{"order_id": 42, "note": "a\"b"}}"#),
            "{value}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&value).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({
                "specversion": "1.0",
                "id": "0190a7e8-0000-7000-8000-000000000001",
                "source": "/billing/Order",
                "type": "OrderPlaced",
                "subject": "42",
                "time": "2026-12-03T15:57:31.123456Z",
                "datacontenttype": "application/json",
                "eventversion": "2",
                "aggregatetype": "Order",
                "aggregatesequence": "7",
                "replayid": "r-1",
                "data": { "order_id": 42, "note": "a\"b" },
            })
        );
        message.payload = None;
        assert!(!event.is_structured(&message));
        assert_eq!(event.structured_value(&message).unwrap(), None);
    }

    #[test]
    fn templates_name_known_placeholders_only() {
        assert!(CloudEvents::check_template("--ce-type", "x.{eventtype}.v{version}").is_ok());
        let error = CloudEvents::check_template("--ce-type", "x.{event}").unwrap_err();
        assert!(error.contains("unknown placeholder {event}"), "{error}");
        assert!(CloudEvents::check_template("--ce-source", " ").is_err());
        assert!(CloudEvents::check_template("--ce-source", "/a/{service").is_err());
    }
}
