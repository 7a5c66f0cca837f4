//! TLS towards the databases, on the machine's real servers: PostgreSQL
//! serves TLS (`ssl = on` with the system's snakeoil certificate, issued to
//! `localhost`); the machine's MariaDB does not.
//!
//! The relay runs as an operator runs it, with the TLS settings in the
//! URL; the server's own view (`pg_stat_ssl`) is the witness that its
//! connections are encrypted.

use std::path::Path;
use std::time::{Duration, Instant};

use outbox_tests::process::{RelayProcess, run_to_end};
use outbox_tests::tls::TlsMariaDb;
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");
/// The certificate the servers present, self-signed, for `localhost`.
const SERVER_CERT: &str = outbox_tests::tls::SERVER_CERT;

/// `url` with `query` appended.
fn with_query(url: &str, query: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{query}")
}

/// A root certificate PostgreSQL's certificate does not chain to: any
/// other certificate of the system's store.
fn unrelated_root() -> String {
    let dir = std::fs::read_dir("/etc/ssl/certs").expect("the system's certificates");
    dir.filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.extension().is_some_and(|ext| ext == "pem")
                && !path.to_string_lossy().contains("snakeoil")
                && std::fs::metadata(path).is_ok_and(|m| m.is_file())
        })
        .expect("a CA certificate in /etc/ssl/certs (package ca-certificates)")
        .display()
        .to_string()
}

/// Inserts `count` rows as plain SQL (the five Debezium columns).
async fn insert_rows(t: &TestDb, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for n in 0..count {
        let id = uuid::Uuid::now_v7().to_string();
        t.db.execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('{id}', 'Invoice', 'inv-{n}', 'InvoiceIssued', '{{\"n\": {n}}}')"
        ))
        .await
        .expect("insert an outbox row");
        ids.push(id);
    }
    ids
}

/// Whether every session named `application_name` is encrypted, and how many there are.
async fn encrypted_sessions(t: &TestDb, application_name: &str) -> (i64, bool) {
    let row =
        t.db.query_one_raw(Statement::from_string(
            t.db_backend(),
            format!(
                "SELECT count(*)::int8, COALESCE(bool_and(s.ssl), false) \
                 FROM pg_stat_activity AS a JOIN pg_stat_ssl AS s ON s.pid = a.pid \
                 WHERE a.application_name = '{application_name}'"
            ),
        ))
        .await
        .expect("read pg_stat_ssl")
        .expect("one row");
    (
        row.try_get_by_index::<i64>(0).unwrap(),
        row.try_get_by_index::<bool>(1).unwrap(),
    )
}

/// The polling relay with `sslmode=require` publishes and marks every row,
/// and the server sees each of its sessions encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_polling_relay_publishes_over_tls() {
    let t = TestDb::new(Backend::Postgres).await;
    let ids = insert_rows(&t, 5).await;
    let instance = format!("tls-{}", uuid::Uuid::now_v7().simple());
    let url = with_query(&t.url, "sslmode=require");
    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--instance-id", &instance],
        &[("DATABASE_URL", &url)],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.count("outbox WHERE published_at IS NOT NULL").await < ids.len() as i64 {
        assert!(
            Instant::now() < deadline && relay.is_running(),
            "rows not marked over TLS; stderr:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (sessions, all_encrypted) = encrypted_sessions(&t, &instance).await;
    assert!(sessions >= 1, "no session of the relay found");
    assert!(all_encrypted, "a session of the relay is not encrypted");
    let printed = relay.stdout().join("\n");
    for id in &ids {
        assert!(printed.contains(id), "{id} not published: {printed}");
    }
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));

    // The same relay without TLS: the witness tells the two apart.
    let plain = format!("{instance}-plain");
    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--instance-id", &plain],
        &[("DATABASE_URL", &with_query(&t.url, "sslmode=disable"))],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while encrypted_sessions(&t, &plain).await.0 == 0 {
        assert!(Instant::now() < deadline, "{}", relay.stderr().join("\n"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (sessions, all_encrypted) = encrypted_sessions(&t, &plain).await;
    assert!(
        sessions >= 1 && !all_encrypted,
        "sslmode=disable sessions encrypted"
    );
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)), Some(0));
    t.drop().await;
}

