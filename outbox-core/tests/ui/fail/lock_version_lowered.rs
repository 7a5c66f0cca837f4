//! A version lower than a recorded one: the lock records only version 2.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartLocked {
    cart_id: i64,
}

fn main() {}
