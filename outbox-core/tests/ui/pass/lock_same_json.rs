//! Changes that leave the JSON as it was compile against the recorded
//! version, and leave the lock as it was: outbox.lock records `ParcelSent`
//! version 1 as it was first written (`to: Box<ParcelAddress>`,
//! `items: Vec<ParcelItem>`, `labels: BTreeMap<String, String>`,
//! `note: Option<String>`, `ParcelAddress.city: String`,
//! `ParcelItem.sku: &str`). `main` checks that the JSON is indeed the same.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct ParcelAddress {
    street: String,
    city: Box<str>,
}

#[derive(EventPayload, Serialize)]
struct ParcelItem {
    sku: String,
    quantity: u32,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Parcel", version = 1)]
struct ParcelSent {
    parcel_id: i64,
    to: ParcelAddress,
    items: VecDeque<Box<ParcelItem>>,
    labels: HashMap<String, Cow<'static, str>>,
    note: Option<Cow<'static, str>>,
}

/// The types as version 1 was first written.
mod first {
    use std::collections::BTreeMap;

    use serde::Serialize;

    #[derive(Serialize)]
    pub struct ParcelAddress {
        pub street: String,
        pub city: String,
    }

    #[derive(Serialize)]
    pub struct ParcelItem {
        pub sku: &'static str,
        pub quantity: u32,
    }

    #[derive(Serialize)]
    pub struct ParcelSent {
        pub parcel_id: i64,
        pub to: Box<ParcelAddress>,
        pub items: Vec<ParcelItem>,
        pub labels: BTreeMap<String, String>,
        pub note: Option<String>,
    }
}

fn main() {
    assert_eq!(ParcelSent::SCHEMA.field("to").unwrap().ty, "ParcelAddress");
    assert_eq!(ParcelAddress::SHAPE.fields[1].wire, "String");

    let now = ParcelSent {
        parcel_id: 7,
        to: ParcelAddress {
            street: "1 Quay".into(),
            city: "Ghent".into(),
        },
        items: VecDeque::from([Box::new(ParcelItem {
            sku: "A-1".into(),
            quantity: 2,
        })]),
        labels: HashMap::from([("fragile".to_owned(), Cow::Borrowed("yes"))]),
        note: Some(Cow::Borrowed("leave at door")),
    };
    let then = first::ParcelSent {
        parcel_id: 7,
        to: Box::new(first::ParcelAddress {
            street: "1 Quay".into(),
            city: "Ghent".into(),
        }),
        items: vec![first::ParcelItem {
            sku: "A-1",
            quantity: 2,
        }],
        labels: [("fragile".to_owned(), "yes".to_owned())].into(),
        note: Some("leave at door".into()),
    };
    assert_eq!(
        serde_json::to_string(&now).unwrap(),
        serde_json::to_string(&then).unwrap()
    );
}
