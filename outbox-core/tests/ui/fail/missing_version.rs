use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order")]
struct OrderPlaced {
    order_id: i64,
}

fn main() {}
