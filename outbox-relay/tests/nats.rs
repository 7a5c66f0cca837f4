//! The relay binary publishing to the real NATS JetStream server
//! (127.0.0.1:4222): rows read back by a witness client of the test's own
//! and compared with the table by event id, exactly once and in
//! per-aggregate order; SIGKILL during a drain leaving no duplicate in the
//! stream; encoded subjects; an outage of a private server; and bad
//! settings. Each test has its own database, stream and subject prefix.

use std::collections::{BTreeMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::path::Path;
use std::time::{Duration, Instant};

use outbox_core::{EventDecoder, IncomingMessage, OutboxEvent};
use outbox_relay::sink::nats::subject::decode_token;
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::http::{get, sample};
use outbox_tests::kafka::free_port;
use outbox_tests::nats::{PrivateServer, Scope, Stored, Witness, nats_url};
use outbox_tests::process::{RelayProcess, assert_refused, run_to_end};
use outbox_tests::stream::{first_arrivals, seed, written_order};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement, TransactionTrait};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn relay() -> &'static Path {
    Path::new(RELAY)
}

/// `scope`'s relay arguments, then `extra`.
fn args<'a>(scope_args: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
    let mut args: Vec<&str> = scope_args.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    args
}

/// Runs `outbox-relay run --drain` to the scope's stream; expects a clean exit.
fn drain(t: &TestDb, scope: &Scope, extra: &[&str]) {
    let scope_args = scope.relay_args(&nats_url());
    let mut all = args(&scope_args, &["--drain"]);
    all.extend_from_slice(extra);
    let (code, _, stderr) = run_to_end(relay(), &all, &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "relay failed:\n{stderr}");
}

/// Inserts one plain-SQL row for aggregate `aggregate_id` (bound, so any
/// text goes); returns its event id.
async fn insert_row_for(t: &TestDb, aggregate_id: &str) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    let sql = match t.backend {
        Backend::Postgres => {
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::uuid, 'Odd', $2, 'OddThing', '{}')"
        }
        _ => {
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES (?, 'Odd', ?, 'OddThing', '{}')"
        }
    };
    t.db.execute_raw(Statement::from_sql_and_values(
        t.db_backend(),
        sql,
        [id.clone().into(), aggregate_id.into()],
    ))
    .await
    .unwrap();
    id
}

/// Every message's `Nats-Msg-Id` is its event id, and no id is there twice.
fn assert_once_with_msg_ids(stored: &[Stored]) {
    let mut seen = HashSet::new();
    for message in stored {
        let id = message.header("id").expect("id header");
        assert_eq!(
            message.header("Nats-Msg-Id"),
            Some(id),
            "seq {}",
            message.sequence
        );
        assert!(
            seen.insert(id.to_owned()),
            "event {id} is in the stream twice"
        );
    }
}

