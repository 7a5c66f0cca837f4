//! The events this consumer reads, decoded into [`OrderEvent`].
//!
//! The structs are the consumer's own: it depends on the order service's
//! published contract (`examples/order-service/outbox.lock`, as another
//! repository would pin it), not on its code. Each reads only the keys it
//! needs, in the types it wants; `cargo outbox check --contract
//! ../order-service/outbox.lock` fails when one of them cannot read a
//! version the contract declares.

use outbox_core::{DomainEvent, EventDecoder};
use serde::{Deserialize, Serialize};

/// An order was placed.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
pub struct OrderPlaced {
    /// The order.
    pub order_id: i64,
    /// Who ordered.
    pub customer: String,
}

/// A line was added to an order; the consumer ignores the SKU.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
pub struct OrderLineAdded {
    /// The order.
    pub order_id: i64,
    /// How many, read wider than the producer's `i32`.
    pub quantity: i64,
    /// Price of one.
    pub unit_price_cents: i64,
}

/// An order was paid; the consumer ignores the payment reference.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
#[serde(rename_all = "camelCase")]
pub struct OrderPaid {
    /// The order.
    pub order_id: i64,
    /// Amount paid.
    pub amount_cents: i64,
}

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
