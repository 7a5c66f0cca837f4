//! Several relays on one database: they share the shards, each aggregate
//! has one owner at a time, an instance that dies or pauses loses its
//! shards, and through all of it every event arrives with per-aggregate
//! order intact (checked on the consumed stream by `aggregateSequence`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use outbox_tests::kafka;
use outbox_tests::process::RelayProcess;
use outbox_tests::stream::{append_events, check_stream};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, DatabaseConnection};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

struct Cluster {
    url: String,
    brokers: String,
    template: String,
    extra: Vec<String>,
}

/// The instance id a relay of this test runs as: the name the test gives
/// it, made unique to this test process. An instance taking over shards
/// ends the sessions of their previous owner by instance id on the whole
/// database, so tests running at once on one database must not share ids.
fn instance_id(name: &str) -> String {
    static RUN: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| uuid::Uuid::now_v7().simple().to_string()[24..].to_owned());
    format!("{name}@{}", *RUN)
}

/// The name a test gave the relay running as `instance`.
fn name_of(instance: String) -> String {
    match instance.split_once('@') {
        Some((name, _)) => name.to_owned(),
        None => instance,
    }
}

impl Cluster {
    fn start(&self, instance: &str) -> RelayProcess {
        let instance = instance_id(instance);
        let mut args = vec![
            "run",
            "--instance-id",
            &instance,
            "--poll-interval",
            "100ms",
            "--topic-template",
            &self.template,
        ];
        if !self.extra.iter().any(|arg| arg == "--batch-size") {
            args.extend(["--batch-size", "50"]);
        }
        args.extend(self.extra.iter().map(String::as_str));
        RelayProcess::spawn(
            Path::new(RELAY),
            &args,
            &[
                ("DATABASE_URL", &self.url),
                ("KAFKA_BROKERS", &self.brokers),
            ],
        )
    }
}

/// Writes `per_aggregate` events to each of `aggregates` aggregates in
/// rounds of `chunk`, pausing between rounds, while the relays run.
fn write_in_background(
    db: DatabaseConnection,
    aggregates: usize,
    per_aggregate: usize,
    chunk: usize,
    pause: Duration,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let mut written = 0;
        while written < per_aggregate {
            for aggregate in 0..aggregates {
                let appended = append_events(&db, &format!("agg-{aggregate}"), chunk).await;
                ids.extend(appended.iter().map(|event| event.id.to_string()));
            }
            written += chunk;
            tokio::time::sleep(pause).await;
        }
        ids
    })
}

async fn owners(t: &TestDb) -> Vec<(String, i64)> {
    let rows = sea_orm::ConnectionTrait::query_all_raw(
        &t.db,
        sea_orm::Statement::from_string(
            t.db_backend(),
            "SELECT owner, COUNT(*) FROM outbox_relay_shard WHERE owner IS NOT NULL \
             GROUP BY owner ORDER BY owner",
        ),
    )
    .await
    .unwrap();
    rows.iter()
        .map(|row| {
            (
                name_of(row.try_get_by_index(0).unwrap()),
                row.try_get_by_index(1).unwrap(),
            )
        })
        .collect()
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn drained(t: &TestDb, expected: usize) {
    wait_until(
        "every event is published",
        Duration::from_secs(120),
        async || t.count("outbox WHERE published_at IS NOT NULL").await as usize >= expected,
    )
    .await;
}

/// Three relays over 200 aggregates x 50 events; one is killed with SIGKILL
/// and restarted several times while events are written.
#[tokio::test(flavor = "multi_thread")]
async fn three_relays_with_one_killed_repeatedly_deliver_everything_in_order() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("three");
    // Created up front: the broker used here (tansu, in memory) loses
    // messages when two relays create a topic at once.
    kafka::create_topic(&kafka::brokers(), &format!("{topics}.Invoice"), 4).await;
    let t = TestDb::new(Backend::Postgres).await;
    let cluster = Cluster {
        url: t.url.clone(),
        brokers: brokers.clone(),
        template: format!("{topics}.{{aggregatetype}}"),
        extra: vec![
            "--lease".into(),
            "2s".into(),
            "--topic-partitions".into(),
            "4".into(),
        ],
    };
    let writer = write_in_background(t.db.clone(), 200, 50, 5, Duration::from_millis(300));
    let _steady_a = cluster.start("relay-a");
    let _steady_b = cluster.start("relay-b");
    let mut victim = cluster.start("relay-c");

    let all_three = Arc::new(AtomicBool::new(false));
    wait_until(
        "three relays share the shards",
        Duration::from_secs(30),
        async || owners(&t).await.len() == 3,
    )
    .await;
    all_three.store(true, Ordering::SeqCst);

    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        victim.kill9();
        tokio::time::sleep(Duration::from_millis(800)).await;
        victim = cluster.start("relay-c");
    }
    let ids = writer.await.unwrap();
    drained(&t, ids.len()).await;

    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        ids.len(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    let report = check_stream(&messages, &ids);
    assert_eq!(report.distinct, 200 * 50);
    eprintln!(
        "{} events, {} messages, {} duplicates after 4 SIGKILLs",
        ids.len(),
        messages.len(),
        report.duplicates
    );
    t.drop().await;
}

