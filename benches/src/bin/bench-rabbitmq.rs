//! `bench-rabbitmq`: how fast the relay drains a backlog to RabbitMQ with
//! publisher confirms, for several `--amqp-max-unconfirmed` windows, beside
//! two ceilings measured in the same run:
//!
//! - the database's: the same drain with a sink that acknowledges at once
//!   (only the relay's claim and settle SQL run);
//! - the broker's: a plain lapin client publishing the same messages
//!   (persistent, `mandatory`) to the same exchange and a durable bound
//!   queue, awaiting the confirms of every `--client-batch` messages; also
//!   without `mandatory` and non-persistent, to show what each costs.
//!
//! PostgreSQL from `OUTBOX_TEST_POSTGRES_URL` (a schema of its own, dropped
//! at the end), RabbitMQ from `OUTBOX_TEST_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`).

// bench-relay's loader, shared; this binary uses only part of it.
#[allow(dead_code)]
#[path = "bench-relay/load.rs"]
mod load;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use outbox_bench::progress;
use outbox_bench::recording::NoBrokerSink;
use outbox_bench::report::{self, Machine, Table};
use outbox_relay::message::TopicTemplate;
use outbox_relay::relay::{Relay, RelayOptions};
use outbox_relay::shutdown::Shutdown;
use outbox_relay::sink::Sink;
use outbox_relay::sink::rabbitmq::{RabbitMqOptions, RabbitMqSink};
use outbox_relay::source::{Source, SourceOptions};
use outbox_tests::rabbitmq::{Broker, amqp_url, unique};
use outbox_tests::{Backend, TestDb};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// Drains a backlog to RabbitMQ at several confirm windows.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "bench-rabbitmq", version)]
struct Options {
    /// Pending events drained in each measurement.
    #[arg(long, default_value_t = 50_000)]
    events: usize,
    /// Aggregates the events are spread over (round-robin).
    #[arg(long, default_value_t = 1_000)]
    aggregates: usize,
    /// Rows per claim.
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// `--amqp-max-unconfirmed` values to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 10, 100, 500, 1000, 5000])]
    windows: Vec<usize>,
    /// Messages the plain client publishes before awaiting their confirms.
    #[arg(long, default_value_t = 500)]
    client_batch: usize,
    /// Print the results as JSON on standard output too.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Measured {
    what: String,
    events: usize,
    seconds: f64,
    events_per_second: f64,
}

impl Measured {
    fn new(what: impl Into<String>, events: usize, elapsed: Duration) -> Self {
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

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    options: Options,
    database_ceiling: Measured,
    client: Vec<Measured>,
    relay: Vec<Measured>,
}

impl Results {
    fn render(&self) -> String {
        let ceiling = self
            .client
            .first()
            .map_or(0.0, |client| client.events_per_second)
            .min(self.database_ceiling.events_per_second);
        let mut table = Table::new(["measurement", "events/s", "vs lower ceiling"]);
        for row in std::iter::once(&self.database_ceiling)
            .chain(&self.client)
            .chain(&self.relay)
        {
            table.row([
                row.what.clone(),
                report::rate(row.events_per_second),
                report::ratio(row.events_per_second / ceiling.max(1e-9)),
            ]);
        }
        format!(
            "{}\n{} events over {} aggregates, relay batch {}, client confirm batch {}\n\n{table}",
            self.machine,
            self.options.events,
            self.options.aggregates,
            self.options.batch_size,
            self.options.client_batch
        )
    }
}

struct Bench {
    options: Options,
    pool: PgPool,
    source: Arc<dyn Source>,
    broker: Broker,
    exchange: String,
}

impl Bench {
    /// Empties the table, loads the backlog, and gives the exchange a fresh
    /// durable queue bound to every routing key.
    async fn prepare(&self) -> anyhow::Result<String> {
        load::truncate(&self.pool).await?;
        load::load(
            &self.pool,
            self.options.events,
            self.options.aggregates,
            load::RowState::Pending,
        )
        .await?;
        load::analyze(&self.pool).await?;
        let queue = unique("bench-q");
        self.broker
            .bind_queue(&self.exchange, &queue, "#", FieldTable::default())
            .await;
        Ok(queue)
    }

