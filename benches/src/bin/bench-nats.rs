//! `bench-nats`: how fast the relay drains a backlog to NATS JetStream with
//! every PubAck awaited, for several `--nats-max-pending` values, beside two
//! ceilings measured in the same run, and its commit-to-ack latency at a
//! fixed rate:
//!
//! - the database's ceiling: the same drain with a sink that acknowledges
//!   at once (only the relay's claim and settle SQL run);
//! - the broker's: a plain async-nats client publishing the same messages
//!   (same subjects, `Nats-Msg-Id` and headers) to a stream of its own,
//!   awaiting the PubAcks of every `--client-batch` messages;
//! - latency: writers commit events at `--rate` per second while the relay
//!   runs (default `--nats-max-pending`); commit to PubAck, p50 and p99.
//!
//! PostgreSQL from `OUTBOX_TEST_POSTGRES_URL` (a schema of its own, dropped
//! at the end), NATS from `OUTBOX_TEST_NATS_URL` (default
//! `nats://127.0.0.1:4222`); every measurement uses a stream of its own,
//! deleted after it.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use outbox_bench::brokers::{
    Backlog, BacklogOptions, Latency, LatencyOptions, Measured, nats_client, rate_table,
};
use outbox_bench::progress;
use outbox_bench::recording::NoBrokerSink;
use outbox_bench::report::{self, Machine};
use outbox_relay::sink::Sink;
use outbox_relay::sink::nats::subject::SubjectTemplate;
use outbox_relay::sink::nats::{DEFAULT_MAX_PENDING, NatsOptions, NatsSink};
use outbox_tests::nats::{Scope, Witness, nats_url};
use outbox_tests::{Backend, TestDb};
use serde::Serialize;

/// Drains a backlog to NATS JetStream at several PubAck windows.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "bench-nats", version)]
struct Options {
    #[command(flatten)]
    backlog: BacklogOptions,
    /// `--nats-max-pending` values to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 64, 256, 1024, 4096])]
    pendings: Vec<usize>,
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
    client: Measured,
    relay: Vec<Measured>,
    latency: Option<Latency>,
}

impl Results {
    fn render(&self) -> String {
        let ceiling = self
            .client
            .events_per_second
            .min(self.database_ceiling.events_per_second);
        let table = rate_table(
            ceiling,
            [&self.database_ceiling, &self.client]
                .into_iter()
                .chain(&self.relay),
        );
        let mut out = format!(
            "{}\n{} events over {} aggregates, relay batch {}, client PubAck batch {}\n\n{table}",
            self.machine,
            self.options.backlog.events,
            self.options.backlog.aggregates,
            self.options.backlog.batch_size,
            self.options.backlog.client_batch
        );
        if let Some(latency) = &self.latency {
            out.push_str(&format!("\n{}\n", latency.line("Commit-to-PubAck")));
        }
        out
    }
}

/// A NATS sink on `scope`'s stream.
async fn sink(scope: &Scope, max_pending: usize) -> anyhow::Result<Arc<dyn Sink>> {
    Ok(Arc::new(
        NatsSink::connect(NatsOptions {
            url: nats_url(),
            stream: scope.stream.clone(),
            subject_template: SubjectTemplate::parse(&scope.template())
                .map_err(anyhow::Error::msg)?,
            max_pending,
            ..NatsOptions::default()
        })
        .await?,
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    report::elapsed_seconds();
    let options = Options::parse();
    let schema = TestDb::new(Backend::Postgres).await;
    let machine = Machine::describe(&schema.db).await?;
    progress!("{machine}");
    let outcome = run(&options, &schema, machine).await;
    schema.drop().await;
    let results = outcome?;
    report::emit(options.json, &results.render(), &results)
}

async fn run(options: &Options, schema: &TestDb, machine: Machine) -> anyhow::Result<Results> {
    let backlog = Backlog::connect(schema, options.backlog).await?;
    let witness = Witness::connect().await;
    let database_ceiling = backlog
        .drain(
            "database ceiling (no broker)".into(),
            Arc::new(NoBrokerSink),
        )
        .await?;

    let rows = backlog.rows().await?;
    let scope = Scope::new("bench_client");
    witness
        .create_stream(&scope.stream, &[&scope.capture()], Duration::from_secs(120))
        .await;
    let client = nats_client(
        &format!(
            "plain client, PubAcks awaited per {}",
            options.backlog.client_batch
        ),
        witness.jetstream(),
        &scope,
        &rows,
        options.backlog.client_batch,
    )
    .await;
    witness.delete_stream(&scope.stream).await;
    let client = client?;

    let mut relay = Vec::new();
    for &max_pending in &options.pendings {
        let scope = Scope::new("bench_drain");
        let measured = match sink(&scope, max_pending).await {
            Ok(sink) => {
                backlog
                    .drain(format!("relay, --nats-max-pending {max_pending}"), sink)
                    .await
            }
            Err(error) => Err(error),
        };
        witness.delete_stream(&scope.stream).await;
        relay.push(measured?);
    }
    let latency = if options.latency.rate > 0 {
        let scope = Scope::new("bench_latency");
        let latency = options.latency;
        let measured = match sink(&scope, DEFAULT_MAX_PENDING).await {
            Ok(sink) => backlog.latency(sink, &latency).await,
            Err(error) => Err(error),
        };
        witness.delete_stream(&scope.stream).await;
        Some(measured?)
    } else {
        None
    };
    backlog.close().await;
    Ok(Results {
        machine,
        options: options.clone(),
        database_ceiling,
        client,
        relay,
        latency,
    })
}
