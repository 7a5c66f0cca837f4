//! `compat` takes "backward" or "full".

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Parcel", version = 1, compat = "forward")]
struct ParcelLabelled {
    parcel_id: i64,
}

fn main() {}
