//! Debezium's `table.field.event.id`, `table.field.event.key` and
//! `table.field.event.payload`: a table whose writers fill columns of
//! their own (`event_uuid`, `msg_key`, `body`) beside the relay's. What a
//! separate Kafka consumer reads back (the `id` header, the key, the
//! value) equals those columns of each row, on PostgreSQL (a JSON body),
//! MariaDB and SQLite (a text body) by polling, in a replay, and on
//! PostgreSQL in CDC mode; each aggregate's events arrive in written
//! order, and the relay marks rows by their own `id` as always. On NATS
//! and RabbitMQ, which have no key, the id and payload columns apply
//! (`Nats-Msg-Id`, `message_id`) and the aggregate id stays where they
//! carry it.

use std::path::Path;
use std::time::Duration;

use outbox_tests::kafka::{self, Consumed};
use outbox_tests::process::run_to_end;
use outbox_tests::{Backend, TestDb};
use sea_orm::ConnectionTrait;
use serde_json::json;

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay() -> &'static Path {
    Path::new(RELAY)
}

/// One row as written: the relay's columns and the writer's own.
struct Row {
    aggregate_id: &'static str,
    event_uuid: String,
    msg_key: Option<&'static str>,
    total: i64,
}

/// Adds the writer's columns: `event_uuid` and `msg_key` (text) and
/// `body` (JSON on PostgreSQL, text elsewhere).
async fn add_columns(t: &TestDb) {
    let (text, body) = match t.backend {
        Backend::Postgres => ("TEXT", "JSONB"),
        Backend::MySql => ("VARCHAR(64)", "TEXT"),
        Backend::Sqlite => ("TEXT", "TEXT"),
    };
    for alter in [
        format!("ALTER TABLE outbox ADD COLUMN event_uuid {text}"),
        format!("ALTER TABLE outbox ADD COLUMN msg_key {text}"),
        format!("ALTER TABLE outbox ADD COLUMN body {body}"),
    ] {
        t.db.execute_unprepared(&alter).await.expect("add a column");
    }
}

/// Rows of aggregates `o-1` and `o-2` keyed by tenant, and one of `o-3`
/// without a key, by plain SQL; `payload` holds a placeholder the
/// messages must not carry.
async fn insert_rows(t: &TestDb) -> Vec<Row> {
    let plan = [
        ("o-1", Some("acme")),
        ("o-2", Some("globex")),
        ("o-1", Some("acme")),
        ("o-2", Some("globex")),
        ("o-1", Some("acme")),
        ("o-3", None),
    ];
    let mut rows = Vec::new();
    for (total, (aggregate_id, msg_key)) in plan.into_iter().enumerate() {
        let id = uuid::Uuid::now_v7();
        let event_uuid = format!("legacy-{}", uuid::Uuid::now_v7().simple());
        let key_sql = msg_key.map_or("NULL".to_owned(), |key| format!("'{key}'"));
        t.db.execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, \
               event_uuid, msg_key, body) \
             VALUES ('{id}', 'Order', '{aggregate_id}', 'OrderPlaced', '{{\"unused\": true}}', \
               '{event_uuid}', {key_sql}, '{{\"total\": {total}}}')"
        ))
        .await
        .expect("insert");
        rows.push(Row {
            aggregate_id,
            event_uuid,
            msg_key,
            total: total as i64,
        });
    }
    rows
}

/// The relay's router options naming the writer's columns.
fn options() -> Vec<String> {
    [
        "table.field.event.id=event_uuid",
        "table.field.event.key=msg_key",
        "table.field.event.payload=body",
    ]
    .into_iter()
    .flat_map(|option| ["--router".to_owned(), option.to_owned()])
    .collect()
}

/// Checks what the consumer read against the rows: the `id` header is
/// the row's `event_uuid`, the key its `msg_key` (none for NULL), the
/// value its `body`; each aggregate's events in written order.
fn check(received: &[Consumed], rows: &[Row]) {
    assert_eq!(received.len(), rows.len(), "{received:?}");
    let mut order: Vec<(&str, i64)> = Vec::new();
    for message in received {
        let id = message.header("id").expect("an id header");
        let row = rows
            .iter()
            .find(|row| row.event_uuid == id)
            .unwrap_or_else(|| panic!("{id} is no row's event_uuid: {received:?}"));
        assert_eq!(message.key.as_deref(), row.msg_key, "event {id}");
        assert_eq!(message.json(), json!({ "total": row.total }), "event {id}");
        assert_eq!(message.header("eventType"), Some("OrderPlaced"));
        order.push((row.aggregate_id, row.total));
    }
    for aggregate in ["o-1", "o-2", "o-3"] {
        let written: Vec<i64> = rows
            .iter()
            .filter(|row| row.aggregate_id == aggregate)
            .map(|row| row.total)
            .collect();
        let arrived: Vec<i64> = order
            .iter()
            .filter(|(of, _)| *of == aggregate)
            .map(|(_, total)| *total)
            .collect();
        assert_eq!(arrived, written, "{aggregate} in written order");
    }
}

fn consume(brokers: &str, topic: &str, count: usize) -> Vec<Consumed> {
    kafka::consume(
        brokers,
        topic,
        count,
        Duration::from_secs(30),
        Duration::from_millis(500),
    )
}

