//! The relay binary publishing over TLS to brokers the tests start with the
//! machine's certificate (issued to `localhost`): a private RabbitMQ node
//! with a TLS listener (`amqps://` and the URL's `cacertfile`) and a private
//! NATS server that accepts TLS only (`tls://` and `--nats-ca`). The
//! witnesses are the brokers themselves: RabbitMQ's connection list and
//! NATS's `/connz` say the relay's connection is encrypted, and a client
//! of the test's own reads the events back and compares them with the
//! table by id, in per-aggregate order. Handshakes that must fail fail in
//! one line naming the cause. (The Kafka-API broker of the suite serves no
//! TLS; Kafka's TLS is librdkafka's own, see the README.)

use std::path::Path;
use std::time::{Duration, Instant};

use lapin::types::FieldTable;
use outbox_tests::nats::{PrivateServer as NatsServer, Scope, Stored, Witness};
use outbox_tests::process::{RelayProcess, assert_refused};
use outbox_tests::rabbitmq::{Broker, PrivateServer as RabbitServer, unique};
use outbox_tests::stream::{first_arrivals, written_order};
use outbox_tests::tls::SERVER_CERT;
use outbox_tests::{Backend, TestDb};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// A root certificate that did not issue the servers' certificate: one of
/// the public roots every machine with `ca-certificates` has.
const OTHER_ROOT: &str = "/etc/ssl/certs/ISRG_Root_X1.pem";

fn relay() -> &'static Path {
    Path::new(RELAY)
}

fn other_root() -> &'static str {
    assert!(
        Path::new(OTHER_ROOT).exists(),
        "{OTHER_ROOT} is missing: install the ca-certificates package"
    );
    OTHER_ROOT
}

