use outbox_core::DomainEvent;
use serde::Serialize;

// serde's impl only exists for `T: Serialize`, so the event needs the bound.
#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderLabelled<T> {
    tag: T,
}

fn main() {}
