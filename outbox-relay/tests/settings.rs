//! Settings a relay cannot work with are refused at start, before anything
//! connects: one line on stderr naming the setting and the allowed range or
//! relation, exit code 2 (a usage error, as clap reports malformed
//! options), whether the value came from a flag, an environment variable or
//! the config file. Values at the edges of the ranges start a relay.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use outbox_tests::process::run_to_end;
use outbox_tests::{Backend, TestDb};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// A PostgreSQL URL nothing listens on: a relay that got past its settings
/// would wait seconds for it, so a quick refusal shows they were checked
/// first.
const NOWHERE: &str = "postgres://relay@127.0.0.1:9/orders";

/// Runs `outbox-relay` with `args` (after `run` unless `args` starts with
/// a command of its own) on the database [`NOWHERE`] (unless `args` or
/// `env` name another) and checks the refusal: exit code 2, one line
/// `error: ...` containing each of `expected`, and no attempt to connect.
fn assert_refused(args: &[&str], env: &[(&str, &str)], expected: &[&str]) {
    let mut full: Vec<&str> = Vec::new();
    if !matches!(args.first(), Some(&"run") | Some(&"cleanup")) {
        full.push("run");
    }
    full.extend(args);
    let mut env = env.to_vec();
    env.insert(0, ("DATABASE_URL", NOWHERE));
    let started = Instant::now();
    let (code, stdout, stderr) = run_to_end(Path::new(RELAY), &full, &env);
    let context = format!("outbox-relay {}\nstderr: {stderr}", full.join(" "));
    assert_eq!(code, 2, "usage error expected: {context}");
    assert!(stdout.is_empty(), "nothing on stdout: {context}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {context}");
    assert!(lines[0].starts_with("error: "), "{context}");
    for part in expected {
        assert!(lines[0].contains(part), "expected {part:?}: {context}");
    }
    assert!(!stderr.contains("panicked"), "{context}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused before connecting: {context}"
    );
}

