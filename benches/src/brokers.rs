//! What the broker benchmarks (`bench-rabbitmq`, `bench-nats`,
//! `bench-brokers`) share: a backlog of pending rows drained by the relay
//! ([`Backlog::drain`]), the same rows published by a plain client of each
//! broker ([`kafka_client`], [`rabbitmq_client`], [`nats_client`]: the
//! broker's own ceiling), and commit-to-ack latency at a fixed rate
//! ([`Backlog::latency`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::HeaderMap;
use async_nats::jetstream::message::PublishMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use outbox_relay::message::TopicTemplate;
use outbox_relay::relay::{Relay, RelayOptions};
use outbox_relay::shutdown::Shutdown;
use outbox_relay::sink::Sink;
use outbox_relay::sink::nats::subject::encode_token;
use outbox_relay::source::{Source, SourceOptions};
use outbox_tests::TestDb;
use outbox_tests::nats::Scope;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sea_orm::{DatabaseConnection, TransactionTrait};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinSet;

use crate::load;
use crate::order::order_events;
use crate::progress;
use crate::recording::{Commit, CommitToAck, RecordingSink};
use crate::report::{self, Table};
use crate::stats::LatencySummary;

/// The backlog drained in each measurement (flattened into each broker
/// benchmark's options).
#[derive(Debug, Clone, Copy, Serialize, clap::Args)]
pub struct BacklogOptions {
    /// Pending events drained in each measurement.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// Aggregates the events are spread over (round-robin).
    #[arg(long, default_value_t = 1_000)]
    pub aggregates: usize,
    /// Rows per claim.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// Messages a plain client publishes before awaiting their
    /// acknowledgements.
    #[arg(long, default_value_t = 500)]
    pub client_batch: usize,
}

/// The fixed-rate part: writers commit events while the relay runs.
#[derive(Debug, Clone, Copy, Serialize, clap::Args)]
pub struct LatencyOptions {
    /// Events per second committed in the latency part (0 skips it).
    #[arg(long, default_value_t = 1_000)]
    pub rate: usize,
    /// Seconds of the latency part measured, after the warm-up.
    #[arg(long = "latency-seconds", default_value_t = 10)]
    pub seconds: u64,
    /// Seconds of the latency part not measured.
    #[arg(long, default_value_t = 2)]
    pub warmup_seconds: u64,
    /// Concurrent writers of the latency part.
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
}

/// A throughput measurement.
#[derive(Debug, Serialize)]
pub struct Measured {
    /// What was measured.
    pub what: String,
    /// Events published.
    pub events: usize,
    /// How long it took.
    pub seconds: f64,
    /// Events per second.
    pub events_per_second: f64,
}

impl Measured {
    /// `events` in `elapsed`; printed as progress.
    pub fn new(what: impl Into<String>, events: usize, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        let measured = Self {
            what: what.into(),
            events,
            seconds,
            events_per_second: events as f64 / seconds.max(1e-9),
        };
        progress!(
            "{}: {} events/s",
            measured.what,
            report::rate(measured.events_per_second)
        );
        measured
    }
}

/// Rows of measurements with their rate and its ratio to `ceiling`.
pub fn rate_table<'a>(ceiling: f64, rows: impl IntoIterator<Item = &'a Measured>) -> Table {
    let mut table = Table::new(["measurement", "events/s", "vs lower ceiling"]);
    for row in rows {
        table.row([
            row.what.clone(),
            report::rate(row.events_per_second),
            report::ratio(row.events_per_second / ceiling.max(1e-9)),
        ]);
    }
    table
}

/// Commit-to-ack latency of a fixed-rate run.
#[derive(Debug, Serialize)]
pub struct Latency {
    /// Events per second asked for.
    pub target_rate: usize,
    /// Events per second committed.
    pub achieved_rate: f64,
    /// Events measured.
    pub events: usize,
    /// Measured events never acknowledged.
    pub unacknowledged: usize,
    /// From `commit()` returning to the broker's acknowledgement.
    pub commit_to_ack: LatencySummary,
    /// Messages per sink call.
    pub mean_batch_size: f64,
}

