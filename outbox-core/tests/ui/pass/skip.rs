//! Fields serde never writes are absent from the schema; fields it writes
//! (even if it may leave a defaulted one out) are present.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderPacked {
    order_id: i64,
    #[serde(skip)]
    cache: Vec<u8>,
    #[serde(skip_serializing)]
    internal_note: String,
    #[serde(default)]
    placed_by: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tags: Vec<String>,
}

fn main() {
    assert_eq!(
        support::names::<OrderPacked>(),
        ["order_id", "placed_by", "tags"]
    );
    assert!(OrderPacked::SCHEMA.field("cache").is_none());
    assert!(OrderPacked::SCHEMA.field("internal_note").is_none());
    support::assert_schema_matches_serde(&OrderPacked {
        order_id: 1,
        cache: vec![1, 2, 3],
        internal_note: "secret".into(),
        placed_by: "web".into(),
        tags: vec!["gift".into()],
    });
}
