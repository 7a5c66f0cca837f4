//! Checks shared by the `ui/pass` programs, included with
//! `#[path = "../support/mod.rs"] mod support;`.

use outbox_core::{DomainEvent, FieldSchema};

/// Asserts that `event` serializes to a JSON object whose keys are exactly
/// the names in `E::SCHEMA`, so the schema describes what serde writes.
pub fn assert_schema_matches_serde<E: DomainEvent>(event: &E) {
    let payload = serde_json::to_value(event).expect("the event serializes");
    let mut keys: Vec<&str> = payload
        .as_object()
        .expect("the payload is a JSON object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut names: Vec<&str> = E::SCHEMA.fields.iter().map(|field| field.name).collect();
    keys.sort_unstable();
    names.sort_unstable();
    assert_eq!(keys, names, "payload keys of {}", E::EVENT_TYPE);
}

/// The schema entry serialized as `name`, which must exist.
pub fn field<E: DomainEvent>(name: &str) -> &'static FieldSchema {
    E::SCHEMA
        .field(name)
        .unwrap_or_else(|| panic!("{} has no field {name:?}", E::EVENT_TYPE))
}

/// The serialized names of `E`'s fields, in declaration order.
pub fn names<E: DomainEvent>() -> Vec<&'static str> {
    E::SCHEMA.fields.iter().map(|field| field.name).collect()
}
