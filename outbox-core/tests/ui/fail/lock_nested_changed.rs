//! A change inside a nested payload type fails at the event's field:
//! the lock records `Discount { percent: u8 }`.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct Discount {
    percent: f64,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartDiscounted {
    cart_id: i64,
    discount: Discount,
}

fn main() {}
