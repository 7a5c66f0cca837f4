//! serde attributes on nested payload types are part of the contract: the
//! lock records `Channel` externally tagged and `Address` with snake_case
//! keys. Changing the representation and renaming every key fail, each at
//! its field, in the same build.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
#[serde(tag = "type")]
enum Channel {
    Web,
    Store { store_id: u32 },
}

#[derive(EventPayload, Serialize)]
#[serde(rename_all = "camelCase")]
struct Address {
    street_name: String,
    postal_code: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderSourced {
    order_id: i64,
    channel: Channel,
    address: Address,
}

fn main() {}
