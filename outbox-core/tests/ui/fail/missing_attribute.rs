use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
struct OrderPlaced {
    order_id: i64,
}

fn main() {}
