//! [`OutboxEvent`]: one domain event on its way into the outbox table.

use serde::Serialize;
use uuid::Uuid;

use crate::{DomainEvent, OutboxError};

/// A domain event ready to be appended, with the options of its outbox row.
///
/// Any [`DomainEvent`] converts into one, so the append APIs take
/// `impl Into<OutboxEvent>`; build one explicitly to set the aggregate id,
/// the event id or a W3C `traceparent`. The payload is serialized when the
/// event is appended, before anything is written.
///
/// ```
/// use outbox_core::{DomainEvent, OutboxEvent};
///
/// #[derive(DomainEvent, serde::Serialize)]
/// #[domain_event(aggregate = "Order", version = 1)]
/// struct OrderShipped { carrier: String }
///
/// let event = OutboxEvent::new(OrderShipped { carrier: "DHL".into() })
///     .aggregate_id("42")
///     .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert_eq!(event.event_type(), "OrderShipped");
/// ```
pub struct OutboxEvent {
    aggregate_type: &'static str,
    event_type: &'static str,
    version: u32,
    payload: Box<dyn SerializePayload>,
    aggregate_id: Option<String>,
    traceparent: Option<String>,
    id: Option<Uuid>,
}

impl OutboxEvent {
    /// Wraps a domain event. Its aggregate id defaults to the primary key of
    /// the model saved with it.
    pub fn new<E>(event: E) -> Self
    where
        E: DomainEvent + Send + Sync + 'static,
    {
        Self {
            aggregate_type: E::AGGREGATE_TYPE,
            event_type: E::EVENT_TYPE,
            version: E::VERSION,
            payload: Box::new(event),
            aggregate_id: None,
            traceparent: None,
            id: None,
        }
    }

    /// Sets the aggregate id (the `aggregateid` column and the Kafka key)
    /// instead of taking it from the saved model's primary key.
    pub fn aggregate_id(mut self, aggregate_id: impl Into<String>) -> Self {
        self.aggregate_id = Some(aggregate_id.into());
        self
    }

    /// Attaches a W3C trace context (`traceparent` header), stored with the
    /// row and sent as a message header.
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// Sets the event id instead of a fresh UUIDv7, for example to make a
    /// retried command append the same event.
    pub fn id(mut self, id: Uuid) -> Self {
        self.id = Some(id);
        self
    }

    /// The aggregate type of the wrapped event.
    pub fn aggregate_type(&self) -> &'static str {
        self.aggregate_type
    }

    /// The event type of the wrapped event.
    pub fn event_type(&self) -> &'static str {
        self.event_type
    }

    /// Serializes the payload and checks the options; nothing is written.
    pub(crate) fn prepare(self) -> Result<PreparedEvent, OutboxError> {
        let payload = self
            .payload
            .to_json()
            .map_err(|source| OutboxError::Serialize {
                event_type: self.event_type,
                source,
            })?;
        if let Some(traceparent) = &self.traceparent
            && !is_valid_traceparent(traceparent)
        {
            return Err(OutboxError::InvalidTraceparent {
                event_type: self.event_type,
                value: traceparent.clone(),
            });
        }
        Ok(PreparedEvent {
            id: self.id.unwrap_or_else(Uuid::now_v7),
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event_type,
            version: self.version,
            payload,
            traceparent: self.traceparent,
        })
    }
}

impl std::fmt::Debug for OutboxEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxEvent")
            .field("aggregate_type", &self.aggregate_type)
            .field("event_type", &self.event_type)
            .field("version", &self.version)
            .field("aggregate_id", &self.aggregate_id)
            .field("traceparent", &self.traceparent)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<E> From<E> for OutboxEvent
where
    E: DomainEvent + Send + Sync + 'static,
{
    fn from(event: E) -> Self {
        Self::new(event)
    }
}

/// An event whose payload is serialized and whose options are checked.
#[derive(Debug, Clone)]
pub(crate) struct PreparedEvent {
    pub id: Uuid,
    pub aggregate_type: &'static str,
    pub aggregate_id: Option<String>,
    pub event_type: &'static str,
    pub version: u32,
    pub payload: String,
    pub traceparent: Option<String>,
}

/// Object-safe serialization, so events of different types share one list.
trait SerializePayload: Send + Sync {
    fn to_json(&self) -> serde_json::Result<String>;
}

impl<T: Serialize + Send + Sync> SerializePayload for T {
    fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }
}

/// `version-traceid-parentid-flags` with lowercase hex, as W3C Trace Context
/// defines it; later versions may append fields after the flags.
fn is_valid_traceparent(value: &str) -> bool {
    let mut parts = value.split('-');
    let is_hex = |part: &str, len: usize| {
        part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let known_shape = is_hex(version, 2)
        && version != "ff"
        && is_hex(trace_id, 32)
        && trace_id.bytes().any(|b| b != b'0')
        && is_hex(parent_id, 16)
        && parent_id.bytes().any(|b| b != b'0')
        && is_hex(flags, 2);
    known_shape && (version != "00" || parts.next().is_none())
}

#[cfg(test)]
mod tests {
    use super::is_valid_traceparent;

    #[test]
    fn accepts_w3c_examples() {
        assert!(is_valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(is_valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future"
        ));
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(!is_valid_traceparent(bad), "{bad}");
        }
    }
}
