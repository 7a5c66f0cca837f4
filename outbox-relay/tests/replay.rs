//! `outbox-relay replay`: what a separate Kafka consumer reads back,
//! compared by event id with the outbox table; each aggregate's copies in
//! the order its writers committed them (`aggregate_seq` as the writers'
//! appends numbered them, insertion order for plain-SQL rows); the live
//! relay's stream of the same aggregates, running at the same time, whole
//! and in order; dry run, confirmation, interruption and resume, and the
//! audit record in `status`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use outbox_tests::db::OutboxRow;
use outbox_tests::kafka::{self, Consumed};
use outbox_tests::process::{RelayProcess, run_to_end};
use outbox_tests::stream::append_events;
use outbox_tests::{Backend, TestDb};
use sea_orm::ConnectionTrait;
use serde_json::Value;

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay_command(t: &TestDb, args: &[&str]) -> (i32, String, String) {
    run_to_end(Path::new(RELAY), args, &[("DATABASE_URL", &t.url)])
}

/// Runs a command that must succeed; returns its standard output and error.
fn succeed(t: &TestDb, args: &[&str]) -> (String, String) {
    let (code, stdout, stderr) = relay_command(t, args);
    assert_eq!(code, 0, "{args:?} failed:\n{stderr}");
    (stdout, stderr)
}

/// `status --json`.
fn status(t: &TestDb) -> Value {
    let (stdout, _) = succeed(t, &["status", "--json"]);
    serde_json::from_str(&stdout).expect("status --json prints JSON")
}

/// The replay id a replay printed (`replay <id>: sending ...`).
fn replay_id(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("replay ")?.split_once(": sending"))
        .map(|(id, _)| id.to_owned())
        .unwrap_or_else(|| panic!("no replay id in:\n{stderr}"))
}

/// The database's time now as RFC 3339, for `--until`.
async fn database_now(t: &TestDb) -> String {
    let sql = match t.backend {
        Backend::MySql => "SELECT DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%fZ')",
        _ => "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
    };
    let row =
        t.db.query_one_raw(sea_orm::Statement::from_string(t.db_backend(), sql))
            .await
            .expect("the time")
            .expect("a row");
    row.try_get_by_index(0).expect("text")
}

/// Checks that `messages` are copies of exactly the rows `expected` (each
/// once), each carrying `replay` and the row's id, type, sequence and
/// payload, and that each aggregate's copies come in `order`'s order (the
/// ids of each aggregate as its writers committed them).
fn check_replayed(
    messages: &[&Consumed],
    expected: &[&OutboxRow],
    replay: &str,
    order: &HashMap<String, Vec<String>>,
) {
    let rows: HashMap<&str, &OutboxRow> =
        expected.iter().map(|row| (row.id.as_str(), *row)).collect();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut per_aggregate: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in messages {
        let id = message.header("id").expect("an id header");
        assert_eq!(message.header("replayId"), Some(replay), "{message:?}");
        let row = rows
            .get(id)
            .unwrap_or_else(|| panic!("replayed {id}, which was not selected: {message:?}"));
        assert!(seen.insert(row.id.as_str()), "{id} replayed twice");
        assert_eq!(message.key.as_deref(), Some(row.aggregate_id.as_str()));
        assert_eq!(message.header("eventType"), Some(row.event_type.as_str()));
        assert_eq!(
            message.header("aggregateSequence").map(str::to_owned),
            row.aggregate_seq.map(|seq| seq.to_string())
        );
        assert_eq!(Some(message.json()), row.payload, "{id}");
        per_aggregate
            .entry(row.aggregate_id.clone())
            .or_default()
            .push(row.id.clone());
    }
    assert_eq!(seen.len(), expected.len(), "every selected event replayed");
    for (aggregate, ids) in per_aggregate {
        let committed: Vec<&String> = order[&aggregate]
            .iter()
            .filter(|id| ids.contains(id))
            .collect();
        let sent: Vec<&String> = ids.iter().collect();
        assert_eq!(sent, committed, "order of aggregate {aggregate}");
    }
}

