//! The contract exported as JSON Schema (`cargo outbox schema`) against
//! what serde really writes: events of every shape the contract models
//! are appended through the library on PostgreSQL, MariaDB and SQLite,
//! and every payload read back from the outbox table validates against
//! the schema of its event type and version, checked by an independent
//! validator (the `jsonschema` crate). Payloads broken the ways a producer
//! could break them are rejected.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeZone, Utc};
use outbox_core::{DomainEvent, EventPayload, OutboxEvent};
use outbox_schema::schema_lock::Lock;
use outbox_tests::{Backend, TestDb, backend_tests};
use sea_orm::TransactionTrait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

/// A shipment left the warehouse: nested types of every representation.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Shipment", version = 1)]
#[serde(rename_all = "camelCase")]
pub struct ShipmentDispatched {
    /// The shipment.
    pub shipment_id: Uuid,
    /// When it left.
    pub dispatched_at: DateTime<Utc>,
    /// Who carries it: an externally tagged enum.
    pub carrier: Carrier,
    /// The parcels, each a nested struct.
    pub parcels: Vec<Parcel>,
    /// The route: an internally tagged enum.
    pub route: Route,
    /// The tracking: an adjacently tagged enum.
    pub tracking: Tracking,
    /// A contact: an untagged enum.
    pub contact: Contact,
    /// Total weight.
    pub weight_grams: u32,
    /// 0 to 255.
    pub priority: u8,
    /// Length, width, height.
    pub dimensions: (u16, u16, u16),
    /// Free labels.
    pub labels: BTreeMap<String, String>,
    /// The insured value, if insured.
    pub insured: Option<Box<Money>>,
    /// Absent means `false`.
    #[serde(default)]
    pub fragile: bool,
    /// The destination's keys, written beside the others.
    #[serde(flatten)]
    pub destination: Address,
    /// The customer's reference: a newtype.
    pub reference: Reference,
    /// Distinct tags.
    pub tags: BTreeSet<String>,
    /// Left out when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Who carries a shipment.
#[derive(Debug, Clone, PartialEq, EventPayload, Serialize, Deserialize)]
pub enum Carrier {
    /// Our own vans.
    Own,
    /// A partner, by name.
    Partner(String),
    /// A courier with an account.
    Courier {
        /// The courier.
        name: String,
        /// Our account there.
        account: u64,
    },
}

/// One parcel.
#[derive(Debug, Clone, PartialEq, EventPayload, Serialize, Deserialize)]
pub struct Parcel {
    /// The parcel's barcode.
    pub barcode: String,
    /// Its weight.
    pub grams: u32,
}

/// How the shipment travels.
#[derive(Debug, Clone, PartialEq, EventPayload, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Route {
    /// Straight to the customer.
    Direct,
    /// Through a hub.
    ViaHub {
        /// The hub.
        hub: String,
        /// Days there.
        days: u8,
    },
}

/// Where tracking stands.
#[derive(Debug, Clone, PartialEq, EventPayload, Serialize, Deserialize)]
#[serde(tag = "state", content = "detail")]
pub enum Tracking {
    /// Not yet scanned.
    Pending,
    /// Scanned at a place.
    Scanned(String),
    /// Delivered.
    Delivered {
        /// Who signed.
        signed_by: String,
    },
}

/// How to reach the recipient.
#[derive(Debug, Clone, PartialEq, EventPayload, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Contact {
    /// A phone number.
    Phone(String),
    /// A mailbox.
    Mail {
        /// The address.
        email: String,
    },
}

/// An amount of money.
#[derive(Debug, Clone, PartialEq, EventPayload, Serialize, Deserialize)]
pub struct Money {
    /// In cents.
    pub cents: i64,
    /// ISO 4217.
    pub currency: String,
}

/// A postal address.
#[derive(Debug, Clone, PartialEq, EventPayload, Serialize, Deserialize)]
pub struct Address {
    /// Street and number.
    pub street: String,
    /// The city.
    pub city: String,
}

/// A customer's reference.
#[derive(Debug, Clone, PartialEq, EventPayload, Serialize, Deserialize)]
pub struct Reference(pub String);

backend_tests!(stored_payloads_validate_against_the_exported_schema);

