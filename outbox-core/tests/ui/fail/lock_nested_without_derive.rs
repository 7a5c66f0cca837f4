//! A type nested in a payload must describe its shape.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(Serialize)]
struct GiftWrap {
    paper: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartWrapped {
    cart_id: i64,
    wrap: Option<GiftWrap>,
}

fn main() {}
