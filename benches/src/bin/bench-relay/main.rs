//! `bench-relay`: the relay's throughput and latency on PostgreSQL and a
//! Kafka-API broker, as ratios measured in one run.
//!
//! - throughput: N pending events are drained by the relay publishing to a
//!   sink that acknowledges at once, so only its claim and settle SQL run
//!   (the database's ceiling), then N more by the relay publishing to the
//!   broker (end to end), for each batch size;
//! - latency: writers commit events at a fixed rate while the relay runs
//!   (woken by `LISTEN`/`NOTIFY`, or with `--without-notify` polling only);
//!   a decorator around its sink timestamps when each event is handed to
//!   the broker and acknowledged;
//! - history: the throughput again with a million or more published rows in
//!   the table, against an empty table.
//!
//! PostgreSQL comes from `OUTBOX_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`; the run works in a schema of
//! its own, dropped at the end) and the broker from `KAFKA_BROKERS` (default
//! `127.0.0.1:9092`, started with `scripts/kafka.sh start`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use outbox_bench::cpu::{CpuPerThousand, CpuTimes};
use outbox_bench::order::order_events;
use outbox_bench::progress;
use outbox_bench::report::{self, Machine, Table};
use outbox_bench::stats::{self, LatencySummary};
use outbox_relay::message::TopicTemplate;
use outbox_relay::relay::{Relay, RelayOptions};
use outbox_relay::shutdown::Shutdown;
use outbox_relay::sink::Sink;
use outbox_relay::sink::kafka::{KafkaOptions, KafkaSink};
use outbox_relay::source::{Source, SourceOptions};
use outbox_tests::{Backend, TestDb};
use sea_orm::{DatabaseConnection, TransactionTrait};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinSet;

use outbox_bench::load::{self, RowState};
use outbox_bench::recording::{Call, Commit, CommitToAck, NoBrokerSink, Recorded, RecordingSink};

/// Measures the relay against the database's ceiling, its commit-to-ack
/// latency, and the effect of a long history of published rows.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "bench-relay", version)]
struct Options {
    /// The parts to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Phase::Throughput, Phase::Latency, Phase::History])]
    phases: Vec<Phase>,
    /// Pending events drained in each throughput measurement.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Aggregates the events are spread over (round-robin).
    #[arg(long, default_value_t = 1_000)]
    aggregates: usize,
    /// Batch sizes of the throughput part, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [100, 500, 2000])]
    batch_sizes: Vec<usize>,
    /// Times each throughput measurement is repeated (the median counts).
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// Events committed per second in the latency part.
    #[arg(long, default_value_t = 2_000)]
    rate: usize,
    /// Measured seconds of the latency part.
    #[arg(long, default_value_t = 20)]
    latency_seconds: u64,
    /// Unmeasured seconds at the same rate before them (topic creation,
    /// connections, the listener).
    #[arg(long, default_value_t = 2)]
    warmup_seconds: u64,
    /// Concurrent writers of the latency part.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Events per transaction in the latency part (the events of one
    /// order); the writers commit `rate / events_per_transaction`
    /// transactions per second.
    #[arg(long, default_value_t = 10)]
    events_per_transaction: usize,
    /// Published rows in the table (vacuumed and analyzed) when the latency
    /// part starts, as in a relay's steady state with retention; 0 starts
    /// from an empty table, as right after the migration.
    #[arg(long, default_value_t = 100_000)]
    latency_history_rows: usize,
    /// Drop the outbox's `NOTIFY` trigger before the latency part, so the
    /// relay finds new rows by polling every `--poll-interval-ms` only (the
    /// opt-out from the trigger's serialized commits).
    #[arg(long)]
    without_notify: bool,
    /// The relay's longest wait between claims when it finds no full batch
    /// (its `--poll-interval`), in the latency part.
    #[arg(long, default_value_t = 500)]
    poll_interval_ms: u64,
    /// The relay's batch size in the latency and history parts.
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// Published rows in the table for the history part.
    #[arg(long, default_value_t = 1_000_000)]
    history_rows: usize,
    /// Drain with one `Relay::publish_batch` after the other instead of
    /// `Relay::run`: claim, send and settle in turn, with no overlap of the
    /// database's work and the broker's (as the relay runs on MariaDB and
    /// SQLite), for comparison.
    #[arg(long)]
    sequential: bool,
    /// A librdkafka setting for the relay's producer, as the relay's own
    /// `--kafka-option` (repeatable), such as `linger.ms=0`.
    #[arg(long = "kafka-option", short = 'X', value_name = "KEY=VALUE", value_parser = outbox_relay::cli::parse_key_value)]
    kafka_options: Vec<(String, String)>,
    /// Partitions of the topics the relay creates.
    #[arg(long, default_value_t = 1)]
    topic_partitions: i32,
    /// Partition the outbox by day (`outbox-relay migrate --partitioned`),
    /// with a partition for each day of the history.
    #[arg(long)]
    partitioned: bool,
    /// Days the published history of the history and latency parts spans
    /// (one partition each with `--partitioned`).
    #[arg(long, default_value_t = 30)]
    history_days: usize,
    /// Print the results as JSON on standard output (the readable report
    /// then goes to standard error).
    #[arg(long)]
    json: bool,
}

