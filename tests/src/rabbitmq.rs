//! The RabbitMQ broker of the tests (`127.0.0.1:5672`, guest/guest, as on
//! every development machine and CI; `OUTBOX_TEST_AMQP_URL` overrides it):
//! per-test exchanges and queues, reading a queue back with a real client,
//! closing the relay's connection from the server's side, and a private
//! broker of a test's own ([`PrivateServer`]) for tests that stop it.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::kafka::Consumed;
use crate::stream::{StreamReport, check_stream};

/// The broker's URL; fails the test when nothing listens there.
pub fn amqp_url() -> String {
    let url = std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    if std::net::TcpStream::connect_timeout(
        &"127.0.0.1:5672".parse().expect("address"),
        Duration::from_secs(2),
    )
    .is_err()
        && std::env::var("OUTBOX_TEST_AMQP_URL").is_err()
    {
        panic!("no RabbitMQ at 127.0.0.1:5672: start it (`service rabbitmq-server start`)");
    }
    url
}

/// A unique exchange or queue name for one test.
pub fn unique(test: &str) -> String {
    format!("t{}.{test}", uuid::Uuid::now_v7().simple())
}

/// A message as a client read it from a queue.
#[derive(Debug, Clone)]
pub struct Received {
    /// Routing key as `topic`, `aggregateId` as `key`, headers as text.
    pub message: Consumed,
    /// The AMQP properties.
    pub properties: BasicProperties,
}

/// A test's own connection to the broker.
pub struct Broker {
    connection: Connection,
    channel: Channel,
}

impl Broker {
    /// Connects to the shared broker, failing the test with the URL when
    /// it cannot.
    pub async fn connect() -> Self {
        Self::connect_to(&amqp_url()).await
    }

