//! Per-aggregate order under concurrent writers, checked against an
//! independent witness (issue 13).
//!
//! Eight or more writer tasks, each on its own connection, save events for
//! a few aggregates (2, 5 or 20) in short transactions, many rounds each,
//! holding a transaction open a random 0-3 ms after the append so that
//! writers queue on an aggregate's sequence row. Each writer records, after
//! `commit`, what it committed: aggregate, the `aggregate_seq` the append
//! returned, event id and payload. The real `outbox-relay` binary (one,
//! two or three instances, polling or CDC) publishes to the real Kafka-API
//! broker while the writers write, and a consumer of the test's own reads
//! the topic from the start. [`outbox_tests::witness::check`] then demands,
//! per aggregate, that the first deliveries in partition/offset order are
//! exactly 1, 2, ..., n (strictly increasing, no gap, nothing missing),
//! that repeats are exact re-sends, and that the delivered event ids are
//! exactly the committed ones. Nothing is read back from the outbox table.
//!
//! `OUTBOX_SOAK_ROUNDS` (transactions per writer, default
//! [`DEFAULT_ROUNDS`]) and `OUTBOX_SOAK_WRITERS` (default 8) scale the
//! load; `scripts/soak-ordering.sh` runs these tests with many rounds,
//! repeatedly, for a release.

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use outbox_core::OutboxEvent;
use outbox_tests::events::InvoiceIssuedV2;
use outbox_tests::kafka;
use outbox_tests::process::RelayProcess;
use outbox_tests::witness::{Committed, TopicReader, check};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement, TransactionTrait};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// Transactions per writer unless `OUTBOX_SOAK_ROUNDS` says otherwise.
const DEFAULT_ROUNDS: usize = 60;
/// Writer tasks unless `OUTBOX_SOAK_WRITERS` says otherwise (at least 8).
const DEFAULT_WRITERS: usize = 8;
/// Partitions of the test's topic: several, so that the witness also sees
/// each aggregate keep to one partition.
const PARTITIONS: i32 = 4;
/// The aggregate type of [`InvoiceIssuedV2`], the last part of the topic.
const AGGREGATE_TYPE: &str = "Invoice";

fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
        Err(_) => default,
    }
}

fn rounds() -> usize {
    env_count("OUTBOX_SOAK_ROUNDS", DEFAULT_ROUNDS).max(1)
}

fn writers() -> usize {
    env_count("OUTBOX_SOAK_WRITERS", DEFAULT_WRITERS).max(8)
}

/// How the relays read committed rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `run` (claiming from the table), shard ownership on by default.
    Poll,
    /// `run --mode cdc` (PostgreSQL's write-ahead log).
    Cdc,
}

/// One case: a backend, how many aggregates the writers share, how many
/// relays publish and whether one of them is killed with SIGKILL when half
/// the transactions have committed.
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    backend: Backend,
    mode: Mode,
    aggregates: usize,
    relays: usize,
    kill_one: bool,
    /// The relays' `--batch-size`, when not the default: small batches cut
    /// aggregates' runs between claims.
    batch_size: Option<&'static str>,
}

impl Case {
    const fn poll(name: &'static str, backend: Backend, aggregates: usize, relays: usize) -> Self {
        Self {
            name,
            backend,
            mode: Mode::Poll,
            aggregates,
            relays,
            kill_one: false,
            batch_size: None,
        }
    }
}

/// A tiny xorshift generator, seeded from the standard library's random
/// hasher keys (no extra dependency).
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Self(seed | 1)
    }

    fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % bound as u64) as usize
    }
}

/// What one writer committed, and how often SQLite turned a transaction
/// away (`database is locked`) before it committed.
struct Written {
    committed: Vec<Committed>,
    busy_retries: usize,
}

/// At most this many `database is locked` retries of one transaction.
const MAX_BUSY_RETRIES: usize = 50;

