//! `--format cloudevents` (binary content mode) and
//! `--format cloudevents-structured`: what a separate client reads back
//! from Kafka, RabbitMQ and NATS (topic, key, headers, value) equals the
//! CloudEvent expected from the table's rows, compared by event id, with
//! `time` against the table's `created_at`; `outbox-core`'s consume
//! helpers read every form into the same metadata, payload and typed
//! event; per-aggregate order holds; bad options are refused in one line.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::{EventDecoder, IncomingMessage};
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::kafka::{self, Consumed};
use outbox_tests::nats::{Scope, Witness, nats_url};
use outbox_tests::process::{assert_refused, run_to_end};
use outbox_tests::rabbitmq::{Broker, amqp_url, unique};
use outbox_tests::stream::append_events;
use outbox_tests::{Backend, OutboxRow, TestDb};
use sea_orm::ConnectionTrait;

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay() -> &'static Path {
    Path::new(RELAY)
}

/// The rows a test wrote, as the table holds them: the witness.
struct Written {
    rows: Vec<OutboxRow>,
    /// Each row's `created_at`, by id.
    times: BTreeMap<String, DateTime<Utc>>,
}

impl Written {
    fn row(&self, id: &str) -> &OutboxRow {
        self.rows
            .iter()
            .find(|row| row.id == id)
            .unwrap_or_else(|| panic!("no outbox row {id}"))
    }
}

/// Writes through `outbox-core` (invoices `inv-1` and `inv-2` over three
/// transactions), one plain-SQL row and one plain-SQL tombstone (NULL
/// payload), then reads the table back.
async fn write(t: &TestDb) -> Written {
    append_events(&t.db, "inv-1", 3).await;
    append_events(&t.db, "inv-2", 2).await;
    append_events(&t.db, "inv-1", 1).await;
    t.insert_plain_rows(1, 1).await;
    let tombstone = uuid::Uuid::now_v7();
    t.db.execute_unprepared(&format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         VALUES ('{tombstone}', 'Customer', 'cust-9', 'CustomerForgotten', NULL)"
    ))
    .await
    .expect("insert tombstone");
    let times = t
        .created_at_times()
        .await
        .into_iter()
        .map(|(id, time)| (id, instant(&time)))
        .collect();
    let rows = t.outbox_rows().await;
    assert_eq!(rows.len(), 8);
    Written { rows, times }
}

fn instant(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|error| panic!("{text:?} is not RFC 3339: {error}"))
        .with_timezone(&Utc)
}

/// The attributes the relay must give `row` (all but `time`), with
/// `--ce-source /shop/{aggregatetype}` and the default type.
fn expected_attributes(row: &OutboxRow) -> BTreeMap<&'static str, String> {
    let mut attributes = BTreeMap::from([
        ("specversion", "1.0".to_owned()),
        ("id", row.id.clone()),
        ("source", format!("/shop/{}", row.aggregate_type)),
        ("type", row.event_type.clone()),
        ("subject", row.aggregate_id.clone()),
        ("eventversion", row.event_version.to_string()),
        ("aggregatetype", row.aggregate_type.clone()),
    ]);
    if let Some(sequence) = row.aggregate_seq {
        attributes.insert("aggregatesequence", sequence.to_string());
    }
    attributes
}

/// Checks a binary CloudEvent's headers (attributes under `prefix`, and
/// `content-type` where `content_type` names the header) against `row`;
/// returns the event id.
fn check_binary(
    headers: &BTreeMap<String, String>,
    prefix: &str,
    content_type: Option<&str>,
    written: &Written,
) -> String {
    let id = headers
        .get(&format!("{prefix}id"))
        .unwrap_or_else(|| panic!("no {prefix}id in {headers:?}"))
        .clone();
    let row = written.row(&id);
    let mut expected: BTreeMap<String, String> = expected_attributes(row)
        .into_iter()
        .map(|(name, value)| (format!("{prefix}{name}"), value))
        .collect();
    if let Some(header) = content_type {
        expected.insert(header.to_owned(), "application/json".to_owned());
    }
    let mut actual = headers.clone();
    let time = actual
        .remove(&format!("{prefix}time"))
        .unwrap_or_else(|| panic!("event {id} has no time: {headers:?}"));
    assert_eq!(instant(&time), written.times[&id], "time of event {id}");
    assert_eq!(actual, expected, "headers of event {id}");
    id
}

