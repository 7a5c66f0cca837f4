//! The binary's command line: bad input gets one clear line and a non-zero
//! exit code, never a panic, a backtrace or a password.

use std::path::Path;

use outbox_tests::kafka::free_port;
use outbox_tests::process::run_to_end;
use outbox_tests::{Backend, TestDb};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    run_to_end(Path::new(RELAY), args, env)
}

/// Exit code 1 and exactly one line on stderr, starting with `error:` and
/// containing `expected`.
fn assert_one_line_error(result: (i32, String, String), expected: &str) -> String {
    let (code, stdout, stderr) = result;
    assert_eq!(code, 1, "stderr: {stderr}");
    assert!(stdout.is_empty(), "nothing on stdout: {stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr, got:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(
        lines[0].contains(expected),
        "expected {expected:?} in {stderr}"
    );
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"));
    stderr
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-cli-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_malformed_database_url_is_one_line() {
    assert_one_line_error(
        relay(&["run", "--database-url", "not a url"], &[]),
        "unsupported database URL",
    );
    assert_one_line_error(
        relay(&["status", "--database-url", "redis://127.0.0.1/0"], &[]),
        "expected postgres://, mysql:// (or mariadb://) or sqlite://",
    );
}

#[test]
fn an_unreachable_database_is_one_line_without_the_password() {
    let url = format!(
        "postgres://app:supersecret@127.0.0.1:{}/orders",
        free_port()
    );
    let stderr = assert_one_line_error(
        relay(&["run"], &[("DATABASE_URL", &url)]),
        "cannot connect to the database at postgres://app:***@127.0.0.1",
    );
    assert!(!stderr.contains("supersecret"), "{stderr}");

    let url = format!("mysql://root:hunter2@127.0.0.1:{}/test", free_port());
    let stderr = assert_one_line_error(
        relay(&["status", "--database-url", &url], &[]),
        "cannot connect",
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[test]
fn a_missing_outbox_table_says_to_migrate() {
    let db = temp_path("empty.db");
    let url = format!("sqlite://{}?mode=rwc", db.display());
    assert_one_line_error(
        relay(&["run"], &[("DATABASE_URL", &url)]),
        "create it with `outbox-relay migrate`",
    );
    // The advice works.
    let (code, _, stderr) = relay(&["migrate"], &[("DATABASE_URL", &url)]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = relay(&["status", "--json"], &[("DATABASE_URL", &url)]);
    assert_eq!(code, 0, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["pending"], 0);
    assert_eq!(status["dead_letters"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_table_on_postgres_and_mariadb_says_to_migrate() {
    for backend in [Backend::Postgres, Backend::MySql] {
        let t = TestDb::new(backend).await;
        sea_orm::ConnectionTrait::execute_unprepared(&t.db, "DROP TABLE outbox")
            .await
            .unwrap();
        assert_one_line_error(
            relay(&["run"], &[("DATABASE_URL", &t.url)]),
            "the outbox table does not exist",
        );
        t.drop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_broker_is_one_line() {
    let t = TestDb::new(Backend::Sqlite).await;
    let brokers = format!("127.0.0.1:{}", free_port());
    assert_one_line_error(
        relay(
            &["run", "--sink", "kafka", "--brokers", &brokers],
            &[("DATABASE_URL", &t.url)],
        ),
        &format!("cannot reach the Kafka brokers at {brokers}"),
    );
    assert_eq!(t.count("outbox").await, 0);
    t.drop().await;
}

#[test]
fn an_unknown_sink_is_a_usage_error() {
    let (code, _, stderr) = relay(&["run", "--sink", "rabbit"], &[]);
    assert_eq!(code, 2, "clap's usage-error code");
    assert!(stderr.contains("invalid value 'rabbit'"), "{stderr}");
    assert!(
        stderr.contains("[possible values: kafka, stdout]"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"));
}

#[test]
fn bad_values_and_config_files_are_one_line() {
    let (code, _, stderr) = relay(&["run", "--poll-interval", "soon"], &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("500ms"), "{stderr}");

    let config = temp_path("relay.toml");
    std::fs::write(&config, "bacth_size = 5\n").unwrap();
    assert_one_line_error(
        relay(&["run", "--config", config.to_str().unwrap()], &[]),
        "unknown field `bacth_size`",
    );
    std::fs::write(&config, "retention = \"a while\"\n").unwrap();
    assert_one_line_error(
        relay(&["run", "--config", config.to_str().unwrap()], &[]),
        "config key `retention`",
    );
    assert_one_line_error(
        relay(&["run", "--config", "/nonexistent/relay.toml"], &[]),
        "cannot read the config file /nonexistent/relay.toml",
    );
    assert_one_line_error(
        relay(&["run", "--batch-size", "0"], &[]),
        "--batch-size must be at least 1",
    );
}

#[test]
fn a_config_file_configures_the_relay() {
    let db = temp_path("configured.db");
    let url = format!("sqlite://{}?mode=rwc", db.display());
    let (code, _, stderr) = relay(&["migrate", "--database-url", &url], &[]);
    assert_eq!(code, 0, "{stderr}");
    let config = temp_path("relay.toml");
    std::fs::write(
        &config,
        format!("database_url = \"{url}\"\nsink = \"stdout\"\ntopic_template = \"custom.{{aggregatetype}}\"\n"),
    )
    .unwrap();
    let insert = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                  VALUES ('e-1', 'Order', '1', 'OrderPlaced', '{}')";
    let status = std::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "import sqlite3; c=sqlite3.connect({:?}); c.execute({insert:?}); c.commit()",
                db.display().to_string()
            ),
        ])
        .status()
        .expect("python3 writes the row");
    assert!(status.success());
    let (code, stdout, stderr) = relay(
        &["run", "--drain"],
        &[("OUTBOX_RELAY_CONFIG", config.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{stderr}");
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(line["topic"], "custom.Order");
}

#[test]
fn help_explains_every_command() {
    let (code, stdout, _) = relay(&["--help"], &[]);
    assert_eq!(code, 0);
    for command in ["run", "migrate", "status", "cleanup"] {
        assert!(stdout.contains(command), "{stdout}");
    }
    let (code, stdout, _) = relay(
        &["run", "--help"],
        &[("DATABASE_URL", "postgres://u:topsecret@db/x")],
    );
    assert_eq!(code, 0);
    for flag in [
        "--sink",
        "--brokers",
        "--topic-template",
        "--batch-size",
        "--poll-interval",
        "--drain",
    ] {
        assert!(stdout.contains(flag), "{flag} in {stdout}");
    }
    assert!(stdout.contains("KAFKA_BROKERS"));
    assert!(
        !stdout.contains("topsecret"),
        "help never shows secret values"
    );
}

/// A reader that goes away (a closed pipe) stops the relay with an error
/// instead of retrying forever; what was not written stays pending.
#[tokio::test(flavor = "multi_thread")]
async fn a_closed_stdout_stops_the_relay_and_keeps_rows_pending() {
    let t = TestDb::new(Backend::Sqlite).await;
    outbox_tests::stream::seed(&t.db, 4, 25, 25).await;
    let mut child = std::process::Command::new(RELAY)
        .args(["run", "--drain", "--sink", "stdout", "--batch-size", "10"])
        .env_remove("KAFKA_BROKERS")
        .env("DATABASE_URL", &t.url)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: the sink was closed"), "{stderr}");
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 100);
    t.drop().await;
}
