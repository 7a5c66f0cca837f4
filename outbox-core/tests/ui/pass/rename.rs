//! `rename_all` and `rename` give the names serde writes; `rust_name` keeps
//! the field's own name.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
#[serde(rename_all = "camelCase")]
struct OrderShipped {
    order_id: i64,
    total_cents: u64,
    #[serde(rename = "customer")]
    customer_id: i64,
    #[serde(rename(serialize = "shipTo", deserialize = "ship_to"))]
    shipping_address: String,
    // Only the deserialized name changes, so rename_all still applies.
    #[serde(rename(deserialize = "note"))]
    gift_note: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
#[serde(rename_all(serialize = "SCREAMING-KEBAB-CASE"))]
struct OrderCancelled {
    order_id: i64,
    cancel_reason: String,
}

fn main() {
    assert_eq!(
        support::names::<OrderShipped>(),
        ["orderId", "totalCents", "customer", "shipTo", "giftNote"]
    );
    assert_eq!(
        support::field::<OrderShipped>("orderId").rust_name,
        "order_id"
    );
    assert_eq!(
        support::field::<OrderShipped>("customer").rust_name,
        "customer_id"
    );
    assert_eq!(
        support::field::<OrderShipped>("shipTo").rust_name,
        "shipping_address"
    );
    support::assert_schema_matches_serde(&OrderShipped {
        order_id: 1,
        total_cents: 2,
        customer_id: 3,
        shipping_address: "Main St".into(),
        gift_note: String::new(),
    });

    assert_eq!(
        support::names::<OrderCancelled>(),
        ["ORDER-ID", "CANCEL-REASON"]
    );
    support::assert_schema_matches_serde(&OrderCancelled {
        order_id: 1,
        cancel_reason: "changed mind".into(),
    });
}
