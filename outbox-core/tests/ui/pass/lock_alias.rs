//! A `type` alias writes what it names, of a well-known type or of a
//! payload type. outbox.lock records `StockCounted` version 1 as
//! `cargo outbox lock` records aliases, spelled as what they name:
//! `quantity: u32`, `lines: Vec<StockLine>`, `counts: BTreeMap<String, u32>`,
//! `StockLine { bin: String, qty: u32 }`.

use std::collections::BTreeMap;

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

type Quantity = u32;
type Bin = String;
type Line = StockLine;
type Counts = BTreeMap<Bin, Quantity>;

#[derive(EventPayload, Serialize)]
struct StockLine {
    bin: Bin,
    qty: Quantity,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Stock", version = 1)]
struct StockCounted {
    quantity: Quantity,
    lines: Vec<Line>,
    counts: Counts,
}

fn main() {
    let counted = StockCounted {
        quantity: 3,
        lines: vec![StockLine {
            bin: "A1".into(),
            qty: 3,
        }],
        counts: BTreeMap::from([("A1".to_owned(), 3)]),
    };
    assert_eq!(
        serde_json::to_string(&counted).unwrap(),
        r#"{"quantity":3,"lines":[{"bin":"A1","qty":3}],"counts":{"A1":3}}"#
    );
}
