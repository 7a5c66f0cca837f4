//! Field types are normalized: paths reduced to their last segment,
//! lifetimes dropped, so equal types read the same however they are spelled.
//! A type of the crate nested in the payload (`Money`) derives
//! `EventPayload`.

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;

use outbox_core::DomainEvent;
use serde::Serialize;

mod money {
    #[derive(outbox_core::EventPayload, serde::Serialize)]
    pub struct Money {
        pub cents: i64,
    }
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderPriced {
    plain: String,
    qualified: std::string::String,
    absolute: ::std::string::String,
    nested: ::std::vec::Vec<std::string::String>,
    map: BTreeMap<String, Vec<crate::money::Money>>,
    optional: Option<std::string::String>,
    tuple: (i64, std::string::String),
    array: [u8; 4],
    boxed: Box<str>,
}

fn main() {
    let ty = |name| support::field::<OrderPriced>(name).ty;
    assert_eq!(ty("plain"), "String");
    assert_eq!(ty("qualified"), "String");
    assert_eq!(ty("absolute"), "String");
    assert_eq!(ty("nested"), "Vec<String>");
    assert_eq!(ty("map"), "BTreeMap<String, Vec<Money>>");
    assert_eq!(ty("optional"), "Option<String>");
    assert_eq!(ty("tuple"), "(i64, String)");
    assert_eq!(ty("array"), "[u8; 4]");
    assert_eq!(ty("boxed"), "Box<str>");
    support::assert_schema_matches_serde(&OrderPriced {
        plain: String::new(),
        qualified: String::new(),
        absolute: String::new(),
        nested: Vec::new(),
        map: BTreeMap::new(),
        optional: None,
        tuple: (1, String::new()),
        array: [0; 4],
        boxed: "x".into(),
    });
}
