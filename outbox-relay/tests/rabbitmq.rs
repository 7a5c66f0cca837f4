//! The relay binary publishing to the real RabbitMQ (127.0.0.1:5672): the
//! message contract read back from a bound queue, per-aggregate order
//! against the table, rows left pending while the broker refuses them,
//! drops the relay's connection or restarts (a private broker of the
//! test's own), unroutable messages, and bad settings. Each test has its
//! own database, exchange and queues.

use std::path::Path;
use std::time::{Duration, Instant};

use lapin::ExchangeKind;
use lapin::types::FieldTable;
use outbox_core::OutboxEvent;
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::process::{RelayProcess, assert_refused, run_to_end};
use outbox_tests::rabbitmq::{
    Broker, PrivateServer, amqp_url, close_connections_named, reject_publish_beyond, unique,
};
use outbox_tests::stream::{first_arrivals, seed, written_order};
use outbox_tests::{Backend, TestDb, wait};
use sea_orm::TransactionTrait;

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
    let plain = t.insert_plain_rows(1, 1).await;
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
        Some(t.stored_payload(&event_id).await.as_bytes()),
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

    assert_eq!(t.pending().await, 0);
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
    let written = t.insert_plain_rows(10, 100).await;

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
    let messages: Vec<_> = received.into_iter().map(|m| m.message).collect();
    assert_eq!(
        first_arrivals(&messages),
        written_order(&written),
        "per aggregate, the queue holds the rows in the order they were written"
    );
    assert_eq!(t.pending().await, 0);
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
    let report = broker.check_queue(&queue, &ids).await;
    assert_eq!(report.distinct, 1000);
    assert_eq!(report.duplicates, 0, "no fault, so no redelivery");
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
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
    wait::until("the first nacks", Duration::from_secs(30), async || {
        t.count("outbox WHERE attempts > 0").await > 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let published = t.published().await;
    assert!(
        published <= 50,
        "only what the full queue took is marked, got {published}"
    );
    assert!(t.pending().await >= 150, "nacked rows stay pending");

    // The fault ends: the full queue goes away.
    broker.delete_queue(&full).await;
    t.wait_until_published(Duration::from_secs(60)).await;
    relay.terminate();

    // A nacked message may still have reached the witness queue: it comes
    // again, never ahead of an earlier event of its aggregate.
    let report = broker.check_queue(&witness, &ids).await;
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
    let name = format!("outbox-relay pid {}", relay.id());
    let mut closed = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while closed < 3 && Instant::now() < deadline {
        let pending = t.pending().await;
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
    t.wait_until_published(Duration::from_secs(60)).await;
    let stderr = relay.terminate();
    assert!(stderr.contains("reconnected to RabbitMQ"), "{stderr}");

    let report = broker.check_queue(&queue, &ids).await;
    assert_eq!(report.distinct, ids.len(), "nothing lost");
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
}

/// How a test stops a broker.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// SIGTERM: RabbitMQ shuts down in order.
    Graceful,
    /// SIGKILL: a crash.
    Crash,
}

#[tokio::test(flavor = "multi_thread")]
async fn broker_restarts_mid_drain_lose_nothing_and_keep_order_in_a_durable_queue() {
    let mut server = PrivateServer::start().await;
    let exchange = unique("restart");
    let queue = unique("restart-q");
    let setup = Broker::connect_to(&server.url).await;
    setup
        .bind_queue(&exchange, &queue, "#", FieldTable::default())
        .await;
    setup.close().await;
    let t = TestDb::new(Backend::Postgres).await;
    let ids = seed(&t.db, 10, 1000, 100).await;
    let total = ids.len() as i64;

    let args = rabbit_args(
        &server.url,
        &exchange,
        &[
            "--batch-size",
            "50",
            "--amqp-max-unconfirmed",
            "8",
            "--send-timeout",
            "5s",
        ],
    );
    let mut relay = RelayProcess::spawn(relay(), &args, &[("DATABASE_URL", &t.url)]);
    for stop in [Stop::Graceful, Stop::Crash] {
        let before = t.published().await;
        wait::until(
            "progress before the stop",
            Duration::from_secs(120),
            async || t.published().await > before,
        )
        .await;
        match stop {
            Stop::Graceful => server.stop().await,
            Stop::Crash => server.kill(),
        }
        let published = t.published().await;
        assert!(
            published < total,
            "the drain ended before the {stop:?} stop; relay:\n{}",
            relay.stderr().join("\n")
        );
        eprintln!("{stop:?} stop with {published} of {total} rows published");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            relay.is_running(),
            "the relay kept running while the broker was down"
        );
        server.restart().await;
    }
    t.wait_until_published(Duration::from_secs(180)).await;
    let stderr = relay.terminate();
    assert!(stderr.contains("reconnected to RabbitMQ"), "{stderr}");

    let broker = Broker::connect_to(&server.url).await;
    let report = broker.check_queue(&queue, &ids).await;
    eprintln!(
        "{} events, {} sent again after the restarts",
        ids.len(),
        report.duplicates
    );
    assert_eq!(report.distinct, ids.len(), "nothing lost");
    broker.close().await;
    t.drop().await;
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
    t.insert_plain_rows(2, 3).await;

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
    assert_eq!(t.published().await, 10);
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
        t.published().await,
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
    t.insert_plain_rows(1, 3).await;
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
        assert_refused(
            relay(),
            &args,
            &env,
            expected_code,
            expected_start,
            "s3cret",
        );
    }
    assert_eq!(t.published().await, 0);
    assert_eq!(t.count("outbox WHERE attempts > 0").await, 0);
    broker.clean_up(&direct, &[]).await;
    t.drop().await;
}
