//! A field whose type changed: the lock records `size: i32`.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartResized {
    cart_id: i64,
    size: u64,
}

fn main() {}