/// A part of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    /// Relay throughput against the claim-and-settle ceiling, per batch size.
    Throughput,
    /// Commit-to-ack latency at a fixed rate.
    Latency,
    /// Throughput with published history in the table against an empty one.
    History,
}

/// The `application_name` of the relay's connections, to find their
/// backends' CPU time.
const RELAY_APPLICATION_NAME: &str = "outbox-bench-relay";

/// The targets.
const TARGET_THROUGHPUT_RATIO: f64 = 0.7;
const TARGET_P99_MS: f64 = 25.0;

/// What the run works with.
struct Bench {
    options: Options,
    /// Loads and cleans the table.
    pool: PgPool,
    /// Business transactions of the latency part.
    db: DatabaseConnection,
    source: Arc<dyn Source>,
    kafka: Arc<dyn Sink>,
    /// The number of the last pending row loaded for each aggregate: the
    /// next load's rows continue from there, as an aggregate's
    /// `aggregate_seq` does, so a relay that settled the previous load's
    /// rows knows where each aggregate stands.
    numbered: AtomicI64,
}

/// One drain of the pending rows.
#[derive(Debug, Clone, Serialize)]
struct Drain {
    events: usize,
    seconds: f64,
    events_per_second: f64,
    batches: usize,
    /// Mean time per batch in the database (claim, settle, commit) and the
    /// relay's own code; for the end-to-end drain, everything but the sink.
    database_ms_per_batch: f64,
    /// Mean time per batch in the sink (send and wait for every ack).
    sink_ms_per_batch: f64,
    /// Mean time of a whole cycle (claim, publish, settle) over the first
    /// tenth of the batches, and over the last tenth: a growing cost shows
    /// work that grows with the rows already drained.
    first_tenth_ms_per_batch: f64,
    last_tenth_ms_per_batch: f64,
    /// CPU per 1,000 events in the relay process, PostgreSQL and the broker.
    cpu_per_thousand_events: CpuPerThousand,
}

/// The same drain repeated.
#[derive(Debug)]
struct Drains {
    runs: Vec<Drain>,
}

impl Drains {
    /// The run with the median throughput (the lower one of an even count).
    fn median(&self) -> &Drain {
        let mut runs: Vec<&Drain> = self.runs.iter().collect();
        runs.sort_by(|a, b| a.events_per_second.total_cmp(&b.events_per_second));
        runs[(runs.len() - 1) / 2]
    }

    fn events_per_second(&self) -> f64 {
        self.median().events_per_second
    }
}

impl Serialize for Drains {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut state = serializer.serialize_struct("Drains", 2)?;
        state.serialize_field("median_events_per_second", &self.events_per_second())?;
        state.serialize_field("runs", &self.runs)?;
        state.end()
    }
}

