//! Debezium's router options (`--router NAME=VALUE`): topics as a separate
//! Kafka consumer reads them back, compared with the table by event id;
//! unknown and unsupported options refused in one line before anything
//! is published.

use std::path::Path;
use std::time::Duration;

use outbox_tests::kafka;
use outbox_tests::process::{assert_refused, run_to_end};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay() -> &'static Path {
    Path::new(RELAY)
}

/// Runs `outbox-relay run --drain` to Kafka with `extra` arguments and
/// expects a clean exit; returns its standard error.
fn drain_to_kafka(t: &TestDb, brokers: &str, extra: &[&str]) -> String {
    let mut args = vec!["run", "--drain", "--sink", "kafka", "--brokers", brokers];
    args.extend_from_slice(extra);
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    stderr
}

/// Inserts a plain-SQL row (the five Debezium columns); returns its id.
async fn insert(t: &TestDb, aggregate_type: &str, aggregate_id: &str, event_type: &str) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    let sql = match t.backend {
        Backend::Postgres => {
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::uuid, $2, $3, $4, jsonb_build_object('type', $4::text))"
        }
        _ => {
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES (?, ?, ?, ?, JSON_OBJECT('type', ?))"
        }
    };
    let mut values: Vec<sea_orm::Value> = vec![
        id.clone().into(),
        aggregate_type.into(),
        aggregate_id.into(),
        event_type.into(),
    ];
    if t.backend != Backend::Postgres {
        values.push(event_type.into());
    }
    t.db.execute_raw(Statement::from_sql_and_values(t.db_backend(), sql, values))
        .await
        .unwrap();
    id
}

