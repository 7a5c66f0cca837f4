//! The NATS server of the tests (`nats://127.0.0.1:4222` with JetStream,
//! as on every development machine and CI; `OUTBOX_TEST_NATS_URL`
//! overrides it): per-test stream names and subject prefixes, and a
//! witness client of its own that reads a stream back, message by
//! message, in stream order.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::stream::{Config, StorageType};
use async_nats::jetstream::{self, Context};

use crate::kafka::Consumed;
use crate::stream::{StreamReport, check_stream};

/// The server's URL; fails the test when nothing listens there.
pub fn nats_url() -> String {
    if let Ok(url) = std::env::var("OUTBOX_TEST_NATS_URL") {
        return url;
    }
    if std::net::TcpStream::connect_timeout(
        &"127.0.0.1:4222".parse().expect("address"),
        Duration::from_secs(2),
    )
    .is_err()
    {
        panic!(
            "no NATS server at 127.0.0.1:4222: start it with JetStream on \
             (`nats-server -js`, or `service nats-server start`)"
        );
    }
    "nats://127.0.0.1:4222".into()
}

/// A test's own stream and subjects.
#[derive(Debug, Clone)]
pub struct Scope {
    /// The stream name (`T<uuid>_<test>`).
    pub stream: String,
    /// The first subject token (`t<uuid>`), so that the test's subjects
    /// overlap no other stream's.
    pub prefix: String,
}

impl Scope {
    /// A fresh stream name and subject prefix for `test`.
    pub fn new(test: &str) -> Self {
        let unique = uuid::Uuid::now_v7().simple().to_string();
        Self {
            stream: format!("T{unique}_{test}"),
            prefix: format!("t{unique}"),
        }
    }

    /// The subject template: `<prefix>.event.{aggregatetype}.{aggregateid}`.
    pub fn template(&self) -> String {
        format!("{}.event.{{aggregatetype}}.{{aggregateid}}", self.prefix)
    }

    /// What a stream created by the relay for [`Scope::template`] captures.
    pub fn capture(&self) -> String {
        format!("{}.event.>", self.prefix)
    }

