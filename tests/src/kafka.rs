//! The Kafka-API broker of the tests: reading topics back with a real
//! consumer, and starting a private broker for tests that stop it.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The shared broker, started by `scripts/kafka.sh start`
/// (`KAFKA_BROKERS`, default `127.0.0.1:9092`).
pub fn brokers() -> String {
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let first = brokers.split(',').next().unwrap_or_default().to_owned();
    if std::net::TcpStream::connect_timeout(
        &first
            .parse()
            .unwrap_or_else(|_| panic!("KAFKA_BROKERS={brokers} is not host:port")),
        Duration::from_secs(2),
    )
    .is_err()
    {
        panic!(
            "no Kafka-API broker at {brokers}: start one with `scripts/kafka.sh start` \
             (the test command `scripts/test.sh` does)"
        );
    }
    brokers
}

/// A unique topic prefix for one test.
pub fn topic_prefix(test: &str) -> String {
    format!("t{}.{test}", uuid::Uuid::now_v7().simple())
}

/// Creates `topic` with `partitions` partitions through the admin API.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let results = admin
        .create_topics(
            [&NewTopic::new(
                topic,
                partitions,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .expect("create topics");
    for result in results {
        result.unwrap_or_else(|(name, code)| panic!("cannot create topic {name}: {code}"));
    }
}

/// A message as a consumer saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Consumed {
    /// Topic it was read from.
    pub topic: String,
    /// Partition it was read from.
    pub partition: i32,
    /// The key as text.
    pub key: Option<String>,
    /// The value's bytes; `None` for a tombstone.
    pub payload: Option<Vec<u8>>,
    /// Headers as text.
    pub headers: BTreeMap<String, String>,
}

impl Consumed {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// What the message says about its event, whatever its format:
    /// Debezium's headers (`id`), a binary CloudEvent's (`ce_id`) or a
    /// structured CloudEvent's envelope (`id` in the value).
    fn attribute(&self, debezium: &str, cloudevents: &str) -> Option<String> {
        if let Some(value) = self
            .header(debezium)
            .or_else(|| self.header(&format!("ce_{cloudevents}")))
        {
            return Some(value.to_owned());
        }
        let structured = self
            .header("content-type")
            .is_some_and(|value| value.starts_with("application/cloudevents"));
        if !structured {
            return None;
        }
        match &self.json()[cloudevents] {
            serde_json::Value::String(text) => Some(text.clone()),
            serde_json::Value::Null => None,
            other => Some(other.to_string()),
        }
    }

    /// The event id, in any format (see [`Consumed::attribute`]).
    pub fn event_id(&self) -> Option<String> {
        self.attribute("id", "id")
    }

    /// The aggregate sequence number, in any format.
    pub fn aggregate_sequence(&self) -> Option<i64> {
        self.attribute("aggregateSequence", "aggregatesequence")
            .map(|text| text.parse().expect("numeric sequence"))
    }

    /// The payload parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.payload.as_deref().expect("a payload")).expect("JSON payload")
    }
}

/// Reads `topic` from the beginning until `expected` messages arrived or
/// `timeout` passed, then for `settle` longer to catch extra messages.
pub fn consume(
    brokers: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
    settle: Duration,
) -> Vec<Consumed> {
    consume_timed(brokers, topic, expected, timeout, settle)
        .into_iter()
        .map(|(message, _)| message)
        .collect()
}

/// [`consume`], with each message's timestamp in milliseconds since the
/// Unix epoch (the producer's create time: when the relay handed it over).
pub fn consume_timed(
    brokers: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
    settle: Duration,
) -> Vec<(Consumed, Option<i64>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("reader-{}", uuid::Uuid::now_v7().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    let deadline = Instant::now() + timeout;
    let partitions = loop {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .expect("topic metadata");
        let count = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        if count > 0 {
            break count;
        }
        if Instant::now() > deadline {
            return Vec::new();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions as i32 {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .expect("assignment");
    }
    consumer.assign(&assignment).expect("assign");

    let mut messages = Vec::new();
    let mut settle_deadline: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if settle_deadline.is_some_and(|end| now > end)
            || (settle_deadline.is_none() && now > deadline)
        {
            break;
        }
        if settle_deadline.is_none() && messages.len() >= expected {
            settle_deadline = Some(now + settle);
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let headers = message
                    .headers()
                    .map(|headers| {
                        headers
                            .iter()
                            .map(|h| {
                                (
                                    h.key.to_owned(),
                                    String::from_utf8_lossy(h.value.unwrap_or_default())
                                        .into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let consumed = Consumed {
                    topic: message.topic().to_owned(),
                    partition: message.partition(),
                    key: message
                        .key()
                        .map(|k| String::from_utf8_lossy(k).into_owned()),
                    payload: message.payload().map(<[u8]>::to_vec),
                    headers,
                };
                messages.push((consumed, message.timestamp().to_millis()));
            }
            Some(Err(error)) => eprintln!("consumer: {error}"),
            None => {}
        }
    }
    messages
}

/// A broker of one test's own, on a free loopback port, for tests that stop
/// and restart it. Killed on drop.
pub struct PrivateBroker {
    /// Its `host:port`.
    pub address: String,
    port: u16,
    child: Option<Child>,
}

impl PrivateBroker {
    /// Starts tansu (from `TANSU_BIN`, `PATH` or `~/.cargo/bin`) on a free port.
    pub fn start() -> Self {
        let port = free_port();
        let mut broker = Self {
            address: format!("127.0.0.1:{port}"),
            port,
            child: None,
        };
        broker.restart();
        broker
    }

    /// Kills the broker; its topics and messages are gone (memory storage).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new(tansu_bin())
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{}", self.port),
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{}", self.port),
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start tansu ({error}); install it with `scripts/kafka.sh install`")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&self.address).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {}",
                self.address
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tansu_bin() -> String {
    if let Ok(bin) = std::env::var("TANSU_BIN") {
        return bin;
    }
    let home_bin = std::env::var("HOME")
        .map(|home| format!("{home}/.cargo/bin/tansu"))
        .unwrap_or_default();
    if std::path::Path::new(&home_bin).exists() {
        home_bin
    } else {
        "tansu".into()
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}
