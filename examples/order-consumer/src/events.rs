//! The events this consumer reads, decoded into [`OrderEvent`].

use order_service::events::{OrderLineAdded, OrderPaid, OrderPlaced};
use outbox_core::EventDecoder;

/// An event of the order aggregate, in the version this consumer handles.
#[derive(Debug, Clone, PartialEq)]
pub enum OrderEvent {
    /// `OrderPlaced`.
    Placed(OrderPlaced),
    /// `OrderLineAdded`.
    LineAdded(OrderLineAdded),
    /// `OrderPaid`.
    Paid(OrderPaid),
}

impl OrderEvent {
    /// The order the event belongs to.
    pub fn order_id(&self) -> i64 {
        match self {
            OrderEvent::Placed(event) => event.order_id,
            OrderEvent::LineAdded(event) => event.order_id,
            OrderEvent::Paid(event) => event.order_id,
        }
    }
}

impl From<OrderPlaced> for OrderEvent {
    fn from(event: OrderPlaced) -> Self {
        OrderEvent::Placed(event)
    }
}

impl From<OrderLineAdded> for OrderEvent {
    fn from(event: OrderLineAdded) -> Self {
        OrderEvent::LineAdded(event)
    }
}

impl From<OrderPaid> for OrderEvent {
    fn from(event: OrderPaid) -> Self {
        OrderEvent::Paid(event)
    }
}

/// Every (event type, version) this consumer reads.
///
/// When the order service publishes a version 2 of an event, keep the
/// version 1 struct (`OrderPlacedV1` with `name = "OrderPlaced", version =
/// 1`), write `From<OrderPlacedV1> for OrderPlaced`, and list it here with
/// `.upcast::<OrderPlacedV1, OrderPlaced>()`: messages of both versions
/// then decode into the current struct.
pub fn decoder() -> EventDecoder<OrderEvent> {
    EventDecoder::new()
        .event::<OrderPlaced>()
        .event::<OrderLineAdded>()
        .event::<OrderPaid>()
}
