//! A nested payload type the sources do not show (here written by a
//! `macro_rules!` macro) is still checked, by the compiler, against its
//! recorded shape: the lock records `Coupon { percent: u8 }`.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

macro_rules! coupon {
    ($ty:ty) => {
        #[derive(EventPayload, Serialize)]
        struct Coupon {
            percent: $ty,
        }
    };
}

coupon!(f64);

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartCouponApplied {
    cart_id: i64,
    coupon: Coupon,
}

fn main() {}