/// One writer task: `rounds` transactions on its own connection, each
/// appending 1 to 3 events to one aggregate picked at random and holding
/// the transaction 0-3 ms before committing. Records what it committed
/// after each `commit`. On SQLite, a transaction refused with `database is
/// locked` (busy timeout exceeded under contention; nothing was committed)
/// is rolled back and run again, as an application would; any other error
/// fails the test.
async fn write(
    url: String,
    writer: usize,
    rounds: usize,
    aggregates: usize,
    transactions: Arc<AtomicUsize>,
) -> Written {
    let db = outbox_tests::db::connect(&url).await;
    let sqlite = db.get_database_backend() == sea_orm::DbBackend::Sqlite;
    let busy =
        |error: &dyn std::fmt::Display| sqlite && error.to_string().contains("database is locked");
    let mut rng = Rng::new();
    let mut written = Written {
        committed: Vec::new(),
        busy_retries: 0,
    };
    for round in 0..rounds {
        let aggregate = format!("agg-{}", rng.below(aggregates));
        let count = match rng.below(10) {
            0 => 3,
            1 | 2 => 2,
            _ => 1,
        };
        let events: Vec<InvoiceIssuedV2> = (0..count)
            .map(|n| InvoiceIssuedV2 {
                amount_cents: (writer * 1_000_000 + round * 10 + n) as i64,
                note: Some(format!("writer {writer} round {round} event {n}")),
            })
            .collect();
        let mut attempt = 0;
        let appended = loop {
            attempt += 1;
            assert!(
                attempt <= MAX_BUSY_RETRIES,
                "writer {writer} round {round}: SQLite refused {MAX_BUSY_RETRIES} times with \
                 `database is locked`"
            );
            let txn = db
                .begin()
                .await
                .unwrap_or_else(|e| panic!("writer {writer} round {round}: begin: {e}"));
            let appended = match outbox_core::append(
                &txn,
                events
                    .iter()
                    .map(|event| OutboxEvent::new(event.clone()).aggregate_id(aggregate.clone())),
            )
            .await
            {
                Ok(appended) => appended,
                Err(e) if busy(&e) => {
                    txn.rollback().await.ok();
                    written.busy_retries += 1;
                    continue;
                }
                Err(e) => panic!("writer {writer} round {round}: append to {aggregate}: {e}"),
            };
            let hold = rng.below(4);
            if hold > 0 {
                tokio::time::sleep(Duration::from_millis(hold as u64)).await;
            }
            match txn.commit().await {
                Ok(()) => break appended,
                // SQLITE_BUSY on COMMIT: not committed; dropping the
                // transaction rolled it back.
                Err(e) if busy(&e) => written.busy_retries += 1,
                Err(e) => panic!("writer {writer} round {round}: commit: {e}"),
            }
        };
        for (event, appended) in events.iter().zip(&appended) {
            written.committed.push(Committed {
                writer,
                aggregate_id: appended.aggregate_id.clone(),
                sequence: appended.sequence,
                id: appended.id.to_string(),
                payload: serde_json::to_value(event).expect("payload"),
            });
        }
        transactions.fetch_add(1, Ordering::SeqCst);
    }
    db.close().await.ok();
    written
}

/// The relays of a case, started as an operator would.
struct Relays {
    processes: Vec<(String, RelayProcess)>,
}

impl Relays {
    fn start(case: &Case, t: &TestDb, brokers: &str, template: &str) -> Self {
        let processes = (0..case.relays)
            .map(|n| {
                // Unique to this test: a takeover ends the previous owner's
                // sessions by instance id on the whole database, where
                // other tests' relays run too.
                let instance = format!("relay-{n}@{}", &t.name()[t.name().len() - 12..]);
                let mut args = vec!["run", "--topic-template", template];
                match case.mode {
                    Mode::Poll => args.extend([
                        "--instance-id",
                        &instance,
                        "--lease",
                        "2s",
                        "--poll-interval",
                        "50ms",
                    ]),
                    Mode::Cdc => args.extend([
                        "--mode",
                        "cdc",
                        "--slot",
                        t.name(),
                        "--publication",
                        t.name(),
                    ]),
                }
                if let Some(batch_size) = case.batch_size {
                    args.extend(["--batch-size", batch_size]);
                }
                let process = RelayProcess::spawn(
                    Path::new(RELAY),
                    &args,
                    &[("DATABASE_URL", &t.url), ("KAFKA_BROKERS", brokers)],
                );
                (instance, process)
            })
            .collect();
        Self { processes }
    }

