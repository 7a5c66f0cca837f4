//! outbox.lock records `TicketSold` version 1 with
//! `price: TicketPrice { cents: i64, currency: String, tier: u8 }`; three
//! changes inside the nested type are reported in one build, each its own
//! error.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct TicketPrice {
    cents: u64,
    currency: String,
    band: String,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Ticket", version = 1)]
struct TicketSold {
    ticket_id: i64,
    price: TicketPrice,
}

fn main() {}
