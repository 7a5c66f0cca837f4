//! A payload type's shape must be known to be recorded: no type parameters.

use outbox_core::EventPayload;
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct Page<T> {
    items: Vec<T>,
}

fn main() {}
