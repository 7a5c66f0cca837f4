//! `order-consumer --broker rabbitmq` and `--broker nats` end to end on
//! PostgreSQL and the real brokers: the relay publishes the orders' events,
//! the consumer decodes each from its headers and body and applies it once
//! through the inbox, and a second delivery of every event is reported as
//! a duplicate and changes nothing.

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use order_consumer::summary;
use outbox_relay::message::TopicTemplate;
use outbox_relay::sink::Sink;
use outbox_relay::sink::nats::subject::SubjectTemplate;
use outbox_relay::sink::nats::{NatsOptions, NatsSink};
use outbox_relay::sink::rabbitmq::{RabbitMqOptions, RabbitMqSink};
use outbox_tests::nats::{Scope, Witness, nats_url};
use outbox_tests::rabbitmq::{amqp_url, unique};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, EntityTrait, QueryOrder};
use support::{
    EVENTS_PER_ORDER, drain_to, expected_summary, place_order, spawn_consumer_with, stop,
    wait_for_effects_on, wait_for_lines,
};

const WAIT: Duration = Duration::from_secs(60);
const ORDERS: i64 = 3;
const DUPLICATE: &str = "a duplicate of an applied event";
/// The order events' topic (RabbitMQ routing key) with the default template.
const TOPIC: &str = "outbox.event.Order";

/// A producer database with `ORDERS` orders placed, and a consumer
/// database with the summary table.
async fn databases() -> (TestDb, TestDb) {
    let producer = TestDb::new(Backend::Postgres).await;
    let consumer = TestDb::new(Backend::Postgres).await;
    summary::create_table(&consumer.db)
        .await
        .expect("order_summary table");
    for order_id in 1..=ORDERS {
        place_order(&producer.db, order_id).await;
    }
    (producer, consumer)
}

/// The relay's RabbitMQ sink publishing to `exchange`.
async fn rabbitmq_sink(url: &str, exchange: &str) -> Arc<dyn Sink> {
    Arc::new(
        RabbitMqSink::connect(RabbitMqOptions {
            url: url.to_owned(),
            exchange: exchange.to_owned(),
            ..RabbitMqOptions::default()
        })
        .await
        .expect("rabbitmq sink"),
    )
}

/// Each order's high-water mark in the inbox is its last event: the
/// aggregate was named by the `aggregateId` header, as there is no key.
async fn assert_high_water_marks(consumer: &TestDb, topic: &str) {
    let marks = consumer
        .count(&format!(
            "outbox_inbox_sequence WHERE topic = '{topic}' AND last_seq = {EVENTS_PER_ORDER}"
        ))
        .await;
    assert_eq!(marks, ORDERS, "one mark per order, at its last event");
}

async fn assert_summaries(consumer: &TestDb) {
    let rows = summary::Entity::find()
        .order_by_asc(summary::Column::OrderId)
        .all(&consumer.db)
        .await
        .expect("order_summary rows");
    let expected: Vec<_> = (1..=ORDERS).map(expected_summary).collect();
    assert_eq!(rows, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_deliveries_are_decoded_from_their_headers_and_applied_once() {
    let (producer, consumer_db) = databases().await;
    let url = amqp_url();
    let exchange = unique("consumer");
    let queue = unique("consumer-q");
    let group = unique("summary");
    let mut consumer = spawn_consumer_with(&[
        "--database-url",
        &consumer_db.url,
        "--broker",
        "rabbitmq",
        "--amqp-url",
        &url,
        "--amqp-exchange",
        &exchange,
        "--amqp-queue",
        &queue,
        "--group",
        &group,
    ]);
    // The queue must be bound before the relay publishes: an unroutable
    // message would come back to the relay.
    wait_for_lines(&mut consumer, "consuming from RabbitMQ", 1).await;
    let events = ORDERS * EVENTS_PER_ORDER;
    drain_to(
        &producer,
        rabbitmq_sink(&url, &exchange).await,
        TopicTemplate::default(),
    )
    .await;
    let applied = wait_for_effects_on(&consumer_db, events, WAIT, &mut [&mut consumer]).await;
    assert_eq!(applied, events, "each event's effect once");

    // As after a relay crash between the broker's ack and the mark: every
    // row is published again, and RabbitMQ delivers each event a second time.
    producer
        .db
        .execute_unprepared("UPDATE outbox SET published_at = NULL")
        .await
        .unwrap();
    drain_to(
        &producer,
        rabbitmq_sink(&url, &exchange).await,
        TopicTemplate::default(),
    )
    .await;
    wait_for_lines(&mut consumer, DUPLICATE, events as usize).await;
    assert_summaries(&consumer_db).await;
    assert_high_water_marks(&consumer_db, TOPIC).await;
    let stats = stop(&mut consumer);
    assert!(
        stats.contains(&format!(
            "{events} applied (0 after a gap), {events} duplicates and 0 stale skipped"
        )),
        "{stats}"
    );
    producer.drop().await;
    consumer_db.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn jetstream_messages_are_decoded_from_their_headers_and_applied_once() {
    let (producer, consumer_db) = databases().await;
    let url = nats_url();
    let scope = Scope::new("consumer");
    let sink = Arc::new(
        NatsSink::connect(NatsOptions {
            url: url.clone(),
            stream: scope.stream.clone(),
            subject_template: SubjectTemplate::parse(&scope.template()).expect("template"),
            ..NatsOptions::default()
        })
        .await
        .expect("nats sink"),
    );
    drain_to(&producer, sink, TopicTemplate::default()).await;
    let events = ORDERS * EVENTS_PER_ORDER;

    let topic = format!("{}.event.Order", scope.prefix);
    let group = format!("summary-{}", scope.prefix);
    let mut consumer = spawn_consumer_with(&[
        "--database-url",
        &consumer_db.url,
        "--broker",
        "nats",
        "--nats-url",
        &url,
        "--nats-stream",
        &scope.stream,
        "--topic",
        &topic,
        "--group",
        &group,
    ]);
    let applied = wait_for_effects_on(&consumer_db, events, WAIT, &mut [&mut consumer]).await;
    assert_eq!(applied, events, "each event's effect once");

    // The stream drops a re-send of an event id (Nats-Msg-Id) within its
    // duplicate window; past the window, or from another publisher, the
    // same event is stored again. Copies without Nats-Msg-Id stand for that.
    let witness = Witness::connect_to(&url).await;
    let stored = witness
        .read(&scope.stream, events as u64, Duration::from_secs(10))
        .await;
    assert_eq!(stored.len(), events as usize);
    for message in &stored {
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            if name != "Nats-Msg-Id" {
                headers.insert(name.as_str(), value.as_str());
            }
        }
        witness
            .jetstream()
            .publish_with_headers(
                message.subject.clone(),
                headers,
                message.payload.clone().into(),
            )
            .await
            .expect("publish a copy")
            .await
            .expect("the copy's PubAck");
    }
    wait_for_lines(&mut consumer, DUPLICATE, events as usize).await;
    assert_summaries(&consumer_db).await;
    assert_high_water_marks(&consumer_db, &topic).await;
    let stats = stop(&mut consumer);
    assert!(
        stats.contains(&format!(
            "{events} applied (0 after a gap), {events} duplicates and 0 stale skipped"
        )),
        "{stats}"
    );
    witness.delete_stream(&scope.stream).await;
    producer.drop().await;
    consumer_db.drop().await;
}
