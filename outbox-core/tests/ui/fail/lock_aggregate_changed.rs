//! An event type moved to another aggregate: the lock records it under `Cart`.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Customer", version = 2)]
struct CartClaimed {
    cart_id: i64,
}

fn main() {}
