//! A bumped version fails until it is recorded; the lock holds version 1.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 2)]
struct CartMerged {
    cart_id: i64,
    into_cart_id: i64,
}

fn main() {}