/// Reads `message` with `outbox-core` (metadata, payload, and for invoices
/// the typed event) and checks it against the table's row.
fn check_consumed(message: &IncomingMessage<'_>, written: &Written) {
    let (metadata, payload) = message.read().expect("outbox-core reads the message");
    let id = metadata.id.to_string();
    let row = written.row(&id);
    assert_eq!(metadata.event_type, row.event_type, "event {id}");
    assert_eq!(i64::from(metadata.version), row.event_version, "event {id}");
    assert_eq!(
        metadata.aggregate_id.as_deref(),
        Some(row.aggregate_id.as_str())
    );
    assert_eq!(metadata.aggregate_sequence, row.aggregate_seq, "event {id}");
    let payload: Option<serde_json::Value> =
        payload.map(|bytes| serde_json::from_slice(bytes).expect("a JSON payload"));
    assert_eq!(payload, row.payload, "payload of event {id}");
    if row.aggregate_type == "Invoice" {
        let decoder = EventDecoder::<InvoiceIssuedV2>::new().event::<InvoiceIssuedV2>();
        let decoded = decoder.decode(message).expect("decodes as InvoiceIssuedV2");
        assert_eq!(
            serde_json::to_value(&decoded.event).unwrap(),
            row.payload.clone().unwrap()
        );
    }
}

/// Each aggregate's sequence numbers arrive strictly increasing, and
/// every event arrived exactly once.
fn check_order(arrivals: &[(String, Option<i64>, String)], written: &Written) {
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    for (key, sequence, id) in arrivals {
        if let Some(sequence) = sequence {
            let previous = last.insert(key, *sequence).unwrap_or(0);
            assert!(
                *sequence > previous,
                "{key}: {sequence} after {previous} ({id})"
            );
        }
    }
    let mut ids: Vec<&str> = arrivals.iter().map(|(_, _, id)| id.as_str()).collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = written.rows.iter().map(|row| row.id.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected, "every event once");
}

/// Drains `t` to Kafka topics `<prefix>.<aggregatetype>` with `format`;
/// returns what a separate consumer read, Invoice topic first.
fn drain_to_kafka(t: &TestDb, prefix: &str, format: &str) -> Vec<Consumed> {
    let brokers = kafka::brokers();
    let template = format!("{prefix}.{{aggregatetype}}");
    let args = [
        "run",
        "--drain",
        "--sink",
        "kafka",
        "--brokers",
        &brokers,
        "--topic-template",
        &template,
        "--format",
        format,
        "--ce-source",
        "/shop/{aggregatetype}",
    ];
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    let mut received = Vec::new();
    for (aggregate_type, count) in [("Invoice", 6), ("Customer", 2)] {
        received.extend(kafka::consume(
            &brokers,
            &format!("{prefix}.{aggregate_type}"),
            count,
            Duration::from_secs(30),
            Duration::from_millis(500),
        ));
    }
    received
}

fn incoming(message: &Consumed) -> IncomingMessage<'_> {
    let mut incoming = IncomingMessage::new(&message.topic, message.payload.as_deref())
        .headers(message.headers.iter());
    if let Some(key) = &message.key {
        incoming = incoming.key(key.as_bytes());
    }
    incoming
}

/// Binary mode on Kafka: `ce_` headers and `content-type`, the payload as
/// the value, a null value for the tombstone.
async fn binary_on_kafka(backend: Backend) {
    let t = TestDb::new(backend).await;
    let written = write(&t).await;
    let prefix = kafka::topic_prefix("ce-binary");
    let received = drain_to_kafka(&t, &prefix, "cloudevents");
    check_binary_on_kafka(&received, &written, &prefix);
    assert_eq!(t.pending().await, 0);
    t.drop().await;
}

