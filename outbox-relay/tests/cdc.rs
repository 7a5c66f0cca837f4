//! CDC mode on real PostgreSQL (wal_level = logical, set by
//! `scripts/test.sh`): the relay binary reads the outbox table's inserts
//! from a replication slot and publishes them to the Kafka-API broker.
//!
//! Each test uses a slot and a publication named after its own schema and
//! drops both at the end; slots a failed test left behind are dropped by
//! the next run once they are old, so they never exhaust the server's slots.

use std::path::Path;
use std::time::{Duration, Instant};

use outbox_core::OutboxEvent;
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::http::{get, sample};
use outbox_tests::kafka::{self, Consumed, PrivateBroker};
use outbox_tests::process::{RelayProcess, run_to_end};
use outbox_tests::stream::{append_events, check_printed, check_stream};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, TransactionTrait};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A test's database with its own slot and publication names.
struct CdcDb {
    t: TestDb,
}

impl CdcDb {
    async fn new() -> Self {
        let t = TestDb::new(Backend::Postgres).await;
        drop_stale_slots(&t.db).await;
        Self { t }
    }

    /// The slot's and the publication's name: the schema's.
    fn name(&self) -> &str {
        self.t.name()
    }

    /// Starts `outbox-relay run --mode cdc` on this database's slot.
    fn relay(&self, brokers: &str, extra: &[&str]) -> RelayProcess {
        self.relay_at(&self.t.url, brokers, extra)
    }

    /// The same, with another URL for the same database.
    fn relay_at(&self, url: &str, brokers: &str, extra: &[&str]) -> RelayProcess {
        let mut args = vec![
            "run",
            "--mode",
            "cdc",
            "--slot",
            self.name(),
            "--publication",
            self.name(),
            "--brokers",
            brokers,
        ];
        args.extend_from_slice(extra);
        RelayProcess::spawn(Path::new(RELAY), &args, &[("DATABASE_URL", url)])
    }

    async fn query_i64(&self, sql: &str) -> Option<i64> {
        self.t
            .db
            .query_one_raw(Statement::from_string(self.t.db_backend(), sql.to_owned()))
            .await
            .expect("query")
            .and_then(|row| row.try_get_by_index::<Option<i64>>(0).expect("value"))
    }

    /// The server process streaming the slot to a relay, if any. (While
    /// the slot is being created, it is active for the creating session,
    /// which is not a reader.)
    async fn reader_pid(&self) -> Option<i64> {
        self.query_i64(&format!(
            "SELECT s.active_pid::int8 FROM pg_replication_slots AS s \
             JOIN pg_stat_activity AS a ON a.pid = s.active_pid \
             WHERE s.slot_name = '{}' AND s.active AND a.backend_type = 'walsender'",
            self.name()
        ))
        .await
    }

    /// Waits until a relay reads the slot (other than `previous`); rows
    /// committed from then on are in it.
    async fn wait_reading(&self, previous: Option<i64>, relay: &RelayProcess) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(pid) = self.reader_pid().await
                && Some(pid) != previous
            {
                return pid;
            }
            assert!(
                Instant::now() < deadline,
                "no relay read slot {} within 60s; stderr:\n{}",
                self.name(),
                relay.stderr().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Drops the slot (once no relay reads it), the publication and the schema.
    async fn drop(self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.reader_pid().await.is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let name = self.name().to_owned();
        self.t
            .db
            .execute_unprepared(&format!(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = '{name}'"
            ))
            .await
            .expect("drop the test's slot");
        self.t
            .db
            .execute_unprepared(&format!("DROP PUBLICATION IF EXISTS {name}"))
            .await
            .expect("drop the test's publication");
        self.t.drop().await;
    }
}

/// Drops inactive test slots (and their publications) older than three
/// minutes, longer than any test runs: the names are `outbox_t_<uuid v7>`,
/// whose first 48 bits are the creation time in milliseconds.
async fn drop_stale_slots(db: &DatabaseConnection) {
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT slot_name::text FROM pg_replication_slots \
             WHERE slot_name LIKE 'outbox\\_t\\_%' AND NOT active"
                .to_owned(),
        ))
        .await
        .expect("list test slots");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for row in rows {
        let name: String = row.try_get_by_index(0).unwrap();
        let created_ms = name
            .get(9..21)
            .and_then(|hex| u128::from_str_radix(hex, 16).ok())
            .unwrap_or(0);
        if now_ms.saturating_sub(created_ms) > 3 * 60 * 1000 {
            db.execute_unprepared(&format!(
                "SELECT pg_drop_replication_slot('{name}') FROM pg_replication_slots \
                 WHERE slot_name = '{name}' AND NOT active"
            ))
            .await
            .ok();
            db.execute_unprepared(&format!("DROP PUBLICATION IF EXISTS {name}"))
                .await
                .ok();
        }
    }
}