    async fn drain(&self, what: String, sink: Arc<dyn Sink>) -> anyhow::Result<Measured> {
        let queue = self.prepare().await?;
        let relay = Relay::new(
            self.source.clone(),
            sink.clone(),
            TopicTemplate::default(),
            RelayOptions {
                batch_size: self.options.batch_size,
                drain: true,
                retention: None,
                ..RelayOptions::default()
            },
        );
        let stats = relay.stats();
        let start = Instant::now();
        let (_stop, shutdown) = Shutdown::manual();
        relay.run(shutdown).await?;
        let elapsed = start.elapsed();
        let published = stats.published.load(Ordering::Relaxed) as usize;
        let failed = stats.failed.load(Ordering::Relaxed);
        self.broker.delete_queue(&queue).await;
        anyhow::ensure!(
            failed == 0 && published == self.options.events,
            "{what}: published {published}, failed {failed}; the measurement is void"
        );
        Ok(Measured::new(what, published, elapsed))
    }

    /// A plain client publishing the backlog's messages with confirms
    /// awaited every `client_batch` messages.
    async fn client(
        &self,
        what: &str,
        mandatory: bool,
        persistent: bool,
    ) -> anyhow::Result<Measured> {
        let queue = self.prepare().await?;
        let rows: Vec<(String, String, String)> =
            sqlx::query_as("SELECT id::text, aggregateid, payload::text FROM outbox ORDER BY seq")
                .fetch_all(&self.pool)
                .await?;
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let options = BasicPublishOptions {
            mandatory,
            ..BasicPublishOptions::default()
        };
        let start = Instant::now();
        for chunk in rows.chunks(self.options.client_batch.max(1)) {
            let mut confirms = Vec::with_capacity(chunk.len());
            for (id, aggregate_id, payload) in chunk {
                let mut headers = FieldTable::default();
                headers.insert(
                    "id".into(),
                    lapin::types::AMQPValue::LongString(id.as_str().into()),
                );
                headers.insert(
                    "aggregateId".into(),
                    lapin::types::AMQPValue::LongString(aggregate_id.as_str().into()),
                );
                let properties = BasicProperties::default()
                    .with_delivery_mode(if persistent { 2 } else { 1 })
                    .with_content_type("application/json".into())
                    .with_message_id(id.as_str().into())
                    .with_type("OrderPlaced".into())
                    .with_headers(headers);
                confirms.push(
                    channel
                        .basic_publish(
                            self.exchange.as_str().into(),
                            "outbox.event.Order".into(),
                            options,
                            payload.as_bytes(),
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
        self.broker.delete_queue(&queue).await;
        Ok(Measured::new(what, rows.len(), elapsed))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    report::elapsed_seconds();
    let options = Options::parse();
    let broker = Broker::connect().await;
    let schema = TestDb::new(Backend::Postgres).await;
    let machine = Machine::describe(&schema.db).await?;
    progress!("{machine}");
    let exchange = unique("bench");
    broker
        .declare_exchange(&exchange, lapin::ExchangeKind::Topic)
        .await;
    let outcome = run(&options, &schema, broker, exchange.clone(), machine).await;
    let cleanup = Broker::connect().await;
    cleanup.clean_up(&exchange, &[]).await;
    schema.drop().await;
    let results = outcome?;
    report::emit(options.json, &results.render(), &results)
}

async fn run(
    options: &Options,
    schema: &TestDb,
    broker: Broker,
    exchange: String,
    machine: Machine,
) -> anyhow::Result<Results> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&schema.url)
        .await
        .context("connecting the loader")?;
    let source: Arc<dyn Source> =
        Arc::from(outbox_relay::source::connect(&schema.url, SourceOptions::default()).await?);
    let bench = Bench {
        options: options.clone(),
        pool,
        source,
        broker,
        exchange,
    };
    let database_ceiling = bench
        .drain(
            "database ceiling (no broker)".into(),
            Arc::new(NoBrokerSink),
        )
        .await?;
    let client = vec![
        bench
            .client("plain client, persistent, mandatory", true, true)
            .await?,
        bench
            .client("plain client, persistent", false, true)
            .await?,
        bench
            .client("plain client, transient, mandatory", true, false)
            .await?,
    ];
    let mut relay = Vec::new();
    for &window in &options.windows {
        let sink = RabbitMqSink::connect(RabbitMqOptions {
            url: amqp_url(),
            exchange: bench.exchange.clone(),
            max_unconfirmed: window,
            ..RabbitMqOptions::default()
        })
        .await?;
        relay.push(
            bench
                .drain(
                    format!("relay, --amqp-max-unconfirmed {window}"),
                    Arc::new(sink),
                )
                .await?,
        );
    }
    bench.pool.close().await;
    Ok(Results {
        machine,
        options: options.clone(),
        database_ceiling,
        client,
        relay,
    })
}
