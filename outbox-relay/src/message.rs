//! [`Message`]: what a sink publishes, in the shape of Debezium's Outbox
//! Event Router.
//!
//! - topic: the topic template with `{aggregatetype}` replaced
//!   (default `outbox.event.{aggregatetype}`);
//! - key: `aggregateid`, so one aggregate's events share a partition;
//! - value: the payload's JSON bytes as stored, or null for a NULL payload;
//! - headers: `id`, `eventType`, `eventVersion`, and `aggregateSequence` and
//!   `traceparent` when the row has them.

use outbox_contract::{headers, topic};

use std::borrow::Cow;
use std::sync::Arc;

use crate::cloudevents::{self, CloudEvent, CloudEvents};
use crate::record::OutboxRecord;
use crate::router::Router;

/// Header carrying the event id ([`headers::ID`]).
pub use outbox_contract::headers::ID as HEADER_ID;

/// A message ready for a sink. It borrows what it can from the claimed
/// row it is made of ([`TopicTemplate::message`]), so that building a
/// batch's messages copies no id, key or payload; a message made by hand
/// owns its values (`"...".into()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    /// Destination topic, shared by the messages of a batch with the same
    /// aggregate type ([`TopicTemplate::messages`]).
    pub topic: Arc<str>,
    /// The aggregate id: the Kafka key (unless `key_column` says
    /// otherwise), and what sinks keep each aggregate's messages in order
    /// by.
    pub key: Cow<'a, str>,
    /// The Kafka key from the router's `table.field.event.key` column:
    /// `None` without the option (the key is `key`), `Some(None)` for a
    /// NULL there (no key).
    pub key_column: Option<Option<String>>,
    /// The row's aggregate type, for brokers that carry it as a header.
    pub aggregate_type: Cow<'a, str>,
    /// Headers, in a fixed order.
    pub headers: Vec<(&'static str, Cow<'a, str>)>,
    /// The payload's JSON text; `None` for a tombstone.
    pub payload: Option<Cow<'a, str>>,
    /// With `--format cloudevents` or `cloudevents-structured`: the
    /// CloudEvents attributes the headers do not carry, and the mode.
    pub cloudevent: Option<Box<CloudEvent>>,
    /// Headers of the router's additional fields (name, value), after the
    /// others in every format.
    pub extra_headers: Vec<(String, String)>,
    /// The Kafka partition an additional field names, or why its value is
    /// not one; `None`: by key.
    pub partition: Option<Result<i32, String>>,
    /// The message timestamp (milliseconds since the epoch) the router's
    /// `table.field.event.timestamp` column gives; `None`: the time of
    /// sending.
    pub timestamp: Option<i64>,
}

/// A message as a sink writes it under its binding: the headers, the
/// value and the content type, for the message's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire<'a> {
    /// Headers, in a fixed order; without `content-type`, which
    /// [`Wire::content_type`] holds.
    pub headers: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// The value; `None` for a tombstone.
    pub value: Option<Cow<'a, str>>,
    /// The content type of the value, for a CloudEvent (Kafka and NATS
    /// carry it as the `content-type` header); `None` in Debezium's shape,
    /// which has no such header.
    pub content_type: Option<&'static str>,
}

impl Message<'_> {
    /// The key a keyed broker (Kafka) gets: the aggregate id, or the
    /// router's key column's value; `None` for a NULL there.
    pub fn wire_key(&self) -> Option<&str> {
        match &self.key_column {
            None => Some(self.key.as_ref()),
            Some(column) => column.as_deref(),
        }
    }

    /// The message as a sink writes it, CloudEvents attributes (if any)
    /// under `prefix` (see [`crate::cloudevents`]). Fails for good when a
    /// structured CloudEvent's payload is not JSON.
    pub fn wire(&self, prefix: &str) -> Result<Wire<'_>, String> {
        let mut wire = self.wire_of_format(prefix)?;
        for (name, value) in &self.extra_headers {
            // An additional field named like a header of the format
            // (`type:header:eventType`) takes its place.
            let value = Cow::Borrowed(value.as_str());
            match wire.headers.iter_mut().find(|(header, _)| header == name) {
                Some(header) => header.1 = value,
                None => wire.headers.push((Cow::Borrowed(name.as_str()), value)),
            }
        }
        Ok(wire)
    }

    fn wire_of_format(&self, prefix: &str) -> Result<Wire<'_>, String> {
        let Some(event) = &self.cloudevent else {
            return Ok(Wire {
                headers: self
                    .headers
                    .iter()
                    .map(|(name, value)| (Cow::Borrowed(*name), Cow::Borrowed(value.as_ref())))
                    .collect(),
                value: self.payload.as_deref().map(Cow::Borrowed),
                content_type: None,
            });
        };
        if event.is_structured(self) {
            return Ok(Wire {
                headers: Vec::new(),
                value: event.structured_value(self)?.map(Cow::Owned),
                content_type: Some(cloudevents::STRUCTURED),
            });
        }
        Ok(Wire {
            headers: event
                .binary_headers(self, prefix)
                .into_iter()
                .map(|(name, value)| (Cow::Owned(name), Cow::Owned(value)))
                .collect(),
            value: self.payload.as_deref().map(Cow::Borrowed),
            content_type: Some(cloudevents::JSON),
        })
    }
}

