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
    assert_one_line_error_with_code(1, result, expected)
}

/// Exit code 2 (a usage error: the settings are wrong), one line.
fn assert_usage_error(result: (i32, String, String), expected: &str) -> String {
    assert_one_line_error_with_code(2, result, expected)
}

fn assert_one_line_error_with_code(
    expected_code: i32,
    result: (i32, String, String),
    expected: &str,
) -> String {
    let (code, stdout, stderr) = result;
    assert_eq!(code, expected_code, "stderr: {stderr}");
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
    let (code, _, stderr) = relay(&["run", "--sink", "pulsar"], &[]);
    assert_eq!(code, 2, "clap's usage-error code");
    assert!(stderr.contains("invalid value 'pulsar'"), "{stderr}");
    assert!(
        stderr.contains("[possible values: kafka, rabbitmq, nats, stdout]"),
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
    assert_usage_error(
        relay(&["run", "--config", config.to_str().unwrap()], &[]),
        "unknown field `bacth_size`",
    );
    std::fs::write(&config, "retention = \"a while\"\n").unwrap();
    assert_usage_error(
        relay(&["run", "--config", config.to_str().unwrap()], &[]),
        "config key `retention`",
    );
    assert_usage_error(
        relay(&["run", "--config", "/nonexistent/relay.toml"], &[]),
        "cannot read the config file /nonexistent/relay.toml",
    );
    assert_usage_error(
        relay(&["run", "--batch-size", "0"], &[]),
        "--batch-size is 0; it must be 1 to 10000",
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

/// One way of handing the relay a credential, and the credentials that
/// must not show.
struct Credential {
    form: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    secrets: Vec<&'static str>,
}

impl Credential {
    fn new(form: &'static str, args: &[&str], secrets: &[&'static str]) -> Self {
        Self {
            form,
            args: args.iter().map(|arg| arg.to_string()).collect(),
            env: Vec::new(),
            secrets: secrets.to_vec(),
        }
    }

    fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }
}

/// Runs every case with every log line on (`RUST_LOG=debug`), as text and
/// as JSON, all at once (unreachable targets take seconds each), and
/// returns the cases whose output showed a credential.
fn leaks(cases: &[Credential]) -> Vec<String> {
    let formats: [&[(&str, &str)]; 2] = [
        &[("RUST_LOG", "debug")],
        &[("RUST_LOG", "debug"), ("OUTBOX_LOG_FORMAT", "json")],
    ];
    std::thread::scope(|scope| {
        let runs: Vec<_> = cases
            .iter()
            .flat_map(|case| formats.iter().map(move |format| (case, *format)))
            .map(|(case, format)| {
                scope.spawn(move || {
                    let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
                    let mut env: Vec<(&str, &str)> = format.to_vec();
                    env.extend(case.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                    let (code, stdout, stderr) = relay(&args, &env);
                    let output = format!("{stdout}{stderr}");
                    let mut problems = Vec::new();
                    for secret in &case.secrets {
                        let words = secret.split_whitespace().filter(|word| word.len() > 5);
                        if output.contains(secret) || words.into_iter().any(|w| output.contains(w))
                        {
                            problems.push(format!("shows {secret:?}"));
                        }
                    }
                    if code == 0 || output.contains("panicked") {
                        problems.push(format!("exit code {code}"));
                    }
                    (!problems.is_empty()).then(|| {
                        let tail: String = output.chars().rev().take(600).collect();
                        let tail: String = tail.chars().rev().collect();
                        format!(
                            "{} ({format:?}): {}\n  ...{tail}",
                            case.form,
                            problems.join(", ")
                        )
                    })
                })
            })
            .collect();
        runs.into_iter()
            .filter_map(|run| run.join().expect("case thread"))
            .collect()
    })
}

fn assert_no_leaks(cases: &[Credential]) {
    let leaks = leaks(cases);
    assert!(
        leaks.is_empty(),
        "{} of {} runs showed a credential:\n{}",
        leaks.len(),
        cases.len() * 2,
        leaks.join("\n")
    );
}

/// Every form a database credential takes, against a server that refuses
/// it (a missing database, a wrong password) or nothing listening, through
/// every command that connects.
#[test]
fn database_credentials_never_appear_in_any_output() {
    let dead = format!("127.0.0.1:{}", free_port());
    let userinfo = format!("postgres://app:Pg-Userinfo-Secret@{dead}/orders");
    let mut cases: Vec<Credential> = [
        &["run"][..],
        &["status"],
        &["status", "--json"],
        &["migrate"],
        &["retry"],
        &["cleanup"],
        &["cdc", "drop-slot"],
        &["run", "--mode", "cdc"],
    ]
    .into_iter()
    .map(|command| {
        Credential::new(
            "postgres user:password@, unreachable",
            command,
            &["Pg-Userinfo-Secret"],
        )
        .env("DATABASE_URL", &userinfo)
    })
    .collect();
    let pg = "postgres://postgres@127.0.0.1:5432/outbox_no_such_db";
    let config = temp_path("relay.toml");
    std::fs::write(
        &config,
        format!("database_url = \"{pg}?password=File-Url-Secret\"\n"),
    )
    .unwrap();
    cases.extend([
        Credential::new(
            "postgres ?password=",
            &[
                "run",
                "--database-url",
                &format!("{pg}?password=Pg-Query-Secret"),
            ],
            &["Pg-Query-Secret"],
        ),
        Credential::new(
            "postgres ?password=, unreachable",
            &["status"],
            &["Pg-Query-Unreachable"],
        )
        .env(
            "DATABASE_URL",
            &format!("postgres://app@{dead}/orders?sslmode=disable&password=Pg-Query-Unreachable"),
        ),
        Credential::new(
            "postgres ?sslpassword=",
            &[
                "run",
                "--database-url",
                &format!("{pg}?sslmode=disable&sslpassword=Pg-Sslpassword-Secret"),
            ],
            &["Pg-Sslpassword-Secret"],
        ),
        Credential::new(
            "postgres ?pass= &pwd=",
            &[
                "migrate",
                "--database-url",
                &format!("{pg}?pass=Pg-Pass-Secret&pwd=Pg-Pwd-Secret"),
            ],
            &["Pg-Pass-Secret", "Pg-Pwd-Secret"],
        ),
        Credential::new(
            "postgres percent-encoded password",
            &[
                "run",
                "--database-url",
                "postgres://postgres:Pg-Encoded%40Secret@127.0.0.1:5432/outbox_no_such_db",
            ],
            &["Pg-Encoded%40Secret", "Pg-Encoded@Secret"],
        ),
        Credential::new(
            "mysql user:password@",
            &[
                "run",
                "--database-url",
                "mysql://root:My-Userinfo-Secret@127.0.0.1:3306/test",
            ],
            &["My-Userinfo-Secret"],
        ),
        Credential::new(
            "mariadb ?password=",
            &[
                "run",
                "--database-url",
                "mariadb://root@127.0.0.1:3306/outbox_no_such_db?password=My-Query-Secret",
            ],
            &["My-Query-Secret"],
        ),
        Credential::new(
            "mariadb ?password=, unreachable",
            &["status"],
            &["My-Query-Unreachable"],
        )
        .env(
            "DATABASE_URL",
            &format!("mariadb://root@{dead}/test?password=My-Query-Unreachable"),
        ),
        Credential::new(
            "key=value connection string",
            &["run"],
            &["Kv-Password-Secret"],
        )
        .env(
            "DATABASE_URL",
            "host=127.0.0.1 port=5432 user=postgres password=Kv-Password-Secret dbname=test",
        ),
        Credential::new(
            "key=value connection string, migrate",
            &["migrate"],
            &["Kv-Password-Secret"],
        )
        .env(
            "DATABASE_URL",
            "host=127.0.0.1 port=5432 user=postgres password=Kv-Password-Secret dbname=test",
        ),
        Credential::new(
            "key=value connection string, quoted",
            &["migrate"],
            &["Kv Quoted Secret"],
        )
        .env("DATABASE_URL", "host=127.0.0.1 password='Kv Quoted Secret'"),
        Credential::new(
            "key=value connection string, cdc",
            &["run", "--mode", "cdc"],
            &["Cdc-Dsn-Secret"],
        )
        .env("DATABASE_URL", "password=Cdc-Dsn-Secret"),
        Credential::new(
            "unknown scheme",
            &[
                "migrate",
                "--database-url",
                "foo://u:Foo-Userinfo-Secret@db/x",
            ],
            &["Foo-Userinfo-Secret"],
        ),
        Credential::new(
            "unknown scheme, run",
            &[
                "run",
                "--database-url",
                "redis://u:Redis-Userinfo-Secret@db/0",
            ],
            &["Redis-Userinfo-Secret"],
        ),
        Credential::new(
            "config file database_url",
            &["run", "--config", config.to_str().unwrap()],
            &["File-Url-Secret"],
        ),
        Credential::new(
            "a URL clap does not expect",
            &["run", "postgres://u:Clap-Positional-Secret@db/x"],
            &["Clap-Positional-Secret"],
        ),
    ]);
    assert_no_leaks(&cases);
}

/// librdkafka's secret settings, from `-X` and from the file's `[kafka]`
/// table, when the broker is unreachable or the setting is refused.
#[test]
fn broker_credentials_never_appear_in_any_output() {
    let db = temp_path("kafka.db");
    let url = format!("sqlite://{}?mode=rwc", db.display());
    let (code, _, stderr) = relay(&["migrate", "--database-url", &url], &[]);
    assert_eq!(code, 0, "{stderr}");
    let brokers = format!("127.0.0.1:{}", free_port());
    let kafka = [
        "run",
        "--database-url",
        &url,
        "--sink",
        "kafka",
        "--brokers",
        &brokers,
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        kafka
            .iter()
            .chain(extra)
            .map(|arg| arg.to_string())
            .collect()
    };
    let config = temp_path("kafka.toml");
    std::fs::write(
        &config,
        "[kafka]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"PLAIN\"\n\
         \"sasl.username\" = \"relay\"\n\"sasl.password\" = \"Kafka-File-Secret\"\n",
    )
    .unwrap();
    let case = |form, args: Vec<String>, secrets: &[&'static str]| Credential {
        form,
        args,
        env: Vec::new(),
        secrets: secrets.to_vec(),
    };
    let cases = [
        case(
            "-X sasl.password, unreachable broker",
            with(&[
                "-X",
                "security.protocol=SASL_PLAINTEXT",
                "-X",
                "sasl.mechanism=PLAIN",
                "-X",
                "sasl.username=relay",
                "-X",
                "sasl.password=Kafka-Sasl-Secret",
                "-X",
                "debug=broker,security,conf",
            ]),
            &["Kafka-Sasl-Secret"],
        ),
        case(
            "-X ssl.key.password refused by librdkafka",
            with(&["-X", "ssl.key.password=Kafka-SslKey-Secret"]),
            &["Kafka-SslKey-Secret"],
        ),
        case(
            "-X sasl.oauthbearer.client.secret",
            with(&[
                "-X",
                "sasl.mechanism=BOGUS",
                "-X",
                "sasl.oauthbearer.client.secret=Kafka-Oauth-Secret",
            ]),
            &["Kafka-Oauth-Secret"],
        ),
        case(
            "[kafka] sasl.password in the config file",
            with(&["--config", config.to_str().unwrap()]),
            &["Kafka-File-Secret"],
        ),
        case(
            "-X with a mistyped separator",
            with(&["-X", "sasl.password:Kafka-Typo-Secret"]),
            &["Kafka-Typo-Secret"],
        ),
    ];
    assert_no_leaks(&cases);
}

/// `status` shows recorded errors, which are the broker's and driver's
/// words: a credential in them is masked, in the table and in JSON.
#[tokio::test(flavor = "multi_thread")]
async fn status_masks_credentials_in_recorded_errors() {
    let t = TestDb::new(Backend::Sqlite).await;
    sea_orm::ConnectionTrait::execute_unprepared(
        &t.db,
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, attempts, last_error, \
         dead_lettered_at) VALUES ('e-1', 'Order', '1', 'OrderPlaced', '{}', 10, \
         'refused: sasl.password=Status-Pattern-Secret via kafka://relay:Status-Url-Secret@b:9092/', \
         '2026-01-01T00:00:00Z')",
    )
    .await
    .unwrap();
    for args in [&["status"][..], &["status", "--json"]] {
        let (code, stdout, stderr) = relay(args, &[("DATABASE_URL", &t.url)]);
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains("refused: sasl.password=***"), "{stdout}");
        for secret in ["Status-Pattern-Secret", "Status-Url-Secret"] {
            assert!(
                !stdout.contains(secret) && !stderr.contains(secret),
                "{stdout}{stderr}"
            );
        }
    }
    t.drop().await;
}

