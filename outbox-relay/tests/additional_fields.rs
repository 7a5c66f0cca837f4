//! Debezium's `table.fields.additional.placement` and `route.by.field` of a
//! column the user added to the outbox (a tenant, a target partition):
//! what a separate Kafka consumer reads back (topic, partition, key,
//! headers, value) equals what the table's rows say, on PostgreSQL and
//! MariaDB by polling and on PostgreSQL in CDC mode; a missing column is
//! refused at start unless `error.on.missing` is false.

use std::path::Path;
use std::time::Duration;

use outbox_tests::kafka::{self, Consumed};
use outbox_tests::process::{assert_refused, run_to_end};
use outbox_tests::{Backend, TestDb};
use sea_orm::ConnectionTrait;
use serde_json::json;

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay() -> &'static Path {
    Path::new(RELAY)
}

/// One row written by plain SQL with the added columns.
struct Row {
    id: String,
    aggregate_id: &'static str,
    tenant: Option<&'static str>,
    part: i32,
    amount: i64,
}

/// Adds `tenant` (text) and `part` (integer) to the outbox and inserts
/// [`insert_rows`].
async fn write(t: &TestDb) -> Vec<Row> {
    add_columns(t).await;
    insert_rows(t).await
}

/// Inserts rows of aggregates `o-1`/`o-2` for tenants `acme` and
/// `globex` and one of `o-3` with no tenant, by plain SQL.
async fn insert_rows(t: &TestDb) -> Vec<Row> {
    let plan = [
        ("o-1", Some("acme"), 2),
        ("o-2", Some("globex"), 1),
        ("o-1", Some("acme"), 2),
        ("o-2", Some("globex"), 1),
        ("o-1", Some("acme"), 2),
        ("o-3", None, 0),
    ];
    let mut rows = Vec::new();
    for (amount, (aggregate_id, tenant, part)) in plan.into_iter().enumerate() {
        let id = uuid::Uuid::now_v7().to_string();
        let tenant_sql = tenant.map_or("NULL".to_owned(), |tenant| format!("'{tenant}'"));
        t.db.execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant, part) \
             VALUES ('{id}', 'Order', '{aggregate_id}', 'OrderPlaced', \
             '{{\"amount\": {amount}}}', {tenant_sql}, {part})"
        ))
        .await
        .expect("insert");
        rows.push(Row {
            id,
            aggregate_id,
            tenant,
            part,
            amount: amount as i64,
        });
    }
    rows
}

/// Adds `tenant` (text) and `part` (integer) to the outbox.
async fn add_columns(t: &TestDb) {
    let tenant = match t.backend {
        Backend::MySql => "VARCHAR(64)",
        _ => "TEXT",
    };
    for alter in [
        format!("ALTER TABLE outbox ADD COLUMN tenant {tenant}"),
        "ALTER TABLE outbox ADD COLUMN part INTEGER".to_owned(),
    ] {
        t.db.execute_unprepared(&alter).await.expect("add a column");
    }
}

/// The routed topics' names and the relay's router options: route by
/// `tenant`, the tenant as header `tenantId` and in the envelope, `part`
/// as the partition and in the envelope (a number), and the event type
/// as the `eventType` header it already is.
fn options(prefix: &str) -> Vec<String> {
    [
        "route.by.field=tenant".to_owned(),
        format!("route.topic.replacement={prefix}.${{routedByValue}}"),
        "table.fields.additional.placement=tenant:header:tenantId,tenant:envelope,\
         part:partition,part:envelope:partNo,type:header:eventType"
            .to_owned(),
    ]
    .into_iter()
    .flat_map(|option| ["--router".to_owned(), option])
    .collect()
}

/// Checks what the consumer read against the rows: the tenant's topic,
/// the row's partition, key, `tenantId` header (none for NULL), and the
/// envelope; per aggregate in written order.
fn check(received: &[Consumed], rows: &[Row], prefix: &str) {
    assert_eq!(received.len(), rows.len(), "{received:?}");
    for row in rows {
        let message = received
            .iter()
            .find(|message| message.header("id") == Some(row.id.as_str()))
            .unwrap_or_else(|| panic!("event {} not received: {received:?}", row.id));
        let tenant = row.tenant.unwrap_or("");
        assert_eq!(
            message.topic,
            format!("{prefix}.{tenant}"),
            "event {}",
            row.id
        );
        assert_eq!(message.partition, row.part, "event {}", row.id);
        assert_eq!(message.key.as_deref(), Some(row.aggregate_id));
        assert_eq!(message.header("tenantId"), row.tenant);
        assert_eq!(message.header("eventType"), Some("OrderPlaced"));
        assert_eq!(
            message.json(),
            json!({ "payload": { "amount": row.amount }, "tenant": row.tenant, "partNo": row.part }),
            "event {}",
            row.id
        );
    }
    for aggregate in ["o-1", "o-2"] {
        let written: Vec<&str> = rows
            .iter()
            .filter(|row| row.aggregate_id == aggregate)
            .map(|row| row.id.as_str())
            .collect();
        let arrived: Vec<&str> = received
            .iter()
            .filter(|message| message.key.as_deref() == Some(aggregate))
            .filter_map(|message| message.header("id"))
            .collect();
        assert_eq!(arrived, written, "{aggregate} in written order");
    }
}

