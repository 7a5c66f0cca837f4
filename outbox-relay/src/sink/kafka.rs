//! Publishes to a Kafka-API broker through librdkafka: an idempotent
//! producer with `acks=all`, so an acknowledged message is on every in-sync
//! replica and retries inside the producer neither duplicate nor reorder it.
//!
//! Per-partition order is never traded for liveness. librdkafka may leave a
//! gap when a message fails (for example expires in its queue), letting a
//! later message of the same partition be written first, so the producer is
//! configured to stop rather than leave a gap (`enable.gapless.guarantee`):
//! a failure that would leave one is a fatal error. The sink bounds each
//! batch with its own send timeout: when acknowledgements do not arrive in
//! time, or the producer hit a fatal error, it purges every queued message
//! at once and replaces the producer. Purging drops a partition's whole
//! queue, never a message in its middle, and unacknowledged rows stay
//! pending, so an aggregate's events are re-sent in order.
//!
//! Messages also expire in librdkafka after the send timeout
//! (`message.timeout.ms`), which it checks before it sends anything after a
//! pause: a relay stopped (SIGSTOP) with messages queued, whose shards
//! moved to another relay meanwhile, does not send them when it resumes
//! (the expiry is a fatal error, and the producer is replaced). Only
//! requests librdkafka had already built for the socket may still go out.
//!
//! librdkafka's own queue is bounded to [`QUEUE_MAX_KBYTES`] (its default
//! is about 1 GB): the relay hands it one batch at a time, itself bounded
//! in bytes, and a message that does not fit waits until acknowledged ones
//! leave the queue. `-X queue.buffering.max.kbytes=...` and
//! `-X queue.buffering.max.messages=...` override the bounds.
//!
//! A batch is enqueued at once and its delivery reports awaited together.
//! Topics are looked up (and, unless turned off, created through the admin
//! API) the first time a batch needs them, and again after a failed delivery.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rdkafka::ClientContext;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _, PurgeConfig};

use super::{SendError, Sink};
use crate::cloudevents;
use crate::message::Message;

/// librdkafka's `queue.buffering.max.kbytes` unless set otherwise: 32 MiB,
/// room for a batch at the relay's byte bound (2 MiB by default) or of
/// CDC mode's pieces many times over, and for a message of librdkafka's
/// largest size.
pub const QUEUE_MAX_KBYTES: u32 = 32 << 10;

/// librdkafka's `queue.buffering.max.messages` unless set otherwise: a
/// few batches of the largest batch size (10,000 rows).
pub const QUEUE_MAX_MESSAGES: u32 = 50_000;

/// Settings of the Kafka sink.
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    /// `bootstrap.servers`: comma-separated `host:port` list.
    pub brokers: String,
    /// Create a missing topic through the admin API; otherwise its rows stay
    /// pending and the relay says which topic to create.
    pub create_topics: bool,
    /// Partitions of a created topic.
    pub topic_partitions: i32,
    /// Replication factor of a created topic.
    pub topic_replication_factor: i32,
    /// How long to wait for a batch's acknowledgements before abandoning the
    /// unacknowledged messages and replacing the producer.
    pub send_timeout: Duration,
    /// Further librdkafka settings (`security.protocol`, `sasl.*`,
    /// `compression.type`, ...), applied last.
    pub client_options: Vec<(String, String)>,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            create_topics: true,
            topic_partitions: 1,
            topic_replication_factor: 1,
            send_timeout: Duration::from_secs(30),
            client_options: Vec::new(),
        }
    }
}

/// A failure to set up the Kafka sink.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSetupError {
    /// librdkafka refused the configuration.
    #[error("invalid Kafka configuration: {0}")]
    Config(KafkaError),
    /// No broker answered.
    #[error("cannot reach the Kafka brokers at {brokers}: {source}")]
    Unreachable {
        /// The bootstrap servers.
        brokers: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
}

/// Sends librdkafka's own log lines and connection errors to DEBUG: during a
/// broker outage they repeat every second per connection, and the relay
/// already reports each failed batch with its cause. Fatal errors stay ERROR.
#[derive(Debug, Clone, Copy, Default)]
pub struct RelayClientContext;

impl ClientContext for RelayClientContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical => {
                tracing::error!(target: "librdkafka", facility, message)
            }
            _ => tracing::debug!(target: "librdkafka", facility, message),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            tracing::error!(target: "librdkafka", %error, reason, "fatal Kafka client error");
        } else {
            tracing::debug!(target: "librdkafka", %error, reason, "Kafka client error");
        }
    }
}

type Producer = FutureProducer<RelayClientContext>;

/// Publishes messages to Kafka.
pub struct KafkaSink {
    config: ClientConfig,
    producer: RwLock<Producer>,
    admin: AdminClient<RelayClientContext>,
    options: KafkaOptions,
    known_topics: Mutex<HashSet<String>>,
}