impl Drain {
    fn new(events: usize, elapsed: Duration, calls: &[Call], cpu: CpuPerThousand) -> Self {
        let batches = calls.len();
        let sink_time: Duration = calls.iter().map(Call::took).sum();
        let per_batch = |time: Duration| {
            if batches == 0 {
                0.0
            } else {
                time.as_secs_f64() * 1000.0 / batches as f64
            }
        };
        // A cycle runs from one hand-over to the sink to the next.
        let cycles: Vec<Duration> = calls
            .windows(2)
            .map(|pair| pair[1].started - pair[0].started)
            .collect();
        let tenth = (cycles.len() / 10).max(1);
        let mean_ms = |cycles: &[Duration]| {
            if cycles.is_empty() {
                0.0
            } else {
                cycles.iter().sum::<Duration>().as_secs_f64() * 1000.0 / cycles.len() as f64
            }
        };
        Self {
            events,
            seconds: elapsed.as_secs_f64(),
            events_per_second: stats::per_second(events, elapsed),
            batches,
            database_ms_per_batch: per_batch(elapsed.saturating_sub(sink_time)),
            sink_ms_per_batch: per_batch(sink_time),
            first_tenth_ms_per_batch: mean_ms(&cycles[..tenth.min(cycles.len())]),
            last_tenth_ms_per_batch: mean_ms(&cycles[cycles.len().saturating_sub(tenth)..]),
            cpu_per_thousand_events: cpu,
        }
    }
}

/// Ceiling and relay at one batch size.
#[derive(Debug, Serialize)]
struct ThroughputResult {
    batch_size: usize,
    ceiling: Drains,
    end_to_end: Drains,
    /// End to end over ceiling, of the medians.
    ratio: f64,
    /// End to end over ceiling, of each repetition.
    ratio_per_repetition: Vec<f64>,
}

impl ThroughputResult {
    fn new(batch_size: usize, ceiling: Drains, end_to_end: Drains) -> Self {
        Self {
            batch_size,
            ratio: end_to_end.events_per_second() / ceiling.events_per_second(),
            ratio_per_repetition: ceiling
                .runs
                .iter()
                .zip(&end_to_end.runs)
                .map(|(ceiling, end_to_end)| {
                    end_to_end.events_per_second / ceiling.events_per_second
                })
                .collect(),
            ceiling,
            end_to_end,
        }
    }
}

/// The latency part.
#[derive(Debug, Serialize)]
struct LatencyResult {
    target_rate: usize,
    /// Events committed in the measured window per second of it.
    achieved_rate: f64,
    events: usize,
    /// Events committed but never acknowledged before the deadline.
    unacknowledged: usize,
    /// Commit (the writer's `commit()` returned) to acknowledgement (the
    /// sink answered `Ok` to the relay).
    commit_to_ack: LatencySummary,
    /// Commit to the relay handing the event to the sink (woken, claimed,
    /// turned into a message).
    commit_to_handover: LatencySummary,
    /// Handed to the sink to acknowledged: the broker's part.
    handover_to_ack: LatencySummary,
    /// How late writers committed against their schedule (transaction time
    /// plus scheduling delay).
    commit_lag: LatencySummary,
    /// Relay batches while measuring, and their mean size.
    batches: usize,
    mean_batch_size: f64,
    /// Time in the sink, per batch.
    sink_call: LatencySummary,
    /// Acknowledgements that came before the writer saw its commit return.
    acked_before_commit_returned: usize,
}

/// One table state of the history part.
#[derive(Debug, Serialize)]
struct HistoryRow {
    published_rows: usize,
    ceiling: Drains,
    end_to_end: Drains,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    options: Options,
    target_throughput_ratio: f64,
    target_p99_ms: f64,
    throughput: Vec<ThroughputResult>,
    latency: Option<LatencyResult>,
    history: Vec<HistoryRow>,
}

impl Bench {
    /// A fresh topic template, so every measurement starts on empty topics.
    fn topics() -> TopicTemplate {
        TopicTemplate::new(format!(
            "{}.{{aggregatetype}}",
            outbox_tests::kafka::topic_prefix("bench")
        ))
    }

