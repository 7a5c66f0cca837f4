//! What an operator sees: the metrics endpoint during a real run, readiness
//! following the broker, `status` as a check, and no password anywhere.

use std::path::Path;
use std::time::{Duration, Instant};

use outbox_core::OutboxEvent;
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::http::{get, sample};
use outbox_tests::kafka::{self, PrivateBroker, free_port};
use outbox_tests::process::{RelayProcess, run_to_end};
use outbox_tests::stream::{append_events, seed};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, TransactionTrait};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

async fn wait_for_metrics(addr: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((200, body)) = get(addr, "/metrics")
            && check(&body)
        {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for metrics: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_move_as_events_are_published_and_dead_lettered() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("metrics");
    let t = TestDb::new(Backend::Postgres).await;
    seed(&t.db, 5, 10, 10).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let template = format!("{topics}.{{aggregatetype}}");
    let _relay = RelayProcess::spawn(
        Path::new(RELAY),
        &[
            "run",
            "--metrics-addr",
            &addr,
            "--metrics-interval",
            "200ms",
            "--max-attempts",
            "2",
            "--topic-template",
            &template,
        ],
        &[("DATABASE_URL", &t.url), ("KAFKA_BROKERS", &brokers)],
    );

    let published = r#"outbox_published_total{aggregate_type="Invoice"}"#;
    let first = wait_for_metrics(&addr, "the seeded events published", |m| {
        sample(m, published) == Some(50.0) && sample(m, "outbox_pending_rows") == Some(0.0)
    })
    .await;
    assert_eq!(sample(&first, "outbox_owned_shards"), Some(16.0));
    assert_eq!(sample(&first, "outbox_database_up"), Some(1.0));
    assert_eq!(sample(&first, "outbox_broker_up"), Some(1.0));
    assert_eq!(
        sample(&first, "outbox_commit_to_ack_seconds_count"),
        Some(50.0)
    );
    assert!(sample(&first, "outbox_batch_size_count").unwrap() >= 1.0);
    assert!(first.contains("# TYPE outbox_commit_to_ack_seconds histogram"));

    // A poison message (over 1 MB) and more ordinary events.
    let txn = t.db.begin().await.unwrap();
    let huge = InvoiceIssuedV2 {
        amount_cents: 0,
        note: Some("x".repeat(1_200_000)),
    };
    outbox_core::append(&txn, [OutboxEvent::new(huge).aggregate_id("poison")])
        .await
        .unwrap();
    txn.commit().await.unwrap();
    append_events(&t.db, "later", 10).await;

    let later = wait_for_metrics(&addr, "the dead letter and the later events", |m| {
        sample(m, published) == Some(60.0) && sample(m, "outbox_dead_letters") == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(
            &later,
            r#"outbox_dead_lettered_total{aggregate_type="Invoice"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&later, r#"outbox_failed_total{aggregate_type="Invoice"}"#),
        Some(2.0),
        "two attempts, then dead-lettered"
    );
    assert_eq!(get(&addr, "/healthz").map(|(code, _)| code), Some(200));
    assert_eq!(get(&addr, "/readyz").map(|(code, _)| code), Some(200));
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_follows_the_broker() {
    let mut broker = PrivateBroker::start();
    let t = TestDb::new(Backend::Postgres).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let _relay = RelayProcess::spawn(
        Path::new(RELAY),
        &[
            "run",
            "--metrics-addr",
            &addr,
            "--metrics-interval",
            "200ms",
        ],
        &[("DATABASE_URL", &t.url), ("KAFKA_BROKERS", &broker.address)],
    );
    let readiness = |expected: u16, needle: &'static str| {
        let addr = addr.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some((code, body)) = get(&addr, "/readyz")
                    && code == expected
                    && body.contains(needle)
                {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "/readyz never answered {expected} with {needle:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    readiness(200, "broker up").await;
    broker.stop();
    readiness(503, "broker down").await;
    assert_eq!(
        get(&addr, "/healthz").map(|(code, _)| code),
        Some(200),
        "still alive"
    );
    broker.restart();
    readiness(200, "broker up").await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn status_reports_backlog_as_json_and_checks_the_lag() {
    for backend in [Backend::Postgres, Backend::MySql, Backend::Sqlite] {
        let t = TestDb::new(backend).await;
        append_events(&t.db, "old", 3).await;
        t.db.execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('{}', 'Customer', 'c', 'CustomerRegistered', '{{}}')",
            uuid::Uuid::now_v7()
        ))
        .await
        .unwrap();
        let backdate = match backend {
            Backend::Postgres => {
                "UPDATE outbox SET created_at = now() - interval '2 minutes' WHERE aggregateid = 'old'"
            }
            Backend::MySql => {
                "UPDATE outbox SET created_at = UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE WHERE aggregateid = 'old'"
            }
            Backend::Sqlite => {
                "UPDATE outbox SET created_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 minutes') WHERE aggregateid = 'old'"
            }
        };
        t.db.execute_unprepared(backdate).await.unwrap();
        let env = [("DATABASE_URL", t.url.as_str())];

        let (code, stdout, stderr) = run_to_end(Path::new(RELAY), &["status", "--json"], &env);
        assert_eq!(code, 0, "{backend:?}: {stderr}");
        let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(status["pending"], 4, "{backend:?}");
        assert_eq!(status["dead_letters"], 0);
        let age = status["oldest_pending_age_seconds"].as_f64().unwrap();
        assert!((110.0..600.0).contains(&age), "{backend:?}: {age}");
        assert_eq!(status["pending_by_type"][0]["aggregate_type"], "Invoice");
        assert_eq!(status["pending_by_type"][0]["pending"], 3);
        assert_eq!(status["pending_by_type"][1]["aggregate_type"], "Customer");

        let (code, stdout, stderr) =
            run_to_end(Path::new(RELAY), &["status", "--max-lag", "1m"], &env);
        assert_eq!(code, 1, "{backend:?}: lagging more than a minute");
        assert!(
            stdout.contains("pending          4"),
            "the table is still printed: {stdout}"
        );
        assert!(
            stderr
                .trim()
                .starts_with("error: the oldest pending row is 2m"),
            "{stderr}"
        );
        assert!(stderr.contains("over --max-lag 1m"), "{stderr}");

        let (code, _, stderr) = run_to_end(Path::new(RELAY), &["status", "--max-lag", "10m"], &env);
        assert_eq!(code, 0, "{backend:?}: {stderr}");
        t.drop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn status_lists_shard_owners_of_running_relays() {
    let t = TestDb::new(Backend::Postgres).await;
    let _relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--instance-id", "relay-on-call"],
        &[("DATABASE_URL", &t.url)],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, stdout, _) = run_to_end(Path::new(RELAY), &["status"], &[("DATABASE_URL", &t.url)]);
        if stdout.contains("relay-on-call") && stdout.contains("16 shards") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no shard owner listed:\n{stdout}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t.drop().await;
}

/// Debug-level JSON logs and the metrics of a run whose database URL has a
/// password (trust authentication ignores it) never show the password.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_password_never_appears_in_logs_or_metrics() {
    let brokers = kafka::brokers();
    let t = TestDb::new(Backend::Postgres).await;
    append_events(&t.db, "secretive", 3).await;
    let url = t.url.replacen(
        "postgres://postgres@",
        "postgres://postgres:Sup3rS3cret@",
        1,
    );
    assert!(url.contains("Sup3rS3cret"));
    let addr = format!("127.0.0.1:{}", free_port());
    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &[
            "run",
            "--log-format",
            "json",
            "--metrics-addr",
            &addr,
            "--metrics-interval",
            "200ms",
            "--topic-template",
            &format!("{}.{{aggregatetype}}", kafka::topic_prefix("secret")),
        ],
        &[
            ("DATABASE_URL", &url),
            ("KAFKA_BROKERS", &brokers),
            ("RUST_LOG", "debug"),
        ],
    );
    let metrics = wait_for_metrics(&addr, "the events published", |m| {
        sample(m, r#"outbox_published_total{aggregate_type="Invoice"}"#) == Some(3.0)
    })
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(20)), Some(0));

    let stderr = relay.stderr();
    assert!(stderr.iter().any(|line| line.contains("relay started")));
    for line in &stderr {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|error| panic!("not a JSON log line ({error}): {line}"));
        assert!(
            !line.contains("Sup3rS3cret"),
            "password in a log line: {line}"
        );
    }
    assert!(
        stderr.iter().any(|line| line.contains("postgres:***@")),
        "the URL is logged redacted"
    );
    assert!(!metrics.contains("Sup3rS3cret"));
    t.drop().await;
}