fn config_file(contents: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("outbox-settings-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("relay.toml");
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn shards_must_be_1_to_4096() {
    for bad in ["0", "4097", "3000000000", "99999999999"] {
        assert_refused(
            &["--shards", bad],
            &[],
            &[&format!("--shards is {bad}"), "1 to 4096"],
        );
    }
    assert_refused(
        &[],
        &[("OUTBOX_SHARDS", "0")],
        &["--shards is 0", "1 to 4096"],
    );
    let file = config_file("shards = 5000\n");
    assert_refused(
        &["--config", file.to_str().unwrap()],
        &[],
        &["config key `shards` is 5000", "1 to 4096"],
    );
}

#[test]
fn a_lease_must_be_1s_to_1h() {
    for (bad, shown) in [("0s", "0s"), ("500ms", "500ms"), ("2h", "2h")] {
        assert_refused(
            &["--lease", bad],
            &[],
            &[&format!("--lease is {shown}"), "1s to 1h"],
        );
    }
    assert_refused(&[], &[("OUTBOX_LEASE", "0s")], &["--lease is 0s"]);
    let file = config_file("lease = \"0s\"\n");
    assert_refused(
        &["--config", file.to_str().unwrap()],
        &[],
        &["config key `lease` is 0s", "1s to 1h"],
    );
}

#[test]
fn a_send_timeout_must_be_1s_to_1h() {
    for bad in ["0s", "500ms", "2h"] {
        assert_refused(
            &["--send-timeout", bad],
            &[],
            &[&format!("--send-timeout is {bad}"), "1s to 1h"],
        );
    }
    assert_refused(
        &[],
        &[("OUTBOX_SEND_TIMEOUT", "0s")],
        &["--send-timeout is 0s"],
    );
}

/// A producer that lingers longer than the send timeout never gets a
/// batch out in time; changing what delivery rests on is refused too.
#[test]
fn producer_settings_must_leave_the_relay_able_to_deliver() {
    let kafka = ["--sink", "kafka", "--brokers", "127.0.0.1:9"];
    fn with<'a>(kafka: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        kafka.iter().chain(extra).copied().collect()
    }
    assert_refused(
        &with(&kafka, &["--send-timeout", "2s", "-X", "linger.ms=3000"]),
        &[],
        &[
            "-X linger.ms=3000 is not shorter than --send-timeout 2s",
            "linger well below the send timeout",
        ],
    );
    let file =
        config_file("send_timeout = \"5s\"\n[kafka]\n\"queue.buffering.max.ms\" = \"5000\"\n");
    assert_refused(
        &with(&kafka, &["--config", file.to_str().unwrap()]),
        &[],
        &["-X queue.buffering.max.ms=5000 is not shorter than config key `send_timeout` 5s"],
    );
    for (option, own) in [
        ("acks=1", "acks=all"),
        ("enable.idempotence=false", "enable.idempotence=true"),
        (
            "message.timeout.ms=5000",
            "message.timeout.ms to the --send-timeout",
        ),
        (
            "message.timeout.ms=0",
            "message.timeout.ms to the --send-timeout",
        ),
        (
            "enable.gapless.guarantee=false",
            "enable.gapless.guarantee=true",
        ),
    ] {
        assert_refused(
            &with(&kafka, &["-X", option]),
            &[],
            &[&format!(
                "-X {option} is not allowed: the relay sets {own} itself"
            )],
        );
    }
}

#[test]
fn a_batch_size_must_be_1_to_10000() {
    for bad in ["0", "10001"] {
        assert_refused(
            &["--batch-size", bad],
            &[],
            &[&format!("--batch-size is {bad}"), "1 to 10000"],
        );
    }
    assert_refused(&[], &[("OUTBOX_BATCH_SIZE", "0")], &["--batch-size is 0"]);
    let file = config_file("batch_size = 0\n");
    assert_refused(
        &["--config", file.to_str().unwrap()],
        &[],
        &["config key `batch_size` is 0", "1 to 10000"],
    );
}

#[test]
fn a_poll_interval_must_be_10ms_to_1h() {
    for bad in ["0s", "5ms", "2h"] {
        assert_refused(
            &["--poll-interval", bad],
            &[],
            &[&format!("--poll-interval is {bad}"), "10ms to 1h"],
        );
    }
    assert_refused(
        &[],
        &[("OUTBOX_POLL_INTERVAL", "0s")],
        &["--poll-interval is 0s"],
    );
}

#[test]
fn a_metrics_interval_must_be_100ms_to_1h() {
    for bad in ["0s", "10ms", "2h"] {
        assert_refused(
            &["--metrics-interval", bad],
            &[],
            &[&format!("--metrics-interval is {bad}"), "100ms to 1h"],
        );
    }
}

#[test]
fn retention_and_cleanup_sizes_are_bounded() {
    assert_refused(
        &["--retention", "4000days"],
        &[],
        &["--retention is 4000days", "0s to 3650days"],
    );
    assert_refused(
        &["--cleanup-interval", "0s"],
        &[],
        &["--cleanup-interval is 0s", "1s to 30days"],
    );
    let file = config_file("cleanup_batch_size = 0\n");
    assert_refused(
        &["--config", file.to_str().unwrap()],
        &[],
        &["config key `cleanup_batch_size` is 0", "1 to 100000"],
    );
    for (bad, expected) in [
        (["--batch-size", "0"], "--batch-size is 0"),
        (["--batch-size", "100001"], "--batch-size is 100001"),
        (["--older-than", "4000days"], "--older-than is 4000days"),
    ] {
        let mut args = vec!["cleanup"];
        args.extend(bad);
        assert_refused(&args, &[], &[expected]);
    }
}

#[test]
fn attempts_and_topic_settings_are_bounded() {
    assert_refused(
        &["--max-attempts", "0"],
        &[],
        &["--max-attempts is 0", "at least 1"],
    );
    assert_refused(
        &["--max-attempts=-3"],
        &[],
        &["--max-attempts is -3", "at least 1"],
    );
    assert_refused(
        &["--topic-partitions", "0"],
        &[],
        &["--topic-partitions is 0", "at least 1"],
    );
    assert_refused(
        &["--topic-replication-factor", "40000"],
        &[],
        &["--topic-replication-factor is 40000", "1 to 32767"],
    );
}

#[test]
fn an_instance_id_must_fit_the_shard_tables() {
    let long = "r".repeat(65);
    assert_refused(
        &["--instance-id", &long],
        &[],
        &[
            "--instance-id must be 1 to 64 printable characters",
            "got 65",
        ],
    );
    assert_refused(
        &["--instance-id", " "],
        &[],
        &["--instance-id must be 1 to 64"],
    );
}

#[test]
fn kafka_options_must_be_key_value() {
    assert_refused(
        &["-X", "compression.type"],
        &[],
        &["-X/--kafka-option", "expected KEY=VALUE"],
    );
}

/// The edges of every range start a relay, on SQLite and on PostgreSQL
/// (where relays share shards; a send timeout longer than the lease is
/// fine: the lease is renewed while the batch waits).
#[tokio::test(flavor = "multi_thread")]
async fn values_at_the_edges_of_the_ranges_start_a_relay() {
    let edges = [
        "--batch-size",
        "10000",
        "--poll-interval",
        "10ms",
        "--metrics-interval",
        "1h",
        "--retention",
        "3650days",
        "--cleanup-interval",
        "1s",
        "--max-attempts",
        "1",
        "--topic-partitions",
        "1",
        "--topic-replication-factor",
        "32767",
    ];
    let sqlite = TestDb::new(Backend::Sqlite).await;
    let mut args = vec!["run", "--drain", "--sink", "stdout"];
    args.extend(edges);
    args.extend(["--lease", "1s", "--send-timeout", "1h", "--shards", "4096"]);
    let (code, _, stderr) = run_to_end(Path::new(RELAY), &args, &[("DATABASE_URL", &sqlite.url)]);
    assert_eq!(code, 0, "{stderr}");
    sqlite.drop().await;

    let postgres = TestDb::new(Backend::Postgres).await;
    for sharing in [
        &["--lease", "1s", "--shards", "4096"][..],
        &["--lease", "1h", "--send-timeout", "1h", "--shards", "4096"][..],
        &["--lease", "3s", "--send-timeout", "60s", "--shards", "4096"][..],
        &[
            "--lease",
            "2s",
            "--send-timeout",
            "2s",
            "--shards",
            "4096",
            "--instance-id",
            &"r".repeat(64),
        ][..],
    ] {
        let mut args = vec!["run", "--drain", "--sink", "stdout"];
        args.extend(sharing);
        let (code, _, stderr) =
            run_to_end(Path::new(RELAY), &args, &[("DATABASE_URL", &postgres.url)]);
        assert_eq!(code, 0, "{}: {stderr}", args.join(" "));
    }
    postgres.drop().await;
}
