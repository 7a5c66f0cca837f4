//! outbox.lock records `StockWeighed` version 1 with `weight: u32`; an
//! alias of another type writes other JSON.

use outbox_core::DomainEvent;
use serde::Serialize;

type Weight = f64;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Stock", version = 1)]
struct StockWeighed {
    weight: Weight,
}

fn main() {}
