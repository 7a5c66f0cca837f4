//! `Option` fields (under any path) are optional; `#[serde(default)]` on a
//! field or on the struct marks fields a reader fills in when missing.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderPrioritized {
    order_id: i64,
    coupon: Option<String>,
    gift_note: std::option::Option<String>,
    #[serde(default)]
    priority: u8,
    #[serde(default = "default_currency")]
    currency: String,
}

fn default_currency() -> String {
    "EUR".into()
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
#[serde(default)]
struct OrderNoted {
    note: String,
    author: Option<String>,
}

fn main() {
    let field = support::field::<OrderPrioritized>;
    assert!(!field("order_id").optional && !field("order_id").default);
    assert!(field("coupon").optional && !field("coupon").default);
    assert!(field("gift_note").optional);
    assert_eq!(field("gift_note").ty, "Option<String>");
    assert!(!field("priority").optional && field("priority").default);
    assert!(field("currency").default);
    assert!(OrderPrioritized::SCHEMA.fields.iter().all(|f| !f.flatten));
    support::assert_schema_matches_serde(&OrderPrioritized {
        order_id: 1,
        coupon: None,
        gift_note: Some("enjoy".into()),
        priority: 0,
        currency: default_currency(),
    });

    assert!(OrderNoted::SCHEMA.fields.iter().all(|f| f.default));
    assert!(support::field::<OrderNoted>("author").optional);
    assert!(!support::field::<OrderNoted>("note").optional);
    support::assert_schema_matches_serde(&OrderNoted {
        note: "call first".into(),
        author: None,
    });
}