    fn relay_options(batch_size: usize, drain: bool, poll_interval: Duration) -> RelayOptions {
        RelayOptions {
            batch_size,
            drain,
            poll_interval,
            retention: None,
            ..RelayOptions::default()
        }
    }

    /// The process ids of the relay's PostgreSQL backends.
    async fn relay_backends(&self) -> anyhow::Result<Vec<u32>> {
        let pids: Vec<i32> =
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
                .bind(RELAY_APPLICATION_NAME)
                .fetch_all(&self.pool)
                .await?;
        Ok(pids
            .into_iter()
            .filter_map(|pid| u32::try_from(pid).ok())
            .collect())
    }

    /// Empties the table and loads `self.options.events` pending rows.
    async fn load_pending(&self) -> anyhow::Result<()> {
        load::truncate(&self.pool).await?;
        self.load_more_pending().await
    }

    /// Loads `self.options.events` pending rows on top of what is there.
    async fn load_more_pending(&self) -> anyhow::Result<()> {
        let aggregates = self.options.aggregates.max(1);
        let per_aggregate = self.options.events.div_ceil(aggregates) as i64;
        let after = self.numbered.fetch_add(per_aggregate, Ordering::Relaxed);
        load::load_over_days(
            &self.pool,
            self.options.events,
            aggregates,
            RowState::Pending,
            1,
            after,
        )
        .await
        .context("loading pending rows")?;
        load::analyze(&self.pool).await?;
        Ok(())
    }

    /// The database's ceiling: drains the pending rows with the relay's
    /// own claim and settle SQL and no broker.
    async fn ceiling(&self, batch_size: usize) -> anyhow::Result<Drain> {
        self.drain(Arc::new(NoBrokerSink), batch_size).await
    }

    /// Drains the pending rows with the relay publishing to the broker.
    async fn end_to_end(&self, batch_size: usize) -> anyhow::Result<Drain> {
        self.drain(self.kafka.clone(), batch_size).await
    }

    /// Drains the pending rows through `sink` with `Relay::run` in drain
    /// mode, as `outbox-relay run --drain` does (or with `--sequential`
    /// one `publish_batch` after the other), then flushes it.
    async fn drain(&self, sink: Arc<dyn Sink>, batch_size: usize) -> anyhow::Result<Drain> {
        let sink = Arc::new(RecordingSink::new(sink));
        let relay = Relay::new(
            self.source.clone(),
            sink.clone(),
            Self::topics(),
            Self::relay_options(batch_size, true, Duration::from_millis(500)),
        );
        let stats = relay.stats();
        let cpu = CpuTimes::now(&self.relay_backends().await?);
        let start = Instant::now();
        if self.options.sequential {
            while relay.publish_batch().await?.claimed > 0 {}
        } else {
            let (_stop, shutdown) = Shutdown::manual();
            relay.run(shutdown).await?;
        }
        let events = stats.published.load(Ordering::Relaxed) as usize;
        let failed = stats.failed.load(Ordering::Relaxed);
        sink.flush(Duration::from_secs(30)).await;
        let elapsed = start.elapsed();
        let cpu = CpuTimes::now(&self.relay_backends().await?).per_thousand_since(&cpu, events);
        anyhow::ensure!(
            failed == 0,
            "the broker refused {failed} sends while draining; the measurement is void"
        );
        let Recorded { calls, .. } = sink.take();
        Ok(Drain::new(events, elapsed, &calls, cpu))
    }