/// A relay paused (SIGSTOP) past its lease loses its shards to the other;
/// resumed (SIGCONT), it neither marks nor publishes what it no longer
/// owns, and the shards are shared again.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_relay_loses_its_shards_and_cannot_disorder_them() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("paused");
    // Created up front: the broker used here (tansu, in memory) loses
    // messages when two relays create a topic at once.
    kafka::create_topic(&kafka::brokers(), &format!("{topics}.Invoice"), 4).await;
    let t = TestDb::new(Backend::Postgres).await;
    let cluster = Cluster {
        url: t.url.clone(),
        brokers: brokers.clone(),
        template: format!("{topics}.{{aggregatetype}}"),
        extra: vec![
            "--lease".into(),
            "2s".into(),
            "--send-timeout".into(),
            "2s".into(),
        ],
    };
    let writer = write_in_background(t.db.clone(), 50, 60, 3, Duration::from_millis(150));
    let paused = cluster.start("relay-paused");
    let _other = cluster.start("relay-other");
    wait_until(
        "both relays own shards",
        Duration::from_secs(30),
        async || owners(&t).await.len() == 2,
    )
    .await;

    paused.signal("STOP");
    wait_until(
        "the other relay owns every shard",
        Duration::from_secs(30),
        async || owners(&t).await == [("relay-other".to_owned(), 16)],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    paused.signal("CONT");

    let ids = writer.await.unwrap();
    drained(&t, ids.len()).await;
    wait_until(
        "the resumed relay owns shards again",
        Duration::from_secs(30),
        async || owners(&t).await.len() == 2,
    )
    .await;
    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        ids.len(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    check_stream(&messages, &ids);
    t.drop().await;
}

/// A relay stopped with SIGTERM hands its shards over at once (well before
/// its lease would expire); one killed with SIGKILL loses them when the
/// lease expires.
#[tokio::test(flavor = "multi_thread")]
async fn shards_move_on_clean_stop_at_once_and_on_kill_after_the_lease() {
    let brokers = kafka::brokers();
    let t = TestDb::new(Backend::Postgres).await;
    let topics = kafka::topic_prefix("handover");
    // Created up front: the broker used here (tansu, in memory) loses
    // messages when two relays create a topic at once.
    kafka::create_topic(&kafka::brokers(), &format!("{topics}.Invoice"), 4).await;
    let cluster = Cluster {
        url: t.url.clone(),
        brokers,
        template: format!("{topics}.{{aggregatetype}}"),
        extra: vec!["--lease".into(), "30s".into()],
    };
    let _stays = cluster.start("relay-stays");
    let mut leaves = cluster.start("relay-leaves");
    wait_until(
        "both relays own shards",
        Duration::from_secs(30),
        async || owners(&t).await.len() == 2,
    )
    .await;
    leaves.signal("TERM");
    assert_eq!(leaves.wait(Duration::from_secs(20)), Some(0));
    let stopped = Instant::now();
    wait_until(
        "the remaining relay owns every shard",
        Duration::from_secs(10),
        async || owners(&t).await == [("relay-stays".to_owned(), 16)],
    )
    .await;
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "no lease expiry was awaited"
    );

    let short = Cluster {
        extra: vec!["--lease".into(), "2s".into()],
        ..cluster
    };
    let t2 = TestDb::new(Backend::Postgres).await;
    let short = Cluster {
        url: t2.url.clone(),
        ..short
    };
    let _survivor = short.start("relay-survivor");
    let mut killed = short.start("relay-killed");
    wait_until(
        "both relays own shards",
        Duration::from_secs(30),
        async || owners(&t2).await.len() == 2,
    )
    .await;
    killed.kill9();
    wait_until(
        "the survivor took the dead relay's shards",
        Duration::from_secs(15),
        async || owners(&t2).await == [("relay-survivor".to_owned(), 16)],
    )
    .await;
    t.drop().await;
    t2.drop().await;
}