fn ids_of(events: &[outbox_core::AppendedEvent]) -> Vec<String> {
    events.iter().map(|event| event.id.to_string()).collect()
}

/// Concurrent writers, some sharing aggregates, a rolled-back transaction
/// and an insert+delete transaction: every committed event arrives once
/// per aggregate in commit order, the rolled-back one never, and the rows
/// left in the table end up marked published.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_are_published_in_commit_order() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("cdcorder");
    let template = format!("{topics}.{{aggregatetype}}");
    let cdc = CdcDb::new().await;
    let relay = cdc.relay(&brokers, &["--topic-template", &template]);
    cdc.wait_reading(None, &relay).await;

    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let db = cdc.t.db.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for round in 0..25 {
                    // Writers 0 and 1 share aggregates, as do 2 and 3.
                    let aggregate = format!("agg-{}-{}", writer / 2, round % 3);
                    ids.extend(ids_of(&append_events(&db, &aggregate, 2).await));
                }
                ids
            })
        })
        .collect();

    let rolled_back = cdc.t.db.begin().await.unwrap();
    outbox_core::append(
        &rolled_back,
        [OutboxEvent::new(InvoiceIssuedV2 {
            amount_cents: -1,
            note: None,
        })
        .aggregate_id("rolled-back")],
    )
    .await
    .unwrap();
    rolled_back.rollback().await.unwrap();

    let transient = cdc.t.db.begin().await.unwrap();
    let appended = outbox_core::append_transient(
        &transient,
        [OutboxEvent::new(InvoiceIssuedV2 {
            amount_cents: 7,
            note: Some("deleted in its own transaction".into()),
        })
        .aggregate_id("transient")],
    )
    .await
    .unwrap();
    transient.commit().await.unwrap();
    // The idiom in plain SQL: insert and delete in one transaction.
    let plain_id = uuid::Uuid::now_v7().to_string();
    cdc.t
        .db
        .execute_unprepared(&format!(
            "BEGIN; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('{plain_id}', 'Transient', 'plain', 'Noted', '{{}}'); \
             DELETE FROM outbox WHERE id = '{plain_id}'; COMMIT"
        ))
        .await
        .unwrap();

    let mut ids = ids_of(&appended);
    for writer in writers {
        ids.extend(writer.await.unwrap());
    }
    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        ids.len(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    let report = check_stream(&messages, &ids);
    assert_eq!(report.duplicates, 0, "no duplicates without a crash");
    assert_eq!(
        messages.len(),
        ids.len(),
        "nothing but the committed events"
    );
    assert!(
        messages
            .iter()
            .all(|message| message.key.as_deref() != Some("rolled-back")),
        "a rolled-back event is never published"
    );
    let transient_message = messages
        .iter()
        .find(|message| message.key.as_deref() == Some("transient"))
        .expect("the inserted-and-deleted event is published");
    assert_eq!(transient_message.json()["amountCents"], 7);
    let plain = kafka::consume(
        &brokers,
        &format!("{topics}.Transient"),
        1,
        Duration::from_secs(30),
        Duration::ZERO,
    );
    assert_eq!(plain.len(), 1);
    assert_eq!(plain[0].header("id"), Some(plain_id.as_str()));

    let deadline = Instant::now() + Duration::from_secs(20);
    while cdc.t.count("outbox WHERE published_at IS NULL").await > 0 {
        assert!(Instant::now() < deadline, "published rows get marked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cdc.t.count("outbox").await, ids.len() as i64 - 1);
    drop(relay);
    cdc.drop().await;
}

/// SIGKILL while events are being written and published: the restarted
/// relay resumes from the slot's confirmed position, without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_relay_resumes_without_loss() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("cdckill");
    let template = format!("{topics}.{{aggregatetype}}");
    let topic = format!("{topics}.Invoice");
    let cdc = CdcDb::new().await;
    let mut relay = cdc.relay(&brokers, &["--topic-template", &template]);
    let first = cdc.wait_reading(None, &relay).await;

    let db = cdc.t.db.clone();
    let writer = tokio::spawn(async move {
        let mut ids = Vec::new();
        for round in 0..300 {
            ids.extend(ids_of(
                &append_events(&db, &format!("agg-{}", round % 10), 4).await,
            ));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ids
    });
    // Kill once some, but not all, events are on the broker.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let published =
            kafka::consume(&brokers, &topic, 40, Duration::from_secs(5), Duration::ZERO);
        if published.len() >= 40 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", relay.stderr().join("\n"));
    }
    relay.kill9();
    assert!(
        !writer.is_finished(),
        "the kill hit the middle of the stream"
    );

    let relay = cdc.relay(&brokers, &["--topic-template", &template]);
    cdc.wait_reading(Some(first), &relay).await;
    let ids = writer.await.unwrap();
    let messages = kafka::consume(
        &brokers,
        &topic,
        ids.len(),
        Duration::from_secs(90),
        Duration::from_secs(1),
    );
    let report = check_stream(&messages, &ids);
    eprintln!(
        "{} events, {} messages, {} duplicates after the kill",
        ids.len(),
        messages.len(),
        report.duplicates
    );
    drop(relay);
    cdc.drop().await;
}

/// One transaction of 50,000 events is sent in pieces as it is read; a
/// relay killed after the first pieces confirmed nothing of it, so the next
/// relay publishes the whole transaction again, in order: every event
/// arrives (at least once), each aggregate's events in insertion order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_transaction_killed_midway_is_published_whole_again() {
    const ROWS: usize = 50_000;
    let cdc = CdcDb::new().await;
    let mut relay = cdc.relay("127.0.0.1:1", &["--sink", "stdout"]);
    let first = cdc.wait_reading(None, &relay).await;
    cdc.t
        .db
        .execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'Invoice', 'inv-' || (g % 7), 'InvoiceIssued', \
             json_build_object('n', g)::jsonb FROM generate_series(1, {ROWS}) AS g"
        ))
        .await
        .expect("one large transaction");
    // Pieces go out before the transaction is read to its end.
    let deadline = Instant::now() + Duration::from_secs(60);
    while relay.stdout().len() < 1_000 {
        assert!(Instant::now() < deadline, "{}", relay.stderr().join("\n"));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    relay.kill9();
    let before_kill = relay.stdout().len();
    assert!(
        before_kill < ROWS,
        "the kill came after the whole transaction"
    );

    let mut relay = cdc.relay("127.0.0.1:1", &["--sink", "stdout"]);
    cdc.wait_reading(Some(first), &relay).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while cdc.t.count("outbox WHERE published_at IS NULL").await > 0 {
        assert!(
            Instant::now() < deadline && relay.is_running(),
            "{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines = relay.stdout();
    // Nothing of the transaction was confirmed: the second relay sent it whole.
    assert_eq!(lines.len(), ROWS, "{before_kill} lines before the kill");
    let mut last: std::collections::HashMap<String, i64> = Default::default();
    for line in &lines {
        let message: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let key = message["key"].as_str().expect("key").to_owned();
        let n = message["payload"]["n"].as_i64().expect("n");
        let previous = last.insert(key.clone(), n).unwrap_or(0);
        assert!(n > previous, "{key}: {n} after {previous}");
    }
    assert_eq!(last.len(), 7);
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));
    cdc.drop().await;
}

