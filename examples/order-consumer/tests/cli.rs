//! `order-consumer` on bad input: one line on stderr, a non-zero exit.

use std::path::Path;

use outbox_tests::kafka;
use outbox_tests::process::run_to_end;

fn consumer(args: &[&str]) -> (i32, String) {
    let (code, _, stderr) = run_to_end(
        Path::new(env!("CARGO_BIN_EXE_order-consumer")),
        args,
        &[("RUST_LOG", "off")],
    );
    (code, stderr)
}

#[test]
fn an_unreachable_database_is_one_line_and_exit_1() {
    let port = kafka::free_port().to_string();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let (code, stderr) = consumer(&["--database-url", &url]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(
            "error: cannot connect to the database given by --database-url / DATABASE_URL: "
        ),
        "{stderr}"
    );
}

#[test]
fn unreachable_brokers_are_one_line_and_exit_1() {
    let dir = tempfile_dir();
    let url = format!("sqlite://{}/summary.db?mode=rwc", dir.display());
    let brokers = format!("127.0.0.1:{}", kafka::free_port());
    let (code, stderr) = consumer(&["--database-url", &url, "--brokers", &brokers]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: cannot reach the Kafka brokers at {brokers} (--brokers / KAFKA_BROKERS): "
        )),
        "{stderr}"
    );
}

#[test]
fn bad_options_are_refused() {
    let (code, stderr) = consumer(&["-X", "no-equals-sign"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("expected KEY=VALUE"), "{stderr}");
    let (code, stderr) = consumer(&["--on-gap", "sometimes"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("[possible values: apply, stop]"),
        "{stderr}"
    );
    let (code, stderr) = consumer(&["--group", ""]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("a consumer group name has 1 to 255 characters"),
        "{stderr}"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("order-consumer-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
