//! The RabbitMQ broker of the tests (`127.0.0.1:5672`, guest/guest, as on
//! every development machine and CI; `OUTBOX_TEST_AMQP_URL` overrides it):
//! per-test exchanges and queues, reading a queue back with a real client,
//! and closing the relay's connection from the server's side.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::kafka::Consumed;

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
    /// Connects, failing the test with the URL when it cannot.
    pub async fn connect() -> Self {
        let url = amqp_url();
        let connection = Connection::connect(&url, ConnectionProperties::default())
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
    /// `timeout` passed, then for `settle` longer to catch extra ones.
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
            if settle_until.is_some_and(|until| now > until) || now > deadline {
                return received;
            }
            let got = self
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get");
            match got {
                Some(message) => received.push(to_received(message.delivery)),
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Deletes `queue`.
    pub async fn delete_queue(&self, queue: &str) {
        self.channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .expect("delete queue");
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