/// Each aggregate's event ids in the order its writers committed them:
/// by the sequence numbers `outbox_core::append` gave (checked to run 1,
/// 2, 3, ... without a gap), plain-SQL rows in insertion order.
fn committed_order(rows: &[OutboxRow]) -> HashMap<String, Vec<String>> {
    let mut order: HashMap<String, Vec<(i64, String)>> = HashMap::new();
    for (position, row) in rows.iter().enumerate() {
        let rank = row.aggregate_seq.unwrap_or(position as i64);
        order
            .entry(row.aggregate_id.clone())
            .or_default()
            .push((rank, row.id.clone()));
    }
    order
        .into_iter()
        .map(|(aggregate, mut ranked)| {
            ranked.sort();
            if rows
                .iter()
                .any(|row| row.aggregate_id == aggregate && row.aggregate_seq.is_some())
            {
                let ranks: Vec<i64> = ranked.iter().map(|(rank, _)| *rank).collect();
                assert_eq!(ranks, (1..=ranks.len() as i64).collect::<Vec<_>>());
            }
            (aggregate, ranked.into_iter().map(|(_, id)| id).collect())
        })
        .collect()
}

/// Inserts events of invoice `aggregate` numbered `numbers` in that
/// (insertion) order: what two writers of one aggregate can commit when
/// the later-numbered one draws its insertion order first.
async fn insert_numbered_out_of_order(t: &TestDb, aggregate: &str, numbers: &[i64]) {
    for number in numbers {
        let id = uuid::Uuid::now_v7();
        t.db.execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq) \
             VALUES ('{id}', 'Invoice', '{aggregate}', 'InvoiceIssued', \
             '{{\"amountCents\": {number}}}', {number})"
        ))
        .await
        .expect("insert a numbered row");
    }
}

