//! A change two levels down: `Price` inside `Item` inside `Vec<Item>`.
//! The lock records `Price { cents: i64 }`.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct Price {
    cents: i64,
    currency: String,
}

#[derive(EventPayload, Serialize)]
struct Item {
    sku: String,
    price: Price,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartFilled {
    cart_id: i64,
    items: Vec<Item>,
}

fn main() {}