/// One transaction of 200,000 events of about 200 bytes, read over TLS
/// (`sslmode=require`) and published to the Kafka-API broker, with the
/// relay killed (SIGKILL) in its middle, once the first pieces were
/// acknowledged: the next relay publishes the transaction again, so every
/// event is on the broker, each aggregate's first arrivals in insertion
/// order, and the events sent before the kill a second time. Both relays'
/// peak memory stays bounded because the transaction is sent in pieces as
/// it is read, with a bounded producer queue (before, the relay held it
/// whole: 352 MB in a release build). The broker's consumer is the
/// witness, counted by event id.
///
/// The bound is 32 MB for a release build (see BENCHMARKS.md).
/// The debug binary the tests spawn holds more, so it gets 64 MiB of room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200000_event_transaction_over_tls_survives_a_kill_midway_in_bounded_memory() {
    const ROWS: usize = 200_000;
    const PEAK_RSS_KIB: u64 = 64 << 10;
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("cdclarge");
    let template = format!("{topics}.{{aggregatetype}}");
    let topic = format!("{topics}.Invoice");
    let cdc = CdcDb::new().await;
    let url = format!("{}&sslmode=require", cdc.t.url);
    let mut relay = cdc.relay_at(&url, &brokers, &["--topic-template", &template]);
    let first = cdc.wait_reading(None, &relay).await;
    cdc.t
        .db
        .execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'Invoice', 'inv-' || (g % 100), 'InvoiceIssued', \
             json_build_object('n', g, 'note', repeat('x', 170))::jsonb \
             FROM generate_series(1, {ROWS}) AS g"
        ))
        .await
        .expect("one large transaction");
    // Pieces are acknowledged and marked as they go, long before the
    // transaction's end is read: the kill comes in its middle.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let pending = cdc.t.count("outbox WHERE published_at IS NULL").await;
        if pending <= ROWS as i64 - 5_000 {
            break;
        }
        assert!(
            Instant::now() < deadline && relay.is_running(),
            "{pending} rows pending; stderr:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut peaks = vec![relay.peak_rss_kib()];
    relay.kill9();
    let pending = cdc.t.count("outbox WHERE published_at IS NULL").await as usize;
    assert!(pending > 0, "the kill came after the whole transaction");
    let sent_before_kill = ROWS - pending;

    let mut relay = cdc.relay_at(&url, &brokers, &["--topic-template", &template]);
    cdc.wait_reading(Some(first), &relay).await;
    let deadline = Instant::now() + Duration::from_secs(300);
    while cdc.t.count("outbox WHERE published_at IS NULL").await > 0 {
        assert!(
            Instant::now() < deadline && relay.is_running(),
            "rows still pending; stderr:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    peaks.push(relay.peak_rss_kib());
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));

    let messages = kafka::consume(
        &brokers,
        &topic,
        ROWS + sent_before_kill,
        Duration::from_secs(300),
        Duration::from_secs(2),
    );
    let mut ids = std::collections::HashSet::with_capacity(ROWS);
    let mut last: std::collections::HashMap<String, i64> = Default::default();
    let mut again = 0;
    for message in &messages {
        let id = message.header("id").expect("an id header").to_owned();
        let key = message.key.clone().expect("a key");
        let n = message.json()["n"].as_i64().expect("n");
        if !ids.insert(id) {
            again += 1;
            continue;
        }
        let previous = last.insert(key.clone(), n).unwrap_or(0);
        assert!(n > previous, "{key}: {n} arrived first after {previous}");
    }
    assert_eq!(ids.len(), ROWS, "events missing on the broker");
    assert_eq!(last.len(), 100);
    assert!(
        again >= sent_before_kill,
        "the transaction was sent again whole: {again} copies, \
         {sent_before_kill} acknowledged before the kill"
    );
    eprintln!("peak RSS {peaks:?} KiB (killed, next) for one transaction of {ROWS} events");
    for peak in peaks {
        assert!(
            peak <= PEAK_RSS_KIB,
            "a relay peaked at {peak} KiB reading one transaction of {ROWS} events \
             (bound {PEAK_RSS_KIB} KiB)"
        );
    }
    cdc.drop().await;
}