impl Latency {
    /// One line: `what` and the percentiles.
    pub fn line(&self, what: &str) -> String {
        format!(
            "{what} at {} events/s (achieved {:.0}, {} events, {} unacknowledged, mean batch \
             {:.1}): p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
            self.target_rate,
            self.achieved_rate,
            self.events,
            self.unacknowledged,
            self.mean_batch_size,
            report::ms(self.commit_to_ack.p50_ms),
            report::ms(self.commit_to_ack.p90_ms),
            report::ms(self.commit_to_ack.p99_ms),
            report::ms(self.commit_to_ack.max_ms),
        )
    }
}

/// A row as the plain clients publish it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PlainRow {
    /// The event id.
    pub id: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The payload as stored.
    pub payload: String,
}

/// The outbox table of a benchmark's schema, its loader and the relay's
/// source on it.
pub struct Backlog {
    /// The backlog's size and the relay's batch.
    pub options: BacklogOptions,
    /// The loader's pool.
    pub pool: PgPool,
    /// The writers' connection.
    pub db: DatabaseConnection,
    /// The relay's source.
    pub source: Arc<dyn Source>,
    /// Where the relay publishes: `<unique prefix>.{aggregatetype}`, so
    /// that Kafka topics are the run's own (RabbitMQ and NATS are kept
    /// apart by exchange and stream).
    pub topics: TopicTemplate,
}

