//! The relay binary publishing to the real RabbitMQ (127.0.0.1:5672): the
//! message contract read back from a bound queue, per-aggregate order
//! against the table, rows left pending while the broker refuses them or
//! drops the relay's connection, unroutable messages, and bad settings.
//! Each test has its own database, exchange and queues.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use lapin::ExchangeKind;
use lapin::types::FieldTable;
use outbox_core::OutboxEvent;
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::process::{RelayProcess, run_to_end};
use outbox_tests::rabbitmq::{
    Broker, Received, amqp_url, close_connections_named, reject_publish_beyond, unique,
};
use outbox_tests::stream::{check_stream, seed};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement, TransactionTrait};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn relay() -> &'static Path {
    Path::new(RELAY)
}

/// `run --sink rabbitmq` arguments for `exchange`, then `extra`.
fn rabbit_args<'a>(url: &'a str, exchange: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--sink",
        "rabbitmq",
        "--amqp-url",
        url,
        "--amqp-exchange",
        exchange,
    ];
    args.extend_from_slice(extra);
    args
}

/// Runs `outbox-relay run --drain` to RabbitMQ and expects a clean exit.
fn drain(t: &TestDb, exchange: &str, extra: &[&str]) {
    let url = amqp_url();
    let mut args = rabbit_args(&url, exchange, &["--drain"]);
    args.extend_from_slice(extra);
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
}

/// The payload text exactly as the database stores it.
async fn stored_payload(t: &TestDb, id: &str) -> String {
    let sql = match t.backend {
        Backend::Postgres => format!("SELECT payload::text FROM outbox WHERE id = '{id}'"),
        _ => format!("SELECT payload FROM outbox WHERE id = '{id}'"),
    };
    let row =
        t.db.query_one_raw(Statement::from_string(t.db_backend(), sql))
            .await
            .unwrap()
            .expect("row");
    row.try_get_by_index(0).unwrap()
}

/// Inserts `per_aggregate` rows for each of `aggregates` aggregates by
/// plain SQL (only Debezium's five columns), interleaved; returns
/// (aggregate id, event id) in insertion order.
async fn insert_plain_rows(
    t: &TestDb,
    aggregates: usize,
    per_aggregate: usize,
) -> Vec<(String, String)> {
    let mut written = Vec::new();
    for round in 0..per_aggregate {
        let mut values = Vec::new();
        for aggregate in 0..aggregates {
            let id = uuid::Uuid::now_v7().to_string();
            let aggregate_id = format!("cust-{aggregate}");
            values.push(format!(
                "('{id}', 'Customer', '{aggregate_id}', 'CustomerUpdated', '{{\"round\": {round}}}')"
            ));
            written.push((aggregate_id, id));
        }
        t.db.execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES {}",
            values.join(", ")
        ))
        .await
        .unwrap();
    }
    written
}

