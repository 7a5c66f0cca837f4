//! End to end on PostgreSQL and the broker: the relay publishes, Kafka
//! delivers at least once (duplicates, a relay crash between the broker's
//! acknowledgement and the mark, out-of-order events, a rebalance while
//! consuming), and `order-consumer` applies every event's effect once.

mod support;

use std::time::Duration;

use order_service::events::{OrderLineAdded, OrderPlaced};
use outbox_relay::shutdown::Shutdown;
use outbox_relay::source::{self, SourceOptions};
use outbox_tests::kafka;
use outbox_tests::stream::check_stream;
use outbox_tests::{Backend, TestDb};
use support::{
    EVENTS_PER_ORDER, Pipeline, RawMessage, expected_summary, place_order, produce, stop,
    wait_for_effects_on, wait_for_log,
};

const WAIT: Duration = Duration::from_secs(60);

/// Every message of the topic published a second time, byte for byte:
/// each event's effect is applied once and the copies are reported as
/// duplicates.
#[tokio::test(flavor = "multi_thread")]
async fn the_same_event_delivered_twice_is_applied_once() {
    let p = Pipeline::new("twice", 1).await;
    for order_id in [1, 2] {
        place_order(&p.producer.db, order_id).await;
    }
    p.drain().await;
    let events = 2 * EVENTS_PER_ORDER;
    let published = kafka::consume(
        &p.brokers,
        &p.topic(),
        events as usize,
        Duration::from_secs(20),
        Duration::from_millis(300),
    );
    assert_eq!(published.len(), events as usize);
    let copies: Vec<RawMessage> = published
        .iter()
        .map(|message| RawMessage {
            key: message.key.clone().expect("a key"),
            headers: message
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            payload: message.payload.clone().expect("a payload"),
        })
        .collect();
    produce(&p.brokers, &p.topic(), &copies).await;

    let mut consumer = p.spawn_consumer("summary", &[]);
    let applied = p.wait_for_effects(events, WAIT, &mut [&mut consumer]).await;
    assert_eq!(applied, events, "each event's effect once");
    assert_eq!(
        p.summary().await,
        [expected_summary(1), expected_summary(2)]
    );
    let stats = stop(&mut consumer);
    assert!(
        stats.contains(&format!(
            "{events} applied (0 after a gap), {events} duplicates"
        )),
        "{stats}"
    );
    p.drop().await;
}

/// The relay publishes a batch and dies before marking it: the rows stay
/// pending, the next relay publishes them again, and the consumer applies
/// each event once.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_crash_between_ack_and_mark_is_applied_once() {
    let p = Pipeline::new("ackmark", 2).await;
    for order_id in 1..=10 {
        place_order(&p.producer.db, order_id).await;
    }
    let events = 10 * EVENTS_PER_ORDER;

    // Claim and publish one batch, then "crash": the claim is dropped
    // unsettled, so its transaction rolls back and nothing is marked.
    let source = source::connect(&p.producer.url, SourceOptions::default())
        .await
        .unwrap();
    let claim = source.claim(20, &[]).await.unwrap();
    let template = p.template();
    let messages: Vec<_> = claim
        .records()
        .iter()
        .map(|record| template.message(record))
        .collect();
    let sink = p.sink().await;
    assert!(
        sink.publish(&messages).await.iter().all(Result::is_ok),
        "the broker acknowledged the batch"
    );
    drop(claim);
    assert_eq!(
        p.producer.count("outbox WHERE published_at IS NULL").await,
        events
    );
    p.drain().await;

    let on_topic = kafka::consume(
        &p.brokers,
        &p.topic(),
        events as usize + 20,
        Duration::from_secs(20),
        Duration::from_millis(300),
    );
    let ids: Vec<String> = p
        .producer
        .outbox_rows()
        .await
        .into_iter()
        .map(|row| row.id)
        .collect();
    assert_eq!(
        check_stream(&on_topic, &ids).duplicates,
        20,
        "the batch arrives twice"
    );

    let mut consumer = p.spawn_consumer("summary", &[]);
    let applied = p.wait_for_effects(events, WAIT, &mut [&mut consumer]).await;
    assert_eq!(applied, events);
    let expected: Vec<_> = (1..=10).map(expected_summary).collect();
    assert_eq!(p.summary().await, expected);
    let stats = stop(&mut consumer);
    assert!(
        stats.contains(&format!("{events} applied (0 after a gap), 20 duplicates")),
        "{stats}"
    );
    p.drop().await;
}

fn order_message(order_id: i64, sequence: i64, event: OrderEventJson) -> RawMessage {
    let (event_type, payload) = match event {
        OrderEventJson::Placed => (
            "OrderPlaced",
            serde_json::to_vec(&OrderPlaced {
                order_id,
                customer: format!("customer-{order_id}"),
            }),
        ),
        OrderEventJson::Line(sku) => (
            "OrderLineAdded",
            serde_json::to_vec(&OrderLineAdded {
                order_id,
                sku: sku.into(),
                quantity: 1,
                unit_price_cents: 100,
            }),
        ),
    };
    RawMessage {
        key: order_id.to_string(),
        headers: vec![
            ("id".into(), uuid::Uuid::now_v7().to_string()),
            ("eventType".into(), event_type.into()),
            ("eventVersion".into(), "1".into()),
            ("aggregateSequence".into(), sequence.to_string()),
        ],
        payload: payload.unwrap(),
    }
}