    /// Measures the ceiling and then the relay on freshly loaded pending
    /// rows, `repetitions` times.
    async fn ceiling_and_relay(
        &self,
        batch_size: usize,
        repetitions: usize,
        mut reload: impl AsyncFnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<(Drains, Drains)> {
        let mut ceiling = Drains { runs: Vec::new() };
        let mut end_to_end = Drains { runs: Vec::new() };
        for _ in 0..repetitions {
            reload().await?;
            ceiling.runs.push(self.ceiling(batch_size).await?);
            reload().await?;
            end_to_end.runs.push(self.end_to_end(batch_size).await?);
        }
        Ok((ceiling, end_to_end))
    }

    async fn throughput(&self) -> anyhow::Result<Vec<ThroughputResult>> {
        let sizes = &self.options.batch_sizes;
        let mut ceilings: Vec<Drains> = sizes.iter().map(|_| Drains { runs: Vec::new() }).collect();
        let mut relays: Vec<Drains> = sizes.iter().map(|_| Drains { runs: Vec::new() }).collect();
        // Repetitions go round the batch sizes, so drift spreads over all.
        for repetition in 0..self.options.repetitions {
            for (index, &batch_size) in sizes.iter().enumerate() {
                let (ceiling, relay) = self
                    .ceiling_and_relay(batch_size, 1, async || self.load_pending().await)
                    .await?;
                progress!(
                    "repetition {}: batch {batch_size}: ceiling {} events/s, end to end {} events/s",
                    repetition + 1,
                    report::rate(ceiling.events_per_second()),
                    report::rate(relay.events_per_second())
                );
                ceilings[index].runs.extend(ceiling.runs);
                relays[index].runs.extend(relay.runs);
            }
        }
        Ok(sizes
            .iter()
            .zip(ceilings.into_iter().zip(relays))
            .map(|(&batch_size, (ceiling, relay))| {
                ThroughputResult::new(batch_size, ceiling, relay)
            })
            .collect())
    }

    async fn history(&self) -> anyhow::Result<Vec<HistoryRow>> {
        let batch_size = self.options.batch_size;
        let repetitions = self.options.repetitions;
        let (ceiling, end_to_end) = self
            .ceiling_and_relay(batch_size, repetitions, async || self.load_pending().await)
            .await?;
        let empty = HistoryRow {
            published_rows: 0,
            ceiling,
            end_to_end,
        };
        progress!("history: empty table measured");

        load::truncate(&self.pool).await?;
        load::load_over_days(
            &self.pool,
            self.options.history_rows,
            self.options.aggregates,
            RowState::Published,
            self.options.history_days,
            0,
        )
        .await
        .context("loading published history")?;
        load::vacuum(&self.pool).await?;
        let history_end = load::last_seq(&self.pool).await?;
        progress!(
            "history: {} published rows loaded",
            self.options.history_rows
        );
        // Each drain starts from the history alone, as vacuum left it.
        let (ceiling, end_to_end) = self
            .ceiling_and_relay(batch_size, repetitions, async || {
                load::delete_after(&self.pool, history_end).await?;
                load::vacuum(&self.pool).await?;
                self.load_more_pending().await
            })
            .await?;
        load::truncate(&self.pool).await?;
        Ok(vec![
            empty,
            HistoryRow {
                published_rows: self.options.history_rows,
                ceiling,
                end_to_end,
            },
        ])
    }

    async fn latency(&self) -> anyhow::Result<LatencyResult> {
        let options = &self.options;
        anyhow::ensure!(
            options.rate > 0 && options.writers > 0,
            "--rate and --writers must be positive"
        );
        load::truncate(&self.pool).await?;
        load::load_over_days(
            &self.pool,
            options.latency_history_rows,
            options.aggregates,
            RowState::Published,
            options.history_days,
            0,
        )
        .await
        .context("loading published history")?;
        load::vacuum(&self.pool).await?;
        if options.without_notify {
            sqlx::query("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
                .execute(&self.pool)
                .await
                .context("dropping the NOTIFY trigger")?;
        }
        let sink = Arc::new(RecordingSink::new(self.kafka.clone()));
        let relay = Relay::new(
            self.source.clone(),
            sink.clone(),
            Self::topics(),
            Self::relay_options(
                options.batch_size,
                false,
                Duration::from_millis(options.poll_interval_ms),
            ),
        );
        let (stop, shutdown) = Shutdown::manual();
        let relay = tokio::spawn(async move { relay.run(shutdown).await });

        // Transaction `n` commits `per_txn` events of one aggregate, due at
        // `start + n * period`.
        let per_txn = options.events_per_transaction.max(1);
        let period = Duration::from_secs(1) * per_txn as u32 / options.rate as u32;
        let warmup = (options.warmup_seconds * options.rate as u64) as usize / per_txn;
        let transactions =
            warmup + (options.latency_seconds * options.rate as u64) as usize / per_txn;
        let total = transactions * per_txn;
        let start = tokio::time::Instant::now() + Duration::from_millis(100);
        let next = Arc::new(AtomicUsize::new(0));
        let mut writers = JoinSet::new();
        for _ in 0..options.writers {
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
                    let events = order_events(n as i64, per_txn)
                        .into_iter()
                        .map(|event| event.aggregate_id(aggregate_id.clone()));
                    let txn = db.begin().await?;
                    let appended = outbox_core::append(&txn, events).await?;
                    txn.commit().await?;
                    let committed = Instant::now();
                    commits.push(Commit {
                        n,
                        ids: appended
                            .iter()
                            .map(|event| event.id.hyphenated().to_string())
                            .collect(),
                        due: due.into_std(),
                        committed,
                    });
                }
                anyhow::Ok(commits)
            });
        }
        let mut commits = Vec::with_capacity(transactions);
        while let Some(writer) = writers.join_next().await {
            commits.extend(writer??);
        }
        progress!("latency: {total} events committed; waiting for the last acks");
        let deadline = Instant::now() + Duration::from_secs(30);
        while sink.acknowledged() < total && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.trigger();
        // `Relay::run` returns `()` or, where the sink can close, a `Result`.
        let stopped = relay.await?;
        progress!("latency: relay stopped: {stopped:?}");

