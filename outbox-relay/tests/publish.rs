//! The relay binary publishing committed rows: the message contract read
//! back by a real consumer, on PostgreSQL and MariaDB to the Kafka-API
//! broker and on SQLite to standard output.

use std::path::Path;
use std::time::Duration;

use outbox_core::OutboxEvent;
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::kafka::{self, Consumed};
use outbox_tests::process::{RelayProcess, run_to_end};
use outbox_tests::stream::{append_events, check_stream, seed};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, TransactionTrait};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn relay() -> &'static Path {
    Path::new(RELAY)
}

/// Runs `outbox-relay run --drain` to Kafka and expects a clean exit.
fn drain_to_kafka(t: &TestDb, brokers: &str, topics: &str, extra: &[&str]) {
    let template = format!("{topics}.{{aggregatetype}}");
    let mut args = vec![
        "run",
        "--drain",
        "--sink",
        "kafka",
        "--brokers",
        brokers,
        "--topic-template",
        &template,
    ];
    args.extend_from_slice(extra);
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
}

/// A committed event with a traceparent, a row inserted by plain SQL with
/// only Debezium's five columns, and a rolled-back event.
async fn write_contract_rows(t: &TestDb) -> (String, String) {
    let txn = t.db.begin().await.unwrap();
    let appended = outbox_core::append(
        &txn,
        [OutboxEvent::new(InvoiceIssuedV2 {
            amount_cents: 990,
            note: Some("first".into()),
        })
        .aggregate_id("inv-1")
        .traceparent(TRACEPARENT)],
    )
    .await
    .unwrap();
    txn.commit().await.unwrap();

    let rolled_back = t.db.begin().await.unwrap();
    outbox_core::append(
        &rolled_back,
        [OutboxEvent::new(InvoiceIssuedV2 {
            amount_cents: -1,
            note: Some("rolled back".into()),
        })
        .aggregate_id("inv-1")],
    )
    .await
    .unwrap();
    rolled_back.rollback().await.unwrap();

    let plain_id = uuid::Uuid::now_v7().to_string();
    t.db.execute_unprepared(&format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         VALUES ('{plain_id}', 'Customer', 'c-7', 'CustomerRegistered', '{{\"name\": \"ada\"}}')"
    ))
    .await
    .unwrap();
    (appended[0].id.to_string(), plain_id)
}

async fn assert_contract(
    t: &TestDb,
    invoice: &[Consumed],
    customer: &[Consumed],
    ids: (String, String),
) {
    let (event_id, plain_id) = ids;
    assert_eq!(
        invoice.len(),
        1,
        "only the committed invoice event: {invoice:?}"
    );
    let message = &invoice[0];
    assert_eq!(message.key.as_deref(), Some("inv-1"));
    assert_eq!(
        message.payload.as_deref(),
        Some(t.stored_payload(&event_id).await.as_bytes()),
        "the value is the payload's bytes as stored"
    );
    assert_eq!(message.json()["amountCents"], 990);
    assert_eq!(message.header("id"), Some(event_id.as_str()));
    assert_eq!(message.header("eventType"), Some("InvoiceIssued"));
    assert_eq!(message.header("eventVersion"), Some("2"));
    assert_eq!(message.header("aggregateSequence"), Some("1"));
    assert_eq!(message.header("traceparent"), Some(TRACEPARENT));

    assert_eq!(customer.len(), 1);
    let plain = &customer[0];
    assert_eq!(plain.key.as_deref(), Some("c-7"));
    assert_eq!(plain.json(), serde_json::json!({"name": "ada"}));
    assert_eq!(plain.header("id"), Some(plain_id.as_str()));
    assert_eq!(plain.header("eventType"), Some("CustomerRegistered"));
    assert_eq!(plain.header("eventVersion"), Some("1"));
    assert_eq!(plain.header("aggregateSequence"), None);
    assert_eq!(plain.header("traceparent"), None);

    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 0);
    assert_eq!(t.count("outbox WHERE published_at IS NOT NULL").await, 2);
}