/// Per aggregate, the event ids in the order a queue delivered them first.
fn first_arrivals(received: &[Received]) -> BTreeMap<String, Vec<String>> {
    let mut seen = HashSet::new();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in received {
        let id = message.message.header("id").expect("id header").to_owned();
        if seen.insert(id.clone()) {
            let key = message.message.key.clone().expect("aggregateId header");
            order.entry(key).or_default().push(id);
        }
    }
    order
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_reach_a_bound_queue_with_every_property_and_are_marked_after_their_confirm() {
    let broker = Broker::connect().await;
    let exchange = unique("contract");
    let queue = unique("contract-q");
    broker
        .bind_queue(&exchange, &queue, "outbox.event.*", FieldTable::default())
        .await;
    let t = TestDb::new(Backend::Postgres).await;

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
    let event_id = appended[0].id.to_string();
    let plain = insert_plain_rows(&t, 1, 1).await;
    let (_, plain_id) = &plain[0];

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    drain(&t, &exchange, &[]);
    let received = broker
        .read(
            &queue,
            2,
            Duration::from_secs(20),
            Duration::from_millis(500),
        )
        .await;
    assert_eq!(received.len(), 2, "{received:?}");

    let invoice = received
        .iter()
        .find(|m| m.message.topic == "outbox.event.Invoice")
        .expect("the invoice event, routed by its aggregate type");
    let properties = &invoice.properties;
    assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        properties.content_type().as_ref().map(|v| v.as_str()),
        Some("application/json")
    );
    assert_eq!(
        properties.message_id().as_ref().map(|v| v.as_str()),
        Some(event_id.as_str())
    );
    assert_eq!(
        properties.kind().as_ref().map(|v| v.as_str()),
        Some("InvoiceIssued")
    );
    let timestamp = properties.timestamp().expect("a timestamp");
    assert!(
        timestamp >= before && timestamp <= before + 60,
        "{timestamp}"
    );
    assert_eq!(
        invoice.message.payload.as_deref(),
        Some(stored_payload(&t, &event_id).await.as_bytes()),
        "the body is the payload's bytes as stored"
    );
    let message = &invoice.message;
    assert_eq!(message.header("id"), Some(event_id.as_str()));
    assert_eq!(message.header("eventType"), Some("InvoiceIssued"));
    assert_eq!(message.header("eventVersion"), Some("2"));
    assert_eq!(message.header("aggregateSequence"), Some("1"));
    assert_eq!(message.header("traceparent"), Some(TRACEPARENT));
    assert_eq!(message.header("aggregateType"), Some("Invoice"));
    assert_eq!(message.header("aggregateId"), Some("inv-1"));

    let customer = received
        .iter()
        .find(|m| m.message.topic == "outbox.event.Customer")
        .expect("the plain-SQL row");
    assert_eq!(
        customer
            .properties
            .message_id()
            .as_ref()
            .map(|v| v.as_str()),
        Some(plain_id.as_str())
    );
    assert_eq!(customer.message.json(), serde_json::json!({"round": 0}));
    assert_eq!(customer.message.header("eventVersion"), Some("1"));
    assert_eq!(customer.message.header("aggregateSequence"), None);
    assert_eq!(customer.message.header("traceparent"), None);
    assert_eq!(customer.message.header("aggregateId"), Some("cust-0"));

    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 0);
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_plain_sql_rows_over_ten_aggregates_arrive_once_in_table_order() {
    let broker = Broker::connect().await;
    let exchange = unique("plain");
    let queue = unique("plain-q");
    broker
        .bind_queue(&exchange, &queue, "#", FieldTable::default())
        .await;
    let t = TestDb::new(Backend::Postgres).await;
    let written = insert_plain_rows(&t, 10, 100).await;

    drain(&t, &exchange, &["--batch-size", "300"]);
    let received = broker
        .read(
            &queue,
            written.len(),
            Duration::from_secs(60),
            Duration::from_millis(500),
        )
        .await;
    assert_eq!(received.len(), 1000, "each row exactly once");
    for message in &received {
        assert_eq!(
            message
                .properties
                .message_id()
                .as_ref()
                .map(|v| v.to_string()),
            message.message.header("id").map(str::to_owned),
            "message_id is the event id"
        );
    }
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (aggregate, id) in &written {
        expected
            .entry(aggregate.clone())
            .or_default()
            .push(id.clone());
    }
    assert_eq!(
        first_arrivals(&received),
        expected,
        "per aggregate, the queue holds the rows in the order they were written"
    );
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 0);
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn appended_events_keep_their_aggregate_sequence_order_with_a_small_confirm_window() {
    let broker = Broker::connect().await;
    let exchange = unique("order");
    let queue = unique("order-q");
    broker
        .bind_queue(
            &exchange,
            &queue,
            "outbox.event.Invoice",
            FieldTable::default(),
        )
        .await;
    let t = TestDb::new(Backend::Postgres).await;
    let ids = seed(&t.db, 10, 100, 10).await;

    drain(&t, &exchange, &["--amqp-max-unconfirmed", "7"]);
    let received = broker
        .read(
            &queue,
            ids.len(),
            Duration::from_secs(60),
            Duration::from_millis(500),
        )
        .await;
    let messages: Vec<_> = received.into_iter().map(|m| m.message).collect();
    let report = check_stream(&messages, &ids);
    assert_eq!(report.distinct, 1000);
    assert_eq!(report.duplicates, 0, "no fault, so no redelivery");
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
}