    fn stderr_tails(&self) -> String {
        self.processes
            .iter()
            .map(|(instance, process)| {
                let lines = process.stderr();
                let tail = &lines[lines.len().saturating_sub(15)..];
                format!("--- {instance} (last stderr lines):\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn kill(&mut self, instance: &str) {
        let (_, process) = self
            .processes
            .iter_mut()
            .find(|(name, _)| name == instance)
            .expect("a relay of that name");
        process.kill9();
    }
}

async fn query_strings(t: &TestDb, sql: &str) -> Vec<String> {
    t.db.query_all_raw(Statement::from_string(t.db_backend(), sql.to_owned()))
        .await
        .expect("query")
        .iter()
        .map(|row| row.try_get_by_index::<String>(0).expect("text column"))
        .collect()
}

/// Waits until the relays are publishing: every polling relay owns shards
/// (SQLite has none), the CDC relay reads its slot.
async fn wait_ready(case: &Case, t: &TestDb, relays: &Relays) {
    let sql = match (case.mode, case.backend) {
        (Mode::Poll, Backend::Sqlite) => return,
        (Mode::Poll, _) => {
            "SELECT DISTINCT owner FROM outbox_relay_shard WHERE owner IS NOT NULL".to_owned()
        }
        (Mode::Cdc, _) => format!(
            "SELECT a.pid::text FROM pg_replication_slots AS s \
             JOIN pg_stat_activity AS a ON a.pid = s.active_pid \
             WHERE s.slot_name = '{}' AND s.active AND a.backend_type = 'walsender'",
            t.name()
        ),
    };
    let want = match case.mode {
        Mode::Poll => case.relays,
        Mode::Cdc => 1,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while query_strings(t, &sql).await.len() < want {
        assert!(
            Instant::now() < deadline,
            "{}: the relays did not start within 30s\n{}",
            case.name,
            relays.stderr_tails()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The relay to kill: the owner of aggregate `agg-0`'s shard on
/// PostgreSQL (so the kill hits a relay with work), else the first relay.
async fn victim(t: &TestDb, relays: &Relays) -> String {
    let owner = query_strings(
        t,
        &format!(
            "SELECT owner FROM outbox_relay_shard WHERE owner IS NOT NULL AND shard = \
             ((hashtextextended('{AGGREGATE_TYPE}/agg-0', 0) % 16) + 16) % 16"
        ),
    )
    .await;
    owner
        .into_iter()
        .next()
        .unwrap_or_else(|| relays.processes[0].0.clone())
}

/// CDC: drops the test's slot and publication once no relay reads it.
async fn drop_slot(t: &TestDb) {
    let name = t.name();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let active = query_strings(
            t,
            &format!(
                "SELECT slot_name::text FROM pg_replication_slots \
                 WHERE slot_name = '{name}' AND active"
            ),
        )
        .await;
        if active.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t.db.execute_unprepared(&format!(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = '{name}'"
    ))
    .await
    .expect("drop the test's slot");
    t.db.execute_unprepared(&format!("DROP PUBLICATION IF EXISTS {name}"))
        .await
        .expect("drop the test's publication");
}

/// The write side, read from the table itself: per aggregate, in `seq`
/// order (the order the relay claims in), the numbers 1, 2, 3, ...
async fn insertion_order(t: &TestDb) -> Result<(), String> {
    let mut by_aggregate: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for row in t.outbox_rows().await {
        by_aggregate
            .entry(row.aggregate_id)
            .or_default()
            .push(row.aggregate_seq.unwrap_or(0));
    }
    for (aggregate, numbers) in by_aggregate {
        if numbers
            .iter()
            .zip(1..)
            .any(|(&number, expected)| number != expected)
        {
            return Err(format!(
                "{aggregate}'s aggregate_seq in seq order reads {numbers:?}"
            ));
        }
    }
    Ok(())
}

async fn run(case: Case) {
    let started = Instant::now();
    let (writers, rounds) = (writers(), rounds());
    let brokers = kafka::brokers();
    let prefix = kafka::topic_prefix(case.name);
    let template = format!("{prefix}.{{aggregatetype}}");
    let topic = format!("{prefix}.{AGGREGATE_TYPE}");
    kafka::create_topic(&brokers, &topic, PARTITIONS).await;
    let t = TestDb::new(case.backend).await;

    let reader = TopicReader::start(&brokers, &topic, PARTITIONS);
    let mut relays = Relays::start(&case, &t, &brokers, &template);
    wait_ready(&case, &t, &relays).await;

    let transactions = Arc::new(AtomicUsize::new(0));
    let writing = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            tokio::spawn(write(
                t.url.clone(),
                writer,
                rounds,
                case.aggregates,
                transactions.clone(),
            ))
        })
        .collect();
    let mut killed = None;
    if case.kill_one {
        let half = writers * rounds / 2;
        while transactions.load(Ordering::SeqCst) < half
            && !tasks.iter().all(|task| task.is_finished())
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let instance = victim(&t, &relays).await;
        relays.kill(&instance);
        killed = Some(instance);
    }
    let mut committed = Vec::new();
    let mut busy_retries = 0;
    for task in tasks {
        let written = task.await.expect("writer task");
        committed.extend(written.committed);
        busy_retries += written.busy_retries;
    }
    let wrote = writing.elapsed();

    let ids: HashSet<String> = committed.iter().map(|event| event.id.clone()).collect();
    // Batches of a few rows take a claim cycle (tens of milliseconds on a
    // busy machine) per few events.
    let per_event = if case.batch_size.is_some() { 25 } else { 2 };
    let patience = Duration::from_secs(30) + Duration::from_millis(ids.len() as u64 * per_event);
    let all_arrived = reader.wait_for(&ids, patience).await;
    let drained = writing.elapsed();
    let delivered = reader.stop(Duration::from_millis(500)).await;
    let verdict = check(&committed, &delivered);
    let table = insertion_order(&t).await;
    let tails = relays.stderr_tails();
    drop(relays);
    if case.mode == Mode::Cdc {
        drop_slot(&t).await;
    }
    t.drop().await;

    if let Err(report) = table {
        panic!(
            "{}: the outbox table breaks the writers' rule: {report}",
            case.name
        );
    }
    match verdict {
        Ok(verdict) => eprintln!(
            "{}: {writers} writers x {rounds} transactions on {} aggregates, {} relay(s){}: \
             {} events committed in {wrote:.1?}, all on the broker after {drained:.1?}, \
             {} messages ({} re-sent){}; test took {:.1?}",
            case.name,
            verdict.aggregates,
            case.relays,
            killed
                .map(|instance| format!(" ({instance} killed with SIGKILL mid-way)"))
                .unwrap_or_default(),
            verdict.events,
            verdict.messages,
            verdict.duplicates,
            if busy_retries > 0 {
                format!(", {busy_retries} transactions retried after `database is locked`")
            } else {
                String::new()
            },
            started.elapsed()
        ),
        Err(report) => panic!(
            "{}: {writers} writers x {rounds} transactions on {} aggregates, {} relay(s){}, \
             {} events committed in {wrote:.1?}, topic {topic}{}:\n{report}\n{tails}",
            case.name,
            case.aggregates,
            case.relays,
            killed
                .map(|instance| format!(" ({instance} killed with SIGKILL mid-way)"))
                .unwrap_or_default(),
            committed.len(),
            if all_arrived {
                String::new()
            } else {
                format!(" (not every committed event arrived within {patience:?})")
            },
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_one_relay_2_aggregates() {
    run(Case::poll("pg-1relay-2agg", Backend::Postgres, 2, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_one_relay_5_aggregates() {
    run(Case::poll("pg-1relay-5agg", Backend::Postgres, 5, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_one_relay_20_aggregates() {
    run(Case::poll("pg-1relay-20agg", Backend::Postgres, 20, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_relays_5_aggregates() {
    run(Case::poll("pg-2relays-5agg", Backend::Postgres, 5, 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_three_relays_5_aggregates() {
    run(Case::poll("pg-3relays-5agg", Backend::Postgres, 5, 3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_three_relays_one_killed_5_aggregates() {
    run(Case {
        kill_one: true,
        ..Case::poll("pg-3relays-kill-5agg", Backend::Postgres, 5, 3)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_one_relay_batches_of_2_on_5_aggregates() {
    run(Case {
        batch_size: Some("2"),
        ..Case::poll("pg-1relay-batch2-5agg", Backend::Postgres, 5, 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_relays_batches_of_3_on_2_aggregates() {
    run(Case {
        batch_size: Some("3"),
        ..Case::poll("pg-2relays-batch3-2agg", Backend::Postgres, 2, 2)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_one_relay_batches_of_2_on_5_aggregates() {
    run(Case {
        batch_size: Some("2"),
        ..Case::poll("maria-1relay-batch2-5agg", Backend::MySql, 5, 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_one_relay_2_aggregates() {
    run(Case::poll("maria-1relay-2agg", Backend::MySql, 2, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_one_relay_20_aggregates() {
    run(Case::poll("maria-1relay-20agg", Backend::MySql, 20, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_one_relay_2_aggregates() {
    run(Case::poll("sqlite-1relay-2agg", Backend::Sqlite, 2, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_one_relay_20_aggregates() {
    run(Case::poll("sqlite-1relay-20agg", Backend::Sqlite, 20, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cdc_2_aggregates() {
    run(Case {
        mode: Mode::Cdc,
        ..Case::poll("pg-cdc-2agg", Backend::Postgres, 2, 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cdc_20_aggregates() {
    run(Case {
        mode: Mode::Cdc,
        ..Case::poll("pg-cdc-20agg", Backend::Postgres, 20, 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_two_relays_5_aggregates() {
    run(Case::poll("maria-2relays-5agg", Backend::MySql, 5, 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_one_relay_5_aggregates() {
    run(Case::poll("sqlite-1relay-5agg", Backend::Sqlite, 5, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cdc_5_aggregates() {
    run(Case {
        mode: Mode::Cdc,
        ..Case::poll("pg-cdc-5agg", Backend::Postgres, 5, 1)
    })
    .await;
}