async fn polled(backend: Backend) {
    let t = TestDb::new(backend).await;
    add_columns(&t).await;
    let rows = insert_rows(&t).await;
    let prefix = kafka::topic_prefix("eventcolumns");
    let template = format!("{prefix}.{{aggregatetype}}");
    let topic = format!("{prefix}.Order");
    let brokers = kafka::brokers();
    kafka::create_topic(&brokers, &topic, 1).await;
    for command in ["run --drain", "replay --yes"] {
        let mut args: Vec<String> = command.split(' ').map(str::to_owned).collect();
        args.extend(
            [
                "--sink",
                "kafka",
                "--brokers",
                &brokers,
                "--topic-template",
                &template,
            ]
            .map(str::to_owned),
        );
        args.extend(options());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
        assert_eq!(code, 0, "{command} failed:\n{stderr}");
    }
    assert_eq!(t.pending().await, 0, "every row marked by its own id");
    // The replay's copies read the same columns.
    let (copies, originals): (Vec<Consumed>, Vec<Consumed>) =
        consume(&brokers, &topic, 2 * rows.len())
            .into_iter()
            .partition(|message| message.header("replayId").is_some());
    check(&originals, &rows);
    check(&copies, &rows);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_messages_take_id_key_and_payload_from_the_named_columns() {
    polled(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_messages_take_id_key_and_payload_from_the_named_columns() {
    polled(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_messages_take_id_key_and_payload_from_the_named_columns() {
    polled(Backend::Sqlite).await;
}

/// CDC mode reads the writer's columns from the write-ahead log.
#[tokio::test(flavor = "multi_thread")]
async fn cdc_messages_take_id_key_and_payload_from_the_named_columns() {
    let t = TestDb::new(Backend::Postgres).await;
    add_columns(&t).await;
    let prefix = kafka::topic_prefix("eventcolumns-cdc");
    let template = format!("{prefix}.{{aggregatetype}}");
    let topic = format!("{prefix}.Order");
    let brokers = kafka::brokers();
    kafka::create_topic(&brokers, &topic, 1).await;
    let mut args: Vec<String> = [
        "--sink",
        "kafka",
        "--brokers",
        &brokers,
        "--topic-template",
        &template,
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(options());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut relay, slot) = t.start_cdc_relay(relay(), &args).await;
    let rows = insert_rows(&t).await;
    let received = consume(&brokers, &topic, rows.len());
    let log = relay.terminate();
    assert_eq!(received.len(), rows.len(), "{received:?}\nrelay:\n{log}");
    check(&received, &rows);
    t.drop_slot(&slot).await;
    t.drop().await;
}

/// On NATS the event id column gives the `id` header and `Nats-Msg-Id`
/// (JetStream's duplicate detection), the payload column the body; NATS
/// has no key, so the subject and `aggregateId` keep the aggregate id.
#[tokio::test(flavor = "multi_thread")]
async fn nats_messages_take_their_id_and_payload_from_the_named_columns() {
    use outbox_tests::nats::{Scope, Witness, nats_url};
    let witness = Witness::connect().await;
    let scope = Scope::new("eventcolumns");
    let t = TestDb::new(Backend::Postgres).await;
    add_columns(&t).await;
    let rows = insert_rows(&t).await;
    let mut args = scope.drain_args(&nats_url(), &[]);
    args.extend(options());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    let stored = witness
        .read(&scope.stream, rows.len() as u64, Duration::from_secs(30))
        .await;
    let received: Vec<Consumed> = stored
        .iter()
        .map(|message| {
            let id = message.header("id").expect("an id header");
            assert_eq!(message.header("Nats-Msg-Id"), Some(id));
            let row = rows
                .iter()
                .find(|row| row.event_uuid == id)
                .unwrap_or_else(|| panic!("{id} is no row's event_uuid"));
            assert_eq!(message.header("aggregateId"), Some(row.aggregate_id));
            assert_eq!(
                message.subject,
                format!("{}.event.Order.{}", scope.prefix, row.aggregate_id)
            );
            // Keyed as the Kafka message would be, for the shared check.
            let mut consumed = message.consumed();
            consumed.key = row.msg_key.map(str::to_owned);
            consumed
        })
        .collect();
    check(&received, &rows);
    witness.delete_stream(&scope.stream).await;
    t.drop().await;
}

/// On RabbitMQ the event id column gives the `id` header and the
/// `message_id` property, the payload column the body; the `aggregateId`
/// header keeps the aggregate id.
#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_messages_take_their_id_and_payload_from_the_named_columns() {
    use lapin::types::FieldTable;
    use outbox_tests::rabbitmq::{Broker, amqp_url, unique};
    let broker = Broker::connect().await;
    let exchange = unique("eventcolumns");
    let queue = unique("eventcolumns-q");
    broker
        .bind_queue(&exchange, &queue, "outbox.event.*", FieldTable::default())
        .await;
    let t = TestDb::new(Backend::MySql).await;
    add_columns(&t).await;
    let rows = insert_rows(&t).await;
    let url = amqp_url();
    let mut args: Vec<String> = [
        "run",
        "--drain",
        "--sink",
        "rabbitmq",
        "--amqp-url",
        &url,
        "--amqp-exchange",
        &exchange,
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(options());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    let received = broker
        .read(
            &queue,
            rows.len(),
            Duration::from_secs(30),
            Duration::from_millis(500),
        )
        .await;
    let received: Vec<Consumed> = received
        .into_iter()
        .map(|message| {
            let id = message.message.header("id").expect("an id header");
            assert_eq!(
                message.properties.message_id().as_ref().map(|v| v.as_str()),
                Some(id)
            );
            let row = rows
                .iter()
                .find(|row| row.event_uuid == id)
                .unwrap_or_else(|| panic!("{id} is no row's event_uuid"));
            // The test client names the aggregate by its `aggregateId`
            // header; keyed as the Kafka message would be for the check.
            assert_eq!(message.message.key.as_deref(), Some(row.aggregate_id));
            let mut consumed = message.message;
            consumed.key = row.msg_key.map(str::to_owned);
            consumed
        })
        .collect();
    check(&received, &rows);
    broker.clean_up(&exchange, &[&queue]).await;
    t.drop().await;
}
