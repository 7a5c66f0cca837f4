//! A `#[serde(flatten)]` field is marked, since its own fields appear inline.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct Audit {
    actor: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderAudited {
    order_id: i64,
    #[serde(flatten)]
    audit: Audit,
}

fn main() {
    assert!(!support::field::<OrderAudited>("order_id").flatten);
    let audit = support::field::<OrderAudited>("audit");
    assert!(audit.flatten);
    assert_eq!(audit.ty, "Audit");

    let payload = serde_json::to_value(OrderAudited {
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