/// Routing by event type with a regex and a replacement, as Debezium's
/// documentation configures it: each row on the topic the replacement
/// names, a type the regex does not match on the topic named by the type
/// itself; key, value and id header as without options.
async fn routes_by_type_on(backend: Backend) {
    let brokers = kafka::brokers();
    let prefix = kafka::topic_prefix("router");
    let t = TestDb::new(backend).await;
    let unmatched_type = format!("{prefix}-Misc");
    let rows = [
        (
            "Order",
            "o-1",
            "OrderPlaced",
            format!("{prefix}.Order.Placed"),
        ),
        (
            "Order",
            "o-1",
            "OrderShipped",
            format!("{prefix}.Order.Shipped"),
        ),
        (
            "Order",
            "o-2",
            "OrderPlaced",
            format!("{prefix}.Order.Placed"),
        ),
        (
            "Invoice",
            "i-1",
            "InvoiceIssued",
            format!("{prefix}.Invoice.Issued"),
        ),
        (
            "Customer",
            "c-1",
            unmatched_type.as_str(),
            unmatched_type.clone(),
        ),
    ];
    let mut expected = Vec::new();
    for (aggregate_type, aggregate_id, event_type, topic) in &rows {
        let id = insert(&t, aggregate_type, aggregate_id, event_type).await;
        expected.push((id, *aggregate_id, *event_type, topic.clone()));
    }
    let replacement = format!("route.topic.replacement={prefix}.${{kind}}.${{what}}");
    let stderr = drain_to_kafka(
        &t,
        &brokers,
        &[
            "--router",
            "route.by.field=type",
            "--router",
            "route.topic.regex=(?<kind>Order|Invoice)(?<what>.+)",
            "--router",
            &replacement,
        ],
    );
    assert!(stderr.contains("router: type matching"), "{stderr}");

    let mut topics: Vec<&str> = rows.iter().map(|row| row.3.as_str()).collect();
    topics.sort_unstable();
    topics.dedup();
    let mut received = Vec::new();
    for topic in topics {
        let want = rows.iter().filter(|row| row.3 == topic).count();
        received.extend(kafka::consume(
            &brokers,
            topic,
            want,
            Duration::from_secs(30),
            Duration::from_millis(500),
        ));
    }
    assert_eq!(received.len(), expected.len(), "{received:?}");
    for (id, aggregate_id, event_type, topic) in &expected {
        let message = received
            .iter()
            .find(|message| message.header("id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("event {id} not on any topic: {received:?}"));
        assert_eq!(&message.topic, topic, "event {id}");
        assert_eq!(message.key.as_deref(), Some(*aggregate_id));
        assert_eq!(message.header("eventType"), Some(*event_type));
        assert_eq!(message.json()["type"], *event_type);
    }
    // Per-aggregate order within a topic: o-1's events went to two topics,
    // o-2's and the others' each to one.
    assert_eq!(t.pending().await, 0);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_rows_are_routed_by_event_type_as_debeziums_router_would() {
    routes_by_type_on(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_rows_are_routed_by_event_type_as_debeziums_router_would() {
    routes_by_type_on(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_and_unsupported_router_options_are_refused_in_one_line() {
    let t = TestDb::new(Backend::Sqlite).await;
    insert(&t, "Order", "o-1", "OrderPlaced").await;
    for (option, message) in [
        (
            "route.topic.regx=x",
            "error: --router: unknown router option \"route.topic.regx\"; did you mean \"route.topic.regex\"?",
        ),
        (
            "route.topic.regex.flags=i",
            "error: --router: router option \"route.topic.regex.flags\" is not supported",
        ),
        (
            "route.by.field=ten-ant",
            "error: --router: route.by.field: \"ten-ant\" is not a column name (letters, digits and _)",
        ),
        ("route.by.field", "error: --router: "),
    ] {
        assert_refused(
            relay(),
            &["run", "--drain", "--router", option],
            &[("DATABASE_URL", &t.url)],
            2,
            message,
            "no secret here",
        );
    }
    // A column the outbox lacks stops the relay at start (exit 1).
    assert_refused(
        relay(),
        &["run", "--drain", "--router", "table.field.event.key=tenant"],
        &[("DATABASE_URL", &t.url)],
        1,
        "error: cannot connect to the database",
        "no secret here",
    );
    assert_refused(
        relay(),
        &[
            "run",
            "--drain",
            "--router",
            "route.topic.replacement=x.${routedByValue}",
            "--topic-template",
            "y.{aggregatetype}",
        ],
        &[("DATABASE_URL", &t.url)],
        2,
        "error: --topic-template and the router's route.* options both name the topic; use one",
        "no secret here",
    );
    assert_eq!(t.pending().await, 1, "nothing published");
    t.drop().await;
}

/// The same options on the embedded default (SQLite, stdout): the printed
/// topic is the routed one, by aggregate id here.
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_rows_on_stdout_carry_the_routed_topic() {
    let t = TestDb::new(Backend::Sqlite).await;
    let vip = insert(&t, "Customer", "vip-7", "CustomerRegistered").await;
    let plain = insert(&t, "Customer", "c-8", "CustomerRegistered").await;
    let (code, stdout, stderr) = run_to_end(
        relay(),
        &[
            "run",
            "--drain",
            "--router",
            "route.by.field=aggregateid",
            "--router",
            "route.topic.regex=vip-(\\d+)",
            "--router",
            "route.topic.replacement=customers.vip.$1",
        ],
        &[("DATABASE_URL", &t.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    let topics: Vec<(String, String)> = stdout
        .lines()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            (
                line["headers"]["id"].as_str().unwrap().to_owned(),
                line["topic"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        topics,
        [
            (vip, "customers.vip.7".to_owned()),
            (plain, "c-8".to_owned())
        ]
    );
    t.drop().await;
}

/// `table.expand.json.payload=false`: the value a separate Kafka consumer
/// reads is a JSON string holding the stored payload, as Debezium writes a
/// JSON column without expansion; the topic stays the template's.
#[tokio::test(flavor = "multi_thread")]
async fn without_expansion_the_kafka_value_is_the_payload_as_a_json_string() {
    let brokers = kafka::brokers();
    let prefix = kafka::topic_prefix("unexpanded");
    let t = TestDb::new(Backend::Postgres).await;
    let id = insert(&t, "Order", "o-1", "OrderPlaced").await;
    let template = format!("{prefix}.{{aggregatetype}}");
    drain_to_kafka(
        &t,
        &brokers,
        &[
            "--topic-template",
            &template,
            "--router",
            "table.expand.json.payload=false",
        ],
    );
    let messages = kafka::consume(
        &brokers,
        &format!("{prefix}.Order"),
        1,
        Duration::from_secs(30),
        Duration::from_millis(500),
    );
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0].header("id"), Some(id.as_str()));
    let value = messages[0].json();
    let text = value.as_str().expect("the value is a JSON string");
    let payload: serde_json::Value = serde_json::from_str(text).expect("holding the JSON");
    assert_eq!(payload, serde_json::json!({"type": "OrderPlaced"}));
    t.drop().await;
}