/// Waits until `done` holds, failing after `timeout` with `what`.
async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn nacked_rows_stay_pending_and_are_delivered_once_the_queue_takes_them() {
    let broker = Broker::connect().await;
    let exchange = unique("nack");
    let witness = unique("nack-witness");
    let full = unique("nack-full");
    broker
        .bind_queue(&exchange, &witness, "#", FieldTable::default())
        .await;
    // Holds 50 messages, then makes RabbitMQ nack every further publish.
    broker
        .bind_queue(&exchange, &full, "#", reject_publish_beyond(50))
        .await;
    let t = TestDb::new(Backend::Postgres).await;
    let ids = seed(&t.db, 5, 40, 10).await;

    let url = amqp_url();
    let args = rabbit_args(&url, &exchange, &["--batch-size", "100"]);
    let mut relay = RelayProcess::spawn(relay(), &args, &[("DATABASE_URL", &t.url)]);
    wait_until(Duration::from_secs(30), "the first nacks", || async {
        t.count("outbox WHERE attempts > 0").await > 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let published = t.count("outbox WHERE published_at IS NOT NULL").await;
    assert!(
        published <= 50,
        "only what the full queue took is marked, got {published}"
    );
    assert!(
        t.count("outbox WHERE published_at IS NULL").await >= 150,
        "nacked rows stay pending"
    );

    // The fault ends: the full queue goes away.
    broker.delete_queue(&full).await;
    wait_until(Duration::from_secs(60), "every row published", || async {
        t.count("outbox WHERE published_at IS NULL").await == 0
    })
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));

    let received = broker
        .read(
            &witness,
            ids.len(),
            Duration::from_secs(30),
            Duration::from_millis(500),
        )
        .await;
    let messages: Vec<_> = received.into_iter().map(|m| m.message).collect();
    // A nacked message may still have reached the witness queue: it comes
    // again, never ahead of an earlier event of its aggregate.
    let report = check_stream(&messages, &ids);
    assert_eq!(report.distinct, ids.len());
    assert_eq!(
        t.count("outbox WHERE dead_lettered_at IS NOT NULL").await,
        0
    );
    broker.clean_up(&exchange, &[&witness]).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_closing_the_relays_connection_mid_drain_loses_nothing_and_keeps_order() {
    let broker = Broker::connect().await;
    let exchange = unique("close");
    let queue = unique("close-q");
    broker
        .bind_queue(&exchange, &queue, "#", FieldTable::default())
        .await;
    let t = TestDb::new(Backend::Postgres).await;
    let ids = seed(&t.db, 10, 500, 50).await;

    let url = amqp_url();
    let args = rabbit_args(
        &url,
        &exchange,
        &["--batch-size", "10", "--amqp-max-unconfirmed", "4"],
    );
    let mut relay = RelayProcess::spawn(relay(), &args, &[("DATABASE_URL", &t.url)]);
    let name = format!("outbox-relay pid {}", relay_pid(&relay));
    let mut closed = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while closed < 3 && Instant::now() < deadline {
        let pending = t.count("outbox WHERE published_at IS NULL").await;
        assert!(
            pending > 0,
            "the drain ended before the connection was closed 3 times"
        );
        if pending < ids.len() as i64 {
            closed += close_connections_named(&name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(closed, 3, "closed the relay's connection three times");
    wait_until(Duration::from_secs(60), "every row published", || async {
        t.count("outbox WHERE published_at IS NULL").await == 0
    })
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));
    let stderr = relay.stderr().join("\n");
    assert!(stderr.contains("reconnected to RabbitMQ"), "{stderr}");

    let received = broker
        .read(
            &queue,
            ids.len(),
            Duration::from_secs(60),
            Duration::from_millis(500),
        )
        .await;
    let messages: Vec<_> = received.into_iter().map(|m| m.message).collect();
    let report = check_stream(&messages, &ids);
    assert_eq!(report.distinct, ids.len(), "nothing lost");
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
}

/// The relay's process id, which names its AMQP connection.
fn relay_pid(relay: &RelayProcess) -> u32 {
    relay.id()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unroutable_message_is_not_marked_and_is_dead_lettered_as_unroutable() {
    let broker = Broker::connect().await;
    let exchange = unique("unroutable");
    let queue = unique("unroutable-q");
    // Only invoices have a queue.
    broker
        .bind_queue(
            &exchange,
            &queue,
            "outbox.event.Invoice",
            FieldTable::default(),
        )
        .await;
    let t = TestDb::new(Backend::Sqlite).await;
    let ids = seed(&t.db, 2, 5, 5).await;
    insert_plain_rows(&t, 2, 3).await;

    drain(
        &t,
        &exchange,
        &["--max-attempts", "2", "--poll-interval", "10ms"],
    );
    let received = broker
        .read(
            &queue,
            ids.len(),
            Duration::from_secs(20),
            Duration::from_millis(300),
        )
        .await;
    assert_eq!(received.len(), ids.len(), "the routable events arrived");
    assert_eq!(t.count("outbox WHERE published_at IS NOT NULL").await, 10);
    assert_eq!(
        t.count("outbox WHERE aggregatetype = 'Customer' AND published_at IS NULL")
            .await,
        6,
        "no Customer row is marked: RabbitMQ returned them"
    );
    assert_eq!(
        t.count(
            "outbox WHERE aggregatetype = 'Customer' AND dead_lettered_at IS NOT NULL \
             AND last_error LIKE 'unroutable: no queue bound%'"
        )
        .await,
        6,
        "each Customer row is dead-lettered with the reason"
    );

    // Re-driven and published without `mandatory`: RabbitMQ acks and drops them.
    let (code, _, stderr) = run_to_end(relay(), &["retry"], &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = run_to_end(
        relay(),
        &rabbit_args(
            &amqp_url(),
            &exchange,
            &["--drain", "--amqp-allow-unroutable"],
        ),
        &[("DATABASE_URL", &t.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        t.count("outbox WHERE published_at IS NOT NULL").await,
        16,
        "the Customer rows are marked, though no queue got them"
    );
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_settings_and_unusable_brokers_stop_the_relay_with_one_line_and_mark_nothing() {
    let broker = Broker::connect().await;
    let direct = unique("direct");
    broker.declare_exchange(&direct, ExchangeKind::Direct).await;
    let t = TestDb::new(Backend::Sqlite).await;
    insert_plain_rows(&t, 1, 3).await;
    let env = [("DATABASE_URL", t.url.as_str())];

    let cases: [(&[&str], i32, &str); 5] = [
        (
            &["--amqp-url", "http://guest:s3cret@127.0.0.1:5672/"],
            2,
            "error: --amqp-url: the scheme is http://",
        ),
        (
            &["--amqp-url", "amqp://guest:s3cret@127.0.0.1:notaport/"],
            2,
            "error: --amqp-url: not a URL",
        ),
        (
            &["--amqp-url", "amqp://guest:s3cret@127.0.0.1:5672/%2f"],
            1,
            "error: cannot connect to RabbitMQ at amqp://127.0.0.1:5672/%2F",
        ),
        (
            &["--amqp-url", "amqp://guest:s3cret@127.0.0.1:1/%2f"],
            1,
            "error: cannot connect to RabbitMQ at amqp://127.0.0.1:1/%2F",
        ),
        (
            &[
                "--amqp-url",
                "amqp://guest:guest@127.0.0.1:5672/%2f",
                "--amqp-exchange",
                &direct,
            ],
            1,
            "error: cannot declare the durable topic exchange",
        ),
    ];
    for (options, expected_code, expected_start) in cases {
        let mut args = vec!["run", "--drain", "--sink", "rabbitmq"];
        args.extend_from_slice(options);
        let (code, stdout, stderr) = run_to_end(relay(), &args, &env);
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|line| !line.contains(" INFO ") && !line.contains(" WARN "))
            .collect();
        assert_eq!(code, expected_code, "{options:?}: {stderr}");
        assert_eq!(lines.len(), 1, "{options:?}: one line: {stderr}");
        assert!(
            lines[0].starts_with(expected_start),
            "{options:?}: {}",
            lines[0]
        );
        assert!(
            !stderr.contains("s3cret") && !stdout.contains("s3cret"),
            "{options:?}: the password is never shown: {stderr}"
        );
    }
    assert_eq!(t.count("outbox WHERE published_at IS NOT NULL").await, 0);
    assert_eq!(t.count("outbox WHERE attempts > 0").await, 0);
    broker.clean_up(&direct, &[]).await;
    t.drop().await;
}