async fn plain_rows_reach_the_stream_once_in_table_order(backend: Backend) {
    let witness = Witness::connect().await;
    let scope = Scope::new("plain");
    let t = TestDb::new(backend).await;
    let written = t.insert_plain_rows(10, 100).await;

    drain(
        &t,
        &scope,
        &["--batch-size", "300", "--nats-max-pending", "64"],
    );
    let stored = witness
        .read(&scope.stream, 1000, Duration::from_secs(30))
        .await;
    assert_eq!(stored.len(), 1000, "each row exactly once");
    assert_once_with_msg_ids(&stored);

    // Compared with the table by id: the same events, in each aggregate's
    // insertion order, on the aggregate's subject, with the stored payload.
    let rows = t.outbox_rows().await;
    let messages: Vec<_> = stored.iter().map(Stored::consumed).collect();
    assert_eq!(first_arrivals(&messages), written_order(&written));
    let by_id: BTreeMap<&str, _> = rows.iter().map(|row| (row.id.as_str(), row)).collect();
    for message in &stored {
        let row = by_id[message.header("id").unwrap()];
        assert_eq!(
            message.subject,
            format!("{}.event.Customer.{}", scope.prefix, row.aggregate_id)
        );
        assert_eq!(message.header("aggregateType"), Some("Customer"));
        assert_eq!(message.header("eventType"), Some("CustomerUpdated"));
        assert_eq!(message.header("eventVersion"), Some("1"));
        assert_eq!(message.header("aggregateSequence"), None);
        let payload: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(Some(payload), row.payload);
    }
    assert_eq!(t.pending().await, 0);
    witness.delete_stream(&scope.stream).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_plain_sql_rows_on_postgres_reach_the_stream_once_in_table_order() {
    plain_rows_reach_the_stream_once_in_table_order(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_plain_sql_rows_on_mariadb_reach_the_stream_once_in_table_order() {
    plain_rows_reach_the_stream_once_in_table_order(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_relay_creates_its_stream_and_messages_carry_the_contract() {
    let witness = Witness::connect().await;
    let scope = Scope::new("contract");
    let t = TestDb::new(Backend::Sqlite).await;
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

    drain(&t, &scope, &[]);
    let config = witness.stream_config(&scope.stream).await;
    assert_eq!(config.subjects, [scope.capture()]);
    assert_eq!(
        config.storage,
        async_nats::jetstream::stream::StorageType::File
    );
    assert!(config.duplicate_window >= Duration::from_secs(120));
    let stored = witness
        .read(&scope.stream, 1, Duration::from_secs(10))
        .await;
    assert_eq!(stored.len(), 1);
    let message = &stored[0];
    assert_eq!(
        message.subject,
        format!("{}.event.Invoice.inv-1", scope.prefix)
    );
    assert_eq!(
        message.payload,
        t.stored_payload(&event_id).await.into_bytes(),
        "the body is the payload's bytes as stored"
    );
    assert_eq!(message.header("Nats-Msg-Id"), Some(event_id.as_str()));
    assert_eq!(message.header("id"), Some(event_id.as_str()));
    assert_eq!(message.header("eventType"), Some("InvoiceIssued"));
    assert_eq!(message.header("eventVersion"), Some("2"));
    assert_eq!(message.header("aggregateSequence"), Some("1"));
    assert_eq!(message.header("traceparent"), Some(TRACEPARENT));
    assert_eq!(message.header("aggregateType"), Some("Invoice"));
    assert_eq!(message.header("aggregateId"), Some("inv-1"));

    // The consumer helpers take a NATS message as it is: its headers and
    // body, with the subject's topic part; the aggregate id comes from the
    // aggregateId header.
    let topic = format!("{}.event.Invoice", scope.prefix);
    let incoming =
        IncomingMessage::new(&topic, Some(message.payload.as_slice())).headers(&message.headers);
    let decoded = EventDecoder::<InvoiceIssuedV2>::new()
        .event::<InvoiceIssuedV2>()
        .decode(&incoming)
        .expect("a typed event from the NATS message");
    assert_eq!(decoded.metadata.id.to_string(), event_id);
    assert_eq!(decoded.metadata.aggregate_id.as_deref(), Some("inv-1"));
    assert_eq!(decoded.metadata.aggregate_sequence, Some(1));
    assert_eq!(decoded.event.amount_cents, 990);
    witness.delete_stream(&scope.stream).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregate_ids_that_are_no_subject_token_are_encoded_and_kept_in_the_header() {
    let witness = Witness::connect().await;
    let scope = Scope::new("encoded");
    let t = TestDb::new(Backend::Postgres).await;
    let odd = [
        "a.b",
        "two words",
        "*",
        ">",
        "",
        "100%",
        "tab\tinside",
        "bell\u{7}",
        "ünï.cødé 🦀",
    ];
    let mut ids = Vec::new();
    for aggregate_id in odd {
        ids.push(insert_row_for(&t, aggregate_id).await);
    }
    drain(&t, &scope, &[]);
    let stored = witness
        .read(&scope.stream, odd.len() as u64, Duration::from_secs(10))
        .await;
    assert_eq!(stored.len(), odd.len());
    for (message, aggregate_id) in stored.iter().zip(odd) {
        let tokens: Vec<&str> = message.subject.split('.').collect();
        assert_eq!(tokens.len(), 4, "one token per value: {}", message.subject);
        assert_eq!(tokens[..3], [scope.prefix.as_str(), "event", "Odd"]);
        assert_eq!(decode_token(tokens[3]).unwrap(), aggregate_id);
        assert_eq!(message.header("aggregateId"), Some(aggregate_id));
    }
    assert_eq!(t.pending().await, 0);
    witness.delete_stream(&scope.stream).await;
    t.drop().await;
}

/// A number from 0 to `below - 1`, different in every run.
fn random_below(below: u64) -> u64 {
    RandomState::new().hash_one(Instant::now()) % below
}

/// The relay's log with every claim and settle, for a test whose failure
/// must show what the relay was doing.
const DEBUG_LOG: &str = "info,outbox_relay=debug,sqlx=warn";

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_a_drain_leaves_every_event_in_the_stream_exactly_once() {
    let witness = Witness::connect().await;
    let scope = Scope::new("sigkill");
    let t = TestDb::new(Backend::Postgres).await;
    let ids = seed(&t.db, 20, 250, 50).await;
    let total = ids.len() as i64;
    let url = nats_url();
    let scope_args = scope.relay_args(&url);
    let run_args = args(
        &scope_args,
        &[
            "--batch-size",
            "100",
            "--lease",
            "2s",
            "--poll-interval",
            "100ms",
        ],
    );

    let mut published_at_kill = Vec::new();
    for _ in 0..5 {
        let before = t.published().await;
        if before == total {
            // A run drained everything before its kill: nothing is left
            // for another run to make progress on.
            break;
        }
        let mut running = RelayProcess::spawn(
            relay(),
            &run_args,
            &[("DATABASE_URL", &t.url), ("RUST_LOG", DEBUG_LOG)],
        );
        // Once this run made progress, kill it at a random point of what follows.
        let deadline = Instant::now() + Duration::from_secs(60);
        while t.published().await == before {
            if Instant::now() >= deadline {
                let stderr = running.stderr();
                panic!(
                    "no progress after the kills at {published_at_kill:?}:\n{}\n{}",
                    t.describe_ownership().await,
                    stderr[stderr.len().saturating_sub(300)..].join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Within a few batches: a run publishes thousands of events a
        // second, and a later kill must still find rows pending.
        tokio::time::sleep(Duration::from_millis(random_below(300))).await;
        running.kill9();
        published_at_kill.push(t.published().await);
    }
    assert!(
        published_at_kill.iter().any(|&n| n > 0 && n < total),
        "a kill hit the middle of the drain: {published_at_kill:?}"
    );

    let mut last = RelayProcess::spawn(
        relay(),
        &args(&scope_args, &["--drain", "--lease", "2s"]),
        &[("DATABASE_URL", &t.url)],
    );
    assert_eq!(
        last.wait(Duration::from_secs(120)),
        Some(0),
        "{}",
        last.stderr().join("\n")
    );
    assert_eq!(t.pending().await, 0);

    let (stored, report) = witness.check_stream(&scope.stream, &ids).await;
    let resent = last
        .stderr()
        .iter()
        .any(|line| line.contains("dropped by the stream's duplicate window"));
    eprintln!(
        "{} events, {} stream messages after kills at {published_at_kill:?}; \
         the last run saw re-sends dropped: {resent}",
        ids.len(),
        stored.len()
    );
    assert_eq!(
        stored.len(),
        ids.len(),
        "every event exactly once: the stream dropped the re-sends"
    );
    assert_once_with_msg_ids(&stored);
    assert_eq!((report.distinct, report.duplicates), (ids.len(), 0));
    witness.delete_stream(&scope.stream).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_outage_keeps_rows_pending_and_readyz_down_until_it_is_back() {
    let mut server = PrivateServer::start();
    let witness_url = server.url.clone();
    let scope = Scope::new("outage");
    let t = TestDb::new(Backend::Postgres).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let scope_args = scope.relay_args(&server.url);
    let mut relay = RelayProcess::spawn(
        relay(),
        &args(
            &scope_args,
            &[
                "--metrics-addr",
                &addr,
                "--metrics-interval",
                "200ms",
                "--send-timeout",
                "2s",
                "--poll-interval",
                "200ms",
            ],
        ),
        &[("DATABASE_URL", &t.url)],
    );
    let readiness = |expected: u16| {
        let addr = addr.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while get(&addr, "/readyz").map(|(code, _)| code) != Some(expected) {
                assert!(
                    Instant::now() < deadline,
                    "/readyz never answered {expected}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    readiness(200).await;
    let mut ids = seed(&t.db, 4, 5, 5).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.pending().await > 0 {
        assert!(Instant::now() < deadline, "{}", relay.stderr().join("\n"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    server.stop();
    readiness(503).await;
    let (_, metrics) = get(&addr, "/metrics").expect("metrics");
    assert_eq!(
        sample(&metrics, r#"outbox_broker_up{sink="nats"}"#),
        Some(0.0),
        "{metrics}"
    );
    ids.extend(seed(&t.db, 4, 5, 5).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        t.pending().await,
        20,
        "nothing is marked while the server is down"
    );
    assert!(
        relay.is_running(),
        "the relay kept running through the outage"
    );

    server.restart();
    readiness(200).await;
    t.wait_until_published(Duration::from_secs(60)).await;
    relay.terminate();

    let witness = Witness::connect_to(&witness_url).await;
    let (stored, _) = witness.check_stream(&scope.stream, &ids).await;
    assert_eq!(
        stored.len(),
        40,
        "every event once, none lost in the outage"
    );
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_settings_and_unusable_streams_stop_the_relay_with_one_line_and_mark_nothing() {
    let witness = Witness::connect().await;
    let uncaptured = Scope::new("uncaptured");
    // Captures only Invoice subjects: Customer rows would go nowhere.
    witness
        .create_stream(
            &uncaptured.stream,
            &[&format!("{}.event.Invoice.*", uncaptured.prefix)],
            Duration::from_secs(600),
        )
        .await;
    let short_window = Scope::new("window");
    witness
        .create_stream(
            &short_window.stream,
            &[&short_window.capture()],
            Duration::from_secs(45),
        )
        .await;
    let t = TestDb::new(Backend::Sqlite).await;
    t.insert_plain_rows(1, 3).await;
    let env = [("DATABASE_URL", t.url.as_str())];
    let url = nats_url();
    let fresh = Scope::new("unused");
    let template = fresh.template();
    // `run --sink nats` with the URL, stream and subject template given.
    let run = |url: &str, stream: &str, subject: &str, extra: &[&str]| -> Vec<String> {
        let mut all = vec![
            "run",
            "--sink",
            "nats",
            "--nats-url",
            url,
            "--nats-stream",
            stream,
            "--nats-subject",
            subject,
        ];
        all.extend_from_slice(extra);
        all.into_iter().map(str::to_owned).collect()
    };

    let cases: Vec<(Vec<String>, i32, String)> = vec![
        (
            run(
                "http://u:s3cret@127.0.0.1:4222",
                &fresh.stream,
                &template,
                &[],
            ),
            2,
            "error: --nats-url: the scheme is http://".into(),
        ),
        (
            run(
                "nats://u:s3cret@127.0.0.1:port",
                &fresh.stream,
                &template,
                &[],
            ),
            2,
            "error: --nats-url: not a URL".into(),
        ),
        (
            run(&url, &fresh.stream, "outbox.*.{aggregateid}", &[]),
            2,
            "error: --nats-subject: the subject template".into(),
        ),
        (
            run(&url, "OUT.BOX", &template, &[]),
            2,
            "error: --nats-stream:".into(),
        ),
        (
            run(&url, &fresh.stream, &template, &["--nats-max-pending", "0"]),
            2,
            "error: --nats-max-pending is 0; it must be 1 to 100000".into(),
        ),
        (
            run("nats://u:s3cret@127.0.0.1:1", &fresh.stream, &template, &[]),
            1,
            "error: cannot connect to NATS at nats://127.0.0.1:1".into(),
        ),
        (
            uncaptured.relay_args(&url),
            1,
            format!(
                "error: the JetStream stream \"{}\" captures",
                uncaptured.stream
            ),
        ),
        (
            short_window.relay_args(&url),
            1,
            format!(
                "error: the JetStream stream \"{}\" drops re-sent events only within its \
                 duplicate window of 45s, but the relay may send an event again up to 1m 100ms \
                 later (--send-timeout 30s + 30s backoff cap + --poll-interval 100ms)",
                short_window.stream
            ),
        ),
    ];
    for (arguments, expected_code, expected_start) in &cases {
        let mut all: Vec<&str> = arguments.iter().map(String::as_str).collect();
        all.push("--drain");
        assert_refused(
            relay(),
            &all,
            &env,
            *expected_code,
            expected_start,
            "s3cret",
        );
    }
    assert!(
        !witness.stream_exists(&fresh.stream).await,
        "no stream was created for refused settings"
    );
    assert_eq!(witness.count(&uncaptured.stream).await, 0);
    assert_eq!(witness.count(&short_window.stream).await, 0);
    assert_eq!(t.published().await, 0);
    assert_eq!(t.count("outbox WHERE attempts > 0").await, 0);

    // With a shorter send timeout, the window covers the longest re-send
    // gap (5s + 30s backoff cap + 100ms) and the stream is used.
    drain(&t, &short_window, &["--send-timeout", "5s"]);
    assert_eq!(witness.count(&short_window.stream).await, 3);
    witness.delete_stream(&uncaptured.stream).await;
    witness.delete_stream(&short_window.stream).await;
    t.drop().await;
}
