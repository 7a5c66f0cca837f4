//! Events may borrow and may be generic. A type parameter needs the
//! `Serialize` bound on the struct itself: the generated impl carries the
//! struct's bounds, and serde's impl exists only for `T: Serialize`.

#[path = "../support/mod.rs"]
mod support;

use std::borrow::Cow;

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderRenamed<'a> {
    old_name: &'a str,
    new_name: Cow<'a, str>,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderTagged<'a, T: Serialize>
where
    T: Clone,
{
    tags: Vec<T>,
    source: &'a str,
}

// Const parameters need no bound; serde never sees them.
#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Batch", version = 1)]
struct BatchClosed<const SIZE: usize> {
    batch_id: i64,
}

fn main() {
    let name = String::from("before");
    let renamed = OrderRenamed {
        old_name: &name,
        new_name: Cow::Borrowed("after"),
    };
    assert_eq!(support::field::<OrderRenamed<'_>>("old_name").ty, "&str");
    assert_eq!(
        support::field::<OrderRenamed<'_>>("new_name").ty,
        "Cow<str>"
    );
    support::assert_schema_matches_serde(&renamed);

    assert_eq!(<OrderTagged<'_, u8>>::EVENT_TYPE, "OrderTagged");
    assert_eq!(support::field::<OrderTagged<'_, u8>>("tags").ty, "Vec<T>");
    support::assert_schema_matches_serde(&OrderTagged {
        tags: vec![String::from("gift"), String::from("rush")],
        source: "web",
    });

    assert_eq!(BatchClosed::<8>::AGGREGATE_TYPE, "Batch");
    assert_eq!(support::names::<BatchClosed<8>>(), ["batch_id"]);
    support::assert_schema_matches_serde(&BatchClosed::<8> { batch_id: 1 });
}
