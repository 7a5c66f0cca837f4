//! Under `compat = "full"` an internally tagged enum with a
//! `#[serde(other)]` variant is open: readers of the recorded `Carrier`
//! (`Post`, `Unknown`) read `Drone` as `Unknown`, so it is additive.

use outbox_core::{DomainEvent, EventPayload};
use serde::{Deserialize, Serialize};

#[derive(EventPayload, Serialize, Deserialize)]
#[serde(tag = "kind")]
enum Carrier {
    Post,
    Drone { id: u32 },
    #[serde(other)]
    Unknown,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Parcel", version = 1, compat = "full")]
struct ParcelCarried {
    parcel_id: i64,
    carrier: Carrier,
}

fn main() {}
