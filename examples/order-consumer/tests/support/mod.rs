//! A producer database, the relay (as a library), a topic of the test's own
//! on the shared broker, a consumer database, and `order-consumer`
//! processes between them.

#![allow(dead_code)] // each test file uses its own part

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use order_consumer::summary;
use order_service::events::{OrderLineAdded, OrderPaid, OrderPlaced};
use outbox_core::OutboxEvent;
use outbox_relay::message::TopicTemplate;
use outbox_relay::relay::{Relay, RelayOptions};
use outbox_relay::shutdown::Shutdown;
use outbox_relay::sink::Sink;
use outbox_relay::sink::kafka::{KafkaOptions, KafkaSink};
use outbox_relay::source::{self, SourceOptions};
use outbox_tests::kafka;
use outbox_tests::process::RelayProcess;
use outbox_tests::{Backend, TestDb};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sea_orm::{DatabaseConnection, EntityTrait, QueryOrder, TransactionTrait};

/// Lines of every order the tests place: (sku, quantity, unit price).
pub const LINES: [(&str, i32, i64); 2] = [("book", 1, 2500), ("pen", 3, 150)];
/// What every order is paid.
pub const PAID_CENTS: i64 = 2950;
/// Events per order: placed, its lines, paid.
pub const EVENTS_PER_ORDER: i64 = 2 + LINES.len() as i64;

/// One test's pipeline.
pub struct Pipeline {
    /// Where the order service's events are appended (PostgreSQL).
    pub producer: TestDb,
    /// The consumer's database: `order_summary` and the inbox (PostgreSQL).
    pub consumer_db: TestDb,
    /// The shared broker.
    pub brokers: String,
    /// Topics are `<prefix>.<aggregatetype>`.
    pub prefix: String,
}

impl Pipeline {
    /// Fresh databases, and the order topic created with `partitions`.
    pub async fn new(test: &str, partitions: i32) -> Self {
        let brokers = kafka::brokers();
        let prefix = kafka::topic_prefix(test);
        let producer = TestDb::new(Backend::Postgres).await;
        let consumer_db = TestDb::new(Backend::Postgres).await;
        summary::create_table(&consumer_db.db)
            .await
            .expect("order_summary table");
        let pipeline = Self {
            producer,
            consumer_db,
            brokers,
            prefix,
        };
        kafka::create_topic(&pipeline.brokers, &pipeline.topic(), partitions).await;
        pipeline
    }

    /// The order events' topic.
    pub fn topic(&self) -> String {
        format!("{}.Order", self.prefix)
    }

    /// The relay's topic template.
    pub fn template(&self) -> TopicTemplate {
        TopicTemplate::new(format!("{}.{{aggregatetype}}", self.prefix))
    }

