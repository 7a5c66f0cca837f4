//! A field renamed on the wire with `#[serde(rename)]`: the lock records `owner`.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartTransferred {
    cart_id: i64,
    #[serde(rename = "customer")]
    owner: String,
}

fn main() {}
