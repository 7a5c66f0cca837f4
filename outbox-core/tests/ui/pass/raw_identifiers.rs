//! Raw identifiers lose their `r#` prefix, as serde writes them.

#[path = "../support/mod.rs"]
mod support;

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct r#OrderMoved {
    r#type: String,
    r#ref: i64,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
#[serde(rename_all = "PascalCase")]
struct OrderRouted {
    r#type: String,
    r#match_key: i64,
}

fn main() {
    assert_eq!(OrderMoved::EVENT_TYPE, "OrderMoved");
    assert_eq!(support::names::<OrderMoved>(), ["type", "ref"]);
    assert_eq!(support::field::<OrderMoved>("type").rust_name, "type");
    support::assert_schema_matches_serde(&OrderMoved {
        r#type: "express".into(),
        r#ref: 1,
    });

    assert_eq!(support::names::<OrderRouted>(), ["Type", "MatchKey"]);
    support::assert_schema_matches_serde(&OrderRouted {
        r#type: "express".into(),
        r#match_key: 1,
    });
}