impl Backlog {
    /// A backlog in `schema`.
    pub async fn connect(schema: &TestDb, options: BacklogOptions) -> anyhow::Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(&schema.url)
            .await
            .context("connecting the loader")?;
        let source: Arc<dyn Source> =
            Arc::from(outbox_relay::source::connect(&schema.url, SourceOptions::default()).await?);
        let prefix = format!("bench{}", uuid::Uuid::now_v7().simple());
        Ok(Self {
            options,
            pool,
            db: schema.db.clone(),
            source,
            topics: TopicTemplate::new(format!("{prefix}.{{aggregatetype}}")),
        })
    }

    /// The topic (Kafka) or routing key (RabbitMQ) of the loaded rows.
    pub fn topic(&self) -> String {
        self.topics.topic("Order")
    }

    /// Empties the table and loads the backlog.
    pub async fn prepare(&self) -> anyhow::Result<()> {
        load::truncate(&self.pool).await?;
        load::load(
            &self.pool,
            self.options.events,
            self.options.aggregates,
            load::RowState::Pending,
        )
        .await?;
        load::analyze(&self.pool).await?;
        Ok(())
    }

    /// A relay publishing through `sink`; `drain` stops it once nothing is
    /// pending.
    pub fn relay(&self, sink: Arc<dyn Sink>, drain: bool) -> Relay {
        Relay::new(
            self.source.clone(),
            sink,
            self.topics.clone(),
            RelayOptions {
                batch_size: self.options.batch_size,
                drain,
                poll_interval: Duration::from_millis(100),
                retention: None,
                ..RelayOptions::default()
            },
        )
    }

    /// Loads the backlog and times the relay draining it through `sink`;
    /// a failed send voids the measurement.
    pub async fn drain(&self, what: String, sink: Arc<dyn Sink>) -> anyhow::Result<Measured> {
        self.prepare().await?;
        let relay = self.relay(sink, true);
        let stats = relay.stats();
        let start = Instant::now();
        let (_stop, shutdown) = Shutdown::manual();
        relay.run(shutdown).await?;
        let elapsed = start.elapsed();
        let published = stats.published.load(Ordering::Relaxed) as usize;
        let failed = stats.failed.load(Ordering::Relaxed);
        anyhow::ensure!(
            failed == 0 && published == self.options.events,
            "{what}: published {published}, failed {failed}; the measurement is void"
        );
        Ok(Measured::new(what, published, elapsed))
    }

    /// Loads the backlog and returns its rows in table order, for a plain
    /// client to publish.
    pub async fn rows(&self) -> anyhow::Result<Vec<PlainRow>> {
        self.prepare().await?;
        Ok(sqlx::query_as(
            "SELECT id::text AS id, aggregateid AS aggregate_id, payload::text AS payload \
             FROM outbox ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Writers commit events at `options.rate` per second while the relay
    /// publishes through `sink`; commit to acknowledgement, per event.
    pub async fn latency(
        &self,
        sink: Arc<dyn Sink>,
        options: &LatencyOptions,
    ) -> anyhow::Result<Latency> {
        load::truncate(&self.pool).await?;
        let sink = Arc::new(RecordingSink::new(sink));
        let relay = self.relay(sink.clone(), false);
        let (stop, shutdown) = Shutdown::manual();
        let relay = tokio::spawn(async move { relay.run(shutdown).await });

        let rate = options.rate.max(1);
        let period = Duration::from_secs(1) / rate as u32;
        let warmup = (options.warmup_seconds as usize) * rate;
        let transactions = warmup + (options.seconds as usize) * rate;
        let start = tokio::time::Instant::now() + Duration::from_millis(100);
        let next = Arc::new(AtomicUsize::new(0));
        let mut writers = JoinSet::new();
        for _ in 0..options.writers.max(1) {
            let (db, next) = (self.db.clone(), next.clone());
            let aggregates = self.options.aggregates.max(1);
            writers.spawn(async move {
                let mut commits = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= transactions {
                        break;
                    }
                    let due = start + period * n as u32;
                    tokio::time::sleep_until(due).await;
                    let aggregate_id = (n % aggregates).to_string();
                    let events = order_events(n as i64, 1)
                        .into_iter()
                        .map(|event| event.aggregate_id(aggregate_id.clone()));
                    let txn = db.begin().await?;
                    let appended = outbox_core::append(&txn, events).await?;
                    txn.commit().await?;
                    commits.push(Commit {
                        n,
                        ids: appended
                            .iter()
                            .map(|event| event.id.hyphenated().to_string())
                            .collect(),
                        due: due.into_std(),
                        committed: Instant::now(),
                    });
                }
                anyhow::Ok(commits)
            });
        }
        let mut commits = Vec::with_capacity(transactions);
        while let Some(writer) = writers.join_next().await {
            commits.extend(writer??);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while sink.acknowledged() < transactions && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.trigger();
        relay.await??;
        let window_start = start.into_std() + period * warmup as u32;
        let measured = CommitToAck::measure(&commits, sink.take(), warmup, window_start);
        progress!(
            "latency: commit-to-ack p50 {} ms, p99 {} ms",
            report::ms(measured.commit_to_ack.p50_ms),
            report::ms(measured.commit_to_ack.p99_ms)
        );
        Ok(Latency {
            target_rate: options.rate,
            achieved_rate: measured.achieved_rate,
            events: measured.events,
            unacknowledged: measured.unacknowledged,
            commit_to_ack: measured.commit_to_ack,
            mean_batch_size: measured.mean_batch_size,
        })
    }

    /// Closes the loader's pool.
    pub async fn close(self) {
        self.pool.close().await;
    }
}

/// Publishes `rows` to `topic` with an idempotent `acks=all` rdkafka
/// producer (as the relay's), keyed by aggregate, awaiting the deliveries
/// of every `batch` messages.
pub async fn kafka_client(
    what: &str,
    brokers: &str,
    topic: &str,
    rows: &[PlainRow],
    batch: usize,
) -> anyhow::Result<Measured> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    let start = Instant::now();
    for chunk in rows.chunks(batch.max(1)) {
        let mut deliveries = Vec::with_capacity(chunk.len());
        for row in chunk {
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "id",
                    value: Some(row.id.as_str()),
                })
                .insert(Header {
                    key: "eventType",
                    value: Some("OrderPlaced"),
                })
                .insert(Header {
                    key: "eventVersion",
                    value: Some("1"),
                });
            let record = FutureRecord::to(topic)
                .key(row.aggregate_id.as_str())
                .payload(row.payload.as_str())
                .headers(headers);
            deliveries.push(
                producer
                    .send_result(record)
                    .map_err(|(error, _)| anyhow::anyhow!("{what}: {error}"))?,
            );
        }
        for delivery in deliveries {
            delivery
                .await?
                .map_err(|(error, _)| anyhow::anyhow!("{what}: {error}"))?;
        }
    }
    Ok(Measured::new(what, rows.len(), start.elapsed()))
}

