//! outbox.lock records `ParcelWeighed` version 1 with
//! `weight: ParcelWeight { grams: i64 }`; a decoder kept for version 1
//! whose own copy of the nested type reads another JSON type.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct ParcelWeightV1 {
    grams: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Parcel", version = 1, name = "ParcelWeighed")]
struct ParcelWeighedV1 {
    parcel_id: i64,
    weight: ParcelWeightV1,
}

fn main() {}
