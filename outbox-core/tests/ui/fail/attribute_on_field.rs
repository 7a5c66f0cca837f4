use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderPlaced {
    #[domain_event(name = "id")]
    order_id: i64,
}

fn main() {}