/// Two relays on MariaDB share the work and keep per-aggregate order.
#[tokio::test(flavor = "multi_thread")]
async fn two_relays_on_mariadb_share_the_work_in_order() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("maria2");
    // Created up front: the broker used here (tansu, in memory) loses
    // messages when two relays create a topic at once.
    kafka::create_topic(&kafka::brokers(), &format!("{topics}.Invoice"), 4).await;
    let t = TestDb::new(Backend::MySql).await;
    let cluster = Cluster {
        url: t.url.clone(),
        brokers: brokers.clone(),
        template: format!("{topics}.{{aggregatetype}}"),
        extra: vec![
            "--lease".into(),
            "2s".into(),
            "--topic-partitions".into(),
            "2".into(),
        ],
    };
    let writer = write_in_background(t.db.clone(), 40, 30, 5, Duration::from_millis(200));
    let _a = cluster.start("relay-a");
    let mut b = cluster.start("relay-b");
    wait_until(
        "both relays own shards",
        Duration::from_secs(30),
        async || owners(&t).await.len() == 2,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    b.kill9();
    let _b = cluster.start("relay-b2");
    let ids = writer.await.unwrap();
    drained(&t, ids.len()).await;
    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        ids.len(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    check_stream(&messages, &ids);
    t.drop().await;
}

/// A relay paused (SIGSTOP) in the middle of draining a backlog of big
/// payloads, where its claim statement may be blocked on sending rows to
/// the stopped process, loses its shards within the lease plus a heartbeat
/// or two: the other relay takes them over, ends the paused relay's
/// database sessions (freeing the rows they hold) and publishes everything
/// during the pause. Resumed, the paused relay sends nothing more.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_paused_mid_claim_frees_its_rows_within_the_lease() {
    paused_mid_claim(Backend::Postgres, &[], Duration::ZERO).await;
}

/// The same with a producer linger of 2 s, so that the pause most likely
/// lands while the paused relay's messages wait in librdkafka's queue:
/// resumed, it must not send them (they expire first). The other relay's
/// own batches take the linger too: two of them may go first. Each batch
/// then takes 2 s, so the batches hold 4 MiB (80 of these 50 KB rows) for
/// the other relay to drain the backlog within the pause.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_paused_mid_send_sends_nothing_stale_when_resumed() {
    paused_mid_claim(
        Backend::Postgres,
        &["-X", "linger.ms=2000", "--max-batch-bytes", "4194304"],
        Duration::from_secs(4),
    )
    .await;
}

/// The same on MariaDB: the other relay ends the paused relay's sessions
/// (recorded in `outbox_relay_session`).
#[tokio::test(flavor = "multi_thread")]
async fn mariadb_relay_paused_mid_claim_frees_its_rows_within_the_lease() {
    paused_mid_claim(Backend::MySql, &[], Duration::ZERO).await;
}