/// A second relay on the same slot stands by and takes over when the
/// reading one dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_takes_over_when_the_reader_dies() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("cdcstandby");
    let template = format!("{topics}.{{aggregatetype}}");
    let topic = format!("{topics}.Invoice");
    let cdc = CdcDb::new().await;
    let mut active = cdc.relay(&brokers, &["--topic-template", &template]);
    let first = cdc.wait_reading(None, &active).await;
    let standby = cdc.relay(&brokers, &["--topic-template", &template]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !standby
        .stderr()
        .iter()
        .any(|line| line.contains("standing by"))
    {
        assert!(
            Instant::now() < deadline,
            "the second relay stands by: {}",
            standby.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut ids = ids_of(&append_events(&cdc.t.db, "before", 5).await);
    assert_eq!(
        kafka::consume(&brokers, &topic, 5, Duration::from_secs(30), Duration::ZERO).len(),
        5
    );
    active.kill9();
    ids.extend(ids_of(&append_events(&cdc.t.db, "after", 5).await));
    cdc.wait_reading(Some(first), &standby).await;
    ids.extend(ids_of(&append_events(&cdc.t.db, "after", 5).await));
    let messages = kafka::consume(
        &brokers,
        &topic,
        ids.len(),
        Duration::from_secs(60),
        Duration::from_millis(500),
    );
    check_stream(&messages, &ids);
    assert!(
        standby
            .stderr()
            .iter()
            .any(|line| line.contains("reading the replication slot")),
        "{}",
        standby.stderr().join("\n")
    );
    drop(standby);
    cdc.drop().await;
}

/// The same rows published by the polling relay and by CDC mode give the
/// same messages, byte for byte (standard output shows topic, key, headers
/// in order and payload).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn polling_and_cdc_publish_identical_messages() {
    let cdc = CdcDb::new().await;
    let mut relay = cdc.relay("127.0.0.1:1", &["--sink", "stdout"]);
    cdc.wait_reading(None, &relay).await;

    let txn = cdc.t.db.begin().await.unwrap();
    outbox_core::append(
        &txn,
        [
            OutboxEvent::new(InvoiceIssuedV2 {
                amount_cents: 990,
                note: Some("naïve ☕ \"quoted\"".into()),
            })
            .aggregate_id("inv-1")
            .traceparent(TRACEPARENT),
            OutboxEvent::new(InvoiceIssuedV2 {
                amount_cents: 5,
                note: None,
            })
            .aggregate_id("inv-1"),
        ],
    )
    .await
    .unwrap();
    txn.commit().await.unwrap();
    cdc.t
        .db
        .execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES \
             ('{}', 'Customer', 'c-7', 'CustomerRegistered', '{{\"name\": \"ada\", \"tags\": [1, 2.50]}}'), \
             ('{}', 'Customer', 'c-8', 'CustomerForgotten', NULL)",
            uuid::Uuid::now_v7(),
            uuid::Uuid::now_v7()
        ))
        .await
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    while relay.stdout().len() < 4 {
        assert!(
            Instant::now() < deadline,
            "CDC published 4 messages: {:?}\n{}",
            relay.stdout(),
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));
    let from_wal = relay.stdout();

    // CDC marked the rows published; make them pending for the polling relay.
    cdc.t
        .db
        .execute_unprepared("UPDATE outbox SET published_at = NULL")
        .await
        .unwrap();
    let (code, from_table, stderr) = run_to_end(
        Path::new(RELAY),
        &["run", "--drain", "--sink", "stdout"],
        &[("DATABASE_URL", &cdc.t.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    let from_table: Vec<String> = from_table.lines().map(str::to_owned).collect();
    assert_eq!(from_wal, from_table);
    assert!(from_wal[0].contains(TRACEPARENT), "{}", from_wal[0]);
    cdc.drop().await;
}

/// CDC mode with `sslmode=require`: the replication connection and the
/// SQL connections are encrypted (the server's `pg_stat_ssl` says so), and
/// the rows arrive and are marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cdc_mode_reads_the_slot_over_tls() {
    let cdc = CdcDb::new().await;
    let name = format!("cdc-tls-{}", uuid::Uuid::now_v7().simple());
    let url = format!("{}&sslmode=require&application_name={name}", cdc.t.url);
    let mut relay = cdc.relay_at(&url, "127.0.0.1:1", &["--sink", "stdout"]);
    let reader = cdc.wait_reading(None, &relay).await;
    let encrypted = cdc
        .query_i64(&format!(
            "SELECT count(*)::int8 FROM pg_stat_ssl WHERE pid = {reader} AND ssl"
        ))
        .await;
    assert_eq!(
        encrypted,
        Some(1),
        "the replication connection is not encrypted"
    );
    let appended = append_events(&cdc.t.db, "inv-tls", 3).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while cdc.t.count("outbox WHERE published_at IS NOT NULL").await < 3 {
        assert!(
            Instant::now() < deadline && relay.is_running(),
            "not marked over TLS; stderr:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let printed = relay.stdout().join("\n");
    for event in &appended {
        let id = event.id.to_string();
        assert!(printed.contains(&id), "{id} not published: {printed}");
    }
    let sessions = |encrypted: bool| {
        format!(
            "SELECT count(*)::int8 FROM pg_stat_activity AS a JOIN pg_stat_ssl AS s \
             ON s.pid = a.pid WHERE a.application_name = '{name}' AND s.ssl = {encrypted}"
        )
    };
    assert!(
        cdc.query_i64(&sessions(true)).await >= Some(1),
        "no SQL session over TLS"
    );
    assert_eq!(
        cdc.query_i64(&sessions(false)).await,
        Some(0),
        "a SQL connection of the relay is not encrypted"
    );
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));
    cdc.drop().await;
}

/// The broker goes away mid-stream: nothing is confirmed past what it
/// acknowledged, and publishing resumes when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishing_resumes_after_a_broker_outage() {
    let mut broker = PrivateBroker::start();
    let topics = kafka::topic_prefix("cdcoutage");
    let template = format!("{topics}.{{aggregatetype}}");
    let topic = format!("{topics}.Invoice");
    let cdc = CdcDb::new().await;
    let relay = cdc.relay(
        &broker.address,
        &[
            "--topic-template",
            &template,
            "--send-timeout",
            "2s",
            // Small batches: the outage's events fill the read-ahead.
            "--batch-size",
            "2",
        ],
    );
    cdc.wait_reading(None, &relay).await;
    let mut ids = ids_of(&append_events(&cdc.t.db, "agg-1", 3).await);
    let consumed = |expected: usize, broker: &PrivateBroker| -> Vec<Consumed> {
        kafka::consume(
            &broker.address,
            &topic,
            expected,
            Duration::from_secs(60),
            Duration::from_millis(300),
        )
    };
    assert_eq!(consumed(3, &broker).len(), 3);

    // The memory-backed broker loses its topics when stopped: what counts
    // is that everything written during the outage arrives afterwards.
    broker.stop();
    let mut during = Vec::new();
    for _ in 0..20 {
        during.extend(ids_of(&append_events(&cdc.t.db, "agg-1", 1).await));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        cdc.t.count("outbox WHERE published_at IS NULL").await >= 20,
        "nothing is marked while the broker is away"
    );
    broker.restart();
    ids.extend(during.iter().cloned());
    ids.extend(ids_of(&append_events(&cdc.t.db, "agg-1", 2).await));
    let messages = consumed(22, &broker);
    let received: std::collections::HashSet<&str> = messages
        .iter()
        .filter_map(|message| message.header("id"))
        .collect();
    let mut first_arrivals: Vec<i64> = Vec::new();
    for message in &messages {
        let sequence: i64 = message
            .header("aggregateSequence")
            .unwrap()
            .parse()
            .unwrap();
        if !first_arrivals.contains(&sequence) {
            first_arrivals.push(sequence);
        }
    }
    assert!(
        first_arrivals.is_sorted(),
        "the aggregate's events arrive in order: {first_arrivals:?}"
    );
    for id in ids.iter().skip(3) {
        assert!(
            received.contains(id.as_str()),
            "event {id} arrived after the outage"
        );
    }
    drop(relay);
    cdc.drop().await;
}