/// Turns records into messages for one topic template, or for the
/// options of Debezium's router ([`Router`]).
#[derive(Debug, Clone)]
pub struct TopicTemplate {
    template: String,
    router: Option<Router>,
    cloudevents: Option<CloudEvents>,
}

impl TopicTemplate {
    /// A template in which `{aggregatetype}` stands for the row's aggregate type.
    pub fn new(template: impl Into<String>) -> Self {
        Self {
            template: template.into(),
            router: None,
            cloudevents: None,
        }
    }

    /// Messages as CloudEvents (see [`crate::cloudevents`]).
    pub fn with_cloudevents(self, cloudevents: CloudEvents) -> Self {
        Self {
            cloudevents: Some(cloudevents),
            ..self
        }
    }

    /// Values, and topics unless its route.* options are the defaults, as
    /// `router` decides them.
    pub fn with_router(self, router: Router) -> Self {
        Self {
            router: Some(router),
            ..self
        }
    }

    /// The topic of an aggregate type, by the template (not the router).
    pub fn topic(&self, aggregate_type: &str) -> String {
        topic::for_aggregate(&self.template, aggregate_type)
    }

    /// The message for a claimed row.
    pub fn message<'a>(&self, record: &'a OutboxRecord) -> Message<'a> {
        self.message_with(record, &mut None)
    }

    /// The messages for claimed rows, in order. Rows with the aggregate
    /// type of the row before them share its topic.
    pub fn messages<'a>(&self, records: &'a [OutboxRecord]) -> Vec<Message<'a>> {
        let mut last = None;
        records
            .iter()
            .map(|record| self.message_with(record, &mut last))
            .collect()
    }

    /// The message for `record`, whose topic is `last`'s when `last` was
    /// made for its aggregate type (and the template, not the router,
    /// decides topics); `last` then holds the topic of `record`'s type.
    fn message_with<'a>(
        &self,
        record: &'a OutboxRecord,
        last: &mut Option<(&'a str, Arc<str>)>,
    ) -> Message<'a> {
        let id = match self
            .router
            .as_ref()
            .and_then(|router| router.event_id(record))
        {
            Some(id) => Cow::Owned(id),
            None => Cow::Borrowed(record.id.as_str()),
        };
        let mut headers = Vec::with_capacity(5);
        headers.extend([
            (headers::ID, id),
            (
                headers::EVENT_TYPE,
                Cow::Borrowed(record.event_type.as_str()),
            ),
            (
                headers::EVENT_VERSION,
                Cow::Owned(record.event_version.to_string()),
            ),
        ]);
        if let Some(sequence) = record.aggregate_seq {
            headers.push((
                headers::AGGREGATE_SEQUENCE,
                Cow::Owned(sequence.to_string()),
            ));
        }
        if let Some(traceparent) = &record.traceparent {
            headers.push((headers::TRACEPARENT, Cow::Borrowed(traceparent.as_str())));
        }
        let topic = match &self.router {
            Some(router) if router.routes() => Arc::from(router.topic(record)),
            _ => match last {
                Some((aggregate_type, topic)) if *aggregate_type == record.aggregate_type => {
                    topic.clone()
                }
                _ => {
                    let topic: Arc<str> = Arc::from(self.topic(&record.aggregate_type));
                    *last = Some((record.aggregate_type.as_str(), topic.clone()));
                    topic
                }
            },
        };
        let (payload, extra_headers, partition, timestamp, key_column) = match &self.router {
            Some(router) => (
                router.value(record).map(Cow::Owned),
                router.headers(record),
                router.partition(record),
                router.timestamp(record),
                router.key(record),
            ),
            None => (
                record.payload.as_deref().map(Cow::Borrowed),
                Vec::new(),
                None,
                None,
                None,
            ),
        };
        Message {
            topic,
            key: Cow::Borrowed(record.aggregate_id.as_str()),
            key_column,
            aggregate_type: Cow::Borrowed(record.aggregate_type.as_str()),
            headers,
            payload,
            cloudevent: self
                .cloudevents
                .as_ref()
                .map(|cloudevents| Box::new(cloudevents.event(record))),
            extra_headers,
            partition,
            timestamp,
        }
    }
}