/// Checks binary CloudEvents read from Kafka topics `<prefix>.<type>`:
/// topic, key, headers and value of each against its row, what
/// `outbox-core` reads, and per-aggregate order.
fn check_binary_on_kafka(received: &[Consumed], written: &Written, prefix: &str) {
    let mut arrivals = Vec::new();
    for message in received {
        let id = check_binary(&message.headers, "ce_", Some("content-type"), written);
        let row = written.row(&id);
        assert_eq!(message.topic, format!("{prefix}.{}", row.aggregate_type));
        assert_eq!(message.key.as_deref(), Some(row.aggregate_id.as_str()));
        let value: Option<serde_json::Value> = message
            .payload
            .as_deref()
            .map(|bytes| serde_json::from_slice(bytes).unwrap());
        assert_eq!(value, row.payload, "value of event {id}");
        check_consumed(&incoming(message), written);
        arrivals.push((message.key.clone().unwrap(), row.aggregate_seq, id));
    }
    check_order(&arrivals, written);
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_rows_reach_kafka_as_binary_cloudevents() {
    binary_on_kafka(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_rows_reach_kafka_as_binary_cloudevents() {
    binary_on_kafka(Backend::Sqlite).await;
}

/// CDC mode: the rows read from the write-ahead log become the same binary
/// CloudEvents, `time` from the logged `created_at`.
#[tokio::test(flavor = "multi_thread")]
async fn cdc_rows_reach_kafka_as_binary_cloudevents() {
    let t = TestDb::new(Backend::Postgres).await;
    let prefix = kafka::topic_prefix("ce-cdc");
    let brokers = kafka::brokers();
    let template = format!("{prefix}.{{aggregatetype}}");
    let args = [
        "--sink",
        "kafka",
        "--brokers",
        &brokers,
        "--topic-template",
        &template,
        "--format",
        "cloudevents",
        "--ce-source",
        "/shop/{aggregatetype}",
    ];
    let (mut relay, slot) = t.start_cdc_relay(relay(), &args).await;
    let written = write(&t).await;
    let mut received = Vec::new();
    for (aggregate_type, count) in [("Invoice", 6), ("Customer", 2)] {
        received.extend(kafka::consume(
            &brokers,
            &format!("{prefix}.{aggregate_type}"),
            count,
            Duration::from_secs(30),
            Duration::from_millis(500),
        ));
    }
    relay.terminate();
    check_binary_on_kafka(&received, &written, &prefix);
    t.drop_slot(&slot).await;
    t.drop().await;
}

/// Structured mode on Kafka: the envelope as the value with the payload
/// as `data`, `content-type: application/cloudevents+json`; the
/// tombstone a null value with `ce_` headers.
async fn structured_on_kafka(backend: Backend) {
    let t = TestDb::new(backend).await;
    let written = write(&t).await;
    let prefix = kafka::topic_prefix("ce-structured");
    let received = drain_to_kafka(&t, &prefix, "cloudevents-structured");
    let mut arrivals = Vec::new();
    for message in &received {
        let id = match &message.payload {
            None => check_binary(&message.headers, "ce_", Some("content-type"), &written),
            Some(_) => {
                assert_eq!(
                    message.headers,
                    BTreeMap::from([(
                        "content-type".to_owned(),
                        "application/cloudevents+json; charset=UTF-8".to_owned()
                    )])
                );
                let mut envelope = message.json();
                let id = envelope["id"].as_str().unwrap().to_owned();
                let row = written.row(&id);
                let time = envelope
                    .as_object_mut()
                    .unwrap()
                    .remove("time")
                    .expect("a time");
                assert_eq!(instant(time.as_str().unwrap()), written.times[&id]);
                let mut expected = serde_json::Map::new();
                for (name, value) in expected_attributes(row) {
                    expected.insert(name.to_owned(), value.into());
                }
                expected.insert("datacontenttype".into(), "application/json".into());
                expected.insert("data".into(), row.payload.clone().unwrap());
                assert_eq!(envelope, serde_json::Value::Object(expected), "event {id}");
                id
            }
        };
        let row = written.row(&id);
        assert_eq!(message.key.as_deref(), Some(row.aggregate_id.as_str()));
        check_consumed(&incoming(message), &written);
        arrivals.push((message.key.clone().unwrap(), row.aggregate_seq, id));
    }
    check_order(&arrivals, &written);
    assert_eq!(t.pending().await, 0);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_rows_reach_kafka_as_structured_cloudevents() {
    structured_on_kafka(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_rows_reach_kafka_as_structured_cloudevents() {
    structured_on_kafka(Backend::Postgres).await;
}

/// RabbitMQ, binary mode: `cloudEvents_` headers, the `content_type`
/// property, the payload as the body.
#[tokio::test(flavor = "multi_thread")]
async fn mariadb_rows_reach_rabbitmq_as_binary_cloudevents() {
    let broker = Broker::connect().await;
    let exchange = unique("ce");
    let queue = unique("ce-q");
    broker
        .declare_exchange(&exchange, lapin::ExchangeKind::Topic)
        .await;
    broker
        .bind_queue(&exchange, &queue, "#", Default::default())
        .await;
    let t = TestDb::new(Backend::MySql).await;
    let written = write(&t).await;
    let url = amqp_url();
    let args = [
        "run",
        "--drain",
        "--sink",
        "rabbitmq",
        "--amqp-url",
        &url,
        "--amqp-exchange",
        &exchange,
        "--format",
        "cloudevents",
        "--ce-source",
        "/shop/{aggregatetype}",
    ];
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    let received = broker
        .read(
            &queue,
            8,
            Duration::from_secs(30),
            Duration::from_millis(500),
        )
        .await;
    let mut arrivals = Vec::new();
    for delivery in &received {
        let message = &delivery.message;
        let id = check_binary(&message.headers, "cloudEvents_", None, &written);
        assert_eq!(
            delivery
                .properties
                .content_type()
                .as_ref()
                .map(|value| value.as_str()),
            Some("application/json")
        );
        let row = written.row(&id);
        let body = message.payload.as_deref().unwrap();
        match &row.payload {
            Some(payload) => assert_eq!(
                &serde_json::from_slice::<serde_json::Value>(body).unwrap(),
                payload
            ),
            None => assert!(body.is_empty(), "a tombstone's body is empty"),
        }
        let mut consumed = message.clone();
        if row.payload.is_none() {
            consumed.payload = None;
        }
        check_consumed(&incoming(&consumed), &written);
        arrivals.push((row.aggregate_id.clone(), row.aggregate_seq, id));
    }
    check_order(&arrivals, &written);
    assert_eq!(t.pending().await, 0);
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
}

/// NATS JetStream, structured mode: the envelope as the body,
/// `content-type` and `Nats-Msg-Id` headers; the tombstone binary, with
/// `ce-` headers and an empty body.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_rows_reach_nats_as_structured_cloudevents() {
    let witness = Witness::connect().await;
    let scope = Scope::new("ce");
    let t = TestDb::new(Backend::Postgres).await;
    let written = write(&t).await;
    let args = scope.drain_args(
        &nats_url(),
        &[
            "--format",
            "cloudevents-structured",
            "--ce-source",
            "/shop/{aggregatetype}",
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    let stored = witness
        .read(&scope.stream, 8, Duration::from_secs(30))
        .await;
    let mut arrivals = Vec::new();
    for message in &stored {
        let tombstone = message.payload.is_empty();
        let mut headers = message.headers.clone();
        let msg_id = headers.remove("Nats-Msg-Id").expect("Nats-Msg-Id");
        let id = if tombstone {
            check_binary(&headers, "ce-", Some("content-type"), &written)
        } else {
            assert_eq!(
                headers,
                BTreeMap::from([(
                    "content-type".to_owned(),
                    "application/cloudevents+json; charset=UTF-8".to_owned()
                )])
            );
            let envelope: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
            envelope["id"].as_str().unwrap().to_owned()
        };
        assert_eq!(msg_id, id);
        let row = written.row(&id);
        assert_eq!(
            message.subject,
            format!(
                "{}.event.{}.{}",
                scope.prefix, row.aggregate_type, row.aggregate_id
            )
        );
        let mut consumed = Consumed {
            topic: message.subject.clone(),
            partition: 0,
            key: None,
            payload: Some(message.payload.clone()),
            headers: message.headers.clone(),
        };
        if tombstone {
            consumed.payload = None;
        }
        check_consumed(&incoming(&consumed), &written);
        arrivals.push((row.aggregate_id.clone(), row.aggregate_seq, id));
    }
    check_order(&arrivals, &written);
    assert_eq!(t.pending().await, 0);
    witness.delete_stream(&scope.stream).await;
    t.drop().await;
}

/// A type template: `type` as the template says, the event type kept as
/// the `eventtype` attribute, which the consume helpers read.
#[tokio::test(flavor = "multi_thread")]
async fn a_type_template_keeps_the_event_type_for_consumers() {
    let t = TestDb::new(Backend::Sqlite).await;
    append_events(&t.db, "inv-1", 2).await;
    let args = [
        "run",
        "--drain",
        "--format",
        "cloudevents",
        "--ce-type",
        "com.acme.{aggregatetype}.{eventtype}.v{version}",
    ];
    let (code, stdout, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for (n, line) in lines.iter().enumerate() {
        let headers = &line["headers"];
        assert_eq!(headers["ce_type"], "com.acme.Invoice.InvoiceIssued.v2");
        assert_eq!(headers["ce_eventtype"], "InvoiceIssued");
        assert_eq!(headers["ce_source"], "/outbox/Invoice");
        assert_eq!(headers["ce_aggregatesequence"], (n + 1).to_string());
        let headers: Vec<(String, String)> = headers
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, value)| (name.clone(), value.as_str().unwrap().to_owned()))
            .collect();
        let payload = line["payload"].to_string();
        let message = IncomingMessage::new("outbox.event.Invoice", Some(payload.as_bytes()))
            .headers(headers.iter().map(|(name, value)| (name, value)));
        let decoder = EventDecoder::<InvoiceIssuedV2>::new().event::<InvoiceIssuedV2>();
        let decoded = decoder.decode(&message).expect("decodes");
        assert_eq!(decoded.metadata.event_type, "InvoiceIssued");
        assert_eq!(decoded.event.amount_cents, n as i64);
    }
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_cloudevents_options_are_refused_in_one_line() {
    let t = TestDb::new(Backend::Sqlite).await;
    append_events(&t.db, "inv-1", 1).await;
    let env = [("DATABASE_URL", t.url.as_str())];
    let cases: [(&[&str], &str); 3] = [
        (
            &["--format", "cloudevents", "--ce-type", "x.{event}"],
            "error: --ce-type \"x.{event}\": unknown placeholder {event}",
        ),
        (
            &[
                "--format",
                "cloudevents-structured",
                "--ce-source",
                "/a/{service",
            ],
            "error: --ce-source \"/a/{service\" has an unclosed {",
        ),
        (
            &["--ce-source", "/shop"],
            "error: --ce-source and --ce-type shape CloudEvents; add --format cloudevents",
        ),
    ];
    for (options, start) in cases {
        let mut args = vec!["run", "--drain"];
        args.extend_from_slice(options);
        assert_refused(relay(), &args, &env, 2, start, "no secret here");
    }
    assert_eq!(t.pending().await, 1, "nothing published");
    t.drop().await;
}
