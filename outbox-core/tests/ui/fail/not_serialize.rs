use outbox_core::DomainEvent;

#[derive(DomainEvent)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderPlaced {
    order_id: i64,
}

fn main() {}