/// `status` and the metrics report the slot; `cdc drop-slot` refuses a
/// slot in use and drops a free one; CDC mode on another database is
/// refused in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_metrics_and_slot_cleanup() {
    let cdc = CdcDb::new().await;
    let addr = format!("127.0.0.1:{}", kafka::free_port());
    let mut relay = cdc.relay(
        "127.0.0.1:1",
        &[
            "--sink",
            "stdout",
            "--metrics-addr",
            &addr,
            "--metrics-interval",
            "200ms",
        ],
    );
    cdc.wait_reading(None, &relay).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = get(&addr, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        if sample(&metrics, "outbox_cdc_reading") == Some(1.0)
            && sample(&metrics, "outbox_cdc_slot_retained_wal_bytes").is_some()
            && sample(&metrics, "outbox_cdc_slot_behind_bytes").is_some()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot metrics appear: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let env = [("DATABASE_URL", cdc.t.url.as_str())];
    let (code, stdout, stderr) = run_to_end(
        Path::new(RELAY),
        &["status", "--json", "--slot", cdc.name()],
        &env,
    );
    assert_eq!(code, 0, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["cdc_slot"]["slot"], cdc.name());
    assert_eq!(status["cdc_slot"]["active"], true);
    assert!(status["cdc_slot"]["retained_wal_bytes"].as_i64().unwrap() >= 0);

    let (code, _, stderr) = run_to_end(
        Path::new(RELAY),
        &["cdc", "drop-slot", "--slot", cdc.name()],
        &env,
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("in use by a running relay"), "{stderr}");

    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));
    let (code, _, stderr) = run_to_end(
        Path::new(RELAY),
        &[
            "cdc",
            "drop-slot",
            "--slot",
            cdc.name(),
            "--publication",
            cdc.name(),
        ],
        &env,
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("dropped replication slot"), "{stderr}");
    assert_eq!(cdc.reader_pid().await, None);

    let (code, _, stderr) = run_to_end(
        Path::new(RELAY),
        &["run", "--mode", "cdc", "--database-url", "sqlite://cdc.db"],
        &[],
    );
    assert_eq!(code, 1);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--mode cdc"), "{stderr}");
    cdc.drop().await;
}

