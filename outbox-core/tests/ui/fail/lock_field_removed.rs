//! A removed field is reported at the version: the lock records `reason`.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartEmptied {
    cart_id: i64,
}

fn main() {}
