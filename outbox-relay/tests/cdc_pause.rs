//! CDC mode when the reading relay stops making progress without dying: a
//! relay frozen with SIGSTOP keeps its replication connection open, so its
//! server process still holds the slot. A standby on the same slot must
//! take over within the stated bound while the reader is frozen, and the
//! reader, once resumed, must publish nothing more.
//!
//! Like `cdc.rs`, the test uses a slot and a publication named after its
//! own schema and drops both at the end.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_tests::kafka;
use outbox_tests::process::RelayProcess;
use outbox_tests::stream::{append_events, check_stream};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// The README's bound: a standby takes over from a reader that stopped
/// making progress within 10 seconds.
const BOUND: Duration = Duration::from_secs(10);

/// How long the reader stays frozen: past the bound.
const PAUSE: Duration = Duration::from_secs(15);

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

    fn name(&self) -> &str {
        self.t.name()
    }

    /// Starts `outbox-relay run --mode cdc` on this database's slot.
    fn relay(&self, brokers: &str, extra: &[&str]) -> RelayProcess {
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
        RelayProcess::spawn(Path::new(RELAY), &args, &[("DATABASE_URL", &self.t.url)])
    }

    /// The server process streaming the slot to a relay, if any.
    async fn reader_pid(&self) -> Option<i64> {
        self.t
            .db
            .query_one_raw(Statement::from_string(
                self.t.db_backend(),
                format!(
                    "SELECT s.active_pid::int8 FROM pg_replication_slots AS s \
                     JOIN pg_stat_activity AS a ON a.pid = s.active_pid \
                     WHERE s.slot_name = '{}' AND s.active AND a.backend_type = 'walsender'",
                    self.name()
                ),
            ))
            .await
            .expect("query")
            .and_then(|row| row.try_get_by_index::<Option<i64>>(0).expect("value"))
    }

    /// Waits until a relay reads the slot; returns its server process.
    async fn wait_reading(&self, relay: &RelayProcess) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(pid) = self.reader_pid().await {
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
/// minutes, as `cdc.rs` does: the names are `outbox_t_<uuid v7>`, whose
/// first 48 bits are the creation time in milliseconds.
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
    for row in rows {
        let name: String = row.try_get_by_index(0).unwrap();
        let created_ms = name
            .get(9..21)
            .and_then(|hex| i64::from_str_radix(hex, 16).ok())
            .unwrap_or(0);
        if now_ms().saturating_sub(created_ms) > 3 * 60 * 1000 {
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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn wait_for_line(relay: &RelayProcess, text: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !relay.stderr().iter().any(|line| line.contains(text)) {
        assert!(
            Instant::now() < deadline,
            "no {text:?} within {within:?}; stderr:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGSTOP the reading relay in the middle of a stream, for longer than
/// the bound, while a writer goes on committing: the standby takes the
/// slot and publishes within the bound during the pause, logging its wait
/// at INFO once (no ERROR). After SIGCONT the old reader hands nothing more
/// to the broker: no message created after the resume repeats an event.
/// Every committed event arrives and each aggregate's events first arrive
/// in `aggregateSequence` order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_reader_loses_the_slot_and_sends_nothing_stale() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("cdcpause");
    let template = format!("{topics}.{{aggregatetype}}");
    let topic = format!("{topics}.Invoice");
    kafka::create_topic(&brokers, &topic, 2).await;
    let cdc = CdcDb::new().await;
    let reader = cdc.relay(&brokers, &["--topic-template", &template]);
    let first = cdc.wait_reading(&reader).await;
    let mut standby = cdc.relay(&brokers, &["--topic-template", &template]);
    wait_for_line(&standby, "standing by", Duration::from_secs(30)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let db = cdc.t.db.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let appended = append_events(&db, &format!("agg-{}", round % 8), 3).await;
                ids.extend(appended.iter().map(|event| event.id.to_string()));
                round += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            ids
        })
    };
    // Pause once the reader is publishing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while kafka::consume(&brokers, &topic, 60, Duration::from_secs(5), Duration::ZERO).len() < 60 {
        assert!(Instant::now() < deadline, "{}", reader.stderr().join("\n"));
    }
    let paused_at = now_ms();
    let paused = Instant::now();
    reader.signal("STOP");

    let taken_over = loop {
        if let Some(pid) = cdc.reader_pid().await
            && pid != first
        {
            break paused.elapsed();
        }
        assert!(
            paused.elapsed() <= BOUND,
            "the standby did not take the slot within {BOUND:?} of the pause; standby stderr:\n{}",
            standby.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("the standby read the slot {taken_over:?} after the pause");
    tokio::time::sleep(PAUSE.saturating_sub(paused.elapsed())).await;
    let resumed_at = now_ms();
    reader.signal("CONT");
    // The writer goes on for a while, so that a resumed reader that still
    // believed it read the slot would have something to send.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let ids = writer.await.unwrap();
    let timed = kafka::consume_timed(
        &brokers,
        &topic,
        ids.len(),
        Duration::from_secs(60),
        Duration::from_secs(3),
    );
    let messages: Vec<_> = timed.iter().map(|(message, _)| message.clone()).collect();
    let report = check_stream(&messages, &ids);
    let created: Vec<i64> = timed
        .iter()
        .map(|(_, timestamp)| timestamp.expect("a create time"))
        .collect();

    // Messages created during the pause are the standby's: the frozen
    // reader created none. The first of them came within the bound.
    let during_pause: Vec<i64> = created
        .iter()
        .copied()
        .filter(|&at| at >= paused_at && at < resumed_at)
        .collect();
    let first_during = during_pause.iter().min().copied().unwrap_or(i64::MAX);
    assert!(
        first_during - paused_at <= BOUND.as_millis() as i64,
        "the standby published within {BOUND:?} of the pause (first message {} ms after it)",
        first_during.saturating_sub(paused_at)
    );

    // After the resume, the standby only sends events it has not sent
    // before: a repeated event created then came from the old reader.
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for message in &messages {
        *copies.entry(message.header("id").unwrap()).or_default() += 1;
    }
    let stale: Vec<&str> = messages
        .iter()
        .zip(&created)
        .filter(|(message, at)| **at >= resumed_at && copies[message.header("id").unwrap()] > 1)
        .map(|(message, _)| message.header("id").unwrap())
        .collect();
    // What the reader had handed to the producer before it froze may still
    // go out when it resumes (the residual window): created before the
    // pause, stored after a message the standby created, in a partition.
    let mut standby_wrote: HashMap<i32, bool> = HashMap::new();
    let mut residual = 0;
    for (message, at) in &timed {
        let after_standby = standby_wrote.entry(message.partition).or_default();
        if at.unwrap() >= paused_at {
            *after_standby = true;
        } else if *after_standby {
            residual += 1;
        }
    }
    eprintln!(
        "{} events, {} messages, {} duplicates, {} created during the pause, \
         {} created before the pause and stored after the standby's, {} stale after the resume",
        ids.len(),
        messages.len(),
        report.duplicates,
        during_pause.len(),
        residual,
        stale.len()
    );
    for (name, relay) in [("reader", &reader), ("standby", &standby)] {
        for line in relay.stderr() {
            if line.contains("slot") && !line.contains("relay started") {
                eprintln!("{name}: {line}");
            }
        }
    }
    assert!(
        stale.is_empty(),
        "the resumed reader published {} events again after losing the slot, e.g. {:?}; its stderr:\n{}",
        stale.len(),
        &stale[..stale.len().min(5)],
        reader.stderr().join("\n")
    );

    let standby_log = standby.stderr();
    assert_eq!(
        standby_log
            .iter()
            .filter(|line| line.contains("standing by"))
            .count(),
        1,
        "the standby says once that it waits: {}",
        standby_log.join("\n")
    );
    assert!(
        !standby_log.iter().any(|line| line.contains("ERROR")),
        "the waiting standby logs no error: {}",
        standby_log.join("\n")
    );
    let mut reader = reader;
    assert!(
        reader.is_running(),
        "the resumed reader keeps running as a standby"
    );
    assert!(standby.is_running(), "{}", standby.stderr().join("\n"));
    assert_ne!(
        cdc.reader_pid().await,
        Some(first),
        "the old reader did not get the slot back"
    );
    drop(reader);
    drop(standby);
    cdc.drop().await;
}

/// Silence means a reader that stopped, not one waiting on its broker: with
/// the broker gone for longer than the bound while more events are written
/// than the relay reads ahead, the reader keeps sending status updates and
/// keeps the slot, the standby
/// stays quiet, and everything written meanwhile arrives once the broker is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_waiting_on_its_broker_keeps_the_slot() {
    let mut broker = kafka::PrivateBroker::start();
    let topics = kafka::topic_prefix("cdcslowbroker");
    let template = format!("{topics}.{{aggregatetype}}");
    let topic = format!("{topics}.Invoice");
    let cdc = CdcDb::new().await;
    // Small batches: the outage's events fill the read-ahead.
    let args = [
        "--topic-template",
        template.as_str(),
        "--send-timeout",
        "2s",
        "--batch-size",
        "2",
    ];
    let reader = cdc.relay(&broker.address, &args);
    let first = cdc.wait_reading(&reader).await;
    let standby = cdc.relay(&broker.address, &args);
    wait_for_line(&standby, "standing by", Duration::from_secs(30)).await;
    append_events(&cdc.t.db, "agg-1", 2).await;
    assert_eq!(
        kafka::consume(
            &broker.address,
            &topic,
            2,
            Duration::from_secs(30),
            Duration::ZERO
        )
        .len(),
        2
    );

    broker.stop();
    let outage = Instant::now();
    let mut during = Vec::new();
    // More than the replication client buffers (8192 events): its reading
    // stops too, and only its status updates go on.
    for aggregate in 0..5 {
        let appended = append_events(&cdc.t.db, &format!("big-{aggregate}"), 2000).await;
        during.extend(appended.iter().map(|event| event.id.to_string()));
    }
    while outage.elapsed() < BOUND + Duration::from_secs(2) {
        let appended = append_events(&cdc.t.db, "agg-1", 5).await;
        during.extend(appended.iter().map(|event| event.id.to_string()));
        assert_eq!(
            cdc.reader_pid().await,
            Some(first),
            "the reader lost the slot while waiting on its broker; standby stderr:\n{}",
            standby.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    broker.restart();
    // The memory-backed broker lost its topics: what counts is that what
    // was written during the outage arrives.
    let messages = kafka::consume(
        &broker.address,
        &topic,
        during.len(),
        Duration::from_secs(60),
        Duration::from_millis(300),
    );
    let received: std::collections::HashSet<&str> = messages
        .iter()
        .filter_map(|message| message.header("id"))
        .collect();
    for id in &during {
        assert!(received.contains(id.as_str()), "event {id} arrived");
    }
    assert_eq!(cdc.reader_pid().await, Some(first));
    assert!(
        !standby
            .stderr()
            .iter()
            .any(|line| line.contains("stopped making progress") || line.contains("ERROR")),
        "{}",
        standby.stderr().join("\n")
    );
    drop(reader);
    drop(standby);
    cdc.drop().await;
}
