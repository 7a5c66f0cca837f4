//! serde attributes the contract does not model are refused, every one in
//! the same build, each where it is written.

use outbox_core::{DomainEvent, EventPayload};
use serde::{Deserialize, Serialize};

mod unix_seconds {
    pub fn serialize<S: serde::Serializer>(value: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.to_string())
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        let text: String = serde::Deserialize::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(EventPayload, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
enum Line {
    Sku { sku_code: String },
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
#[serde(deny_unknown_fields)]
struct OrderArchived {
    #[serde(with = "unix_seconds")]
    archived_at: i64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    lines: Vec<Line>,
}

fn main() {}
