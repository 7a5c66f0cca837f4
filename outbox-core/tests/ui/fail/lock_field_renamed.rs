//! A renamed field: the lock records `title`, the struct now says `name`.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartRenamed {
    cart_id: i64,
    name: String,
}

fn main() {}
