//! `cargo outbox schema` on the example order service: the AsyncAPI
//! document it prints is valid by the AsyncAPI 3.0.0 specification's own
//! JSON Schema, the JSON Schema document is valid by the 2020-12
//! meta-schema, and both describe every recorded event version.

use std::path::{Path, PathBuf};

mod common;
use common::{cargo_outbox, workspace};

use outbox_schema::schema_lock::Lock;
use serde_json::Value;

fn order_service() -> PathBuf {
    workspace().join("examples/order-service")
}

fn document(dir: &Path, args: &[&str]) -> Value {
    let output = cargo_outbox(dir, args);
    assert!(
        output.status.success(),
        "cargo outbox {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the document is JSON")
}

fn recorded() -> Lock {
    Lock::read(&order_service().join("outbox.lock"))
        .expect("the lock parses")
        .expect("the example has a lock")
}

#[test]
fn asyncapi_document_is_valid_by_the_specification() {
    let spec: Value = serde_json::from_str(include_str!("fixtures/asyncapi-3.0.0.schema.json"))
        .expect("the specification's schema is JSON");
    let validator = jsonschema::draft7::new(&spec).expect("the specification's schema compiles");
    let template = "shop.{aggregatetype}.events";
    let document = document(
        &order_service().join("src"),
        &[
            "schema",
            "--format",
            "asyncapi",
            "--topic-template",
            template,
        ],
    );
    let problems: Vec<String> = validator
        .iter_errors(&document)
        .map(|error| format!("{error} at {}", error.instance_path()))
        .collect();
    assert_eq!(problems, Vec::<String>::new(), "{document:#}");
    // A channel per aggregate type at the relay's topic, a message per
    // recorded version, each naming its event type in the headers.
    let lock = recorded();
    for entry in &lock.events {
        let channel = &document["channels"][&entry.aggregate];
        assert_eq!(
            channel["address"],
            template.replace("{aggregatetype}", &entry.aggregate)
        );
        let key = format!("{}.v{}", entry.event, entry.version);
        assert!(channel["messages"].get(&key).is_some(), "no message {key}");
        let message = &document["components"]["messages"][&key];
        assert_eq!(
            message["headers"]["properties"]["eventType"]["const"],
            entry.event.as_str()
        );
        assert_eq!(
            message["headers"]["properties"]["eventVersion"]["const"],
            entry.version.to_string()
        );
        // Every recorded field is a property of the payload.
        let payload = &document["components"]["schemas"][&key];
        for field in &entry.fields {
            assert!(
                payload["properties"].get(&field.name).is_some(),
                "{key} lacks {}",
                field.name
            );
        }
    }
}

#[test]
fn json_schema_document_is_valid_and_lists_every_version() {
    let document = document(&order_service(), &["schema"]);
    assert!(jsonschema::meta::is_valid(&document), "{document:#}");
    let lock = recorded();
    let defs = document["$defs"].as_object().expect("$defs");
    let mut listed: Vec<&String> = defs.keys().collect();
    listed.sort();
    let mut expected: Vec<String> = lock
        .events
        .iter()
        .map(|entry| format!("{}.v{}", entry.event, entry.version))
        .collect();
    expected.sort();
    assert_eq!(listed, expected.iter().collect::<Vec<_>>());
    // --manifest-path from elsewhere prints the same document, and
    // --output writes it.
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("events.schema.json");
    let manifest = order_service().join("Cargo.toml");
    let output = cargo_outbox(
        out.path(),
        &[
            "schema",
            "--manifest-path",
            manifest.to_str().unwrap(),
            "--output",
            file.to_str().unwrap(),
        ],
    );
    assert!(output.status.success(), "{output:?}");
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).expect("JSON");
    assert_eq!(written, document);
}

#[test]
fn a_crate_without_a_lock_gets_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"unlocked\"\nversion = \"0.1.0\"\n",
    )
    .unwrap();
    let output = cargo_outbox(dir.path(), &["schema"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no lock at") && stderr.contains("cargo outbox lock"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}
