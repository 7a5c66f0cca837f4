//! `rename_all` changed: the lock records `camelCase`. One error, not
//! one per field.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
#[serde(rename_all = "PascalCase")]
struct CartFrozen {
    cart_id: i64,
    frozen_by: String,
}

fn main() {}
