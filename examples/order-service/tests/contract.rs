//! The service's published contract against its real output: the service
//! runs on SQLite, and every payload it left in the outbox table validates
//! against the JSON Schema `cargo outbox schema` exports from its
//! `outbox.lock`, for the event type and version stored beside it. A
//! payload with a key removed or retyped is rejected.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use outbox_schema::schema_lock::Lock;
use sea_orm::{ConnectionTrait, Database, Statement};
use serde_json::{Value, json};

/// The exported document, and a validator of one event version of it.
struct Contract {
    document: Value,
}

impl Contract {
    fn exported() -> Self {
        let lock = Lock::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("outbox.lock"))
            .expect("the lock parses")
            .expect("the service has a lock");
        Self {
            document: outbox_schema::export::json_schema(&lock, "order-service events"),
        }
    }

    fn validator(&self, event_type: &str, version: i64) -> jsonschema::Validator {
        let key = format!("{event_type}.v{version}");
        assert!(
            self.document["$defs"].get(&key).is_some(),
            "the contract has no {key}"
        );
        let mut root = self.document.clone();
        root.as_object_mut().unwrap().remove("anyOf");
        root["$ref"] = json!(format!("#/$defs/{key}"));
        jsonschema::draft202012::options()
            .should_validate_formats(true)
            .build(&root)
            .expect("the contract compiles")
    }
}

/// Runs the service on a new SQLite database; returns its stored events
/// as (type, version, payload).
async fn run_service(orders: u32) -> Vec<(String, i64, Value)> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("orders.db").display()
    );
    let output = Command::new(env!("CARGO_BIN_EXE_order-service"))
        .args(["--database-url", &url, "--orders", &orders.to_string()])
        .env_remove("DATABASE_URL")
        .output()
        .expect("the service runs");
    assert!(
        output.status.success(),
        "the service failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let db = Database::connect(&url).await.expect("the database opens");
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT type, event_version, payload FROM outbox",
        ))
        .await
        .expect("the outbox reads");
    rows.iter()
        .map(|row| {
            let payload: String = row.try_get_by_index(2).expect("payload");
            (
                row.try_get_by_index(0).expect("type"),
                row.try_get_by_index(1).expect("event_version"),
                serde_json::from_str(&payload).expect("the payload is JSON"),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_services_stored_payloads_validate_against_its_contract() {
    let contract = Contract::exported();
    let orders = 4;
    let events = run_service(orders).await;
    let mut counted: BTreeMap<String, u32> = BTreeMap::new();
    for (event_type, version, payload) in &events {
        let validator = contract.validator(event_type, *version);
        let problems: Vec<String> = validator
            .iter_errors(payload)
            .map(|error| format!("{error} at {}", error.instance_path()))
            .collect();
        assert!(
            problems.is_empty(),
            "{event_type} v{version} does not validate: {problems:?}\n{payload:#}"
        );
        *counted.entry(event_type.clone()).or_default() += 1;
    }
    // Each order is placed with two lines; every other one is paid.
    let expected = BTreeMap::from([
        ("OrderLineAdded".to_owned(), 2 * orders),
        ("OrderPaid".to_owned(), orders.div_ceil(2)),
        ("OrderPlaced".to_owned(), orders),
    ]);
    assert_eq!(counted, expected);
}

#[tokio::test]
async fn a_payload_broken_after_the_fact_is_rejected() {
    let contract = Contract::exported();
    let events = run_service(1).await;
    let find = |wanted: &str| {
        events
            .iter()
            .find(|(event_type, _, _)| event_type == wanted)
            .unwrap_or_else(|| panic!("no {wanted} stored"))
    };
    let (_, version, placed) = find("OrderPlaced");
    let validator = contract.validator("OrderPlaced", *version);
    assert!(validator.is_valid(placed));
    let mut without_customer = placed.clone();
    without_customer.as_object_mut().unwrap().remove("customer");
    assert!(!validator.is_valid(&without_customer), "{without_customer}");
    let (_, version, paid) = find("OrderPaid");
    let validator = contract.validator("OrderPaid", *version);
    assert!(validator.is_valid(paid));
    let mut retyped = paid.clone();
    retyped["amountCents"] = json!("2950");
    assert!(!validator.is_valid(&retyped), "{retyped}");
    // The payment reference is optional: null or absent both validate.
    let mut unreferenced = paid.clone();
    unreferenced["paymentReference"] = Value::Null;
    assert!(validator.is_valid(&unreferenced));
    unreferenced
        .as_object_mut()
        .unwrap()
        .remove("paymentReference");
    assert!(validator.is_valid(&unreferenced));
}