impl KafkaSink {
    /// Creates the producer and checks that a broker answers.
    pub async fn connect(options: KafkaOptions) -> Result<Self, KafkaSetupError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &options.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set(
                "message.timeout.ms",
                options.send_timeout.as_millis().max(1).to_string(),
            )
            .set("enable.gapless.guarantee", "true")
            .set("queue.buffering.max.kbytes", QUEUE_MAX_KBYTES.to_string())
            .set(
                "queue.buffering.max.messages",
                QUEUE_MAX_MESSAGES.to_string(),
            )
            .set("client.id", "outbox-relay");
        for (key, value) in &options.client_options {
            config.set(key, value);
        }
        let producer: Producer = config
            .create_with_context(RelayClientContext)
            .map_err(KafkaSetupError::Config)?;
        let admin: AdminClient<RelayClientContext> = config
            .create_with_context(RelayClientContext)
            .map_err(KafkaSetupError::Config)?;

        let probe = producer.clone();
        tokio::task::spawn_blocking(move || {
            probe
                .client()
                .fetch_metadata(None, Duration::from_secs(10))
                .map(|_| ())
        })
        .await
        .expect("metadata probe does not panic")
        .map_err(|source| KafkaSetupError::Unreachable {
            brokers: options.brokers.clone(),
            source,
        })?;

