use outbox_core::DomainEvent;

#[derive(DomainEvent)]
#[domain_event(aggregate = "Order", version = 1)]
union OrderId {
    number: i64,
    bytes: [u8; 8],
}

fn main() {}
