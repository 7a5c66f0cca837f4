//! A required field that may now be left out of the JSON: the lock records
//! `tag` as required, so readers of version 1 need its key.

use outbox_core::DomainEvent;
use serde::Serialize;

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Cart", version = 1)]
struct CartTagged {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    tag: String,
}

fn main() {}
