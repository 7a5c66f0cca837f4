//! Every problem is reported at once, each at its field: `currency` was
//! removed, `cart_id` changed type and `tax_cents` is new and required.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartRepriced {
    cart_id: String,
    total_cents: i64,
    tax_cents: i64,
}

fn main() {}
