//! Payload types nested in an event derive `EventPayload`; the event checks
//! their shapes against the ones recorded with it, so additive changes
//! inside them compile too. outbox.lock records `CartPaid` version 1 with
//! `Amount { cents }` (now also `currency: Option<String>`) and `Payment`
//! with `card` and `bank_transfer` (now also `voucher`).

use std::collections::BTreeMap;

use outbox_core::shape::Kind;
use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct Amount {
    cents: i64,
    currency: Option<String>,
}

#[derive(EventPayload, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Payment {
    Card { last4: String },
    BankTransfer,
    Voucher(String),
}

#[derive(EventPayload, Serialize)]
struct Sku(String);

#[derive(EventPayload, Serialize)]
struct Line {
    sku: Sku,
    price: Amount,
}

/// Refers to itself: its shape leaves that reference out.
#[derive(EventPayload, Serialize)]
struct Category {
    name: String,
    children: Vec<Category>,
}

mod other_crate {
    /// Stands for a type of another crate, which cannot derive
    /// `EventPayload` here.
    #[derive(serde::Serialize)]
    pub struct Reference(pub String);
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartPaid {
    cart_id: i64,
    total: Amount,
    payment: Payment,
    lines: Vec<Line>,
    refund: Option<Amount>,
    by_sku: BTreeMap<String, Line>,
    category: Category,
    #[domain_event(opaque)]
    reference: other_crate::Reference,
}

fn main() {
    assert_eq!(Amount::SHAPE.kind, Kind::Struct);
    assert_eq!(Amount::SHAPE.fields[1].ty, "Option<String>");
    assert_eq!(Payment::SHAPE.repr, "internal(type)");
    let variants: Vec<_> = Payment::SHAPE.variants.iter().map(|v| v.name).collect();
    assert_eq!(variants, ["card", "bank_transfer", "voucher"]);
    assert_eq!(Sku::SHAPE.kind, Kind::Tuple);
    assert_eq!(Line::SHAPE.fields[1].types[0].name, "Amount");
    assert!(Category::SHAPE.fields[1].types.is_empty());
    assert_eq!(CartPaid::SCHEMA.field("reference").unwrap().ty, "Reference");

    let paid = CartPaid {
        cart_id: 1,
        total: Amount { cents: 100, currency: None },
        payment: Payment::Card { last4: "4242".into() },
        lines: vec![],
        refund: None,
        by_sku: BTreeMap::new(),
        category: Category { name: "books".into(), children: vec![] },
        reference: other_crate::Reference("r-1".into()),
    };
    let payload = serde_json::to_value(&paid).unwrap();
    assert_eq!(payload["payment"]["type"], "card");
    let _ = Payment::BankTransfer;
    let _ = Payment::Voucher(String::new());
    let _ = Line { sku: Sku(String::new()), price: Amount { cents: 0, currency: None } };
}
