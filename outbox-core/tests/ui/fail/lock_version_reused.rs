//! A recorded version reused for another payload: versions 1 and 2 are
//! recorded, so the fix is version 3.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 2)]
struct CartSplit {
    cart_id: i64,
    parts: Vec<i64>,
}

fn main() {}
