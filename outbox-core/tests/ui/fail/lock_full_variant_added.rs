//! Under `compat = "full"` a variant added to a nested enum needs a new
//! version: readers of the recorded, closed `Route` (`Road`, `Rail`) fail
//! on `Air`. Without the rule the same change is additive.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
enum Route {
    Road,
    Rail,
    Air { carrier: String },
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Parcel", version = 1, compat = "full")]
struct ParcelRouted {
    parcel_id: i64,
    route: Route,
}

fn main() {}
