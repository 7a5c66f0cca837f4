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

// bench-relay's loader, shared; this binary uses only part of it.
#[allow(dead_code)]
#[path = "bench-relay/load.rs"]
mod load;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::HeaderMap;
use async_nats::jetstream::message::PublishMessage;
use clap::Parser;
use outbox_bench::order::order_events;
use outbox_bench::progress;
use outbox_bench::recording::{Commit, CommitToAck, NoBrokerSink, RecordingSink};
use outbox_bench::report::{self, Machine, Table};
use outbox_bench::stats::LatencySummary;
use outbox_relay::message::TopicTemplate;
use outbox_relay::relay::{Relay, RelayOptions};
use outbox_relay::shutdown::Shutdown;
use outbox_relay::sink::Sink;
use outbox_relay::sink::nats::subject::{SubjectTemplate, encode_token};
use outbox_relay::sink::nats::{DEFAULT_MAX_PENDING, NatsOptions, NatsSink};
use outbox_relay::source::{Source, SourceOptions};
use outbox_tests::nats::{Scope, Witness, nats_url};
use outbox_tests::{Backend, TestDb};
use sea_orm::{DatabaseConnection, TransactionTrait};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinSet;

/// Drains a backlog to NATS JetStream at several PubAck windows.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "bench-nats", version)]
struct Options {
    /// Pending events drained in each measurement.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Aggregates the events are spread over (round-robin).
    #[arg(long, default_value_t = 1_000)]
    aggregates: usize,
    /// Rows per claim.
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// `--nats-max-pending` values to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 64, 256, 1024, 4096])]
    pendings: Vec<usize>,
    /// Messages the plain client publishes before awaiting their PubAcks.
    #[arg(long, default_value_t = 500)]
    client_batch: usize,
    /// Events per second committed in the latency part (0 skips it).
    #[arg(long, default_value_t = 1_000)]
    rate: usize,
    /// Seconds of the latency part measured, after the warm-up.
    #[arg(long, default_value_t = 10)]
    latency_seconds: u64,
    /// Seconds of the latency part not measured.
    #[arg(long, default_value_t = 2)]
    warmup_seconds: u64,
    /// Concurrent writers of the latency part.
    #[arg(long, default_value_t = 4)]
    writers: usize,
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
struct Latency {
    target_rate: usize,
    achieved_rate: f64,
    events: usize,
    unacknowledged: usize,
    commit_to_ack: LatencySummary,
    mean_batch_size: f64,
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
        let mut table = Table::new(["measurement", "events/s", "vs lower ceiling"]);
        for row in [&self.database_ceiling, &self.client]
            .into_iter()
            .chain(&self.relay)
        {
            table.row([
                row.what.clone(),
                report::rate(row.events_per_second),
                report::ratio(row.events_per_second / ceiling.max(1e-9)),
            ]);
        }
        let mut out = format!(
            "{}\n{} events over {} aggregates, relay batch {}, client PubAck batch {}\n\n{table}",
            self.machine,
            self.options.events,
            self.options.aggregates,
            self.options.batch_size,
            self.options.client_batch
        );
        if let Some(latency) = &self.latency {
            out.push_str(&format!(
                "\nCommit-to-PubAck at {} events/s (achieved {:.0}, {} events, {} unacknowledged, \
                 mean batch {:.1}): p50 {} ms, p90 {} ms, p99 {} ms, max {} ms\n",
                latency.target_rate,
                latency.achieved_rate,
                latency.events,
                latency.unacknowledged,
                latency.mean_batch_size,
                report::ms(latency.commit_to_ack.p50_ms),
                report::ms(latency.commit_to_ack.p90_ms),
                report::ms(latency.commit_to_ack.p99_ms),
                report::ms(latency.commit_to_ack.max_ms),
            ));
        }
        out
    }
}

struct Bench {
    options: Options,
    pool: PgPool,
    db: DatabaseConnection,
    source: Arc<dyn Source>,
    witness: Witness,
}