/// A relay joins the shard owners when it connects to the database; when
/// a later start-up step fails (the broker unreachable, the metrics port
/// taken), it hands the shards back before exiting instead of leaving them
/// to expire with its lease.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_that_fails_to_start_releases_its_shards() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    for backend in [Backend::Postgres, Backend::MySql] {
        let t = TestDb::new(backend).await;
        let brokers = format!("127.0.0.1:{}", free_port());
        let failures: [(&[&str], &str); 2] = [
            (
                &["run", "--sink", "kafka", "--brokers", &brokers],
                "cannot reach the Kafka brokers",
            ),
            (
                &["run", "--sink", "stdout", "--metrics-addr", &taken],
                "cannot serve metrics",
            ),
        ];
        for (args, expected) in failures {
            let mut args = args.to_vec();
            args.extend([
                "--instance-id",
                "doomed",
                "--lease",
                "1h",
                "--send-timeout",
                "30s",
            ]);
            let (code, _, stderr) = relay(&args, &[("DATABASE_URL", &t.url)]);
            assert_eq!(code, 1, "{backend:?}: {stderr}");
            assert!(stderr.contains(expected), "{backend:?}: {stderr}");
            assert!(
                t.count("outbox_relay_shard").await >= 16,
                "{backend:?}: the relay joined"
            );
            assert_eq!(
                t.count("outbox_relay_shard WHERE owner IS NOT NULL").await,
                0,
                "{backend:?}, {expected}: shards left owned:\n{stderr}"
            );
            assert_eq!(t.count("outbox_relay_instance").await, 0, "{backend:?}");
        }
        t.drop().await;
    }
}