    /// `run --sink nats` arguments for this scope.
    pub fn relay_args(&self, url: &str) -> Vec<String> {
        [
            "run",
            "--sink",
            "nats",
            "--nats-url",
            url,
            "--nats-stream",
            &self.stream,
            "--nats-subject",
            &self.template(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// `run --sink nats --drain` arguments for this scope, then `extra`.
    pub fn drain_args(&self, url: &str, extra: &[&str]) -> Vec<String> {
        let mut args = self.relay_args(url);
        args.push("--drain".to_owned());
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args
    }
}

/// A message as the witness read it from the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// Its stream sequence.
    pub sequence: u64,
    /// Its subject.
    pub subject: String,
    /// Headers as text (the first value of each).
    pub headers: BTreeMap<String, String>,
    /// The body.
    pub payload: Vec<u8>,
}

impl Stored {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// As a consumed message: subject as topic, `aggregateId` as key.
    pub fn consumed(&self) -> Consumed {
        Consumed {
            topic: self.subject.clone(),
            partition: 0,
            key: self.header("aggregateId").map(str::to_owned),
            payload: Some(self.payload.clone()),
            headers: self.headers.clone(),
        }
    }
}

/// The witness: a client of the test's own.
pub struct Witness {
    jetstream: Context,
}

impl Witness {
    /// Connects to the shared server, failing the test with the URL when
    /// it cannot.
    pub async fn connect() -> Self {
        Self::connect_to(&nats_url()).await
    }

    /// Connects to `url`, failing the test when it cannot.
    pub async fn connect_to(url: &str) -> Self {
        Self::connect_with(url, async_nats::ConnectOptions::new()).await
    }

    /// Connects to the TLS server at `url`, trusting only `root`.
    pub async fn connect_tls(url: &str, root: &str) -> Self {
        // The test process has two TLS providers compiled in, like the
        // relay: choose one, as the relay does.
        let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
        let options = async_nats::ConnectOptions::new()
            .add_root_certificates(root.into())
            .require_tls(true);
        Self::connect_with(url, options).await
    }

    async fn connect_with(url: &str, options: async_nats::ConnectOptions) -> Self {
        let client = options
            .connect(url)
            .await
            .unwrap_or_else(|error| panic!("cannot connect to NATS at {url}: {error}"));
        Self {
            jetstream: jetstream::new(client),
        }
    }

    /// The JetStream context, for tests that publish themselves.
    pub fn jetstream(&self) -> &Context {
        &self.jetstream
    }

    /// Creates `stream` capturing `subjects` with `duplicate_window`.
    pub async fn create_stream(&self, stream: &str, subjects: &[&str], duplicate_window: Duration) {
        self.jetstream
            .create_stream(Config {
                name: stream.to_owned(),
                subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
                storage: StorageType::File,
                duplicate_window,
                ..Config::default()
            })
            .await
            .unwrap_or_else(|error| panic!("cannot create the stream {stream}: {error}"));
    }

    /// The stream's configuration; fails the test when it does not exist.
    pub async fn stream_config(&self, stream: &str) -> Config {
        self.jetstream
            .get_stream(stream)
            .await
            .unwrap_or_else(|error| panic!("no stream {stream}: {error}"))
            .cached_info()
            .config
            .clone()
    }

    /// Whether `stream` exists.
    pub async fn stream_exists(&self, stream: &str) -> bool {
        self.jetstream.get_stream(stream).await.is_ok()
    }

    /// How many messages `stream` holds.
    pub async fn count(&self, stream: &str) -> u64 {
        let mut handle = self
            .jetstream
            .get_stream(stream)
            .await
            .unwrap_or_else(|error| panic!("no stream {stream}: {error}"));
        handle.info().await.expect("stream info").state.messages
    }

    /// Waits until `stream` holds at least `expected` messages (or
    /// `timeout` passed), then reads every message it holds, in stream
    /// order, one by one by sequence.
    pub async fn read(&self, stream: &str, expected: u64, timeout: Duration) -> Vec<Stored> {
        let deadline = Instant::now() + timeout;
        while self.count(stream).await < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut handle = self.jetstream.get_stream(stream).await.expect("stream");
        let state = handle.info().await.expect("stream info").state.clone();
        let mut stored = Vec::with_capacity(state.messages as usize);
        if state.messages == 0 {
            return stored;
        }
        for sequence in state.first_sequence..=state.last_sequence {
            let message = handle
                .get_raw_message(sequence)
                .await
                .unwrap_or_else(|error| panic!("message {sequence} of {stream}: {error}"));
            stored.push(Stored {
                sequence: message.sequence,
                subject: message.subject.to_string(),
                headers: message
                    .headers
                    .iter()
                    .filter_map(|(name, values)| {
                        values
                            .first()
                            .map(|value| (name.to_string(), value.as_str().to_owned()))
                    })
                    .collect(),
                payload: message.payload.to_vec(),
            });
        }
        stored
    }

    /// Reads `stream` once it holds `ids.len()` messages (or after 30
    /// seconds) and checks it: every id there, per aggregate in sequence
    /// order. Returns what it read and the report.
    pub async fn check_stream(&self, stream: &str, ids: &[String]) -> (Vec<Stored>, StreamReport) {
        let stored = self
            .read(stream, ids.len() as u64, Duration::from_secs(30))
            .await;
        let messages: Vec<Consumed> = stored.iter().map(Stored::consumed).collect();
        let report = check_stream(&messages, ids);
        (stored, report)
    }

    /// Deletes `stream`, at the end of a test.
    pub async fn delete_stream(&self, stream: &str) {
        let _ = self.jetstream.delete_stream(stream).await;
    }
}

/// A NATS server of the test's own (`nats-server -js` on a free port,
/// storing in a directory of its own), for tests that stop the server.
/// The binary comes from `NATS_SERVER_BIN`, else the `PATH`.
pub struct PrivateServer {
    /// Its `nats://127.0.0.1:port` URL (`tls://localhost:port` when it
    /// serves TLS).
    pub url: String,
    port: u16,
    store: std::path::PathBuf,
    /// The monitoring port of a TLS server, for [`PrivateServer::connections`].
    monitor: Option<u16>,
    child: Option<std::process::Child>,
}

impl PrivateServer {
    /// Starts a server on a free port.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts a server that accepts TLS connections only, with the
    /// machine's certificate ([`crate::tls::SERVER_CERT`], issued to
    /// `localhost`), and serves its monitoring endpoint.
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        let port = crate::kafka::free_port();
        let store =
            std::env::temp_dir().join(format!("outbox-nats-{}", uuid::Uuid::now_v7().simple()));
        let mut server = Self {
            url: if tls {
                format!("tls://localhost:{port}")
            } else {
                format!("nats://127.0.0.1:{port}")
            },
            port,
            store,
            monitor: tls.then(crate::kafka::free_port),
            child: None,
        };
        server.restart();
        server
    }

    /// The server's monitoring view of its client connections (`/connz`,
    /// JSON: name and `tls_version` of each); TLS servers only.
    pub fn connections(&self) -> serde_json::Value {
        let monitor = self.monitor.expect("a server started with start_tls");
        let (code, body) = crate::http::get(&format!("127.0.0.1:{monitor}"), "/connz")
            .expect("the server's monitoring endpoint");
        assert_eq!(code, 200, "/connz: {body}");
        serde_json::from_str(&body).expect("/connz is JSON")
    }

    /// Kills the server; its streams stay on disk for [`Self::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.stop();
        let binary = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into());
        let mut command = std::process::Command::new(&binary);
        command
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.store);
        if let Some(monitor) = self.monitor {
            command.args([
                "--tls",
                "--tlscert",
                crate::tls::SERVER_CERT,
                "--tlskey",
                crate::tls::SERVER_KEY,
                "-m",
                &monitor.to_string(),
            ]);
        }
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start {binary} ({error}); install nats-server or set NATS_SERVER_BIN"
                )
            });
        self.child = Some(child);
        let address = format!("127.0.0.1:{}", self.port);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {address}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}