/// Waits until the relay marked every row, failing with its output.
async fn wait_published(t: &TestDb, relay: &mut RelayProcess) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while t.count("outbox WHERE published_at IS NULL").await > 0 {
        assert!(
            Instant::now() < deadline && relay.is_running(),
            "rows still pending; stderr:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the relay to its end and expects it to fail at start: exit code
/// 1 and one line (besides INFO and WARN logs) starting with `start` and
/// holding `reason`; the URL's password shown nowhere.
fn refused_in_one_line(t: &TestDb, args: &[&str], start: &str, reason: &str) {
    let env = [("DATABASE_URL", t.url.as_str())];
    let line = assert_refused(relay(), args, &env, 1, start, "guest:guest");
    assert!(line.contains(reason), "{args:?}: {line}");
}

/// The relay's own connection name on a broker.
fn connection_name(relay: &RelayProcess) -> String {
    format!("outbox-relay pid {}", relay.id())
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_over_tls_with_a_private_root_publishes_and_marks() {
    let server = RabbitServer::start_tls().await;
    let tls_url = server.tls_url.clone().expect("a TLS listener");
    // The test's own client uses the plain listener: the relay's
    // connection is the one under test.
    let broker = Broker::connect_to(&server.url).await;
    let exchange = unique("tls");
    let queue = unique("tls-q");
    broker
        .bind_queue(&exchange, &queue, "outbox.event.*", FieldTable::default())
        .await;
    let t = TestDb::new(Backend::Postgres).await;
    let written = t.insert_plain_rows(3, 10).await;

    let url = format!("{tls_url}?cacertfile={SERVER_CERT}");
    let mut relay = RelayProcess::spawn(
        relay(),
        &[
            "run",
            "--sink",
            "rabbitmq",
            "--amqp-url",
            &url,
            "--amqp-exchange",
            &exchange,
        ],
        &[("DATABASE_URL", &t.url)],
    );
    wait_published(&t, &mut relay).await;
    let name = connection_name(&relay);
    let connections = server.connections();
    let relays: Vec<_> = connections.iter().filter(|(n, _)| *n == name).collect();
    assert!(
        !relays.is_empty() && relays.iter().all(|(_, ssl)| *ssl),
        "the relay's connection ({name}) is encrypted: {connections:?}"
    );
    assert!(
        connections.iter().any(|(n, ssl)| *n != name && !*ssl),
        "the control: the test's own plain connection shows as unencrypted: {connections:?}"
    );
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));

    let ids: Vec<String> = written.iter().map(|(_, id)| id.clone()).collect();
    let received = broker
        .read(
            &queue,
            ids.len(),
            Duration::from_secs(30),
            Duration::from_millis(500),
        )
        .await;
    let messages: Vec<_> = received.into_iter().map(|m| m.message).collect();
    assert_eq!(messages.len(), ids.len(), "each event once");
    assert_eq!(first_arrivals(&messages), written_order(&written));
    broker.close().await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_over_tls_refuses_a_server_its_roots_do_not_trust() {
    let server = RabbitServer::start_tls().await;
    let tls_url = server.tls_url.clone().expect("a TLS listener");
    let t = TestDb::new(Backend::Postgres).await;
    t.insert_plain_rows(1, 2).await;
    let exchange = unique("tls-refused");
    let run = |url: &str, expected: &str| {
        refused_in_one_line(
            &t,
            &[
                "run",
                "--sink",
                "rabbitmq",
                "--amqp-url",
                url,
                "--amqp-exchange",
                &exchange,
                "--drain",
            ],
            "error: cannot connect to RabbitMQ",
            expected,
        );
    };
    // The machine's certificate is self-signed: no public root trusts it.
    run(
        &tls_url,
        "TLS: the server's certificate is not trusted by the public root certificates \
         (set cacertfile in the URL to add a file)",
    );
    let other = other_root();
    run(
        &format!("{tls_url}?cacertfile={other}"),
        &format!("TLS: the server's certificate is not trusted by root certificates from {other}"),
    );
    assert_eq!(
        t.count("outbox WHERE published_at IS NULL").await,
        2,
        "nothing marked"
    );
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_over_tls_with_a_private_root_publishes_and_marks() {
    let server = NatsServer::start_tls();
    let scope = Scope::new("tls");
    let t = TestDb::new(Backend::Postgres).await;
    let written = t.insert_plain_rows(3, 10).await;

    let mut args = scope.relay_args(&server.url);
    args.extend(["--nats-ca".to_owned(), SERVER_CERT.to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut relay = RelayProcess::spawn(relay(), &args, &[("DATABASE_URL", &t.url)]);
    wait_published(&t, &mut relay).await;
    let name = connection_name(&relay);
    let connz = server.connections();
    let relays: Vec<_> = connz["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter(|c| c["name"] == name.as_str())
        .collect();
    assert!(
        !relays.is_empty()
            && relays
                .iter()
                .all(|c| c["tls_version"].as_str().is_some_and(|v| !v.is_empty())),
        "the relay's connection ({name}) is encrypted: {connz}"
    );
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));

    let witness = Witness::connect_tls(&server.url, SERVER_CERT).await;
    let stored = witness
        .read(&scope.stream, written.len() as u64, Duration::from_secs(30))
        .await;
    assert_eq!(stored.len(), written.len(), "each event once");
    let messages: Vec<_> = stored.iter().map(Stored::consumed).collect();
    assert_eq!(first_arrivals(&messages), written_order(&written));
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_over_tls_refuses_an_untrusted_or_misnamed_server_in_one_line() {
    let server = NatsServer::start_tls();
    let scope = Scope::new("tlsrefused");
    let t = TestDb::new(Backend::Postgres).await;
    t.insert_plain_rows(1, 2).await;
    let refuse = |url: &str, root: &str, expected: &str| {
        let args = scope.drain_args(url, &["--nats-ca", root, "--send-timeout", "5s"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused_in_one_line(&t, &args, "error: cannot connect to NATS", expected);
    };
    let other = other_root();
    refuse(
        &server.url,
        other,
        &format!("TLS: the server's certificate is not trusted by root certificates from {other}"),
    );
    // The certificate names `localhost`, not the address.
    let by_address = server.url.replace("localhost", "127.0.0.1");
    refuse(
        &by_address,
        SERVER_CERT,
        "TLS: the server's certificate is not valid for the host name in the URL (127.0.0.1)",
    );
    assert_eq!(
        t.count("outbox WHERE published_at IS NULL").await,
        2,
        "nothing marked"
    );
    t.drop().await;
}

/// Built without the `kafka-tls` feature, the relay says in one line that
/// Kafka's TLS and SCRAM need it, and prints no SASL password.
#[cfg(not(feature = "kafka-tls"))]
#[tokio::test(flavor = "multi_thread")]
async fn kafka_tls_and_scram_without_the_feature_are_refused_in_one_line() {
    let t = TestDb::new(Backend::Sqlite).await;
    let brokers = outbox_tests::kafka::brokers();
    for (settings, reason) in [
        (
            vec!["-X", "security.protocol=ssl"],
            "OpenSSL not available at build time",
        ),
        (
            vec![
                "-X",
                "security.protocol=sasl_plaintext",
                "-X",
                "sasl.mechanisms=SCRAM-SHA-512",
                "-X",
                "sasl.username=relay",
                "-X",
                "sasl.password=guest:guest",
            ],
            "No provider for SASL mechanism SCRAM-SHA-512",
        ),
    ] {
        let mut args = vec!["run", "--brokers", &brokers, "--drain"];
        args.extend(settings);
        refused_in_one_line(&t, &args, "error: invalid Kafka configuration", reason);
    }
    t.drop().await;
}
