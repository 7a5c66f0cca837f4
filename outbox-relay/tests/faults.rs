//! The relay under faults: a broker outage after commit, SIGKILL in the
//! middle of a stream, and database connections dropped under it. Every
//! committed event must arrive (duplicates allowed), in per-aggregate order.

use std::path::Path;
use std::time::{Duration, Instant};

use outbox_tests::kafka::{self, PrivateBroker};
use outbox_tests::process::RelayProcess;
use outbox_tests::stream::{append_events, check_stream, seed};
use outbox_tests::{Backend, TestDb};
use sea_orm::ConnectionTrait;

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay(args: &[&str], database_url: &str, brokers: &str) -> RelayProcess {
    RelayProcess::spawn(
        Path::new(RELAY),
        args,
        &[("DATABASE_URL", database_url), ("KAFKA_BROKERS", brokers)],
    )
}

async fn wait_until_started(relay: &RelayProcess) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !relay
        .stderr()
        .iter()
        .any(|line| line.contains("relay started"))
    {
        assert!(
            Instant::now() < deadline,
            "relay did not start:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The broker goes away after the relay published to it, events commit
/// while it is down, and it comes back empty (in-memory storage, so the
/// topic is gone too): the relay keeps running, recreates the topic and
/// publishes everything committed during the outage.
#[tokio::test(flavor = "multi_thread")]
async fn events_committed_during_a_broker_outage_arrive_after_it() {
    outage_in("debezium").await;
}

/// The same with messages as structured CloudEvents.
#[tokio::test(flavor = "multi_thread")]
async fn structured_cloudevents_committed_during_a_broker_outage_arrive_after_it() {
    outage_in("cloudevents-structured").await;
}

async fn outage_in(format: &str) {
    let mut broker = PrivateBroker::start();
    let topics = kafka::topic_prefix("outage");
    let t = TestDb::new(Backend::Postgres).await;
    let template = format!("{topics}.{{aggregatetype}}");
    let mut relay = relay(
        &[
            "run",
            "--poll-interval",
            "200ms",
            "--send-timeout",
            "3s",
            "--topic-template",
            &template,
            "--format",
            format,
        ],
        &t.url,
        &broker.address,
    );
    wait_until_started(&relay).await;
    append_events(&t.db, "before", 2).await;
    let topic = format!("{topics}.Invoice");
    let before = kafka::consume(
        &broker.address,
        &topic,
        2,
        Duration::from_secs(20),
        Duration::ZERO,
    );
    assert_eq!(before.len(), 2, "published before the outage");

    broker.stop();
    let ids = seed(&t.db, 10, 20, 5).await;
    // Let the relay fail against the missing broker for a while.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        t.count("outbox WHERE published_at IS NULL").await,
        200,
        "nothing is marked while the broker is down"
    );

    assert!(
        relay.is_running(),
        "the relay kept running through the outage"
    );
    broker.restart();

    let messages = kafka::consume(
        &broker.address,
        &topic,
        ids.len(),
        Duration::from_secs(90),
        Duration::from_millis(500),
    );
    check_stream(&messages, &ids);
    assert!(relay.is_running());
    t.drop().await;
}

/// SIGKILL three times in the middle of a stream, each time restarting the
/// relay: nothing is lost and no aggregate's events overtake each other.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_stream_loses_nothing() {
    sigkill_mid_stream_loses_nothing_in("debezium").await;
}

/// The same with messages as binary CloudEvents.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_stream_loses_no_cloudevent() {
    sigkill_mid_stream_loses_nothing_in("cloudevents").await;
}

async fn sigkill_mid_stream_loses_nothing_in(format: &str) {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("sigkill");
    let t = TestDb::new(Backend::Postgres).await;
    let ids = seed(&t.db, 40, 50, 10).await;
    let total = ids.len() as i64;
    let template = format!("{topics}.{{aggregatetype}}");
    let args = [
        "run",
        "--batch-size",
        "25",
        "--topic-template",
        &template,
        "--format",
        format,
    ];

    let mut kills = 0;
    let mut published_at_kill = Vec::new();
    while kills < 3 {
        let mut running = relay(&args, &t.url, &brokers);
        let before = t.count("outbox WHERE published_at IS NOT NULL").await;
        // Kill once this run has made progress, but before it is done.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let published = t.count("outbox WHERE published_at IS NOT NULL").await;
            if published > before || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        running.kill9();
        kills += 1;
        published_at_kill.push(t.count("outbox WHERE published_at IS NOT NULL").await);
    }
    assert!(
        published_at_kill
            .iter()
            .any(|&published| published > 0 && published < total),
        "at least one kill hit the middle of the stream: {published_at_kill:?}"
    );

    let mut last = relay(
        &[
            "run",
            "--drain",
            "--topic-template",
            &template,
            "--format",
            format,
        ],
        &t.url,
        &brokers,
    );
    assert_eq!(
        last.wait(Duration::from_secs(60)),
        Some(0),
        "{}",
        last.stderr().join("\n")
    );
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 0);

    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        ids.len(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    let report = check_stream(&messages, &ids);
    eprintln!(
        "{} events, {} messages, {} duplicates after {kills} kills at {published_at_kill:?}",
        ids.len(),
        messages.len(),
        report.duplicates
    );
    t.drop().await;
}

/// The relay's database connections are terminated under it (as by a
/// server restart): it reconnects, resumes LISTEN and keeps publishing.
#[tokio::test(flavor = "multi_thread")]
async fn the_relay_survives_losing_its_database_connections() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("dbloss");
    let t = TestDb::new(Backend::Postgres).await;
    let application = format!("relay-{}", uuid::Uuid::now_v7().simple());
    let url = format!("{}&application_name={application}", t.url);
    let template = format!("{topics}.{{aggregatetype}}");
    let relay = relay(
        &[
            "run",
            "--poll-interval",
            "300ms",
            "--topic-template",
            &template,
        ],
        &url,
        &brokers,
    );
    wait_until_started(&relay).await;
    let mut ids: Vec<String> = append_events(&t.db, "before", 3)
        .await
        .iter()
        .map(|e| e.id.to_string())
        .collect();
    let topic = format!("{topics}.Invoice");
    assert_eq!(
        kafka::consume(&brokers, &topic, 3, Duration::from_secs(20), Duration::ZERO).len(),
        3
    );

    for _ in 0..2 {
        let terminated =
            t.db.query_one_raw(sea_orm::Statement::from_string(
                t.db_backend(),
                format!(
                    "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = '{application}'"
                ),
            ))
            .await
            .unwrap()
            .unwrap()
            .try_get_by_index::<i64>(0)
            .unwrap();
        assert!(
            terminated > 0,
            "the relay's connections were found and terminated"
        );
        ids.extend(
            append_events(&t.db, "after", 2)
                .await
                .iter()
                .map(|e| e.id.to_string()),
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let messages = kafka::consume(
        &brokers,
        &topic,
        ids.len(),
        Duration::from_secs(60),
        Duration::from_millis(300),
    );
    check_stream(&messages, &ids);
    t.db.execute_unprepared("SELECT 1").await.unwrap();
    t.drop().await;
}