    /// A Kafka sink on the shared broker.
    pub async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(
            KafkaSink::connect(KafkaOptions {
                brokers: self.brokers.clone(),
                send_timeout: Duration::from_secs(10),
                ..KafkaOptions::default()
            })
            .await
            .expect("kafka sink"),
        )
    }

    /// A relay on the producer database.
    pub async fn relay(&self, drain: bool) -> Relay {
        let source = source::connect(&self.producer.url, SourceOptions::default())
            .await
            .expect("relay source");
        Relay::new(
            Arc::from(source),
            self.sink().await,
            self.template(),
            RelayOptions {
                batch_size: 100,
                poll_interval: Duration::from_millis(50),
                drain,
                retention: None,
                ..RelayOptions::default()
            },
        )
    }

    /// Publishes every pending row and returns.
    pub async fn drain(&self) {
        let (_trigger, shutdown) = Shutdown::manual();
        self.relay(true)
            .await
            .run(shutdown)
            .await
            .expect("relay run");
    }

    /// Starts `order-consumer` in this test's group `group` on the consumer
    /// database.
    pub fn spawn_consumer(&self, group: &str, extra: &[&str]) -> RelayProcess {
        self.spawn_consumer_on(&self.consumer_db, group, extra)
    }

    /// Starts `order-consumer` in this test's group `group` on `db`. Group
    /// names carry the test's prefix: groups live on the shared broker.
    pub fn spawn_consumer_on(&self, db: &TestDb, group: &str, extra: &[&str]) -> RelayProcess {
        let topic = self.topic();
        let group = format!("{}.{group}", self.prefix);
        let mut args = vec![
            "--database-url",
            db.url.as_str(),
            "--brokers",
            self.brokers.as_str(),
            "--topic",
            topic.as_str(),
            "--group",
            group.as_str(),
        ];
        args.extend(extra);
        RelayProcess::spawn(
            Path::new(env!("CARGO_BIN_EXE_order-consumer")),
            &args,
            &[("RUST_LOG", "info,order_consumer=debug,sqlx=warn")],
        )
    }

    /// Effects applied so far: the sum of `events_applied`.
    pub async fn effects(&self) -> i64 {
        effects_on(&self.consumer_db).await
    }

    /// Waits until `expected` effects were applied, then `settle` longer,
    /// and returns the count then (more would be a double application).
    pub async fn wait_for_effects(
        &self,
        expected: i64,
        timeout: Duration,
        consumers: &mut [&mut RelayProcess],
    ) -> i64 {
        match poll_effects(&self.consumer_db, expected, timeout, consumers).await {
            Ok(applied) => applied,
            Err(failure) => panic!("{failure}\n{}", self.diagnosis().await),
        }
    }

    /// What the pipeline holds, for a failure message: the outbox rows not
    /// published, the orders whose effects are incomplete, and the topic.
    pub async fn diagnosis(&self) -> String {
        let pending = self
            .producer
            .count("outbox WHERE published_at IS NULL")
            .await;
        let incomplete: Vec<String> = self
            .summary()
            .await
            .into_iter()
            .filter(|order| i64::from(order.events_applied) != EVENTS_PER_ORDER)
            .map(|order| format!("{order:?}"))
            .collect();
        let messages = kafka::consume(
            &self.brokers,
            &self.topic(),
            usize::MAX,
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
        let on_topic: Vec<String> = messages
            .iter()
            .filter(|message| {
                incomplete
                    .iter()
                    .any(|order| order.contains(&format!("order_id: {},", key(message))))
            })
            .map(|message| {
                format!(
                    "{} seq {} {} (partition {})",
                    key(message),
                    message.header("aggregateSequence").unwrap_or("?"),
                    message.header("eventType").unwrap_or("?"),
                    message.partition
                )
            })
            .collect();
        format!(
            "outbox rows not published: {pending}\norders with missing effects: {incomplete:#?}\n\
             their messages on the topic ({} messages in all):\n{}",
            messages.len(),
            on_topic.join("\n")
        )
    }

    /// The summary rows, by order id.
    pub async fn summary(&self) -> Vec<summary::Model> {
        summary::Entity::find()
            .order_by_asc(summary::Column::OrderId)
            .all(&self.consumer_db.db)
            .await
            .expect("order_summary rows")
    }

    /// Drops both databases.
    pub async fn drop(self) {
        self.producer.drop().await;
        self.consumer_db.drop().await;
    }
}

fn key(message: &kafka::Consumed) -> &str {
    message.key.as_deref().unwrap_or("?")
}

/// Effects applied on `db` so far.
pub async fn effects_on(db: &TestDb) -> i64 {
    let row = sea_orm::ConnectionTrait::query_one_raw(
        &db.db,
        sea_orm::Statement::from_string(
            db.db_backend(),
            "SELECT CAST(COALESCE(SUM(events_applied), 0) AS BIGINT) FROM order_summary",
        ),
    )
    .await
    .expect("sum of effects")
    .expect("a row");
    row.try_get_by_index::<i64>(0).expect("a number")
}

/// See [`Pipeline::wait_for_effects`]; fails early if a consumer exits.
pub async fn wait_for_effects_on(
    db: &TestDb,
    expected: i64,
    timeout: Duration,
    consumers: &mut [&mut RelayProcess],
) -> i64 {
    poll_effects(db, expected, timeout, consumers)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"))
}

