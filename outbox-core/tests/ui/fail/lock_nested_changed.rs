//! A change inside a nested payload type fails at the event's field, the
//! whole type underlined: the lock records `Discount { percent: u8 }`.

use outbox_core::DomainEvent;
use serde::Serialize;

mod pricing {
    use outbox_core::EventPayload;
    use serde::Serialize;

    #[derive(EventPayload, Serialize)]
    pub struct Discount {
        pub percent: f64,
    }
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartDiscounted {
    cart_id: i64,
    discount: pricing::Discount,
}

fn main() {}