        let window_start = start.into_std() + period * warmup as u32;
        let measured = CommitToAck::measure(&commits, sink.take(), warmup, window_start);
        Ok(LatencyResult {
            target_rate: options.rate,
            achieved_rate: measured.achieved_rate,
            events: measured.events,
            unacknowledged: measured.unacknowledged,
            commit_to_ack: measured.commit_to_ack,
            commit_to_handover: measured.commit_to_handover,
            handover_to_ack: measured.handover_to_ack,
            commit_lag: measured.commit_lag,
            batches: measured.batches,
            mean_batch_size: measured.mean_batch_size,
            sink_call: measured.sink_call,
            acked_before_commit_returned: measured.acked_before_commit_returned,
        })
    }
}

impl Results {
    fn render(&self) -> String {
        let mut out = format!("# bench-relay\n\n{}\n", self.machine);
        let options = &self.options;
        if !self.throughput.is_empty() {
            out.push_str(&format!(
                "\n## Throughput: {} events over {} aggregates, empty table, median of {}\n\n",
                options.events, options.aggregates, options.repetitions
            ));
            let mut table = Table::new([
                "batch",
                "ceiling events/s",
                "end-to-end events/s",
                "ratio (target >= 0.70)",
                "ratio per repetition",
            ]);
            for result in &self.throughput {
                let per_repetition: Vec<String> = result
                    .ratio_per_repetition
                    .iter()
                    .map(|ratio| format!("{ratio:.2}"))
                    .collect();
                table.row([
                    result.batch_size.to_string(),
                    report::rate(result.ceiling.events_per_second()),
                    report::rate(result.end_to_end.events_per_second()),
                    format!(
                        "{:.2} {}",
                        result.ratio,
                        verdict(result.ratio >= self.target_throughput_ratio)
                    ),
                    per_repetition.join(" "),
                ]);
            }
            out.push_str(&table.to_string());
            out.push_str(&format!(
                "\n### Where the time goes (median runs)\n\n{}",
                time_table(self.throughput.iter().flat_map(|result| {
                    [
                        (
                            format!("ceiling, batch {}", result.batch_size),
                            result.ceiling.median(),
                        ),
                        (
                            format!("end to end, batch {}", result.batch_size),
                            result.end_to_end.median(),
                        ),
                    ]
                }))
            ));
        }
        if let Some(latency) = &self.latency {
            out.push_str(&format!(
                "\n## Commit-to-ack latency: {} events/s for {} s ({} writers, {} event(s) per \
                 transaction, relay batch {}, {} published rows in the table, {}, poll interval \
                 {} ms)\n\n\
                 achieved {} events/s, {} events measured, {} unacknowledged, {} relay batches \
                 of {:.1} events on average\n\n",
                latency.target_rate,
                options.latency_seconds,
                options.writers,
                options.events_per_transaction,
                options.batch_size,
                options.latency_history_rows,
                if options.without_notify {
                    "no NOTIFY trigger"
                } else {
                    "woken by NOTIFY"
                },
                options.poll_interval_ms,
                report::rate(latency.achieved_rate),
                latency.events,
                latency.unacknowledged,
                latency.batches,
                latency.mean_batch_size,
            ));
            let mut table = Table::new(["interval", "p50 ms", "p90 ms", "p99 ms", "max ms"]);
            for (name, summary) in [
                ("commit -> ack", &latency.commit_to_ack),
                ("commit -> handed to sink", &latency.commit_to_handover),
                ("handed to sink -> ack", &latency.handover_to_ack),
                ("sink publish (per batch)", &latency.sink_call),
                ("writer commit lag vs schedule", &latency.commit_lag),
            ] {
                table.row([
                    name.to_owned(),
                    report::ms(summary.p50_ms),
                    report::ms(summary.p90_ms),
                    report::ms(summary.p99_ms),
                    report::ms(summary.max_ms),
                ]);
            }
            out.push_str(&table.to_string());
            out.push_str(&format!(
                "\np99 commit -> ack {} ms (target <= {} ms): {}\n",
                report::ms(latency.commit_to_ack.p99_ms),
                self.target_p99_ms,
                verdict(latency.commit_to_ack.p99_ms <= self.target_p99_ms)
            ));
        }
        if let [empty, ..] = self.history.as_slice() {
            out.push_str(&format!(
                "\n## Published history: {} pending events, batch {}, median of {}\n\n",
                options.events, options.batch_size, options.repetitions
            ));
            let mut table = Table::new([
                "published rows in table",
                "ceiling events/s",
                "vs empty",
                "end-to-end events/s",
                "vs empty",
            ]);
            for row in &self.history {
                table.row([
                    row.published_rows.to_string(),
                    report::rate(row.ceiling.events_per_second()),
                    report::ratio(
                        row.ceiling.events_per_second() / empty.ceiling.events_per_second(),
                    ),
                    report::rate(row.end_to_end.events_per_second()),
                    report::ratio(
                        row.end_to_end.events_per_second() / empty.end_to_end.events_per_second(),
                    ),
                ]);
            }
            out.push_str(&table.to_string());
            out.push_str(&format!(
                "\n### Where the time goes (median runs)\n\n{}",
                time_table(self.history.iter().flat_map(|row| {
                    [
                        (
                            format!("ceiling, {} published", row.published_rows),
                            row.ceiling.median(),
                        ),
                        (
                            format!("end to end, {} published", row.published_rows),
                            row.end_to_end.median(),
                        ),
                    ]
                }))
            ));
        }
        out
    }
}

