//! A new field that is neither `Option` nor `#[serde(default)]`.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartShared {
    cart_id: i64,
    shared_with: String,
}

fn main() {}