impl Bench {
    /// Empties the table and loads the backlog.
    async fn prepare(&self) -> anyhow::Result<()> {
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

    fn relay(&self, sink: Arc<dyn Sink>, drain: bool) -> Relay {
        Relay::new(
            self.source.clone(),
            sink,
            TopicTemplate::default(),
            RelayOptions {
                batch_size: self.options.batch_size,
                drain,
                poll_interval: Duration::from_millis(100),
                retention: None,
                ..RelayOptions::default()
            },
        )
    }

    /// A NATS sink on a stream of its own.
    async fn sink(&self, scope: &Scope, max_pending: usize) -> anyhow::Result<NatsSink> {
        Ok(NatsSink::connect(NatsOptions {
            url: nats_url(),
            stream: scope.stream.clone(),
            subject_template: SubjectTemplate::parse(&scope.template())
                .map_err(anyhow::Error::msg)?,
            max_pending,
            ..NatsOptions::default()
        })
        .await?)
    }

    async fn drain(&self, what: String, sink: Arc<dyn Sink>) -> anyhow::Result<Measured> {
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

    /// A plain client publishing the backlog's messages to a stream of its
    /// own, PubAcks awaited every `client_batch` messages.
    async fn client(&self) -> anyhow::Result<Measured> {
        self.prepare().await?;
        let scope = Scope::new("bench_client");
        self.witness
            .create_stream(&scope.stream, &[&scope.capture()], Duration::from_secs(120))
            .await;
        let rows: Vec<(String, String, String)> =
            sqlx::query_as("SELECT id::text, aggregateid, payload::text FROM outbox ORDER BY seq")
                .fetch_all(&self.pool)
                .await?;
        let jetstream = self.witness.jetstream();
        let start = Instant::now();
        for chunk in rows.chunks(self.options.client_batch.max(1)) {
            let mut acks = Vec::with_capacity(chunk.len());
            for (id, aggregate_id, payload) in chunk {
                let mut headers = HeaderMap::new();
                headers.insert("id", id.as_str());
                headers.insert("eventType", "OrderPlaced");
                headers.insert("eventVersion", "1");
                headers.insert("aggregateType", "Order");
                headers.insert("aggregateId", aggregate_id.as_str());
                let subject = format!(
                    "{}.event.Order.{}",
                    scope.prefix,
                    encode_token(aggregate_id)
                );
                let publish = PublishMessage::build()
                    .payload(payload.clone().into_bytes().into())
                    .headers(headers)
                    .message_id(id);
                acks.push(jetstream.send_publish(subject, publish).await?);
            }
            for ack in acks {
                ack.await?;
            }
        }
        let elapsed = start.elapsed();
        self.witness.delete_stream(&scope.stream).await;
        Ok(Measured::new(
            format!(
                "plain client, PubAcks awaited per {}",
                self.options.client_batch
            ),
            rows.len(),
            elapsed,
        ))
    }

    /// Writers commit at a fixed rate while the relay publishes to NATS.
    async fn latency(&self) -> anyhow::Result<Latency> {
        let options = &self.options;
        load::truncate(&self.pool).await?;
        let scope = Scope::new("bench_latency");
        let nats: Arc<dyn Sink> = Arc::new(self.sink(&scope, DEFAULT_MAX_PENDING).await?);
        let sink = Arc::new(RecordingSink::new(nats));
        let relay = self.relay(sink.clone(), false);
        let (stop, shutdown) = Shutdown::manual();
        let relay = tokio::spawn(async move { relay.run(shutdown).await });

        let period = Duration::from_secs(1) / options.rate.max(1) as u32;
        let warmup = (options.warmup_seconds as usize) * options.rate;
        let transactions = warmup + (options.latency_seconds as usize) * options.rate;
        let start = tokio::time::Instant::now() + Duration::from_millis(100);
        let next = Arc::new(AtomicUsize::new(0));
        let mut writers = JoinSet::new();
        for _ in 0..options.writers.max(1) {
            let (db, next) = (self.db.clone(), next.clone());
            let aggregates = options.aggregates.max(1);
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
        self.witness.delete_stream(&scope.stream).await;
        let window_start = start.into_std() + period * warmup as u32;
        let measured = CommitToAck::measure(&commits, sink.take(), warmup, window_start);
        progress!(
            "latency: commit-to-PubAck p50 {} ms, p99 {} ms",
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
        db: schema.db.clone(),
        source,
        witness: Witness::connect().await,
    };
    let database_ceiling = bench
        .drain(
            "database ceiling (no broker)".into(),
            Arc::new(NoBrokerSink),
        )
        .await?;
    let client = bench.client().await?;
    let mut relay = Vec::new();
    for &max_pending in &options.pendings {
        let scope = Scope::new("bench_drain");
        let sink = bench.sink(&scope, max_pending).await?;
        let measured = bench
            .drain(
                format!("relay, --nats-max-pending {max_pending}"),
                Arc::new(sink),
            )
            .await;
        bench.witness.delete_stream(&scope.stream).await;
        relay.push(measured?);
    }
    let latency = if options.rate > 0 {
        Some(bench.latency().await?)
    } else {
        None
    };
    bench.pool.close().await;
    Ok(Results {
        machine,
        options: options.clone(),
        database_ceiling,
        client,
        relay,
        latency,
    })
}
