//! The Kafka side: a consumer-group member whose offsets are committed only
//! for messages the application marked done, and the adapter from rdkafka's
//! message to [`IncomingMessage`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use outbox_core::IncomingMessage;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};

/// The consumer this example runs.
pub type OrderStreamConsumer = StreamConsumer<LoggingContext>;

/// Logs the group's rebalances, so an operator sees which partitions this
/// member holds, and librdkafka's errors once each rather than at every
/// retry.
#[derive(Default)]
pub struct LoggingContext {
    last_error: Mutex<Option<(String, Instant)>>,
}

/// How long an error is not repeated in the log.
const REPEAT_ERRORS_AFTER: Duration = Duration::from_secs(30);

impl ClientContext for LoggingContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        // Failures reach `error` as well; the rest is detail.
        tracing::debug!(target: "librdkafka", ?level, "{facility}: {message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let mut last = self.last_error.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((previous, at)) = last.as_ref()
            && previous == reason
            && at.elapsed() < REPEAT_ERRORS_AFTER
        {
            return;
        }
        *last = Some((reason.to_owned(), Instant::now()));
        tracing::warn!(%error, "kafka: {reason}");
    }
}

impl ConsumerContext for LoggingContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(partitions) => {
                tracing::info!(partitions = %list(partitions), "partitions assigned")
            }
            Rebalance::Revoke(partitions) => {
                tracing::info!(partitions = %list(partitions), "partitions revoked")
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance failed"),
        }
    }
}

fn list(partitions: &TopicPartitionList) -> String {
    let names: Vec<String> = partitions
        .elements()
        .iter()
        .map(|p| format!("{}/{}", p.topic(), p.partition()))
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(",")
    }
}

/// Settings of the consumer.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The consumer group.
    pub group: String,
    /// Further librdkafka settings, applied after the defaults.
    pub client_options: Vec<(String, String)>,
}

/// A member of the group, not subscribed yet.
///
/// Offsets are stored by the application ([`Consumer::store_offset_from_message`])
/// once a message's transaction committed, and librdkafka commits the
/// stored offsets periodically, when partitions are revoked in a
/// rebalance, and on close: a message is never committed before its
/// effect. A group new to a topic starts at its beginning.
pub fn consumer(settings: &KafkaSettings) -> anyhow::Result<OrderStreamConsumer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("group.id", &settings.group)
        .set("enable.auto.commit", "true")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        // A topic the relay creates after we subscribed is noticed soon.
        .set("topic.metadata.refresh.interval.ms", "10000");
    for (key, value) in &settings.client_options {
        config.set(key, value);
    }
    // Not overridable: auto-storing would commit offsets of messages whose
    // transaction has not committed.
    config.set("enable.auto.offset.store", "false");
    config
        .create_with_context(LoggingContext::default())
        .context("invalid Kafka client settings (check -X options)")
}

/// Fails unless a broker answers within `timeout`, so an unreachable
/// cluster is an error at start rather than a silent wait.
pub fn check_brokers(
    consumer: &OrderStreamConsumer,
    brokers: &str,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let metadata = tokio::task::block_in_place(|| consumer.fetch_metadata(Some(topic), timeout))
        .with_context(|| {
            format!("cannot reach the Kafka brokers at {brokers} (--brokers / KAFKA_BROKERS)")
        })?;
    if metadata.brokers().is_empty() {
        bail!("the Kafka cluster at {brokers} lists no brokers");
    }
    let exists = metadata
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
    if !exists {
        tracing::warn!(
            topic,
            "the topic does not exist yet; waiting for the relay to create it"
        );
    }
    Ok(())
}

/// The message as the decoder and the inbox read it. Headers without a
/// value are left out.
pub fn incoming<'a>(message: &'a BorrowedMessage<'_>) -> IncomingMessage<'a> {
    let mut incoming = IncomingMessage::new(message.topic(), message.payload());
    if let Some(key) = message.key() {
        incoming = incoming.key(key);
    }
    if let Some(headers) = message.headers() {
        incoming = incoming.headers(
            headers
                .iter()
                .filter_map(|header| Some((header.key, header.value?))),
        );
    }
    incoming
}

/// `topic/partition@offset`, for messages to the operator.
pub fn position(message: &BorrowedMessage<'_>) -> String {
    format!(
        "{}/{}@{}",
        message.topic(),
        message.partition(),
        message.offset()
    )
}