    /// Connects to `url`, failing the test when it cannot.
    pub async fn connect_to(url: &str) -> Self {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|error| panic!("cannot connect to RabbitMQ at {url}: {error}"));
        let channel = connection.create_channel().await.expect("channel");
        Self {
            connection,
            channel,
        }
    }

    /// Declares `exchange` as the relay does (durable topic).
    pub async fn declare_exchange(&self, exchange: &str, kind: ExchangeKind) {
        self.channel
            .exchange_declare(
                exchange.into(),
                kind,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");
    }

    /// Declares `queue` (durable, with `arguments`) and binds it to
    /// `exchange` for `pattern`, declaring the exchange first.
    pub async fn bind_queue(
        &self,
        exchange: &str,
        queue: &str,
        pattern: &str,
        arguments: FieldTable,
    ) {
        self.declare_exchange(exchange, ExchangeKind::Topic).await;
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                arguments,
            )
            .await
            .expect("declare queue");
        self.channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                pattern.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
    }

    /// Reads (and acks) messages from `queue` until `expected` arrived or
    /// `timeout` passed, then for `settle` longer and until the queue is
    /// empty, to catch extra ones.
    pub async fn read(
        &self,
        queue: &str,
        expected: usize,
        timeout: Duration,
        settle: Duration,
    ) -> Vec<Received> {
        let mut received = Vec::new();
        let deadline = Instant::now() + timeout;
        let mut settle_until: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if received.len() >= expected && settle_until.is_none() {
                settle_until = Some(now + settle);
            }
            if now > deadline {
                return received;
            }
            let got = self
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get");
            match got {
                Some(message) => received.push(to_received(message.delivery)),
                // Extra copies are read to the end of the queue, however
                // slowly a loaded machine reads them.
                None if settle_until.is_some_and(|until| Instant::now() > until) => {
                    return received;
                }
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Reads `queue` until every event of `ids` could have arrived (two
    /// minutes at most, then half a second for extra copies) and checks
    /// it: every id there, per aggregate in sequence order.
    pub async fn check_queue(&self, queue: &str, ids: &[String]) -> StreamReport {
        let received = self
            .read(
                queue,
                ids.len(),
                Duration::from_secs(120),
                Duration::from_millis(500),
            )
            .await;
        let messages: Vec<Consumed> = received.into_iter().map(|m| m.message).collect();
        check_stream(&messages, ids)
    }

    /// Empties `queue`.
    pub async fn purge_queue(&self, queue: &str) {
        self.channel
            .queue_purge(queue.into(), QueuePurgeOptions::default())
            .await
            .expect("purge queue");
    }

    /// Deletes `queue`.
    pub async fn delete_queue(&self, queue: &str) {
        self.channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .expect("delete queue");
    }

    /// Closes the connection.
    pub async fn close(self) {
        let _ = self.connection.close(200, "done".into()).await;
    }

    /// Deletes `exchange` and `queues`, at the end of a test.
    pub async fn clean_up(self, exchange: &str, queues: &[&str]) {
        for queue in queues {
            let _ = self
                .channel
                .queue_delete((*queue).into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self
            .channel
            .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
            .await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// Queue arguments: at most `length` messages, refusing (nacking) more.
pub fn reject_publish_beyond(length: i64) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(length));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    arguments
}

fn to_received(delivery: lapin::message::Delivery) -> Received {
    let headers: BTreeMap<String, String> = delivery
        .properties
        .headers()
        .as_ref()
        .map(|table| {
            table
                .inner()
                .iter()
                .map(|(name, value)| (name.to_string(), header_text(value)))
                .collect()
        })
        .unwrap_or_default();
    Received {
        message: Consumed {
            topic: delivery.routing_key.to_string(),
            partition: 0,
            key: headers.get("aggregateId").cloned(),
            payload: Some(delivery.data.clone()),
            headers,
        },
        properties: delivery.properties,
    }
}

fn header_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(text) => String::from_utf8_lossy(text.as_bytes()).into_owned(),
        AMQPValue::ShortString(text) => text.to_string(),
        other => format!("{other:?}"),
    }
}

/// Closes, from the server's side, every connection whose client named
/// itself `name`; returns how many. Uses `rabbitmqctl`, which must be on
/// the PATH (it is wherever the server runs).
pub fn close_connections_named(name: &str) -> usize {
    let output = Command::new("rabbitmqctl")
        .args([
            "list_connections",
            "pid",
            "client_properties",
            "--no-table-headers",
            "-q",
        ])
        .output()
        .expect("rabbitmqctl must be installed to close connections from the server");
    assert!(
        output.status.success(),
        "rabbitmqctl list_connections failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Lines of `<pid>\t[..,{"connection_name","name"},..]`.
    let named = format!("{{\"connection_name\",\"{name}\"}}");
    let mut closed = 0;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some((pid, properties)) = line.split_once('\t') else {
            continue;
        };
        if !properties.contains(&named) {
            continue;
        }
        let status = Command::new("rabbitmqctl")
            .args(["close_connection", pid.trim(), "closed by a test", "-q"])
            .status()
            .expect("rabbitmqctl close_connection");
        if status.success() {
            closed += 1;
        }
    }
    closed
}

/// A RabbitMQ node of the test's own, for tests that stop the broker: its
/// own node name, AMQP and distribution ports on loopback, and its
/// database, logs, configuration and Erlang cookie in a directory of its
/// own, so that stopping it leaves the shared broker alone. Its queues and
/// persistent messages survive [`PrivateServer::restart`]. The start script
/// comes from `RABBITMQ_SERVER_BIN`, else RabbitMQ's own
/// `/usr/lib/rabbitmq/bin/rabbitmq-server` (Debian's `/usr/sbin` wrapper
/// switches user and log files), else the `PATH`.
pub struct PrivateServer {
    /// Its `amqp://guest:guest@127.0.0.1:port/%2f` URL.
    pub url: String,
    /// Its `amqps://guest:guest@localhost:port/%2f` URL, when started with
    /// [`PrivateServer::start_tls`].
    pub tls_url: Option<String>,
    node: String,
    port: u16,
    dist_port: u16,
    home: PathBuf,
    child: Option<Child>,
}

impl PrivateServer {
    /// Starts a node on free ports and waits until it accepts AMQP
    /// connections.
    pub async fn start() -> Self {
        Self::start_with(false).await
    }

    /// Starts a node that also accepts TLS connections (`tls_url`), with
    /// the machine's certificate ([`crate::tls::SERVER_CERT`], issued to
    /// `localhost`), and waits until it accepts AMQP connections.
    pub async fn start_tls() -> Self {
        Self::start_with(true).await
    }

    async fn start_with(tls: bool) -> Self {
        let unique = uuid::Uuid::now_v7().simple().to_string();
        let home = std::env::temp_dir().join(format!("outbox-rabbitmq-{unique}"));
        std::fs::create_dir_all(&home).expect("the broker's directory");
        let port = crate::kafka::free_port();
        let dist_port = crate::kafka::free_port();
        let mut config = format!("listeners.tcp.default = 127.0.0.1:{port}\n");
        let mut tls_url = None;
        if tls {
            let tls_port = crate::kafka::free_port();
            config.push_str(&format!(
                "listeners.ssl.default = 127.0.0.1:{tls_port}\n\
                 ssl_options.certfile = {}\n\
                 ssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_none\n\
                 ssl_options.fail_if_no_peer_cert = false\n",
                crate::tls::SERVER_CERT,
                crate::tls::SERVER_KEY
            ));
            tls_url = Some(format!("amqps://guest:guest@localhost:{tls_port}/%2f"));
        }
        std::fs::write(home.join("rabbitmq.conf"), config).expect("rabbitmq.conf");
        std::fs::write(home.join("enabled_plugins"), "[].\n").expect("enabled_plugins");
        // Replaces /etc/rabbitmq/rabbitmq-env.conf, which names the shared node.
        std::fs::write(home.join("rabbitmq-env.conf"), "").expect("rabbitmq-env.conf");
        let mut server = Self {
            url: format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
            tls_url,
            node: format!("outbox-test-{unique}@localhost"),
            port,
            dist_port,
            home,
            child: None,
        };
        server.launch();
        server.wait_until_ready().await;
        server
    }

    /// Stops the node with SIGTERM to its start script, which stops the
    /// Erlang VM in order (queues flushed) and waits for it; SIGKILL after
    /// 60 seconds.
    pub async fn stop(&mut self) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.exited() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.kill();
    }

    /// Kills the node with SIGKILL: a crash, nothing flushed that was not
    /// on disk already.
    pub fn kill(&mut self) {
        self.signal("KILL");
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// Starts the stopped node again on the same ports and database, and
    /// waits until it accepts AMQP connections.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill the node first");
        self.launch();
        self.wait_until_ready().await;
    }

    /// The node's client connections as `rabbitmqctl list_connections`
    /// shows them: each one's `connection_name` property (or empty) and
    /// whether it is encrypted (`ssl`).
    pub fn connections(&self) -> Vec<(String, bool)> {
        // The packaged wrapper on the PATH switches to the broker's user,
        // whose cookie is not this node's: the tool beside the start script
        // runs as the test, with the node's home.
        let server = PathBuf::from(rabbitmq_server_bin());
        let ctl = server.with_file_name("rabbitmqctl");
        let ctl = if ctl.exists() {
            ctl
        } else {
            PathBuf::from("rabbitmqctl")
        };
        let output = Command::new(ctl)
            .env("HOME", &self.home)
            .env(
                "RABBITMQ_CONF_ENV_FILE",
                self.home.join("rabbitmq-env.conf"),
            )
            .args([
                "-n",
                &self.node,
                "list_connections",
                "ssl",
                "client_properties",
                "--no-table-headers",
                "-q",
            ])
            .output()
            .expect("rabbitmqctl must be installed to list the node's connections");
        assert!(
            output.status.success(),
            "rabbitmqctl list_connections failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        // Lines of `<ssl>\t[..,{"connection_name","name"},..]`.
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let (ssl, properties) = line.split_once('\t')?;
                let name = properties
                    .split_once("{\"connection_name\",\"")
                    .and_then(|(_, rest)| rest.split_once('"'))
                    .map(|(name, _)| name.to_owned())
                    .unwrap_or_default();
                Some((name, ssl.trim() == "true"))
            })
            .collect()
    }

    /// The node's log so far, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home.join("server.out")).unwrap_or_default()
    }

    fn launch(&mut self) {
        let binary = rabbitmq_server_bin();
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.home.join("server.out"))
            .expect("the broker's output file");
        let mut command = Command::new(&binary);
        command
            .env("HOME", &self.home)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.home.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.home.join("log"))
            .env("RABBITMQ_CONFIG_FILE", self.home.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                self.home.join("advanced.config"),
            )
            .env(
                "RABBITMQ_CONF_ENV_FILE",
                self.home.join("rabbitmq-env.conf"),
            )
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.home.join("enabled_plugins"),
            )
            .env(
                "RABBITMQ_PLUGINS_EXPAND_DIR",
                self.home.join("plugins-expand"),
            )
            .current_dir(&self.home)
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("output file"))
            .stderr(output)
            // Its own process group, so that stopping it reaches the VM.
            .process_group(0);
        let child = command.spawn().unwrap_or_else(|error| {
            panic!(
                "cannot start {binary} ({error}); install rabbitmq-server or set RABBITMQ_SERVER_BIN"
            )
        });
        self.child = Some(child);
    }

    async fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(connection) =
                Connection::connect(&self.url, ConnectionProperties::default()).await
            {
                let _ = connection.close(200, "ready".into()).await;
                return;
            }
            assert!(
                !self.exited(),
                "the private RabbitMQ node exited at start:\n{}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "the private RabbitMQ node did not accept connections within 120s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("try_wait").is_some(),
            None => true,
        }
    }

    /// Sends `signal` to the node's process group: the start script, the
    /// Erlang VM and its helpers.
    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg("--")
                .arg(format!("-{}", child.id()))
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn rabbitmq_server_bin() -> String {
    if let Ok(bin) = std::env::var("RABBITMQ_SERVER_BIN") {
        return bin;
    }
    let packaged = "/usr/lib/rabbitmq/bin/rabbitmq-server";
    if std::path::Path::new(packaged).exists() {
        packaged.into()
    } else {
        "rabbitmq-server".into()
    }
}