async fn contract_on(backend: Backend) {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("contract");
    let t = TestDb::new(backend).await;
    let ids = write_contract_rows(&t).await;
    drain_to_kafka(&t, &brokers, &topics, &[]);

    let wait = Duration::from_secs(20);
    let settle = Duration::from_millis(500);
    let invoice = kafka::consume(&brokers, &format!("{topics}.Invoice"), 1, wait, settle);
    let customer = kafka::consume(&brokers, &format!("{topics}.Customer"), 1, wait, settle);
    assert_contract(&t, &invoice, &customer, ids).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_rows_reach_kafka_in_the_outbox_event_router_shape() {
    contract_on(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_rows_reach_kafka_in_the_outbox_event_router_shape() {
    contract_on(Backend::MySql).await;
}

async fn many_events_keep_per_aggregate_order(
    backend: Backend,
    aggregates: usize,
    per_aggregate: usize,
) {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("order");
    let t = TestDb::new(backend).await;
    let ids = seed(&t.db, aggregates, per_aggregate, 10).await;
    drain_to_kafka(
        &t,
        &brokers,
        &topics,
        &["--topic-partitions", "4", "--batch-size", "300"],
    );

    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        ids.len(),
        Duration::from_secs(60),
        Duration::from_millis(500),
    );
    let report = check_stream(&messages, &ids);
    assert_eq!(report.distinct, aggregates * per_aggregate);
    assert_eq!(report.duplicates, 0, "no fault, so no redelivery");
    let partitions: std::collections::HashSet<i32> = messages.iter().map(|m| m.partition).collect();
    assert!(
        partitions.len() > 1,
        "keys spread over the topic's partitions"
    );
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_ten_thousand_events_over_a_hundred_aggregates_arrive_in_order() {
    many_events_keep_per_aggregate_order(Backend::Postgres, 100, 100).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_events_arrive_in_order() {
    many_events_keep_per_aggregate_order(Backend::MySql, 20, 50).await;
}

/// Runs `outbox-relay run --drain` with the default stdout sink and reads
/// its JSON lines back as messages.
fn drain_to_stdout(t: &TestDb, extra: &[&str]) -> Vec<Consumed> {
    let mut args = vec!["run", "--drain"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "{stderr}");
    stdout
        .lines()
        .map(|line| {
            let line: serde_json::Value =
                serde_json::from_str(line).expect("each stdout line is one JSON object");
            Consumed {
                topic: line["topic"].as_str().unwrap().to_owned(),
                partition: 0,
                key: line["key"].as_str().map(str::to_owned),
                payload: Some(serde_json::to_vec(&line["payload"]).unwrap()),
                headers: line["headers"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect(),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_rows_reach_stdout_as_json_lines() {
    let t = TestDb::new(Backend::Sqlite).await;
    let ids = write_contract_rows(&t).await;
    let messages = drain_to_stdout(&t, &[]);
    assert_eq!(messages.len(), 2);
    let on_topic = |topic: &str| -> Vec<Consumed> {
        messages
            .iter()
            .filter(|m| m.topic == topic)
            .cloned()
            .collect()
    };
    let invoice = on_topic("outbox.event.Invoice");
    assert_eq!(
        invoice[0].json(),
        serde_json::json!({"amountCents": 990, "note": "first"})
    );
    assert_contract(&t, &invoice, &on_topic("outbox.event.Customer"), ids).await;

    let seeded = seed(&t.db, 5, 20, 5).await;
    let messages = drain_to_stdout(&t, &["--batch-size", "7"]);
    let report = check_stream(&messages, &seeded);
    assert_eq!((report.distinct, report.duplicates), (100, 0));
    t.drop().await;
}

/// With a one-hour poll interval, only LISTEN/NOTIFY can wake the relay.
/// SIGTERM then stops it with exit code 0.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_notify_wakes_the_relay_and_sigterm_stops_it_cleanly() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("notify");
    let t = TestDb::new(Backend::Postgres).await;
    append_events(&t.db, "early", 1).await;
    let template = format!("{topics}.{{aggregatetype}}");
    let mut relay = RelayProcess::spawn(
        relay(),
        &[
            "run",
            "--poll-interval",
            "1h",
            "--topic-template",
            &template,
        ],
        &[("DATABASE_URL", &t.url), ("KAFKA_BROKERS", &brokers)],
    );
    let topic = format!("{topics}.Invoice");
    let first = kafka::consume(&brokers, &topic, 1, Duration::from_secs(20), Duration::ZERO);
    assert_eq!(
        first.len(),
        1,
        "the relay published the row waiting at start"
    );

    let later = append_events(&t.db, "later", 3).await;
    let messages = kafka::consume(&brokers, &topic, 4, Duration::from_secs(20), Duration::ZERO);
    let later_ids: Vec<String> = later.iter().map(|e| e.id.to_string()).collect();
    for id in &later_ids {
        assert!(
            messages.iter().any(|m| m.header("id") == Some(id.as_str())),
            "a commit during the one-hour poll interval was published: NOTIFY woke the relay"
        );
    }

    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(20)), Some(0));
    let stderr = relay.stderr().join("\n");
    assert!(stderr.contains("relay stopped"), "{stderr}");
    t.drop().await;
}

/// With topic creation off, rows for a missing topic stay pending and the
/// relay says which topic to create; once it exists, they are published.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_keeps_rows_pending_until_it_exists() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("missing");
    let t = TestDb::new(Backend::Postgres).await;
    let appended = append_events(&t.db, "inv-9", 2).await;
    let template = format!("{topics}.{{aggregatetype}}");
    let relay = RelayProcess::spawn(
        relay(),
        &[
            "run",
            "--no-create-topics",
            "--poll-interval",
            "100ms",
            "--topic-template",
            &template,
        ],
        &[("DATABASE_URL", &t.url), ("KAFKA_BROKERS", &brokers)],
    );
    let topic = format!("{topics}.Invoice");
    wait_until("the relay reports the missing topic", || {
        relay
            .stderr()
            .iter()
            .any(|line| line.contains("does not exist") && line.contains(&topic))
    })
    .await;
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 2);
    assert_eq!(
        t.count("outbox WHERE dead_lettered_at IS NOT NULL").await,
        0
    );

    kafka::create_topic(&brokers, &topic, 1).await;
    let messages = kafka::consume(&brokers, &topic, 2, Duration::from_secs(60), Duration::ZERO);
    let ids: Vec<String> = appended.iter().map(|e| e.id.to_string()).collect();
    check_stream(&messages, &ids);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_on_publish_leaves_an_empty_table() {
    let t = TestDb::new(Backend::Postgres).await;
    append_events(&t.db, "gone", 5).await;
    let (code, stdout, stderr) = run_to_end(
        relay(),
        &["run", "--drain", "--sink", "stdout", "--delete-on-publish"],
        &[("DATABASE_URL", &t.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 5);
    assert_eq!(t.count("outbox").await, 0);
    t.drop().await;
}

async fn cleanup_on(backend: Backend) {
    let t = TestDb::new(backend).await;
    append_events(&t.db, "old", 5).await;
    append_events(&t.db, "new", 3).await;
    let (code, _, stderr) = run_to_end(
        relay(),
        &["run", "--drain", "--no-cleanup"],
        &[("DATABASE_URL", &t.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    let backdate = match backend {
        Backend::Postgres => {
            "UPDATE outbox SET published_at = now() - interval '2 days' WHERE aggregateid = 'old'"
        }
        Backend::MySql => {
            "UPDATE outbox SET published_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE aggregateid = 'old'"
        }
        Backend::Sqlite => {
            "UPDATE outbox SET published_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 days') WHERE aggregateid = 'old'"
        }
    };
    t.db.execute_unprepared(backdate).await.unwrap();
    append_events(&t.db, "pending", 1).await;

    let (code, _, stderr) = run_to_end(
        relay(),
        &["cleanup", "--older-than", "1d", "--batch-size", "2"],
        &[("DATABASE_URL", &t.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("deleted 5 published rows"), "{stderr}");
    assert_eq!(t.count("outbox WHERE aggregateid = 'old'").await, 0);
    assert_eq!(t.count("outbox WHERE aggregateid = 'new'").await, 3);
    assert_eq!(t.count("outbox WHERE aggregateid = 'pending'").await, 1);
    // The sequence outlives the deleted rows.
    assert_eq!(append_events(&t.db, "old", 1).await[0].sequence, 6);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_cleanup_deletes_only_old_published_rows() {
    cleanup_on(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_cleanup_deletes_only_old_published_rows() {
    cleanup_on(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_cleanup_deletes_only_old_published_rows() {
    cleanup_on(Backend::Sqlite).await;
}

async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