/// Shipments covering every variant of every enum, with and without the
/// optional keys.
fn shipments() -> Vec<ShipmentDispatched> {
    let carriers = [
        Carrier::Own,
        Carrier::Partner("Ferry & Co".into()),
        Carrier::Courier {
            name: "Swift".into(),
            account: u64::MAX,
        },
    ];
    let routes = [
        Route::Direct,
        Route::ViaHub {
            hub: "Leipzig".into(),
            days: 2,
        },
    ];
    let trackings = [
        Tracking::Pending,
        Tracking::Scanned("Gate 4".into()),
        Tracking::Delivered {
            signed_by: "Ada".into(),
        },
    ];
    let contacts = [
        Contact::Phone("+49 30 1234".into()),
        Contact::Mail {
            email: "ada@example.com".into(),
        },
    ];
    (0..6)
        .map(|n| ShipmentDispatched {
            shipment_id: Uuid::now_v7(),
            dispatched_at: Utc.timestamp_opt(1_790_000_000 + n, 0).unwrap(),
            carrier: carriers[n as usize % 3].clone(),
            parcels: (0..n)
                .map(|p| Parcel {
                    barcode: format!("P{n}-{p}"),
                    grams: 100 * p as u32,
                })
                .collect(),
            route: routes[n as usize % 2].clone(),
            tracking: trackings[n as usize % 3].clone(),
            contact: contacts[n as usize % 2].clone(),
            weight_grams: 1200,
            priority: if n == 5 { 255 } else { n as u8 },
            dimensions: (30, 20, 10),
            labels: BTreeMap::from([("dock".to_owned(), n.to_string())]),
            insured: (n % 2 == 1).then(|| {
                Box::new(Money {
                    cents: 5000,
                    currency: "EUR".into(),
                })
            }),
            fragile: n % 3 == 0,
            destination: Address {
                street: "Main St 1".into(),
                city: "Berlin".into(),
            },
            reference: Reference(format!("REF-{n}")),
            tags: BTreeSet::from(["b".to_owned(), "a".to_owned()]),
            note: (n % 2 == 0).then(|| "leave at the door".to_owned()),
        })
        .collect()
}

/// The JSON Schema document `cargo outbox schema` prints for this crate.
fn exported() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("outbox.lock");
    let lock = Lock::read(&path)
        .expect("the lock parses")
        .expect("the crate has a lock");
    outbox_schema::export::json_schema(&lock, "outbox-tests events")
}

/// A validator for one event version of the document: the document's
/// definitions, with a root that is that version.
fn validator_for(document: &Value, event_type: &str, version: i64) -> jsonschema::Validator {
    let key = format!("{event_type}.v{version}");
    assert!(
        document["$defs"].get(&key).is_some(),
        "the exported schema has no {key}"
    );
    let mut root = document.clone();
    let root_map = root.as_object_mut().expect("an object");
    root_map.remove("anyOf");
    root_map.insert("$ref".into(), json!(format!("#/$defs/{key}")));
    strict(&root)
}

/// A 2020-12 validator that checks `format`s too (uuid, date-time).
fn strict(schema: &Value) -> jsonschema::Validator {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(schema)
        .expect("the exported schema compiles")
}

fn errors(validator: &jsonschema::Validator, payload: &Value) -> Vec<String> {
    validator
        .iter_errors(payload)
        .map(|error| format!("{} at {}", error, error.instance_path()))
        .collect()
}

async fn stored_payloads_validate_against_the_exported_schema(backend: Backend) {
    let document = exported();
    assert!(
        jsonschema::meta::is_valid(&document),
        "the exported document is not a valid JSON Schema"
    );
    let whole = strict(&document);
    let t = TestDb::new(backend).await;
    let shipments = shipments();
    let events = shipments
        .iter()
        .map(|shipment| OutboxEvent::new(shipment.clone()).aggregate_id(shipment.shipment_id));
    let txn = t.db.begin().await.expect("a transaction");
    outbox_core::append(&txn, events)
        .await
        .expect("the shipments are appended");
    txn.commit().await.expect("the shipments are committed");
    let rows = t.outbox_rows().await;
    let mut validated = BTreeSet::new();
    for row in &rows {
        let payload = row.payload.as_ref().expect("a payload");
        let validator = validator_for(&document, &row.event_type, row.event_version);
        let problems = errors(&validator, payload);
        assert!(
            problems.is_empty(),
            "the stored payload of {} v{} does not validate: {problems:?}\n{payload:#}",
            row.event_type,
            row.event_version
        );
        assert!(
            whole.is_valid(payload),
            "the whole document rejects {payload}"
        );
        // What was stored reads back as what was saved.
        let read: ShipmentDispatched = serde_json::from_value(payload.clone()).expect("decodes");
        assert!(shipments.contains(&read));
        validated.insert(row.id.clone());
    }
    assert_eq!(
        validated.len(),
        shipments.len(),
        "every appended event is stored once"
    );
    t.drop().await;
}

