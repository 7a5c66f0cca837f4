//! Changes readers of a recorded version handle compile without a bump.
//! outbox.lock records `CartCheckedOut` version 1 as
//! `{ cart_id: i64, total_cents: i64, note: String }`; since then a field
//! gained `Option`-free defaults, new fields are `Option` or
//! `#[serde(default)]`, and a Rust field was renamed keeping its serialized
//! name.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartCheckedOut {
    cart_id: i64,
    #[serde(rename = "total_cents")]
    total_in_cents: i64,
    #[serde(default)]
    note: String,
    coupon: Option<String>,
    #[serde(default)]
    channel: String,
}

fn main() {
    assert_eq!(
        support::names::<CartCheckedOut>(),
        ["cart_id", "total_cents", "note", "coupon", "channel"]
    );
    support::assert_schema_matches_serde(&CartCheckedOut {
        cart_id: 1,
        total_in_cents: 2500,
        note: String::new(),
        coupon: None,
        channel: "web".into(),
    });
}
