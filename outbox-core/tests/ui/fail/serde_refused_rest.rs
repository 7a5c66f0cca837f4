//! The rest of the serde attributes the contract refuses (see
//! serde_unmodelled.rs for the others), every one in the same build, each
//! where it is written, with what to write instead.

use outbox_core::{DomainEvent, EventPayload};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
struct WireMoney {
    cents: i64,
}

#[derive(EventPayload, Clone, Serialize, Deserialize)]
#[serde(from = "WireMoney", into = "WireMoney")]
struct Money {
    cents: i64,
}

impl From<WireMoney> for Money {
    fn from(wire: WireMoney) -> Self {
        Money { cents: wire.cents }
    }
}

impl From<Money> for WireMoney {
    fn from(money: Money) -> Self {
        WireMoney { cents: money.cents }
    }
}

#[derive(EventPayload, Serialize, Deserialize)]
#[serde(try_from = "String")]
struct Sku {
    code: String,
}

impl TryFrom<String> for Sku {
    type Error = String;
    fn try_from(code: String) -> Result<Self, String> {
        Ok(Sku { code })
    }
}

#[derive(EventPayload, Serialize, Deserialize)]
enum Channel {
    Web,
    #[serde(skip_deserializing)]
    Legacy,
    #[serde(untagged)]
    Other(String),
}

fn as_text<S: serde::Serializer>(value: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&value.to_string())
}

fn from_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let text: String = Deserialize::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
struct OrderRepriced {
    #[serde(serialize_with = "as_text")]
    total: i64,
    #[serde(deserialize_with = "from_text")]
    shipping: i64,
    #[serde(skip_deserializing)]
    note: String,
    money: Money,
    sku: Sku,
    channel: Channel,
}

fn main() {}
