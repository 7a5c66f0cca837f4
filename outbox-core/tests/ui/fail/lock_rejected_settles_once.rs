//! An event whose own fields already show problems, and whose newtype and
//! alias only the compiled types (or the sources) settle: each problem is
//! reported once, in the words of the event's own fields. The lock records
//! `StockTallied { sku: String, count: u32 }`.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct Sku(String);

type Qty = u32;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Stock", version = 1)]
struct StockTallied {
    sku: Sku,
    total: Qty,
}

fn main() {}
