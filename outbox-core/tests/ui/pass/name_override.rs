//! `name = ".."` replaces the struct name as the event type, and the keys may
//! be spread over several `#[domain_event]` attributes.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", name = "order.placed")]
#[domain_event(version = 3)]
struct OrderPlacedV3 {
    order_id: i64,
}

fn main() {
    assert_eq!(OrderPlacedV3::EVENT_TYPE, "order.placed");
    assert_eq!(OrderPlacedV3::SCHEMA.event_type, "order.placed");
    assert_eq!(OrderPlacedV3::AGGREGATE_TYPE, "Order");
    assert_eq!(OrderPlacedV3::VERSION, 3);
    assert_eq!(OrderPlacedV3::SCHEMA.version, 3);
    support::assert_schema_matches_serde(&OrderPlacedV3 { order_id: 1 });
}
