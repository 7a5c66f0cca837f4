//! outbox.lock records `PickupMoved` version 1 with `pickup_id`, `street`
//! and `city`; the flattened struct they moved into lost `city`.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct PickupSpot {
    street: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Pickup", version = 1)]
struct PickupMoved {
    pickup_id: i64,
    #[serde(flatten)]
    spot: PickupSpot,
}

fn main() {}
