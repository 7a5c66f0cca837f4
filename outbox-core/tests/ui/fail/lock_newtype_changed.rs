//! outbox.lock records `RefundIssued` version 1 with `amount: i64`; a
//! newtype of another type writes other JSON.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct RefundAmount(String);

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Refund", version = 1)]
struct RefundIssued {
    refund_id: i64,
    amount: RefundAmount,
}

fn main() {}
