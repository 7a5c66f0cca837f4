//! An enum variant removed (or renamed) from a nested payload type: the
//! lock records `Delivery` with `Courier` and `Pickup`.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
enum Delivery {
    Courier { company: String },
    Locker,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartDispatched {
    cart_id: i64,
    delivery: Option<Delivery>,
}

fn main() {}