        Ok(Self {
            config,
            producer: RwLock::new(producer),
            admin,
            options,
            known_topics: Mutex::new(HashSet::new()),
        })
    }

    /// The current producer.
    fn producer(&self) -> Producer {
        self.producer.read().expect("producer lock").clone()
    }

    /// Drops every message still queued in `broken` and puts a fresh
    /// producer in its place.
    fn replace_producer(&self, broken: &Producer, why: &str) {
        broken.purge(PurgeConfig::default().queue().inflight());
        match self
            .config
            .create_with_context::<_, Producer>(RelayClientContext)
        {
            Ok(fresh) => {
                tracing::warn!(reason = why, "replaced the Kafka producer");
                *self.producer.write().expect("producer lock") = fresh;
            }
            Err(error) => tracing::error!(%error, "cannot create a new Kafka producer"),
        }
    }

    /// Makes sure each topic exists; returns the error of those that do not.
    async fn ensure_topics<'a>(&self, topics: HashSet<&'a str>) -> HashMap<&'a str, SendError> {
        let unknown: Vec<&str> = {
            let known = self.known_topics.lock().expect("topic set lock");
            topics
                .into_iter()
                .filter(|topic| !known.contains(*topic))
                .collect()
        };
        let mut missing = HashMap::new();
        for topic in unknown {
            let result = match self.topic_exists(topic).await {
                Err(_) if self.options.create_topics => self.create_topic(topic).await,
                found => found,
            };
            match result {
                Ok(()) => {
                    self.known_topics
                        .lock()
                        .expect("topic set lock")
                        .insert(topic.to_owned());
                }
                Err(error) => {
                    tracing::warn!(topic, %error, "topic is not available; its events stay pending");
                    missing.insert(topic, error);
                }
            }
        }
        missing
    }

    async fn create_topic(&self, topic: &str) -> Result<(), SendError> {
        let new_topic = NewTopic::new(
            topic,
            self.options.topic_partitions,
            TopicReplication::Fixed(self.options.topic_replication_factor),
        );
        let options = AdminOptions::new()
            .operation_timeout(Some(Duration::from_secs(10)))
            .request_timeout(Some(Duration::from_secs(10)));
        let results = self
            .admin
            .create_topics([&new_topic], &options)
            .await
            .map_err(|error| {
                SendError::transient(format!("cannot create topic {topic}: {error}"))
            })?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, RDKafkaErrorCode::InvalidTopic)) => {
                    return Err(SendError::permanent(format!(
                        "invalid topic name {topic:?}"
                    )));
                }
                Err((_, code)) => {
                    return Err(SendError::transient(format!(
                        "cannot create topic {topic}: {code}"
                    )));
                }
            }
        }
        tracing::info!(topic, "created topic");
        Ok(())
    }

    async fn topic_exists(&self, topic: &str) -> Result<(), SendError> {
        let producer = self.producer();
        let name = topic.to_owned();
        let metadata = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(Some(&name), Duration::from_secs(10))
        })
        .await
        .expect("metadata lookup does not panic")
        .map_err(|error| SendError::transient(format!("cannot look up topic {topic}: {error}")))?;
        let exists = metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
        if exists {
            Ok(())
        } else {
            Err(SendError::transient(format!(
                "topic {topic} does not exist and topic creation is off; \
                 create it or run with --create-topics"
            )))
        }
    }

    /// Hands one message to the producer, waiting while its queue is full.
    async fn enqueue(
        producer: &Producer,
        message: &Message<'_>,
        deadline: tokio::time::Instant,
    ) -> Result<rdkafka::producer::DeliveryFuture, SendError> {
        let wire = message
            .wire(cloudevents::KAFKA_PREFIX)
            .map_err(SendError::permanent)?;
        let mut headers = OwnedHeaders::new_with_capacity(wire.headers.len() + 1);
        if let Some(content_type) = wire.content_type {
            headers = headers.insert(Header {
                key: "content-type",
                value: Some(content_type.as_bytes()),
            });
        }
        for (name, value) in &wire.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        let mut record = FutureRecord::to(&message.topic).headers(headers);
        if let Some(key) = message.wire_key() {
            record = record.key(key.as_bytes());
        }
        if let Some(value) = &wire.value {
            record = record.payload(value.as_bytes());
        }
        if let Some(timestamp) = message.timestamp {
            record = record.timestamp(timestamp);
        }
        if let Some(partition) = &message.partition {
            let partition = partition.as_ref().map_err(SendError::permanent)?;
            record = record.partition(*partition);
        }
        loop {
            match producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(SendError::transient("the producer queue stayed full"));
                    }
                    record = returned;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((error, _)) => return Err(classify(&message.topic, error)),
            }
        }
    }

    fn forget_topic(&self, topic: &str) {
        self.known_topics
            .lock()
            .expect("topic set lock")
            .remove(topic);
    }

    /// [`Sink::publish`], handing no message to the producer after
    /// `fresh_until` when given.
    async fn send(
        &self,
        messages: &[Message<'_>],
        fresh_until: Option<Instant>,
    ) -> Vec<Result<(), SendError>> {
        let topics = messages.iter().map(|message| &*message.topic).collect();
        let missing = self.ensure_topics(topics).await;
        let deadline = tokio::time::Instant::now() + self.options.send_timeout;
        let producer = self.producer();

        let mut outcomes: Vec<Option<Result<(), SendError>>> = vec![None; messages.len()];
        let mut deliveries = Vec::with_capacity(messages.len());
        let mut failed_keys: HashSet<(&str, &str)> = HashSet::new();
        for (index, message) in messages.iter().enumerate() {
            let key = (&*message.topic, &*message.key);
            if failed_keys.contains(&key) {
                outcomes[index] = Some(Err(SendError::held_back()));
                continue;
            }
            if fresh_until.is_some_and(|until| Instant::now() >= until) {
                outcomes[index] = Some(Err(SendError::stale()));
                continue;
            }
            let enqueued = match missing.get(&*message.topic) {
                Some(error) => Err(error.clone()),
                None => Self::enqueue(&producer, message, deadline).await,
            };
            match enqueued {
                Ok(delivery) => deliveries.push((index, delivery)),
                Err(error) => {
                    failed_keys.insert(key);
                    outcomes[index] = Some(Err(error));
                }
            }
        }

        // Acknowledgements arrive about in the order the messages were
        // handed over: awaited in that order, the task is woken about once
        // per acknowledgement it waits for, not once per message.
        let deadline = tokio::time::sleep_until(deadline);
        tokio::pin!(deadline);
        let mut timed_out = false;
        for (index, delivery) in deliveries {
            let delivery = tokio::select! {
                biased;
                delivery = delivery => delivery,
                () = &mut deadline => {
                    timed_out = true;
                    break;
                }
            };
            let topic = &messages[index].topic;
            outcomes[index] = Some(match delivery {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((error, _))) => {
                    // The broker may have lost the topic (restarted, new
                    // cluster): make sure it exists before the next batch.
                    self.forget_topic(topic);
                    Err(classify(topic, error))
                }
                Err(_canceled) => Err(SendError::transient("the producer shut down")),
            });
        }
        self.finish(&producer, outcomes, timed_out)
    }

    /// The batch's outcomes once its deliveries resolved or it `timed_out`
    /// (the unresolved ones fail, and the producer is replaced, as after a
    /// fatal error).
    fn finish(
        &self,
        producer: &Producer,
        mut outcomes: Vec<Option<Result<(), SendError>>>,
        timed_out: bool,
    ) -> Vec<Result<(), SendError>> {
        if timed_out {
            let reason = format!(
                "no acknowledgement within {}",
                humantime::format_duration(self.options.send_timeout)
            );
            for outcome in outcomes.iter_mut().filter(|outcome| outcome.is_none()) {
                *outcome = Some(Err(SendError::transient(reason.clone())));
            }
            self.known_topics.lock().expect("topic set lock").clear();
            self.replace_producer(producer, &reason);
        } else if let Some(fatal) = producer.client().fatal_error() {
            self.replace_producer(producer, &format!("fatal error: {fatal:?}"));
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.expect("every message has an outcome"))
            .collect()
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>> {
        self.send(messages, None).await
    }

    /// Checks `fresh_until` before each message it hands to the producer.
    async fn publish_until(
        &self,
        messages: &[Message<'_>],
        fresh_until: Instant,
    ) -> Vec<Result<(), SendError>> {
        self.send(messages, Some(fresh_until)).await
    }

    async fn probe(&self) -> bool {
        let producer = self.producer();
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, Duration::from_secs(2))
                .is_ok()
        })
        .await
        .unwrap_or(false)
    }

    async fn flush(&self, timeout: Duration) {
        let producer = self.producer();
        let flushed = tokio::task::spawn_blocking(move || producer.flush(timeout)).await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!(%error, "messages were still in flight at shutdown; they stay pending");
        }
    }
}

/// Whether the broker will ever take the message.
fn classify(topic: &str, error: KafkaError) -> SendError {
    let reason = format!("publishing to {topic} failed: {error}");
    match error.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidMessage,
        ) => SendError::permanent(reason),
        _ => SendError::transient(reason),
    }
}
