//! `bench-rabbitmq`: how fast the relay drains a backlog to RabbitMQ with
//! publisher confirms, for several `--amqp-max-unconfirmed` windows, beside
//! two ceilings measured in the same run:
//!
//! - the database's: the same drain with a sink that acknowledges at once
//!   (only the relay's claim and settle SQL run);
//! - the broker's: a plain lapin client publishing the same messages
//!   (persistent, `mandatory`) to the same exchange and a durable bound
//!   queue, awaiting the confirms of every `--client-batch` messages; also
//!   without `mandatory` and non-persistent, to show what each costs;
//! - latency: writers commit events at `--rate` per second while the relay
//!   runs (default `--amqp-max-unconfirmed`); commit to confirm, p50 and
//!   p99.
//!
//! PostgreSQL from `OUTBOX_TEST_POSTGRES_URL` (a schema of its own, dropped
//! at the end), RabbitMQ from `OUTBOX_TEST_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`).

use std::sync::Arc;

use clap::Parser;
use lapin::types::FieldTable;
use outbox_bench::brokers::{
    AmqpPublish, Backlog, BacklogOptions, Latency, LatencyOptions, Measured, rabbitmq_client,
    rate_table,
};
use outbox_bench::progress;
use outbox_bench::recording::NoBrokerSink;
use outbox_bench::report::{self, Machine};
use outbox_relay::sink::Sink;
use outbox_relay::sink::rabbitmq::{DEFAULT_MAX_UNCONFIRMED, RabbitMqOptions, RabbitMqSink};
use outbox_tests::rabbitmq::{Broker, amqp_url, unique};
use outbox_tests::{Backend, TestDb};
use serde::Serialize;

/// Drains a backlog to RabbitMQ at several confirm windows.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "bench-rabbitmq", version)]
struct Options {
    #[command(flatten)]
    backlog: BacklogOptions,
    /// `--amqp-max-unconfirmed` values to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 10, 100, 500, 1000, 5000])]
    windows: Vec<usize>,
    #[command(flatten)]
    latency: LatencyOptions,
    /// Print the results as JSON on standard output too.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    options: Options,
    database_ceiling: Measured,
    client: Vec<Measured>,
    relay: Vec<Measured>,
    latency: Option<Latency>,
}

impl Results {
    fn render(&self) -> String {
        let ceiling = self
            .client
            .first()
            .map_or(0.0, |client| client.events_per_second)
            .min(self.database_ceiling.events_per_second);
        let table = rate_table(
            ceiling,
            std::iter::once(&self.database_ceiling)
                .chain(&self.client)
                .chain(&self.relay),
        );
        let mut out = format!(
            "{}\n{} events over {} aggregates, relay batch {}, client confirm batch {}\n\n{table}",
            self.machine,
            self.options.backlog.events,
            self.options.backlog.aggregates,
            self.options.backlog.batch_size,
            self.options.backlog.client_batch
        );
        if let Some(latency) = &self.latency {
            out.push_str(&format!("\n{}\n", latency.line("Commit-to-confirm")));
        }
        out
    }
}

struct Bench {
    options: Options,
    backlog: Backlog,
    broker: Broker,
    exchange: String,
}

impl Bench {
    /// Runs `measure` with a fresh durable queue bound to every routing
    /// key of the exchange, deleted after it.
    async fn with_queue<T>(
        &self,
        measure: impl AsyncFnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let queue = unique("bench-q");
        self.broker
            .bind_queue(&self.exchange, &queue, "#", FieldTable::default())
            .await;
        let measured = measure().await;
        self.broker.delete_queue(&queue).await;
        measured
    }

    async fn sink(&self, max_unconfirmed: usize) -> anyhow::Result<Arc<dyn Sink>> {
        Ok(Arc::new(
            RabbitMqSink::connect(RabbitMqOptions {
                url: amqp_url(),
                exchange: self.exchange.clone(),
                max_unconfirmed,
                ..RabbitMqOptions::default()
            })
            .await?,
        ))
    }

    /// A plain client publishing the backlog's messages with confirms
    /// awaited every `client_batch` messages.
    async fn client(
        &self,
        what: &str,
        mandatory: bool,
        persistent: bool,
    ) -> anyhow::Result<Measured> {
        let rows = self.backlog.rows().await?;
        let publish = AmqpPublish {
            mandatory,
            persistent,
            batch: self.options.backlog.client_batch,
        };
        self.with_queue(async || {
            rabbitmq_client(
                what,
                &amqp_url(),
                &self.exchange,
                &self.backlog.topic(),
                &rows,
                publish,
            )
            .await
        })
        .await
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
    let backlog = Backlog::connect(schema, options.backlog).await?;
    let bench = Bench {
        options: options.clone(),
        backlog,
        broker,
        exchange,
    };
    let database_ceiling = bench
        .backlog
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
        let sink = bench.sink(window).await?;
        let what = format!("relay, --amqp-max-unconfirmed {window}");
        relay.push(
            bench
                .with_queue(async || bench.backlog.drain(what, sink).await)
                .await?,
        );
    }
    let latency = if options.latency.rate > 0 {
        let sink = bench.sink(DEFAULT_MAX_UNCONFIRMED).await?;
        let latency = options.latency;
        Some(
            bench
                .with_queue(async || bench.backlog.latency(sink, &latency).await)
                .await?,
        )
    } else {
        None
    };
    bench.backlog.close().await;
    Ok(Results {
        machine,
        options: options.clone(),
        database_ceiling,
        client,
        relay,
        latency,
    })
}
