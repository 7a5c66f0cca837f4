//! Fields may move into a `#[serde(flatten)]` struct: the JSON object keeps
//! its keys. outbox.lock records `PickupBooked` version 1 with `pickup_id`,
//! `street`, `city` and `note` as the event's own fields.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct PickupAddress {
    street: String,
    city: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Pickup", version = 1)]
struct PickupBooked {
    pickup_id: i64,
    #[serde(flatten)]
    address: PickupAddress,
    note: Option<String>,
}

fn main() {
    let booked = PickupBooked {
        pickup_id: 1,
        address: PickupAddress {
            street: "1 Quay".into(),
            city: "Ghent".into(),
        },
        note: None,
    };
    assert_eq!(
        serde_json::to_string(&booked).unwrap(),
        r#"{"pickup_id":1,"street":"1 Quay","city":"Ghent","note":null}"#
    );
}
