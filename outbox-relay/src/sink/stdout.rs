//! Prints each message as one JSON object per line on standard output:
//! `{"topic":..,"key":..,"headers":{..},"payload":..}`, the payload embedded
//! as JSON (null for a tombstone). Logs go to standard error, so the output
//! can be piped.

use std::borrow::Cow;
use std::io::Write;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{SendError, Sink};
use crate::cloudevents;
use crate::message::Message;

/// Writes messages to standard output.
#[derive(Debug, Default)]
pub struct StdoutSink;

#[derive(Serialize)]
struct Line<'a> {
    topic: &'a str,
    key: Option<&'a str>,
    /// The partition an additional field names, if one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<i32>,
    /// The timestamp `table.field.event.timestamp` gives, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<i64>,
    headers: Headers<'a>,
    payload: Option<&'a RawValue>,
}

/// Headers as a JSON object, in the message's order.
struct Headers<'a>(&'a [(Cow<'a, str>, Cow<'a, str>)]);

impl Serialize for Headers<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// The JSON line of a message, as Kafka would carry it (CloudEvents
/// attributes under `ce_`, and a `content-type` header first). A payload
/// that is not JSON fails for good.
pub fn json_line(message: &Message<'_>) -> Result<String, SendError> {
    let mut wire = message
        .wire(cloudevents::KAFKA_PREFIX)
        .map_err(SendError::permanent)?;
    if let Some(content_type) = wire.content_type {
        wire.headers.insert(
            0,
            (Cow::Borrowed("content-type"), Cow::Borrowed(content_type)),
        );
    }
    let payload = match &wire.value {
        Some(text) => Some(
            serde_json::from_str::<&RawValue>(text)
                .map_err(|error| SendError::permanent(format!("payload is not JSON: {error}")))?,
        ),
        None => None,
    };
    let partition = message
        .partition
        .clone()
        .transpose()
        .map_err(SendError::permanent)?;
    let line = Line {
        topic: &message.topic,
        key: message.wire_key(),
        partition,
        timestamp: message.timestamp,
        headers: Headers(&wire.headers),
        payload,
    };
    serde_json::to_string(&line).map_err(|error| SendError::permanent(error.to_string()))
}

/// A closed stdout (the reader went away) ends the run; anything else may pass.
fn write_error(error: &std::io::Error) -> SendError {
    let reason = format!("cannot write to stdout: {error}");
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        SendError::closed(reason)
    } else {
        SendError::transient(reason)
    }
}

#[async_trait]
impl Sink for StdoutSink {
    async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>> {
        let mut out = std::io::stdout().lock();
        let outcomes = messages
            .iter()
            .map(|message| {
                let line = json_line(message)?;
                writeln!(out, "{line}").map_err(|error| write_error(&error))
            })
            .collect::<Vec<_>>();
        if let Err(error) = out.flush() {
            return vec![Err(write_error(&error)); messages.len()];
        }
        outcomes
    }

    async fn flush(&self, _timeout: Duration) {
        let _ = std::io::stdout().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_embedded_as_json() {
        let message = Message {
            topic: "outbox.event.Order".into(),
            key: "42".into(),
            key_column: None,
            aggregate_type: "Order".into(),
            headers: vec![("id", "e-1".into()), ("eventType", "OrderPlaced".into())],
            payload: Some(r#"{"order_id": 42}"#.into()),
            cloudevent: None,
            extra_headers: Vec::new(),
            partition: None,
            timestamp: None,
        };
        assert_eq!(
            json_line(&message).unwrap(),
            r#"{"topic":"outbox.event.Order","key":"42","headers":{"id":"e-1","eventType":"OrderPlaced"},"payload":{"order_id": 42}}"#
        );
    }

    #[test]
    fn tombstones_and_invalid_payloads() {
        let mut message = Message {
            topic: "t".into(),
            key: "k".into(),
            key_column: None,
            aggregate_type: "A".into(),
            headers: vec![],
            payload: None,
            cloudevent: None,
            extra_headers: Vec::new(),
            partition: None,
            timestamp: None,
        };
        assert!(json_line(&message).unwrap().ends_with(r#""payload":null}"#));
        message.payload = Some("not json".into());
        let error = json_line(&message).unwrap_err();
        assert_eq!(error.kind, super::super::FailureKind::Permanent);
    }
}