/// Waits until `expected` effects were applied, then 2 s longer, and
/// returns the count then; the failure, with the consumers' logs, when a
/// consumer exits or `timeout` passes first.
async fn poll_effects(
    db: &TestDb,
    expected: i64,
    timeout: Duration,
    consumers: &mut [&mut RelayProcess],
) -> Result<i64, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let applied = effects_on(db).await;
        if applied >= expected {
            break;
        }
        for consumer in consumers.iter_mut() {
            if !consumer.is_running() {
                return Err(format!(
                    "a consumer exited early:\n{}",
                    consumer.stderr().join("\n")
                ));
            }
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = consumers.iter().map(|c| c.stderr().join("\n")).collect();
            return Err(format!(
                "{applied} of {expected} effects after {timeout:?}; consumers:\n{}",
                logs.join("\n---\n")
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(effects_on(db).await)
}

/// Appends one order's events (placed, lines, paid), each in a transaction
/// of its own as separate requests would.
pub async fn place_order(producer: &DatabaseConnection, order_id: i64) {
    let aggregate = order_id.to_string();
    let mut events = vec![OutboxEvent::new(OrderPlaced {
        order_id,
        customer: format!("customer-{order_id}"),
    })];
    for (sku, quantity, unit_price_cents) in LINES {
        events.push(OutboxEvent::new(OrderLineAdded {
            order_id,
            sku: sku.into(),
            quantity,
            unit_price_cents,
        }));
    }
    events.push(OutboxEvent::new(OrderPaid {
        order_id,
        amount_cents: PAID_CENTS,
        payment_reference: None,
    }));
    for event in events {
        let txn = producer.begin().await.expect("begin");
        outbox_core::append(&txn, [event.aggregate_id(aggregate.clone())])
            .await
            .expect("append");
        txn.commit().await.expect("commit");
    }
}

/// The summary of an order whose events were each applied once.
pub fn expected_summary(order_id: i64) -> summary::Model {
    summary::Model {
        order_id,
        customer: Some(format!("customer-{order_id}")),
        lines: LINES.len() as i32,
        items: LINES.iter().map(|(_, q, _)| i64::from(*q)).sum(),
        total_cents: LINES.iter().map(|(_, q, p)| i64::from(*q) * p).sum(),
        paid_cents: PAID_CENTS,
        events_applied: EVENTS_PER_ORDER as i32,
    }
}

/// A message to produce by hand: key, headers, payload.
pub struct RawMessage {
    /// The key (aggregate id).
    pub key: String,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// The value.
    pub payload: Vec<u8>,
}

/// Produces `messages` to `topic` in order (partition by key), acks=all.
pub async fn produce(brokers: &str, topic: &str, messages: &[RawMessage]) {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for message in messages {
        let mut headers = OwnedHeaders::new();
        for (key, value) in &message.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_bytes()),
            });
        }
        producer
            .send(
                FutureRecord::to(topic)
                    .key(message.key.as_bytes())
                    .payload(&message.payload)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(error, _)| error)
            .expect("produce");
    }
}

/// Waits for a consumer's log to contain `text`.
pub async fn wait_for_log(consumer: &mut RelayProcess, text: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !consumer.stderr().iter().any(|line| line.contains(text)) {
        assert!(
            Instant::now() < deadline && consumer.is_running(),
            "no {text:?} in the consumer's log:\n{}",
            consumer.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The consumer's final statistics line, after SIGTERM and a clean exit.
pub fn stop(consumer: &mut RelayProcess) -> String {
    consumer.signal("TERM");
    let code = consumer.wait(Duration::from_secs(30));
    let stderr = consumer.stderr();
    assert_eq!(
        code,
        Some(0),
        "consumer exit; stderr:\n{}",
        stderr.join("\n")
    );
    stderr
        .iter()
        .find(|line| line.contains("stopped: "))
        .cloned()
        .unwrap_or_else(|| panic!("no statistics line:\n{}", stderr.join("\n")))
}

/// Publishes every pending row of `producer` through `sink` (topics from
/// `template`) and returns.
pub async fn drain_to(producer: &TestDb, sink: Arc<dyn Sink>, template: TopicTemplate) {
    let source = source::connect(&producer.url, SourceOptions::default())
        .await
        .expect("relay source");
    let relay = Relay::new(
        Arc::from(source),
        sink,
        template,
        RelayOptions {
            batch_size: 100,
            poll_interval: Duration::from_millis(50),
            drain: true,
            retention: None,
            ..RelayOptions::default()
        },
    );
    let (_trigger, shutdown) = Shutdown::manual();
    relay.run(shutdown).await.expect("relay run");
}

/// Starts `order-consumer` with `args` (the broker's and the database's).
pub fn spawn_consumer_with(args: &[&str]) -> RelayProcess {
    RelayProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_order-consumer")),
        args,
        &[("RUST_LOG", "info,order_consumer=debug,sqlx=warn")],
    )
}

/// Waits until the consumer's log has `count` lines containing `text`.
pub async fn wait_for_lines(consumer: &mut RelayProcess, text: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = consumer
            .stderr()
            .iter()
            .filter(|line| line.contains(text))
            .count();
        if seen >= count {
            return;
        }
        assert!(
            Instant::now() < deadline && consumer.is_running(),
            "{seen} of {count} {text:?} lines in the consumer's log:\n{}",
            consumer.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