/// Per-batch times and CPU per 1,000 events of drains.
fn time_table<'a>(drains: impl IntoIterator<Item = (String, &'a Drain)>) -> Table {
    let mut table = Table::new([
        "drain",
        "ms/batch outside sink",
        "ms/batch in sink",
        "ms/cycle first/last tenth",
        "CPU ms/1k events: relay",
        "its backends",
        "all postgres",
        "broker",
    ]);
    for (name, drain) in drains {
        let cpu = &drain.cpu_per_thousand_events;
        table.row([
            name,
            report::ms(drain.database_ms_per_batch),
            report::ms(drain.sink_ms_per_batch),
            format!(
                "{}/{}",
                report::ms(drain.first_tenth_ms_per_batch),
                report::ms(drain.last_tenth_ms_per_batch)
            ),
            format!("{:.0}", cpu.this_process_ms),
            format!("{:.0}", cpu.backends_ms),
            format!("{:.0}", cpu.postgres_ms),
            format!("{:.0}", cpu.broker_ms),
        ]);
    }
    table
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    report::elapsed_seconds();
    let options = Options::parse();
    anyhow::ensure!(
        options.batch_sizes.iter().all(|&size| size > 0) && options.batch_size > 0,
        "batch sizes must be positive"
    );
    // Fails loudly, naming the command that starts it, without a broker.
    let brokers = outbox_tests::kafka::brokers();
    let kafka: Arc<dyn Sink> = Arc::new(
        KafkaSink::connect(KafkaOptions {
            brokers,
            topic_partitions: options.topic_partitions,
            client_options: options.kafka_options.clone(),
            ..KafkaOptions::default()
        })
        .await
        .context("connecting to the Kafka-API broker (start it with `scripts/kafka.sh start`)")?,
    );
    let schema = TestDb::new(Backend::Postgres).await;
    if options.partitioned {
        partition(&schema, options.history_days).await?;
    }
    let machine = Machine::describe(&schema.db).await?;
    progress!("{machine}");
    let outcome = run(&options, &schema, kafka, machine).await;
    schema.drop().await;
    let results = outcome?;
    report::emit(options.json, &results.render(), &results)
}

