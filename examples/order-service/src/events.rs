//! The order aggregate's domain events.

use outbox_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// An order was placed (appended by the `orders` hooks).
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
pub struct OrderPlaced {
    /// The order.
    pub order_id: i64,
    /// Who ordered.
    pub customer: String,
}

/// A line was added to an order (appended by the `order_lines` hooks).
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
pub struct OrderLineAdded {
    /// The order.
    pub order_id: i64,
    /// What was ordered.
    pub sku: String,
    /// How many.
    pub quantity: i32,
    /// Price of one.
    pub unit_price_cents: i64,
}

/// An order was paid (appended explicitly with `update_with_events`).
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
#[serde(rename_all = "camelCase")]
pub struct OrderPaid {
    /// The order.
    pub order_id: i64,
    /// Amount paid.
    pub amount_cents: i64,
    /// Payment provider reference, if any.
    pub payment_reference: Option<String>,
}
