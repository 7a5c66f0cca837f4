//! A bumped event keeps its older version's struct for decoding: both are
//! recorded, and each is checked against its own entry.

use outbox_core::DomainEvent;
use serde::Serialize;

/// `CartOpened` as version 1 payloads have it.
#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1, name = "CartOpened")]
struct CartOpenedV1 {
    cart_id: i64,
    customer: String,
}

/// Version 2: the customer became an id.
#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 2)]
struct CartOpened {
    cart_id: i64,
    customer_id: i64,
}

fn main() {
    assert_eq!(CartOpenedV1::EVENT_TYPE, CartOpened::EVENT_TYPE);
    assert_eq!((CartOpenedV1::VERSION, CartOpened::VERSION), (1, 2));
    let _ = CartOpenedV1 { cart_id: 1, customer: String::new() };
    let _ = CartOpened { cart_id: 1, customer_id: 2 };
}
