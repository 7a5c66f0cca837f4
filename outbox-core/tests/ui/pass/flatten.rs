//! A `#[serde(flatten)]` field is marked, since its own fields appear inline.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(Serialize)]
struct Audit {
    actor: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderPlaced {
    order_id: i64,
    #[serde(flatten)]
    audit: Audit,
}

fn main() {
    assert!(!support::field::<OrderPlaced>("order_id").flatten);
    let audit = support::field::<OrderPlaced>("audit");
    assert!(audit.flatten);
    assert_eq!(audit.ty, "Audit");

    let payload = serde_json::to_value(OrderPlaced {
        order_id: 1,
        audit: Audit {
            actor: "ann".into(),
        },
    })
    .unwrap();
    assert_eq!(
        payload,
        serde_json::json!({ "order_id": 1, "actor": "ann" })
    );
}