/// WAL written elsewhere while the outbox table is quiet does not stay
/// pinned by the slot: the relay confirms the positions it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_outbox_table_does_not_pin_wal() {
    let cdc = CdcDb::new().await;
    let relay = cdc.relay("127.0.0.1:1", &["--sink", "stdout"]);
    cdc.wait_reading(None, &relay).await;
    let wal_position = || async {
        let row = cdc
            .t
            .db
            .query_one_raw(Statement::from_string(
                cdc.t.db_backend(),
                "SELECT pg_current_wal_lsn()::text".to_owned(),
            ))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index::<String>(0).unwrap()
    };
    let before = wal_position().await;
    cdc.t
        .db
        .execute_unprepared(
            "CREATE TABLE busy AS SELECT g AS n, repeat('x', 200) AS pad \
             FROM generate_series(1, 20000) AS g",
        )
        .await
        .unwrap();
    let after = wal_position().await;
    let written = cdc
        .query_i64(&format!(
            "SELECT pg_wal_lsn_diff('{after}', '{before}')::int8"
        ))
        .await
        .unwrap();
    assert!(written > 1_000_000, "the table wrote WAL: {written} bytes");
    let confirmed = format!(
        "SELECT (confirmed_flush_lsn >= '{after}')::int4::int8 FROM pg_replication_slots \
         WHERE slot_name = '{}'",
        cdc.name()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while cdc.query_i64(&confirmed).await != Some(1) {
        assert!(
            Instant::now() < deadline,
            "the slot is not confirmed past {after}; stderr:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(relay.stdout().is_empty(), "nothing to publish");
    drop(relay);
    cdc.drop().await;
}

/// The server ends the replication connection (as a restart or an
/// administrator would): the relay reconnects and goes on from the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_replication_connection_is_reopened() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("cdcreconnect");
    let template = format!("{topics}.{{aggregatetype}}");
    let cdc = CdcDb::new().await;
    let relay = cdc.relay(&brokers, &["--topic-template", &template]);
    let first = cdc.wait_reading(None, &relay).await;
    let mut ids = ids_of(&append_events(&cdc.t.db, "agg-1", 3).await);
    cdc.t
        .db
        .execute_unprepared(&format!("SELECT pg_terminate_backend({first})"))
        .await
        .unwrap();
    ids.extend(ids_of(&append_events(&cdc.t.db, "agg-1", 3).await));
    cdc.wait_reading(Some(first), &relay).await;
    ids.extend(ids_of(&append_events(&cdc.t.db, "agg-1", 3).await));
    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        ids.len(),
        Duration::from_secs(60),
        Duration::from_millis(500),
    );
    check_stream(&messages, &ids);
    assert!(
        relay
            .stderr()
            .iter()
            .any(|line| line.contains("replication stream failed; reconnecting")),
        "{}",
        relay.stderr().join("\n")
    );
    // The server ending this relay's own session is no takeover, even when
    // a batch was about to be sent at that moment.
    assert!(
        !relay
            .stderr()
            .iter()
            .any(|line| line.contains("took the replication slot over")),
        "{}",
        relay.stderr().join("\n")
    );
    drop(relay);
    cdc.drop().await;
}