/// A valid payload broken at `pointer` by `edit`.
fn broken(payload: &Value, pointer: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut payload = payload.clone();
    edit(payload.pointer_mut(pointer).expect("the pointer exists"));
    payload
}

fn remove(key: &'static str) -> impl FnOnce(&mut Value) {
    move |object| {
        object
            .as_object_mut()
            .expect("an object")
            .remove(key)
            .expect("the key is there");
    }
}

fn set(value: Value) -> impl FnOnce(&mut Value) {
    move |slot| *slot = value
}

#[test]
fn payloads_broken_as_a_producer_could_are_rejected() {
    let document = exported();
    let validator = validator_for(&document, "ShipmentDispatched", 1);
    let shipment = &shipments()[5];
    let valid = serde_json::to_value(shipment).unwrap();
    assert_eq!(errors(&validator, &valid), Vec::<String>::new());
    // Optional and defaulted keys may be left out.
    let mut sparse = valid.clone();
    for key in ["insured", "fragile", "note"] {
        sparse.as_object_mut().unwrap().remove(key);
    }
    assert_eq!(errors(&validator, &sparse), Vec::<String>::new());
    let cases = [
        (
            "a required key missing",
            broken(&valid, "", remove("shipmentId")),
        ),
        (
            "not a UUID",
            broken(&valid, "/shipmentId", set(json!("42"))),
        ),
        (
            "a negative u32",
            broken(&valid, "/weightGrams", set(json!(-1))),
        ),
        (
            "a u8 out of range",
            broken(&valid, "/priority", set(json!(256))),
        ),
        (
            "a number as a string",
            broken(&valid, "/priority", set(json!("5"))),
        ),
        (
            "an unknown unit variant",
            broken(&valid, "/carrier", set(json!("Teleport"))),
        ),
        (
            "a variant with the wrong content",
            broken(&valid, "/carrier", set(json!({ "Partner": 7 }))),
        ),
        (
            "an internal tag missing",
            broken(&valid, "/route", remove("mode")),
        ),
        (
            "an unknown internal tag",
            broken(&valid, "/route/mode", set(json!("by_air"))),
        ),
        (
            "a variant's field missing",
            broken(&valid, "/route", remove("hub")),
        ),
        (
            "an adjacent content of the wrong type",
            broken(
                &valid,
                "/tracking",
                set(json!({ "state": "Scanned", "detail": 4 })),
            ),
        ),
        (
            "an untagged enum matching no variant",
            broken(&valid, "/contact", set(json!({ "fax": "1" }))),
        ),
        (
            "a nested struct's key missing",
            broken(&valid, "/parcels/0", remove("grams")),
        ),
        (
            "a flattened key missing",
            broken(&valid, "", remove("city")),
        ),
        (
            "a tuple too short",
            broken(&valid, "/dimensions", set(json!([30, 20]))),
        ),
        (
            "a map value of the wrong type",
            broken(&valid, "/labels/dock", set(json!(5))),
        ),
        (
            "an Option's inner key missing",
            broken(&valid, "/insured", remove("currency")),
        ),
        (
            "a newtype of the wrong type",
            broken(&valid, "/reference", set(json!({ "0": "REF" }))),
        ),
        (
            "not a date-time",
            broken(&valid, "/dispatchedAt", set(json!("yesterday"))),
        ),
    ];
    for (what, payload) in cases {
        assert!(
            !validator.is_valid(&payload),
            "{what}: the schema accepts {payload}"
        );
        // An independent reader agrees the payload is broken.
        assert!(
            serde_json::from_value::<ShipmentDispatched>(payload.clone()).is_err(),
            "{what}: serde reads the payload, so the case proves nothing"
        );
    }
}