/// A relay that works, with credentials in every URL form its driver
/// accepts (PostgreSQL here trusts any password): nothing it logs at debug
/// level, serves on its metrics and health endpoints, or shows in `status`
/// contains them.
#[tokio::test(flavor = "multi_thread")]
async fn a_working_relay_shows_no_credential_in_logs_metrics_or_status() {
    use outbox_tests::process::RelayProcess;
    let t = TestDb::new(Backend::Postgres).await;
    let seeded = outbox_tests::stream::seed(&t.db, 4, 10, 10).await.len();
    let secrets = [
        "Running-Userinfo-Secret",
        "Running-Query-Secret",
        "Running-Ssl-Secret",
    ];
    let url = format!(
        "{}&password=Running-Query-Secret&sslpassword=Running-Ssl-Secret",
        t.url
            .replacen("://postgres@", "://postgres:Running-Userinfo-Secret@", 1)
    );
    assert!(url.contains("Running-Userinfo-Secret"), "{url}");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &[
            "run",
            "--sink",
            "stdout",
            "--metrics-addr",
            &addr,
            "--metrics-interval",
            "200ms",
        ],
        &[("DATABASE_URL", &url), ("RUST_LOG", "debug")],
    );
    let mut served = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some((_, metrics)) = outbox_tests::http::get(&addr, "/metrics")
            && outbox_tests::http::sample(&metrics, "outbox_pending_rows") == Some(0.0)
            && relay.stdout().len() == seeded
        {
            served.push_str(&metrics);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay never drained: {}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for path in ["/readyz", "/healthz"] {
        served.push_str(&outbox_tests::http::get(&addr, path).unwrap().1);
    }
    let mut status = String::new();
    for args in [&["status"][..], &["status", "--json"]] {
        let (code, stdout, stderr) = relay_cmd(args, &url);
        assert_eq!(code, 0, "{stderr}");
        status.push_str(&stdout);
        status.push_str(&stderr);
    }
    relay.signal("TERM");
    assert_eq!(relay.wait(std::time::Duration::from_secs(30)), Some(0));
    let logs = relay.stderr().join("\n");
    assert!(logs.contains("relay started"), "{logs}");
    let output = format!("{served}\n{status}\n{logs}\n{}", relay.stdout().join("\n"));
    for secret in secrets {
        assert!(!output.contains(secret), "{secret} shown:\n{output}");
    }
    t.drop().await;
}

fn relay_cmd(args: &[&str], url: &str) -> (i32, String, String) {
    relay(args, &[("DATABASE_URL", url), ("RUST_LOG", "debug")])
}
