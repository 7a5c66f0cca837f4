//! An event with no entry in the lock fails until it is recorded.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartAbandoned {
    cart_id: i64,
}

fn main() {}