/// `verify-full` with the server's certificate as root succeeds when the
/// URL names the host the certificate is for; `migrate` and `status` go
/// over the same connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_servers_certificate_succeeds() {
    let t = TestDb::new(Backend::Postgres).await;
    let ids = insert_rows(&t, 3).await;
    let url = with_query(
        &t.url.replacen("127.0.0.1", "localhost", 1),
        &format!("sslmode=verify-full&sslrootcert={SERVER_CERT}"),
    );
    let env = [("DATABASE_URL", url.as_str())];
    let (code, _, stderr) = run_to_end(Path::new(RELAY), &["migrate"], &env);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = run_to_end(
        Path::new(RELAY),
        &["run", "--drain", "--sink", "stdout"],
        &env,
    );
    assert_eq!(code, 0, "{stderr}");
    for id in &ids {
        assert!(stdout.contains(id), "{id} not published: {stdout}");
    }
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 0);
    let (code, _, stderr) = run_to_end(Path::new(RELAY), &["status"], &env);
    assert_eq!(code, 0, "{stderr}");
    t.drop().await;
}

/// Asserts that `args` fail on `url` with one line naming `expected`,
/// without the password, and that nothing was marked.
async fn fails_with(t: &TestDb, url: &str, args: &[&str], expected: &str) {
    let (code, stdout, stderr) = run_to_end(Path::new(RELAY), args, &[("DATABASE_URL", url)]);
    assert_ne!(code, 0, "{args:?} succeeded on {url}: {stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let error = lines.last().copied().unwrap_or_default();
    assert!(
        error.contains(expected),
        "{args:?}: expected `{expected}` in: {stderr}"
    );
    assert!(!error.contains("s3cret"), "password printed: {error}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(t.count("outbox WHERE published_at IS NOT NULL").await, 0);
}

/// Failed handshakes say what failed, in one line, for every subcommand
/// that connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_handshakes_are_named_in_one_line() {
    let t = TestDb::new(Backend::Postgres).await;
    insert_rows(&t, 2).await;
    let localhost =
        t.url
            .replacen("postgres@", "postgres:s3cret@", 1)
            .replacen("127.0.0.1", "localhost", 1);
    let wrong_root = unrelated_root();
    let untrusted = with_query(
        &localhost,
        &format!("sslmode=verify-full&sslrootcert={wrong_root}"),
    );
    let expected = format!("not trusted by root certificates from {wrong_root}");
    for args in [
        &["run", "--drain", "--sink", "stdout"][..],
        &["status"],
        &["migrate"],
    ] {
        fails_with(&t, &untrusted, args, &expected).await;
    }
    // The certificate is for `localhost`, not for the address.
    let by_address = with_query(
        &t.url.replacen("postgres@", "postgres:s3cret@", 1),
        &format!("sslmode=verify-full&sslrootcert={SERVER_CERT}"),
    );
    fails_with(
        &t,
        &by_address,
        &["run", "--drain", "--sink", "stdout"],
        "not valid for the host name in the URL (127.0.0.1)",
    )
    .await;
    // verify-ca does not check the name.
    let verify_ca = by_address.replace("verify-full", "verify-ca");
    let (code, _, stderr) = run_to_end(
        Path::new(RELAY),
        &["run", "--drain", "--sink", "stdout"],
        &[("DATABASE_URL", &verify_ca)],
    );
    assert_eq!(code, 0, "{stderr}");
    t.drop().await;
}

/// MariaDB here serves no TLS: a URL that requires it is refused in one
/// line, and `PREFERRED` falls back to a plain connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_without_tls_refuses_a_required_mode() {
    let t = TestDb::new(Backend::MySql).await;
    insert_rows(&t, 2).await;
    fails_with(
        &t,
        &with_query(&t.url, "ssl-mode=REQUIRED"),
        &["run", "--drain", "--sink", "stdout"],
        "the server does not support TLS",
    )
    .await;
    let (code, stdout, stderr) = run_to_end(
        Path::new(RELAY),
        &["run", "--drain", "--sink", "stdout"],
        &[("DATABASE_URL", &with_query(&t.url, "ssl-mode=PREFERRED"))],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    t.drop().await;
}

/// A MariaDB that accepts TLS only: `migrate`, the relay and `status` work
/// with `VERIFY_IDENTITY` and the server's certificate as CA (so every
/// connection is encrypted: the server refuses plain ones), and a plain or
/// mis-addressed connection fails in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_over_tls_publishes_and_marks() {
    outbox_relay::tls::install_crypto_provider();
    let server = TlsMariaDb::start();
    let verified = server.url(
        "localhost",
        &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={SERVER_CERT}"),
    );
    let env = [("DATABASE_URL", verified.as_str())];
    let (code, _, stderr) = run_to_end(Path::new(RELAY), &["migrate"], &env);
    assert_eq!(code, 0, "{stderr}");
    let db = outbox_tests::db::connect(&server.url("127.0.0.1", "ssl-mode=REQUIRED")).await;
    let mut ids = Vec::new();
    for n in 0..4 {
        let id = uuid::Uuid::now_v7().to_string();
        db.execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('{id}', 'Invoice', 'inv-{n}', 'InvoiceIssued', '{{}}')"
        ))
        .await
        .expect("insert over TLS");
        ids.push(id);
    }
    let (code, stdout, stderr) = run_to_end(
        Path::new(RELAY),
        &["run", "--drain", "--sink", "stdout"],
        &env,
    );
    assert_eq!(code, 0, "{stderr}");
    for id in &ids {
        assert!(stdout.contains(id), "{id} not published: {stdout}");
    }
    let pending = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT CAST(COUNT(*) AS SIGNED) FROM outbox WHERE published_at IS NULL".to_owned(),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap();
    assert_eq!(pending, 0);
    let (code, _, stderr) = run_to_end(Path::new(RELAY), &["status"], &env);
    assert_eq!(code, 0, "{stderr}");

    for (url, expected) in [
        // MariaDB answers a plain connection under require_secure_transport
        // with "access denied".
        (
            server.url("127.0.0.1", "ssl-mode=DISABLED"),
            "Access denied",
        ),
        (
            server.url(
                "127.0.0.1",
                &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={SERVER_CERT}"),
            ),
            "not valid for the host name in the URL (127.0.0.1)",
        ),
    ] {
        let (code, _, stderr) = run_to_end(
            Path::new(RELAY),
            &["run", "--drain", "--sink", "stdout"],
            &[("DATABASE_URL", &url)],
        );
        assert_ne!(code, 0, "{url} connected");
        let error = stderr
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or_default();
        assert!(
            error.contains(expected),
            "expected `{expected}` in: {stderr}"
        );
    }
}

