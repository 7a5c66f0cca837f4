use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
enum OrderEvent {
    Placed { order_id: i64 },
    Cancelled { order_id: i64 },
}

fn main() {}