/// Writers append to the same few invoices and the live relay publishes
/// them to Kafka, while a replay sends the invoices' events up to a
/// moment, and the plain-SQL customers', to the same topics. What a
/// separate consumer reads: the live stream whole and in committed order
/// per aggregate; the replay's copies exactly the selection, each once, in
/// committed order per aggregate, with the replay header.
async fn replays_beside_the_live_relay(backend: Backend) {
    let brokers = kafka::brokers();
    let prefix = kafka::topic_prefix("replay");
    let template = format!("{prefix}.{{aggregatetype}}");
    let t = TestDb::new(backend).await;
    succeed(&t, &["migrate", "--partitioned"]);
    for invoice in ["inv-0", "inv-1", "inv-2"] {
        append_events(&t.db, invoice, 5).await;
    }
    let customers = t.insert_plain_rows(2, 4).await;
    insert_numbered_out_of_order(&t, "inv-9", &[3, 1, 2]).await;
    let live_args = [
        "run",
        "--sink",
        "kafka",
        "--brokers",
        &brokers,
        "--topic-template",
        &template,
        "--batch-size",
        "7",
    ];
    let mut drain = live_args.to_vec();
    drain.push("--drain");
    succeed(&t, &drain);
    let until = database_now(&t).await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    // The live relay and writers on the same aggregates, during the replay.
    let mut live = RelayProcess::spawn(Path::new(RELAY), &live_args, &[("DATABASE_URL", &t.url)]);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|writer| {
            let db = t.db.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    append_events(&db, &format!("inv-{}", (writer + round) % 3), 2).await;
                    round += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, stderr) = succeed(
        &t,
        &[
            "replay",
            "--aggregate-type",
            "Invoice",
            "--aggregate-type",
            "Customer",
            "--until",
            &until,
            "--chunk-size",
            "4",
            "--sink",
            "kafka",
            "--brokers",
            &brokers,
            "--topic-template",
            &template,
        ],
    );
    let replay = replay_id(&stderr);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while t.pending().await > 0 {
        assert!(
            live.is_running(),
            "the live relay stopped:\n{}",
            live.terminate()
        );
        assert!(Instant::now() < deadline, "the live relay did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    live.terminate();

    let rows = t.outbox_rows().await;
    let order = committed_order(&rows);
    let cutoff: HashSet<&str> = {
        let selected =
            t.db.query_all_raw(sea_orm::Statement::from_string(
                t.db_backend(),
                match backend {
                    Backend::MySql => format!(
                        "SELECT id FROM outbox WHERE created_at < CAST('{}' AS DATETIME(6))",
                        until.trim_end_matches('Z').replace('T', " ")
                    ),
                    _ => format!(
                        "SELECT id::text FROM outbox WHERE created_at < '{until}'::timestamptz"
                    ),
                },
            ))
            .await
            .expect("the selection");
        let ids: HashSet<String> = selected
            .iter()
            .map(|row| row.try_get_by_index::<String>(0).expect("id"))
            .collect();
        rows.iter()
            .filter(|row| ids.contains(&row.id))
            .map(|row| row.id.as_str())
            .collect()
    };
    let selected: Vec<&OutboxRow> = rows
        .iter()
        .filter(|row| cutoff.contains(row.id.as_str()))
        .collect();
    assert_eq!(
        selected.len(),
        15 + 3 + customers.len(),
        "the events before --until"
    );

    for aggregate_type in ["Invoice", "Customer"] {
        let of_type: Vec<&OutboxRow> = rows
            .iter()
            .filter(|row| row.aggregate_type == aggregate_type)
            .collect();
        let copies = selected
            .iter()
            .filter(|row| row.aggregate_type == aggregate_type)
            .count();
        let topic = format!("{prefix}.{aggregate_type}");
        let messages = kafka::consume(
            &brokers,
            &topic,
            of_type.len() + copies,
            Duration::from_secs(60),
            Duration::from_secs(2),
        );
        let (replayed, live_sent): (Vec<&Consumed>, Vec<&Consumed>) = messages
            .iter()
            .partition(|message| message.header("replayId").is_some());
        // The live stream: every event of the type, each aggregate's in
        // committed order (a redelivery may repeat an event, never reorder).
        let mut first_seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut ids: HashSet<String> = HashSet::new();
        for message in &live_sent {
            let id = message.header("id").expect("id").to_owned();
            if ids.insert(id.clone()) {
                first_seen
                    .entry(message.key.clone().expect("a key"))
                    .or_default()
                    .push(id);
            }
        }
        assert_eq!(ids.len(), of_type.len(), "live {aggregate_type} events");
        for (aggregate, sent) in &first_seen {
            assert_eq!(sent, &order[aggregate], "live order of {aggregate}");
        }
        let expected: Vec<&OutboxRow> = selected
            .iter()
            .copied()
            .filter(|row| row.aggregate_type == aggregate_type)
            .collect();
        check_replayed(&replayed, &expected, &replay, &order);
    }

    let status = status(&t);
    let record = &status["replays"][0];
    assert_eq!(record["id"].as_str(), Some(replay.as_str()), "{status}");
    assert_eq!(record["state"], "done", "{status}");
    assert_eq!(record["sent"].as_i64(), Some(selected.len() as i64));
    assert_eq!(record["planned"].as_i64(), Some(selected.len() as i64));
    assert!(
        record["selection"]
            .as_str()
            .is_some_and(|s| s.contains("--aggregate-type Invoice") && s.contains("--until")),
        "{status}"
    );
    assert!(
        record["requested_by"]
            .as_str()
            .is_some_and(|by| by.contains('@'))
    );
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replays_beside_the_live_relay_postgres() {
    replays_beside_the_live_relay(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replays_beside_the_live_relay_mariadb() {
    replays_beside_the_live_relay(Backend::MySql).await;
}

/// A dry run sends nothing and counts what would be sent; over the
/// threshold a replay wants --yes; interrupted, it resumes after its last
/// acknowledged chunk, and the copies on the topic are then every selected
/// event once, in order per aggregate.
async fn dry_run_confirmation_and_resume(backend: Backend) {
    let brokers = kafka::brokers();
    let to = format!("{}.replayed", kafka::topic_prefix("replay-resume"));
    let t = TestDb::new(backend).await;
    for invoice in 0..4 {
        append_events(&t.db, &format!("inv-{invoice}"), 15).await;
    }
    succeed(&t, &["run", "--drain", "--sink", "stdout"]);
    let (stdout, _) = succeed(&t, &["replay", "--dry-run", "--json"]);
    let summary: Value = serde_json::from_str(&stdout).expect("--dry-run --json prints JSON");
    assert_eq!(summary["events"].as_i64(), Some(60), "{summary}");
    assert_eq!(summary["aggregates"].as_i64(), Some(4), "{summary}");
    assert_eq!(
        summary["by_type"][0]["events"].as_i64(),
        Some(60),
        "{summary}"
    );
    assert_eq!(
        summary["largest"][0]["events"].as_i64(),
        Some(15),
        "{summary}"
    );
    let (stdout, _) = succeed(&t, &["replay", "--dry-run", "--aggregate-id", "inv-1"]);
    assert!(
        stdout.starts_with("would replay 15 events of 1 aggregates"),
        "{stdout}"
    );

    let sink = ["--sink", "kafka", "--brokers", brokers.as_str()];
    let mut over = vec!["replay", "--to", to.as_str(), "--confirm-over", "10"];
    over.extend_from_slice(&sink);
    let (code, _, stderr) = relay_command(&t, &over);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("would send 60 events, over --confirm-over 10") && stderr.contains("--yes"),
        "{stderr}"
    );
    assert_eq!(status(&t)["replays"].as_array().map(Vec::len), Some(0));

    let mut slow = vec![
        "replay",
        "--to",
        to.as_str(),
        "--rate",
        "20",
        "--chunk-size",
        "5",
        "--yes",
    ];
    slow.extend_from_slice(&sink);
    let mut replay = RelayProcess::spawn(Path::new(RELAY), &slow, &[("DATABASE_URL", &t.url)]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sent = status(&t)["replays"][0]["sent"].as_i64().unwrap_or(0);
        if sent >= 10 {
            break;
        }
        assert!(Instant::now() < deadline, "the replay made no progress");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    replay.signal("INT");
    assert_eq!(replay.wait(Duration::from_secs(30)), Some(1));
    let stderr = replay.stderr().join("\n");
    let id = replay_id(&stderr);
    assert!(
        stderr.contains(&format!("replay {id} interrupted after"))
            && stderr.contains(&format!("--resume {id}")),
        "{stderr}"
    );
    let record = status(&t)["replays"][0].clone();
    assert_eq!(record["state"], "interrupted", "{record}");
    let interrupted_at = record["sent"].as_i64().expect("sent");
    assert!((10..60).contains(&interrupted_at), "{record}");

    let mut resume = vec!["replay", "--resume", id.as_str()];
    resume.extend_from_slice(&sink);
    let (_, stderr) = succeed(&t, &resume);
    assert!(
        stderr.contains(&format!("sending {} of 60 events", 60 - interrupted_at)),
        "{stderr}"
    );
    let record = status(&t)["replays"][0].clone();
    assert_eq!(record["state"], "done", "{record}");
    assert_eq!(record["sent"].as_i64(), Some(60), "{record}");
    let (code, _, stderr) = relay_command(&t, &resume);
    assert_eq!(code, 1);
    assert!(stderr.contains("is done"), "{stderr}");

    let rows = t.outbox_rows().await;
    let order = committed_order(&rows);
    let messages = kafka::consume(
        &brokers,
        &to,
        60,
        Duration::from_secs(60),
        Duration::from_secs(2),
    );
    let messages: Vec<&Consumed> = messages.iter().collect();
    let expected: Vec<&OutboxRow> = rows.iter().collect();
    check_replayed(&messages, &expected, &id, &order);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_confirmation_and_resume_postgres() {
    dry_run_confirmation_and_resume(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_confirmation_and_resume_mariadb() {
    dry_run_confirmation_and_resume(Backend::MySql).await;
}

/// On NATS JetStream, whose stream drops a message whose id it stored
/// within its duplicate window: copies sent right after the events are
/// stored beside them, each aggregate's in order.
#[tokio::test(flavor = "multi_thread")]
async fn replays_into_a_jetstream_stream_within_its_duplicate_window() {
    let url = outbox_tests::nats::nats_url();
    let scope = outbox_tests::nats::Scope::new("replay");
    let witness = outbox_tests::nats::Witness::connect().await;
    let t = TestDb::new(Backend::Postgres).await;
    for invoice in ["inv-0", "inv-1"] {
        append_events(&t.db, invoice, 6).await;
    }
    let drain = scope.drain_args(&url, &[]);
    let drain: Vec<&str> = drain.iter().map(String::as_str).collect();
    succeed(&t, &drain);
    let replay_args: Vec<String> = scope.relay_args(&url).into_iter().skip(1).collect();
    let mut replay = vec!["replay"];
    replay.extend(replay_args.iter().map(String::as_str));
    let (_, stderr) = succeed(&t, &replay);
    let id = replay_id(&stderr);

    let stored = witness
        .read(&scope.stream, 24, Duration::from_secs(30))
        .await;
    let consumed: Vec<Consumed> = stored.iter().map(|message| message.consumed()).collect();
    let copies: Vec<&Consumed> = consumed
        .iter()
        .filter(|message| message.header("replayId").is_some())
        .collect();
    assert_eq!(consumed.len(), 24, "12 events and their 12 copies");
    let rows = t.outbox_rows().await;
    let order = committed_order(&rows);
    let expected: Vec<&OutboxRow> = rows.iter().collect();
    check_replayed(&copies, &expected, &id, &order);
    witness.delete_stream(&scope.stream).await;
    t.drop().await;
}

/// The embedded default: SQLite to standard output, selected by event
/// type and by partition-free time window; a bad selection is one line.
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_replays_to_standard_output() {
    let t = TestDb::new(Backend::Sqlite).await;
    append_events(&t.db, "inv-0", 3).await;
    let customers = t.insert_plain_rows(1, 3).await;
    succeed(&t, &["run", "--drain", "--sink", "stdout"]);
    let (stdout, stderr) = succeed(
        &t,
        &["replay", "--event-type", "CustomerUpdated", "--since", "1h"],
    );
    let id = replay_id(&stderr);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let ids: Vec<&str> = lines
        .iter()
        .map(|line| line["headers"]["id"].as_str().expect("id"))
        .collect();
    let written: Vec<&str> = customers.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids, written, "the plain-SQL rows, in insertion order");
    assert!(
        lines
            .iter()
            .all(|line| line["headers"]["replayId"].as_str() == Some(id.as_str()))
    );

    let (code, _, stderr) = relay_command(&t, &["replay", "--since", "yesterday-ish"]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("RFC 3339"), "{stderr}");
    let (code, _, stderr) = relay_command(&t, &["replay", "--partition", "outbox_p20261201"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("SQLite"), "{stderr}");
    let (code, _, stderr) = relay_command(&t, &["replay", "--resume", "nope"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("there is no replay nope"), "{stderr}");

    // A broker that cannot be reached: one line, and no replay recorded
    // (none left looking as if it ran).
    let replays = status(&t)["replays"].as_array().map(Vec::len);
    let (code, _, stderr) = relay_command(
        &t,
        &["replay", "--sink", "kafka", "--brokers", "127.0.0.1:1"],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("cannot reach the Kafka brokers"),
        "{stderr}"
    );
    assert_eq!(status(&t)["replays"].as_array().map(Vec::len), replays);

    // Killed, a replay still looks like it runs for a minute: not resumed
    // twice at once.
    let mut killed = RelayProcess::spawn(
        Path::new(RELAY),
        &["replay", "--rate", "1", "--chunk-size", "1"],
        &[("DATABASE_URL", &t.url)],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&t)["replays"][0]["sent"].as_i64() != Some(1) {
        assert!(Instant::now() < deadline, "the replay sent nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    killed.kill9();
    let record = status(&t)["replays"][0].clone();
    assert_eq!(record["state"], "running", "{record}");
    let id = record["id"].as_str().expect("an id").to_owned();
    let (code, _, stderr) = relay_command(&t, &["replay", "--resume", &id]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("replay {id} is running")) && stderr.contains("wait a minute"),
        "{stderr}"
    );
    t.drop().await;
}

/// To RabbitMQ (publisher confirms) from MariaDB, with `--to` a routing
/// key template: a queue bound to the replay's keys receives copies of
/// exactly the selected aggregate type's events, each once, in committed
/// order per aggregate; the queue of the live routing keys receives
/// nothing more than the originals.
#[tokio::test(flavor = "multi_thread")]
async fn replays_to_a_rabbitmq_routing_key_of_its_own() {
    use lapin::types::FieldTable;
    use outbox_tests::rabbitmq::{Broker, amqp_url, unique};

    let url = amqp_url();
    let broker = Broker::connect().await;
    let exchange = unique("replay");
    let live = unique("replay-live");
    let copies_queue = unique("replay-copies");
    broker
        .bind_queue(&exchange, &live, "outbox.event.*", FieldTable::default())
        .await;
    broker
        .bind_queue(&exchange, &copies_queue, "replay.#", FieldTable::default())
        .await;
    let t = TestDb::new(Backend::MySql).await;
    for invoice in ["inv-0", "inv-1", "inv-2"] {
        append_events(&t.db, invoice, 4).await;
    }
    t.insert_plain_rows(2, 2).await;
    let sink = [
        "--sink",
        "rabbitmq",
        "--amqp-url",
        &url,
        "--amqp-exchange",
        &exchange,
    ];
    let mut drain = vec!["run", "--drain"];
    drain.extend(sink);
    succeed(&t, &drain);
    let mut replay = vec![
        "replay",
        "--aggregate-type",
        "Invoice",
        "--to",
        "replay.{aggregatetype}",
    ];
    replay.extend(sink);
    let (_, stderr) = succeed(&t, &replay);
    let id = replay_id(&stderr);

    let settle = Duration::from_millis(500);
    let originals = broker
        .read(&live, 16, Duration::from_secs(30), settle)
        .await;
    assert_eq!(originals.len(), 16, "12 invoice and 4 customer events");
    assert!(
        originals
            .iter()
            .all(|received| received.message.header("replayId").is_none()),
        "{originals:?}"
    );
    let received = broker
        .read(&copies_queue, 12, Duration::from_secs(30), settle)
        .await;
    assert!(
        received
            .iter()
            .all(|copy| copy.message.topic == "replay.Invoice"),
        "{received:?}"
    );
    let copies: Vec<&Consumed> = received.iter().map(|copy| &copy.message).collect();
    let rows = t.outbox_rows().await;
    let order = committed_order(&rows);
    let expected: Vec<&OutboxRow> = rows
        .iter()
        .filter(|row| row.aggregate_type == "Invoice")
        .collect();
    check_replayed(&copies, &expected, &id, &order);
    broker.clean_up(&exchange, &[&live, &copies_queue]).await;
    t.drop().await;
}