/// Creates the tenants' topics with three partitions, so `part` decides.
async fn create_topics(prefix: &str) -> String {
    let brokers = kafka::brokers();
    for tenant in ["acme", "globex", ""] {
        kafka::create_topic(&brokers, &format!("{prefix}.{tenant}"), 3).await;
    }
    brokers
}

fn consume_all(brokers: &str, prefix: &str) -> Vec<Consumed> {
    consume_times(brokers, prefix, 1)
}

/// Reads each tenant's topic until `times` copies of its events arrived.
fn consume_times(brokers: &str, prefix: &str, times: usize) -> Vec<Consumed> {
    let mut received = Vec::new();
    for (tenant, count) in [("acme", 3), ("globex", 2), ("", 1)] {
        received.extend(kafka::consume(
            brokers,
            &format!("{prefix}.{tenant}"),
            count * times,
            Duration::from_secs(30),
            Duration::from_millis(500),
        ));
    }
    received
}

async fn polled(backend: Backend) {
    let t = TestDb::new(backend).await;
    let rows = write(&t).await;
    let prefix = kafka::topic_prefix("additional");
    let brokers = create_topics(&prefix).await;
    let mut args: Vec<String> = ["run", "--drain", "--sink", "kafka", "--brokers", &brokers]
        .map(str::to_owned)
        .to_vec();
    args.extend(options(&prefix));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    check(&consume_all(&brokers, &prefix), &rows, &prefix);
    assert_eq!(t.pending().await, 0);

    // A replay with the same router reads the added columns too: its
    // copies go where the originals went, with the same headers and value.
    let mut args: Vec<String> = ["replay", "--yes", "--sink", "kafka", "--brokers", &brokers]
        .map(str::to_owned)
        .to_vec();
    args.extend(options(&prefix));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "replay failed:\n{stderr}");
    let (copies, originals): (Vec<Consumed>, Vec<Consumed>) = consume_times(&brokers, &prefix, 2)
        .into_iter()
        .partition(|message| message.header("replayId").is_some());
    check(&originals, &rows, &prefix);
    check(&copies, &rows, &prefix);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_additional_fields_go_where_the_placement_says() {
    polled(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_additional_fields_go_where_the_placement_says() {
    polled(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_additional_fields_go_where_the_placement_says() {
    polled(Backend::Sqlite).await;
}

/// CDC mode reads the added columns from the write-ahead log and places
/// them the same way (numbers stay numbers in the envelope).
#[tokio::test(flavor = "multi_thread")]
async fn cdc_additional_fields_go_where_the_placement_says() {
    let t = TestDb::new(Backend::Postgres).await;
    let prefix = kafka::topic_prefix("additional-cdc");
    let brokers = create_topics(&prefix).await;
    add_columns(&t).await;
    let mut args: Vec<String> = ["--sink", "kafka", "--brokers", &brokers]
        .map(str::to_owned)
        .to_vec();
    args.extend(options(&prefix));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut relay, slot) = t.start_cdc_relay(relay(), &args).await;
    let rows = insert_rows(&t).await;
    let received = consume_all(&brokers, &prefix);
    relay.terminate();
    check(&received, &rows, &prefix);
    t.drop_slot(&slot).await;
    t.drop().await;
}

/// `table.field.event.timestamp=created_at`: each Kafka message's
/// timestamp is its row's creation time (to the millisecond), not the
/// time it was sent, which the rows' times, set an hour back, tell apart.
async fn timestamps_from_a_column(backend: Backend) {
    let t = TestDb::new(backend).await;
    let rows = write(&t).await;
    let back = match backend {
        Backend::Postgres => "UPDATE outbox SET created_at = created_at - interval '1 hour'",
        Backend::MySql => "UPDATE outbox SET created_at = created_at - INTERVAL 1 HOUR",
        Backend::Sqlite => {
            "UPDATE outbox SET created_at = \
             strftime('%Y-%m-%dT%H:%M:%fZ', created_at, '-1 hour')"
        }
    };
    t.db.execute_unprepared(back)
        .await
        .expect("move creation times");
    let created: std::collections::BTreeMap<String, i64> = t
        .created_at_times()
        .await
        .into_iter()
        .map(|(id, time)| {
            let time = chrono::DateTime::parse_from_rfc3339(&time).unwrap();
            (id, time.timestamp_millis())
        })
        .collect();
    let prefix = kafka::topic_prefix("timestamp");
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
        "--router",
        "table.field.event.timestamp=created_at",
    ];
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    let received = kafka::consume_timed(
        &brokers,
        &format!("{prefix}.Order"),
        rows.len(),
        Duration::from_secs(30),
        Duration::from_millis(500),
    );
    assert_eq!(received.len(), rows.len());
    for (message, timestamp) in received {
        let id = message.header("id").unwrap();
        let expected = created[id];
        assert_eq!(timestamp, Some(expected), "event {id}");
    }
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_kafka_timestamps_come_from_the_named_column() {
    timestamps_from_a_column(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_kafka_timestamps_come_from_the_named_column() {
    timestamps_from_a_column(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_kafka_timestamps_come_from_the_named_column() {
    timestamps_from_a_column(Backend::Sqlite).await;
}

/// On NATS JetStream (and RabbitMQ alike) the header and envelope
/// placements apply as on Kafka; routing names the subject's template
/// there, so only placements are given.
#[tokio::test(flavor = "multi_thread")]
async fn nats_messages_carry_the_additional_fields() {
    use outbox_tests::nats::{Scope, Witness, nats_url};
    let witness = Witness::connect().await;
    let scope = Scope::new("additional");
    let t = TestDb::new(Backend::Postgres).await;
    let rows = write(&t).await;
    let args = scope.drain_args(
        &nats_url(),
        &[
            "--router",
            "table.fields.additional.placement=tenant:header:tenantId,part:envelope:partNo",
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_to_end(relay(), &args, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
    let stored = witness
        .read(&scope.stream, 6, Duration::from_secs(30))
        .await;
    assert_eq!(stored.len(), rows.len());
    for row in &rows {
        let message = stored
            .iter()
            .find(|message| message.header("id") == Some(row.id.as_str()))
            .unwrap_or_else(|| panic!("event {} not stored", row.id));
        assert_eq!(message.header("tenantId"), row.tenant);
        let value: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(
            value,
            json!({ "payload": { "amount": row.amount }, "partNo": row.part })
        );
    }
    witness.delete_stream(&scope.stream).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_column_is_refused_at_start_unless_allowed() {
    let t = TestDb::new(Backend::Sqlite).await;
    t.db.execute_unprepared(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         VALUES ('0190a7e8-0000-7000-8000-000000000001', 'Order', 'o-1', 'OrderPlaced', '{}')",
    )
    .await
    .unwrap();
    let env = [("DATABASE_URL", t.url.as_str())];
    let (code, _, stderr) = run_to_end(
        relay(),
        &[
            "run",
            "--drain",
            "--router",
            "table.fields.additional.placement=tenant:header",
        ],
        &env,
    );
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.contains(" INFO ") && !line.contains(" WARN "))
        .collect();
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(errors.len(), 1, "one line: {stderr}");
    assert!(
        errors[0].starts_with("error: ")
            && errors[0].contains("the outbox table has no column `tenant`"),
        "{stderr}"
    );
    assert_eq!(t.pending().await, 1, "nothing published");
    let (code, stdout, stderr) = run_to_end(
        relay(),
        &[
            "run",
            "--drain",
            "--router",
            "table.fields.additional.placement=tenant:header:tenantId,tenant:envelope",
            "--router",
            "table.fields.additional.error.on.missing=false",
        ],
        &env,
    );
    assert_eq!(code, 0, "{stderr}");
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(line["headers"].get("tenantId").is_none(), "{line}");
    assert_eq!(line["payload"], json!({ "payload": {}, "tenant": null }));
    for (option, start) in [
        (
            "table.fields.additional.placement=tenant:head",
            "error: --router: table.fields.additional.placement: placement \"head\" of \"tenant\" is not header, envelope or partition",
        ),
        (
            "table.fields.additional.placement=ten-ant:header",
            "error: --router: table.fields.additional.placement: \"ten-ant\" is not a column name",
        ),
        (
            "table.fields.additional.placement=a:partition,b:partition",
            "error: --router: table.fields.additional.placement: one column sets the partition, not two",
        ),
    ] {
        assert_refused(
            relay(),
            &["run", "--drain", "--router", option],
            &env,
            2,
            start,
            "no secret here",
        );
    }
    assert_refused(
        relay(),
        &[
            "run",
            "--drain",
            "--sink",
            "rabbitmq",
            "--router",
            "table.fields.additional.placement=part:partition",
        ],
        &env,
        2,
        "error: --router: a partition placement names a Kafka partition; the rabbitmq sink has none",
        "no secret here",
    );
    t.drop().await;
}
