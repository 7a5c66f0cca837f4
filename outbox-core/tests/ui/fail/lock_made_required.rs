//! Optional fields made required: the lock records `note: Option<String>`
//! and `priority` with `#[serde(default)]`.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartNoted {
    note: String,
    priority: u8,
}

fn main() {}
