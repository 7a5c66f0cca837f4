//! A poison message (one the broker refuses for good) neither blocks other
//! aggregates nor vanishes: it is retried with backoff, dead-lettered with
//! its error, listed by `status` and re-driven by `retry` once fixed.

use std::path::Path;
use std::time::{Duration, Instant};

use outbox_core::OutboxEvent;
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::kafka;
use outbox_tests::process::{RelayProcess, run_to_end};
use outbox_tests::stream::{check_stream, seed};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, TransactionTrait};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// Appends three events to `poison`: the first too large for the producer
/// (over librdkafka's 1 MB `message.max.bytes`), two ordinary ones after it.
async fn append_poison(t: &TestDb) -> Vec<String> {
    let txn = t.db.begin().await.unwrap();
    let huge = InvoiceIssuedV2 {
        amount_cents: 0,
        note: Some("x".repeat(1_200_000)),
    };
    let small = |n| InvoiceIssuedV2 {
        amount_cents: n,
        note: None,
    };
    let events = [
        OutboxEvent::new(huge).aggregate_id("poison"),
        OutboxEvent::new(small(1)).aggregate_id("poison"),
        OutboxEvent::new(small(2)).aggregate_id("poison"),
    ];
    let appended = outbox_core::append(&txn, events).await.unwrap();
    txn.commit().await.unwrap();
    appended.iter().map(|event| event.id.to_string()).collect()
}

async fn wait_for(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_message_is_dead_lettered_without_blocking_others_and_redriven() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("poison");
    let topic = format!("{topics}.Invoice");
    let t = TestDb::new(Backend::Postgres).await;
    let poison = append_poison(&t).await;
    let others = seed(&t.db, 10, 30, 10).await;

    let template = format!("{topics}.{{aggregatetype}}");
    let relay = RelayProcess::spawn(
        Path::new(RELAY),
        &[
            "run",
            "--max-attempts",
            "3",
            "--batch-size",
            "50",
            "--poll-interval",
            "100ms",
            "--topic-template",
            &template,
        ],
        &[("DATABASE_URL", &t.url), ("KAFKA_BROKERS", &brokers)],
    );

    // Everyone else gets through while the poison message is retried. The
    // poison aggregate's two later events may come first, once it is
    // parked: read until they are there too.
    let messages = kafka::consume(
        &brokers,
        &topic,
        others.len() + 2,
        Duration::from_secs(60),
        Duration::ZERO,
    );
    check_stream(
        &messages
            .iter()
            .filter(|m| m.key.as_deref() != Some("poison"))
            .cloned()
            .collect::<Vec<_>>(),
        &others,
    );

    wait_for(
        "the poison message to be dead-lettered",
        Duration::from_secs(60),
        async || t.count("outbox WHERE dead_lettered_at IS NOT NULL").await == 1,
    )
    .await;
    let dead = format!(
        "outbox WHERE dead_lettered_at IS NOT NULL AND id = '{}' AND attempts = 3",
        poison[0]
    );
    assert_eq!(
        t.count(&dead).await,
        1,
        "dead-lettered after exactly 3 attempts"
    );

    // The aggregate's later events follow once it is parked; the gap shows
    // in their sequence numbers (2 and 3, no 1).
    let all = kafka::consume(
        &brokers,
        &topic,
        others.len() + 2,
        Duration::from_secs(30),
        Duration::ZERO,
    );
    let poison_sequences: Vec<&str> = all
        .iter()
        .filter(|m| m.key.as_deref() == Some("poison"))
        .filter_map(|m| m.header("aggregateSequence"))
        .collect();
    assert_eq!(poison_sequences, ["2", "3"]);

    // status lists it with its error.
    let env = [("DATABASE_URL", t.url.as_str())];
    let (code, stdout, stderr) = run_to_end(Path::new(RELAY), &["status"], &env);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("dead letters     1"), "{stdout}");
    assert!(
        stdout.contains(&poison[0]) && stdout.contains("MessageSizeTooLarge"),
        "{stdout}"
    );
    let (_, json, _) = run_to_end(Path::new(RELAY), &["status", "--json"], &env);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["dead_letter_rows"][0]["id"], poison[0].as_str());
    assert_eq!(json["dead_letter_rows"][0]["attempts"], 3);

    // Fixed, then re-driven: the running relay publishes it.
    t.db.execute_unprepared(&format!(
        "UPDATE outbox SET payload = '{{\"amountCents\": 0, \"note\": \"trimmed\"}}' WHERE id = '{}'",
        poison[0]
    ))
    .await
    .unwrap();
    let (code, _, stderr) = run_to_end(Path::new(RELAY), &["retry", "--id", &poison[0]], &env);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("1 dead-lettered events are pending again"),
        "{stderr}"
    );
    let all = kafka::consume(
        &brokers,
        &topic,
        others.len() + 3,
        Duration::from_secs(30),
        Duration::ZERO,
    );
    let redriven = all
        .iter()
        .find(|m| m.header("id") == Some(poison[0].as_str()))
        .expect("the re-driven event arrived");
    assert_eq!(redriven.json()["note"], "trimmed");
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 0);
    drop(relay);
    t.drop().await;
}

/// `retry` with no selection re-drives every dead letter; with an aggregate
/// type, only that type's.
#[tokio::test(flavor = "multi_thread")]
async fn retry_selects_dead_letters() {
    for backend in [Backend::MySql, Backend::Sqlite] {
        let t = TestDb::new(backend).await;
        outbox_tests::stream::append_events(&t.db, "a", 3).await;
        t.db.execute_unprepared(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('c-1', 'Customer', 'c', 'CustomerRegistered', '{}')",
        )
        .await
        .unwrap();
        let dead = match backend {
            Backend::MySql => {
                "UPDATE outbox SET dead_lettered_at = UTC_TIMESTAMP(6), attempts = 10, last_error = 'refused'"
            }
            _ => {
                "UPDATE outbox SET dead_lettered_at = '2026-01-01T00:00:00.000Z', attempts = 10, last_error = 'refused'"
            }
        };
        t.db.execute_unprepared(dead).await.unwrap();
        let env = [("DATABASE_URL", t.url.as_str())];
        let (code, _, stderr) = run_to_end(
            Path::new(RELAY),
            &["retry", "--aggregate-type", "Customer"],
            &env,
        );
        assert_eq!(code, 0, "{stderr}");
        assert!(stderr.contains("1 dead-lettered"), "{stderr}");
        assert_eq!(
            t.count("outbox WHERE dead_lettered_at IS NULL AND attempts = 0")
                .await,
            1
        );
        let (code, _, stderr) = run_to_end(Path::new(RELAY), &["retry"], &env);
        assert_eq!(code, 0, "{stderr}");
        assert!(stderr.contains("3 dead-lettered"), "{stderr}");
        assert_eq!(
            t.count("outbox WHERE dead_lettered_at IS NOT NULL").await,
            0
        );
        t.drop().await;
    }
}
