use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderPlaced(i64, u64);

fn main() {}