/// Inserts a row by plain SQL created `days` days from now (in a day
/// partition of a partitioned outbox); returns its id.
async fn insert_days_ahead(cdc: &CdcDb, aggregate_id: &str, days: u32) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    cdc.t
        .db
        .execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
             VALUES ('{id}', 'Invoice', '{aggregate_id}', 'InvoiceIssued', '{{}}', \
             now() + interval '{days} days')"
        ))
        .await
        .unwrap();
    id
}

/// Waits until `count` rows are marked published, the relay running.
async fn wait_marked(cdc: &CdcDb, relay: &mut RelayProcess, count: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while cdc.t.count("outbox WHERE published_at IS NOT NULL").await < count {
        assert!(
            relay.is_running() && Instant::now() < deadline,
            "{} of {count} rows marked; stderr:\n{}",
            cdc.t.count("outbox WHERE published_at IS NOT NULL").await,
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `migrate --partitioned` while a CDC relay reads the plain outbox: the
/// events committed before the conversion (under the plain table's oid),
/// after it into the old rows' partition, and into a day partition (both
/// published through the partition root) all arrive, in order, and are
/// marked; the relay never stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_conversion_to_a_partitioned_outbox_loses_no_event() {
    let cdc = CdcDb::new().await;
    let mut relay = cdc.relay("127.0.0.1:1", &["--sink", "stdout"]);
    cdc.wait_reading(None, &relay).await;
    let mut written = ids_of(&append_events(&cdc.t.db, "inv-conv", 5).await);
    let (code, _, stderr) = run_to_end(
        Path::new(RELAY),
        &["migrate", "--partitioned"],
        &[("DATABASE_URL", &cdc.t.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    written.extend(ids_of(&append_events(&cdc.t.db, "inv-conv", 5).await));
    written.push(insert_days_ahead(&cdc, "inv-ahead", 2).await);
    written.extend(ids_of(&append_events(&cdc.t.db, "inv-conv", 5).await));
    wait_marked(&cdc, &mut relay, written.len() as i64).await;
    check_printed(&relay.stdout(), &written);
    relay.terminate();
    cdc.drop().await;
}

/// On an outbox partitioned from the start, CDC mode creates its
/// publication through the partition root and publishes rows of every
/// partition; a publication that does not publish through the root is
/// refused with the statement that fixes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cdc_mode_publishes_a_partitioned_outbox_through_its_root() {
    let cdc = CdcDb::new().await;
    let (code, _, stderr) = run_to_end(
        Path::new(RELAY),
        &["migrate", "--partitioned"],
        &[("DATABASE_URL", &cdc.t.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    let mut relay = cdc.relay("127.0.0.1:1", &["--sink", "stdout"]);
    cdc.wait_reading(None, &relay).await;
    let mut written = ids_of(&append_events(&cdc.t.db, "inv-part", 5).await);
    written.push(insert_days_ahead(&cdc, "inv-later", 3).await);
    wait_marked(&cdc, &mut relay, written.len() as i64).await;
    check_printed(&relay.stdout(), &written);
    relay.terminate();

    cdc.t
        .db
        .execute_unprepared(&format!(
            "ALTER PUBLICATION {} SET (publish_via_partition_root = false)",
            cdc.name()
        ))
        .await
        .unwrap();
    let mut refused = cdc.relay("127.0.0.1:1", &["--sink", "stdout"]);
    assert_eq!(refused.wait(Duration::from_secs(30)), Some(1));
    let stderr = refused.stderr().join("\n");
    assert!(
        stderr.contains("does not publish through the partition root")
            && stderr.contains("SET (publish_via_partition_root = true)"),
        "{stderr}"
    );
    cdc.drop().await;
}
