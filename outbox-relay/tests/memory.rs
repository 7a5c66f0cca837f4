//! The polling relay's memory on large payloads: the relay binary's peak
//! resident memory (`VmHWM`) stays bounded while it publishes a backlog of
//! 1 MB payloads to the Kafka-API broker (its producer queue included),
//! everything once, each aggregate in order, as a consumer of the broker
//! reads them. A memory bound
//! is no timing assertion: it holds on a loaded machine as on an idle one.
//! (CDC mode's counterpart, one transaction of 200,000 events, is in
//! `tests/cdc.rs`.)

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use outbox_tests::kafka;
use outbox_tests::process::RelayProcess;
use outbox_tests::{Backend, TestDb};
use sea_orm::ConnectionTrait;

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// A backlog of payloads of about 1 MB each is drained in batches bounded
/// in bytes: everything is published once, each aggregate in order, and
/// the relay's peak memory stays far below the backlog's size. Before the
/// byte bound, a claim took the whole backlog and held it several times
/// over (the rows read, their messages, the producer's queue): over 200 MB
/// for this one (debug builds; more figures in BENCHMARKS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_one_megabyte_payloads_drains_in_bounded_memory() {
    const ROWS: usize = 100;
    /// Under librdkafka's default largest message (1,000,000 bytes) with
    /// the headers, as a Kafka deployment's payloads would be.
    const PAYLOAD_BYTES: usize = 990_000;
    /// A 2 MiB batch held as rows, messages and in the producer's queue,
    /// in a debug binary: about 43 MiB measured; a claim of the whole
    /// backlog holds over 200 MB.
    const PEAK_RSS_KIB: u64 = 64 << 10;
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("largepayloads");
    let template = format!("{topics}.{{aggregatetype}}");
    let topic = format!("{topics}.Blob");
    let t = TestDb::new(Backend::Postgres).await;
    t.db.execute_unprepared(&format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         SELECT gen_random_uuid(), 'Blob', 'blob-' || (g % 4), 'BlobStored', \
         jsonb_build_object('n', g, 'blob', repeat('x', {PAYLOAD_BYTES} - 30)) \
         FROM generate_series(1, {ROWS}) AS g"
    ))
    .await
    .expect("the backlog");

    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--brokers", &brokers, "--topic-template", &template],
        &[("DATABASE_URL", &t.url)],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while t.count("outbox WHERE published_at IS NULL").await > 0 {
        assert!(
            Instant::now() < deadline && relay.is_running(),
            "rows still pending; stderr:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let peak = relay.peak_rss_kib();
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));

    let messages = kafka::consume(
        &brokers,
        &topic,
        ROWS,
        Duration::from_secs(120),
        Duration::from_secs(2),
    );
    let mut ids = HashSet::new();
    let mut last: HashMap<String, i64> = HashMap::new();
    for message in &messages {
        let id = message.header("id").expect("an id header").to_owned();
        assert!(ids.insert(id.clone()), "{id} published twice");
        let payload = message.json();
        let blob = payload["blob"].as_str().expect("the blob");
        assert_eq!(
            blob.len(),
            PAYLOAD_BYTES - 30,
            "{id}: the payload arrived cut"
        );
        let key = message.key.clone().expect("a key");
        let n = payload["n"].as_i64().expect("n");
        let previous = last.insert(key.clone(), n).unwrap_or(0);
        assert!(n > previous, "{key}: {n} after {previous}");
    }
    assert_eq!(ids.len(), ROWS, "events missing on the broker");
    assert_eq!(last.len(), 4);
    eprintln!("peak RSS {peak} KiB draining {ROWS} rows of about {PAYLOAD_BYTES} bytes");
    assert!(
        peak <= PEAK_RSS_KIB,
        "the relay peaked at {peak} KiB draining {ROWS} rows of about {PAYLOAD_BYTES} bytes \
         (bound {PEAK_RSS_KIB} KiB)"
    );
    t.drop().await;
}