/// How [`rabbitmq_client`] publishes.
#[derive(Debug, Clone, Copy)]
pub struct AmqpPublish {
    /// With `mandatory`, as the relay does by default.
    pub mandatory: bool,
    /// Persistent (delivery mode 2), as the relay does.
    pub persistent: bool,
    /// Messages published before awaiting their confirms.
    pub batch: usize,
}

/// Publishes `rows` to `exchange` (routing key `routing_key`) with lapin on
/// a confirm-mode channel, awaiting the confirms of every `publish.batch`
/// messages.
pub async fn rabbitmq_client(
    what: &str,
    url: &str,
    exchange: &str,
    routing_key: &str,
    rows: &[PlainRow],
    publish: AmqpPublish,
) -> anyhow::Result<Measured> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let options = BasicPublishOptions {
        mandatory: publish.mandatory,
        ..BasicPublishOptions::default()
    };
    let start = Instant::now();
    for chunk in rows.chunks(publish.batch.max(1)) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for row in chunk {
            let mut headers = FieldTable::default();
            headers.insert("id".into(), AMQPValue::LongString(row.id.as_str().into()));
            headers.insert(
                "aggregateId".into(),
                AMQPValue::LongString(row.aggregate_id.as_str().into()),
            );
            let properties = BasicProperties::default()
                .with_delivery_mode(if publish.persistent { 2 } else { 1 })
                .with_content_type("application/json".into())
                .with_message_id(row.id.as_str().into())
                .with_type("OrderPlaced".into())
                .with_headers(headers);
            confirms.push(
                channel
                    .basic_publish(
                        exchange.into(),
                        routing_key.into(),
                        options,
                        row.payload.as_bytes(),
                        properties,
                    )
                    .await?,
            );
        }
        for confirm in confirms {
            anyhow::ensure!(confirm.await?.is_ack(), "{what}: a publish was nacked");
        }
    }
    let elapsed = start.elapsed();
    let _ = connection.close(200, "done".into()).await;
    Ok(Measured::new(what, rows.len(), elapsed))
}

/// Publishes `rows` with async-nats to `scope`'s subjects (a stream
/// capturing them must exist), with `Nats-Msg-Id` and the relay's headers,
/// awaiting the PubAcks of every `batch` messages.
pub async fn nats_client(
    what: &str,
    jetstream: &async_nats::jetstream::Context,
    scope: &Scope,
    rows: &[PlainRow],
    batch: usize,
) -> anyhow::Result<Measured> {
    let start = Instant::now();
    for chunk in rows.chunks(batch.max(1)) {
        let mut acks = Vec::with_capacity(chunk.len());
        for row in chunk {
            let mut headers = HeaderMap::new();
            headers.insert("id", row.id.as_str());
            headers.insert("eventType", "OrderPlaced");
            headers.insert("eventVersion", "1");
            headers.insert("aggregateType", "Order");
            headers.insert("aggregateId", row.aggregate_id.as_str());
            let subject = format!(
                "{}.event.Order.{}",
                scope.prefix,
                encode_token(&row.aggregate_id)
            );
            let publish = PublishMessage::build()
                .payload(row.payload.clone().into_bytes().into())
                .headers(headers)
                .message_id(&row.id);
            acks.push(jetstream.send_publish(subject, publish).await?);
        }
        for ack in acks {
            ack.await?;
        }
    }
    Ok(Measured::new(what, rows.len(), start.elapsed()))
}