/// `batches` is how long the other relay's batches in flight may delay its
/// first batch of the paused relay's shards, beyond the bound.
async fn paused_mid_claim(backend: Backend, settings: &[&str], batches: Duration) {
    const EVENTS: i64 = 2400;
    const AGGREGATES: i64 = 20;
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("paused-big");
    let t = TestDb::new(backend).await;
    // 50 KB payloads, each aggregate's events numbered 1, 2, ... as the
    // library would number them.
    let load = match backend {
        Backend::Postgres => format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq) \
             SELECT gen_random_uuid(), 'Invoice', 'agg-' || (g % {AGGREGATES}), 'InvoiceIssued', \
               json_build_object('n', g, 'blob', repeat(md5(g::text), 1600)), g / {AGGREGATES} + 1 \
             FROM generate_series(0, {EVENTS} - 1) AS g"
        ),
        _ => format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq) \
             SELECT UUID(), 'Invoice', CONCAT('agg-', seq % {AGGREGATES}), 'InvoiceIssued', \
               JSON_OBJECT('n', seq, 'blob', REPEAT(MD5(seq), 1600)), seq DIV {AGGREGATES} + 1 \
             FROM seq_0_to_{}",
            EVENTS - 1
        ),
    };
    t.db.execute_unprepared(&load).await.unwrap();
    let ids = all_ids(&t).await;
    // Created up front: the broker used here (tansu, in memory) loses
    // messages when two relays create a topic at once.
    kafka::create_topic(&brokers, &format!("{topics}.Invoice"), 4).await;
    let lease = Duration::from_secs(5);
    let cluster = Cluster {
        url: t.url.clone(),
        brokers: brokers.clone(),
        template: format!("{topics}.{{aggregatetype}}"),
        extra: [
            "--lease",
            "5s",
            "--send-timeout",
            "5s",
            "--batch-size",
            "200",
        ]
        .iter()
        .chain(settings)
        .map(|arg| arg.to_string())
        .collect(),
    };
    let paused = cluster.start("relay-paused");
    let other = cluster.start("relay-other");
    let under_way = Instant::now() + Duration::from_secs(30);
    while owners(&t).await.len() < 2 || t.count("outbox WHERE published_at IS NOT NULL").await < 100
    {
        assert!(
            Instant::now() < under_way,
            "the relays did not start draining; their logs:\n{}\n{}",
            paused.stderr().join("\n"),
            other.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The pending rows of a relay's shards (the shard of a row as the
    // relay computes it, 16 shards).
    let shard_of_row = match backend {
        Backend::Postgres => {
            "((hashtextextended(aggregatetype || '/' || aggregateid, 0) % 16) + 16) % 16"
        }
        _ => "MOD(CRC32(CONCAT(aggregatetype, '/', aggregateid)), 16)",
    };
    let pending_of = async |name: &str| {
        let shards: Vec<String> = owned_shards(&t, name)
            .await
            .iter()
            .map(i32::to_string)
            .collect();
        if shards.is_empty() {
            return (String::new(), 0);
        }
        let condition = format!(
            "outbox WHERE published_at IS NULL AND {shard_of_row} IN ({})",
            shards.join(", ")
        );
        let pending = t.count(&condition).await;
        (condition, pending)
    };
    // The relay to pause is one whose shards still hold pending rows: the
    // 20 aggregates fall in 11 of the 16 shards, and a relay may own few
    // of them and have drained them already.
    let (paused, other, paused_name) = if pending_of("relay-paused").await.1 > 0 {
        (paused, other, "relay-paused")
    } else {
        (other, paused, "relay-other")
    };
    paused.signal("STOP");
    let stopped = Instant::now();
    let (of_paused_shards, stranded) = pending_of(paused_name).await;
    assert!(stranded > 0, "the paused relay's shards hold pending rows");
    // Within the lease, a heartbeat and a claim, the other relay publishes
    // some of them: the paused relay's claims, which hold the earliest
    // rows of their aggregates, no longer block them.
    let bound = lease + Duration::from_secs(3) + batches;
    while t.count(&of_paused_shards).await == stranded {
        assert!(
            stopped.elapsed() < bound,
            "none of the {stranded} pending events of the paused relay's shards was published \
             {bound:?} after it stopped (lease {lease:?}); sessions:\n{}\nother relay's log:\n{}",
            sessions(&t).await,
            other.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let taken_over_after = stopped.elapsed();
    for line in other.stderr() {
        if line.contains("took over") || line.contains("WARN") || line.contains("ERROR") {
            eprintln!("other relay: {line}");
        }
    }
    let pause = Duration::from_secs(60);
    while t.count("outbox WHERE published_at IS NULL").await > 0 {
        assert!(
            stopped.elapsed() < pause,
            "the other relay did not publish everything during a {pause:?} pause: {} pending",
            t.count("outbox WHERE published_at IS NULL").await,
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained_after = stopped.elapsed();
    let published_before_resume = topic_end(&brokers, &format!("{topics}.Invoice"));
    paused.signal("CONT");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after_resume = topic_end(&brokers, &format!("{topics}.Invoice"));
    assert_eq!(
        after_resume,
        published_before_resume,
        "the resumed relay published {} messages of shards it no longer owned; its log:\n{}",
        after_resume - published_before_resume,
        paused.stderr().join("\n")
    );

    // Every message on the topic, duplicates included.
    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        after_resume as usize,
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    let report = check_stream(&messages, &ids);
    eprintln!(
        "paused relay's shards moving {taken_over_after:?} after the pause began; \
         drained {} events after {drained_after:?}; {} duplicates",
        ids.len(),
        report.duplicates
    );
    t.drop().await;
}

/// The relays' database sessions, for a failure message.
async fn sessions(t: &TestDb) -> String {
    if t.backend != Backend::Postgres {
        return String::new();
    }
    let rows = sea_orm::ConnectionTrait::query_all_raw(
        &t.db,
        sea_orm::Statement::from_string(
            t.db_backend(),
            "SELECT concat_ws(' | ', application_name, state, wait_event_type, wait_event, \
               left(query, 120)) FROM pg_stat_activity WHERE application_name LIKE 'relay-%'",
        ),
    )
    .await
    .unwrap();
    rows.iter()
        .map(|row| row.try_get_by_index::<String>(0).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The shards `owner` holds.
async fn owned_shards(t: &TestDb, owner: &str) -> Vec<i32> {
    let rows = sea_orm::ConnectionTrait::query_all_raw(
        &t.db,
        sea_orm::Statement::from_string(
            t.db_backend(),
            format!(
                "SELECT shard FROM outbox_relay_shard WHERE owner = '{}'",
                instance_id(owner)
            ),
        ),
    )
    .await
    .unwrap();
    rows.iter()
        .map(|row| row.try_get_by_index(0).unwrap())
        .collect()
}

/// Every event id in the outbox.
async fn all_ids(t: &TestDb) -> Vec<String> {
    let rows = sea_orm::ConnectionTrait::query_all_raw(
        &t.db,
        sea_orm::Statement::from_string(
            t.db_backend(),
            match t.backend {
                Backend::Postgres => "SELECT id::text FROM outbox",
                _ => "SELECT id FROM outbox",
            },
        ),
    )
    .await
    .unwrap();
    rows.iter()
        .map(|row| row.try_get_by_index(0).unwrap())
        .collect()
}

/// The number of messages on `topic` (partition 0's high watermark plus
/// the others').
fn topic_end(brokers: &str, topic: &str) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("watermarks-{}", uuid::Uuid::now_v7()))
        .create()
        .expect("consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("topic metadata");
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|partition| {
            let (low, high) = consumer
                .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
                .expect("watermarks");
            high - low
        })
        .sum()
}
