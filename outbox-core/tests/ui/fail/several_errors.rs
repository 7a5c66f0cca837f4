// Every misuse is reported in one compile, each at its own token.
use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(
    aggregate = "",
    version = 0,
    topic = "orders",
    name = "Placed",
    name = "Paid"
)]
#[serde(transparent)]
struct OrderPlaced {
    order_id: i64,
}

fn main() {}