/// Partitions the schema's outbox by day, with partitions for the past
/// `days` days (UTC) too.
async fn partition(schema: &TestDb, days: usize) -> anyhow::Result<()> {
    use sea_orm::ConnectionTrait;
    use sea_orm_migration::MigratorTrait;
    outbox_migrations::PartitionedMigrator::up(&schema.db, None)
        .await
        .context("partitioning the outbox")?;
    schema
        .db
        .execute_unprepared(&format!(
            "SELECT outbox_create_day_partition((now() AT TIME ZONE 'UTC')::date - d) \
             FROM generate_series(1, {days}) AS d"
        ))
        .await
        .context("creating the past days' partitions")?;
    // As `outbox-relay partitions maintain` does: claims leave out the
    // days before yesterday, which hold no pending row.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&schema.url)
        .await
        .context("connecting for partition maintenance")?;
    let store = outbox_relay::partitions::postgres::PgStore(pool);
    let claims_from = outbox_relay::partitions::Store::settle_days(&store)
        .await
        .context("settling the past days")?;
    outbox_relay::partitions::Store::close(&store).await;
    let claims_from = claims_from.map_or("every day".to_owned(), |from| from.to_string());
    progress!("outbox partitioned by day, {days} past days; claims read from {claims_from}");
    Ok(())
}

async fn run(
    options: &Options,
    schema: &TestDb,
    kafka: Arc<dyn Sink>,
    machine: Machine,
) -> anyhow::Result<Results> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&schema.url)
        .await
        .context("connecting the loader")?;
    let relay_url = format!("{}&application_name={RELAY_APPLICATION_NAME}", schema.url);
    let source: Arc<dyn Source> =
        Arc::from(outbox_relay::source::connect(&relay_url, SourceOptions::default()).await?);
    let bench = Bench {
        options: options.clone(),
        pool,
        db: schema.db.clone(),
        source,
        kafka,
        numbered: AtomicI64::new(0),
    };
    let mut results = Results {
        machine,
        options: options.clone(),
        target_throughput_ratio: TARGET_THROUGHPUT_RATIO,
        target_p99_ms: TARGET_P99_MS,
        throughput: Vec::new(),
        latency: None,
        history: Vec::new(),
    };
    if options.phases.contains(&Phase::Throughput) {
        results.throughput = bench.throughput().await?;
    }
    if options.phases.contains(&Phase::Latency) {
        let latency = bench.latency().await?;
        progress!(
            "latency: p99 commit -> ack {} ms",
            report::ms(latency.commit_to_ack.p99_ms)
        );
        results.latency = Some(latency);
    }
    if options.phases.contains(&Phase::History) && options.history_rows > 0 {
        results.history = bench.history().await?;
    }
    bench.pool.close().await;
    Ok(results)
}