enum OrderEventJson {
    Placed,
    Line(&'static str),
}

/// Sequence 1, 3, 2 of one order. With `--on-gap apply` (the default), 3
/// is applied with a warning about the gap and 2, older than 3, is skipped
/// as stale. With `--on-gap stop`, the consumer stops at 3 without
/// committing its offset: a restart stops at the same message, and only 1
/// is applied.
#[tokio::test(flavor = "multi_thread")]
async fn events_of_one_order_out_of_order_skip_the_older_or_stop_at_the_gap() {
    let p = Pipeline::new("order", 1).await;
    let messages = [
        order_message(5, 1, OrderEventJson::Placed),
        order_message(5, 3, OrderEventJson::Line("late")),
        order_message(5, 2, OrderEventJson::Line("early")),
    ];
    produce(&p.brokers, &p.topic(), &messages).await;

    let mut applying = p.spawn_consumer("apply", &["--on-gap", "apply"]);
    let applied = p.wait_for_effects(2, WAIT, &mut [&mut applying]).await;
    assert_eq!(applied, 2, "placed and sequence 3; sequence 2 skipped");
    let summary = p.summary().await;
    assert_eq!((summary[0].lines, summary[0].total_cents), (1, 100));
    wait_for_log(
        &mut applying,
        "skipped OrderLineAdded",
        Duration::from_secs(10),
    )
    .await;
    let log = applying.stderr().join("\n");
    assert!(log.contains("after a gap: sequence 2 is missing"), "{log}");
    assert!(
        log.contains("older than the last applied event of its order"),
        "{log}"
    );
    let stats = stop(&mut applying);
    assert!(
        stats.contains("2 applied (1 after a gap), 0 duplicates and 1 stale"),
        "{stats}"
    );

    // Another consumer (its own group and database) that stops at gaps.
    let strict_db = TestDb::new(Backend::Postgres).await;
    order_consumer::summary::create_table(&strict_db.db)
        .await
        .unwrap();
    for run in 1..=2 {
        let mut strict = p.spawn_consumer_on(&strict_db, "strict", &["--on-gap", "stop"]);
        let code = strict.wait(WAIT);
        let stderr = strict.stderr();
        assert_eq!(code, Some(1), "run {run}: {stderr:?}");
        let error = stderr.last().unwrap();
        assert!(
            error.starts_with("error: sequence 2 is missing before OrderLineAdded ")
                && error.contains(&format!("of order 5 at {}/0@1; stopping", p.topic())),
            "run {run}: {error}"
        );
        assert_eq!(support::effects_on(&strict_db).await, 1, "run {run}");
    }
    strict_db.drop().await;
    p.drop().await;
}

/// Two `order-consumer` processes in one group while the relay publishes:
/// the second joins mid-stream (a rebalance), then leaves mid-stream
/// (another). Offsets are committed only at shutdown
/// (`enable.auto.commit=false`), so at each rebalance the new owner of a
/// partition receives again what the previous owner applied. Every event's
/// effect is applied exactly once, and the redeliveries are reported as
/// duplicates.
///
/// (The second consumer leaves with SIGTERM, not SIGKILL: tansu 0.6 keeps
/// assigning partitions to a member that died without leaving.)
#[tokio::test(flavor = "multi_thread")]
async fn two_consumers_in_one_group_with_a_rebalance_apply_every_event_once() {
    const ORDERS: i64 = 80;
    let p = Pipeline::new("rebalance", 4).await;
    let events = ORDERS * EVENTS_PER_ORDER;

    let (stop_relay, shutdown) = Shutdown::manual();
    let relay = p.relay(false).await;
    let relaying = tokio::spawn(async move { relay.run(shutdown).await });
    let producer = p.producer.db.clone();
    let producing = tokio::spawn(async move {
        for order_id in 1..=ORDERS {
            place_order(&producer, order_id).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });

    let options = ["-X", "enable.auto.commit=false"];
    let topic = p.topic();
    let assigned = format!("partitions assigned partitions={topic}");
    let mut first = p.spawn_consumer("summary", &options);
    wait_for_log(&mut first, &assigned, WAIT).await;
    wait_for_effects_on(&p.consumer_db, 40, WAIT, &mut [&mut first]).await;

    let mut second = p.spawn_consumer("summary", &options);
    wait_for_log(&mut second, &assigned, WAIT).await;
    let joined_at = p.effects().await;
    wait_for_effects_on(
        &p.consumer_db,
        joined_at + 40,
        WAIT,
        &mut [&mut first, &mut second],
    )
    .await;
    let second_stats = stop(&mut second);
    // Shown only when the test fails.
    eprintln!("second consumer:\n{}", second.stderr().join("\n"));
    let left_at = p.effects().await;
    assert!(
        left_at < events - 20,
        "the second consumer leaves mid-stream ({left_at} of {events} applied)"
    );

    producing.await.unwrap();
    let applied = p
        .wait_for_effects(events, Duration::from_secs(120), &mut [&mut first])
        .await;
    stop_relay.trigger();
    relaying.await.unwrap().expect("relay run");

    assert_eq!(applied, events, "every event's effect exactly once");
    let expected: Vec<_> = (1..=ORDERS).map(expected_summary).collect();
    assert_eq!(p.summary().await, expected);
    let first_stats = stop(&mut first);
    let [first_applied, first_duplicates] = counts(&first_stats);
    let [second_applied, _] = counts(&second_stats);
    assert_eq!(first_applied + second_applied, events as u64);
    assert!(
        first_duplicates > 0,
        "the first consumer received its own partitions again: {first_stats}"
    );
    eprintln!("first: {first_stats}\nsecond: {second_stats}");
    p.drop().await;
}

/// Applied and duplicate counts of a statistics line.
fn counts(stats: &str) -> [u64; 2] {
    let number = |marker: &str| -> u64 {
        let before = &stats[..stats
            .find(marker)
            .unwrap_or_else(|| panic!("no {marker:?} in {stats:?}"))];
        before
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count before {marker:?} in {stats:?}"))
    };
    [number(" applied ("), number(" duplicates ")]
}