/// This process's TCP sockets connected to `port`: each one's local
/// address and whether it sends at once (`TCP_NODELAY`), read with
/// `getsockopt` through the descriptor table.
fn sockets_to(port: u16) -> Vec<(std::net::SocketAddr, bool)> {
    use std::os::fd::BorrowedFd;
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .expect("the descriptor table")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.into_iter()
        .filter_map(|fd| {
            // SAFETY: only borrowed for reading socket options; the test's
            // own descriptors are not closed meanwhile.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let socket = socket2::SockRef::from(&fd);
            let peer = socket.peer_addr().ok()?.as_socket()?;
            (peer.port() == port && socket.r#type().ok()? == socket2::Type::STREAM).then(|| {
                let local = socket.local_addr().ok()?.as_socket()?;
                Some((local, socket.tcp_nodelay().ok()?))
            })?
        })
        .collect()
}

/// The relay's SQL connections send each statement at once
/// (`TCP_NODELAY`), on PostgreSQL over TLS (`sslmode=prefer`, the default)
/// and on MariaDB: sqlx 0.9.0 leaves Nagle's algorithm on, and a statement
/// larger than a TLS record then waits up to 40 ms for the server's delayed
/// acknowledgement, twice per batch at 2,000 rows (BENCHMARKS.md). A
/// socket the test opens itself keeps the system's default, so the witness
/// tells the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relays_sql_connections_send_each_statement_at_once() {
    use outbox_relay::source::{self, Settlement, SourceOptions};
    for (backend, default_port) in [(Backend::Postgres, 5432), (Backend::MySql, 3306)] {
        let t = TestDb::new(backend).await;
        let port = url::Url::parse(&t.url)
            .expect("the test URL")
            .port()
            .unwrap_or(default_port);
        let source = source::connect(&t.url, SourceOptions::default())
            .await
            .expect("the source");
        // Two claims open at once hold two of the pool's connections.
        let first = source.claim(10, &[]).await.expect("a claim");
        let second = source.claim(10, &[]).await.expect("a second claim");
        let own = std::net::TcpStream::connect(("127.0.0.1", port)).expect("a plain socket");
        let own = own.local_addr().expect("its address");

        let sockets = sockets_to(port);
        assert!(
            sockets
                .iter()
                .any(|&(local, nodelay)| local == own && !nodelay),
            "the test's own socket keeps Nagle's algorithm: {sockets:?}"
        );
        let relays: Vec<_> = sockets.iter().filter(|(local, _)| *local != own).collect();
        assert!(
            relays.len() >= 2,
            "{backend:?}: the claims' connections: {sockets:?}"
        );
        assert!(
            relays.iter().all(|(_, nodelay)| *nodelay),
            "{backend:?}: a connection with Nagle's algorithm on: {sockets:?}"
        );
        first.settle(&Settlement::default()).await.expect("settle");
        second.settle(&Settlement::default()).await.expect("settle");
        t.drop().await;
    }
}