impl Default for TopicTemplate {
    fn default() -> Self {
        Self::new(topic::DEFAULT_TEMPLATE)
    }
}

/// An `OrderPlaced` message of order `key` with event id `id`, as the
/// Kafka headers carry it.
#[cfg(test)]
pub(crate) fn test_message(id: &str, key: &str) -> Message<'static> {
    Message {
        topic: "outbox.event.Order".into(),
        key: key.to_owned().into(),
        key_column: None,
        aggregate_type: "Order".into(),
        headers: vec![
            ("id", id.to_owned().into()),
            ("eventType", "OrderPlaced".into()),
            ("eventVersion", "2".into()),
            ("aggregateSequence", "7".into()),
        ],
        payload: Some(r#"{"order_id":42}"#.into()),
        cloudevent: None,
        extra_headers: Vec::new(),
        partition: None,
        timestamp: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> OutboxRecord {
        OutboxRecord {
            id: "0190a7e8-0000-7000-8000-000000000001".into(),
            aggregate_type: "Order".into(),
            aggregate_id: "42".into(),
            event_type: "OrderPlaced".into(),
            payload: Some(r#"{"order_id":42}"#.into()),
            event_version: 2,
            aggregate_seq: Some(7),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            seq: 1,
            attempts: 0,
            age_at_claim: 0.0,
            created_at: None,
            partition: None,
            ctid: None,
            extra: Vec::new(),
        }
    }

    #[test]
    fn follows_the_outbox_event_router_shape() {
        let record = record();
        let message = TopicTemplate::default().message(&record);
        assert_eq!(&*message.topic, "outbox.event.Order");
        assert_eq!(message.key, "42");
        assert_eq!(message.payload.as_deref(), Some(r#"{"order_id":42}"#));
        assert_eq!(
            message.headers,
            [
                ("id", "0190a7e8-0000-7000-8000-000000000001".into()),
                ("eventType", "OrderPlaced".into()),
                ("eventVersion", "2".into()),
                ("aggregateSequence", "7".into()),
                (
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()
                ),
            ]
        );
    }

    #[test]
    fn a_batch_shares_topics_by_aggregate_type_only() {
        let types = ["Order", "Order", "Customer", "Order", "Customer"];
        let records: Vec<OutboxRecord> = types
            .iter()
            .enumerate()
            .map(|(n, aggregate_type)| OutboxRecord {
                aggregate_type: (*aggregate_type).into(),
                aggregate_id: n.to_string(),
                ..record()
            })
            .collect();
        let template = TopicTemplate::new("{aggregatetype}-events");
        let messages = template.messages(&records);
        let topics: Vec<&str> = messages.iter().map(|m| &*m.topic).collect();
        assert_eq!(
            topics,
            [
                "Order-events",
                "Order-events",
                "Customer-events",
                "Order-events",
                "Customer-events"
            ]
        );
        // Each message is the one `message` makes for its row.
        for (message, record) in messages.iter().zip(&records) {
            assert_eq!(*message, template.message(record));
        }
    }

    #[test]
    fn optional_headers_are_left_out() {
        let mut plain = record();
        plain.aggregate_seq = None;
        plain.traceparent = None;
        let message = TopicTemplate::new("{aggregatetype}-events").message(&plain);
        assert_eq!(&*message.topic, "Order-events");
        let names: Vec<_> = message.headers.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["id", "eventType", "eventVersion"]);
    }
}
