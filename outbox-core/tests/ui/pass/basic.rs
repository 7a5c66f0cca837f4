//! The minimal event: constants from the attribute, the struct name as the
//! event type, and one schema entry per field in declaration order.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::{DomainEvent, FieldSchema};
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 2)]
struct OrderPlaced {
    order_id: i64,
    total_cents: u64,
    lines: Vec<String>,
}

fn main() {
    assert_eq!(OrderPlaced::AGGREGATE_TYPE, "Order");
    assert_eq!(OrderPlaced::EVENT_TYPE, "OrderPlaced");
    assert_eq!(OrderPlaced::VERSION, 2);
    assert_eq!(OrderPlaced::SCHEMA.aggregate_type, "Order");
    assert_eq!(OrderPlaced::SCHEMA.event_type, "OrderPlaced");
    assert_eq!(OrderPlaced::SCHEMA.version, 2);

    let plain = |name, ty| FieldSchema {
        name,
        rust_name: name,
        ty,
        optional: false,
        default: false,
        flatten: false,
    };
    assert_eq!(
        OrderPlaced::SCHEMA.fields,
        [
            plain("order_id", "i64"),
            plain("total_cents", "u64"),
            plain("lines", "Vec<String>"),
        ]
    );

    support::assert_schema_matches_serde(&OrderPlaced {
        order_id: 7,
        total_cents: 1250,
        lines: vec!["book".into()],
    });
}
