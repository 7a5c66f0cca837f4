//! `bench-cdc`: CDC mode (`outbox-relay run --mode cdc`) beside polling
//! mode on the same load, in one run, with the same Kafka sink:
//!
//! - throughput: a backlog of committed transactions (by default 100,000
//!   events, 10 per transaction, over 1,000 aggregates) is drained by the
//!   polling relay (claim, publish, settle) and by the CDC relay (reading
//!   the same transactions from its replication slot, then marking the
//!   rows), and, with the insert+delete idiom, by the CDC relay from a
//!   table that stays empty; repetitions alternate the modes;
//! - latency: writers commit events at a fixed rate through the library's
//!   `append` (or `append_transient`) while each relay runs; a decorator
//!   around the sink timestamps when each event is handed to the broker and
//!   acknowledged.
//!
//! Both relays are the library's own (`Relay` and `CdcRelay`), run in this
//! process with the sink wrapped. The run works in a schema of its own,
//! with a replication slot and a publication of its own, and drops all
//! three at the end, also when it fails or is interrupted.
//!
//! PostgreSQL (with `wal_level = logical`) comes from
//! `OUTBOX_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) and the broker from
//! `KAFKA_BROKERS` (default `127.0.0.1:9092`, started with
//! `scripts/kafka.sh start`).

mod load;
mod replication;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use outbox_bench::cpu::{CpuPerThousand, CpuTimes};
use outbox_bench::order::order_events;
use outbox_bench::progress;
use outbox_bench::report::{self, Machine, Table};
use outbox_bench::stats::{self, LatencySummary};
use outbox_relay::cdc::slot::{self, SlotStatus};
use outbox_relay::cdc::{CdcOptions, CdcRelay};
use outbox_relay::message::TopicTemplate;
use outbox_relay::relay::{Relay, RelayOptions};
use outbox_relay::shutdown::Shutdown;
use outbox_relay::sink::Sink;
use outbox_relay::sink::kafka::{KafkaOptions, KafkaSink};
use outbox_relay::source::postgres::PostgresSource;
use outbox_relay::source::{Source, SourceOptions};
use outbox_tests::{Backend, TestDb};
use sea_orm::{DatabaseConnection, TransactionTrait};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinSet;

use load::Backlog;
use outbox_bench::recording::{Call, Commit, CommitToAck, Recorded, RecordingSink};
use replication::Replication;

/// Measures CDC mode beside polling mode: backlog throughput and
/// commit-to-ack latency at a fixed rate.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "bench-cdc", version)]
struct Options {
    /// The parts to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Phase::Throughput, Phase::Latency])]
    phases: Vec<Phase>,
    /// The relays measured, comma-separated, in this order in each round.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Poll, Mode::Cdc, Mode::CdcInsertDelete])]
    modes: Vec<Mode>,
    /// Events of the backlog drained in each throughput measurement.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Aggregates the transactions go round.
    #[arg(long, default_value_t = 1_000)]
    aggregates: usize,
    /// Events per committed transaction of the backlog.
    #[arg(long, default_value_t = 10)]
    backlog_events_per_transaction: usize,
    /// Times each throughput measurement is repeated (the median counts).
    #[arg(long, default_value_t = 5)]
    repetitions: usize,
    /// The relays' batch size (both modes; CDC mode sends whole
    /// transactions, so its batches may be slightly larger).
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// Events committed per second in the latency part.
    #[arg(long, default_value_t = 2_000)]
    rate: usize,
    /// Measured seconds of the latency part, per mode.
    #[arg(long, default_value_t = 20)]
    latency_seconds: u64,
    /// Unmeasured seconds at the same rate before them.
    #[arg(long, default_value_t = 2)]
    warmup_seconds: u64,
    /// Concurrent writers of the latency part.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Events per transaction in the latency part (one order's events);
    /// the writers commit `rate / events_per_transaction` transactions per
    /// second.
    #[arg(long, default_value_t = 10)]
    events_per_transaction: usize,
    /// Published rows in the table (vacuumed and analyzed) when each
    /// latency measurement starts, as in a relay's steady state with
    /// retention.
    #[arg(long, default_value_t = 100_000)]
    latency_history_rows: usize,
    /// The polling relay's longest wait between claims (it is woken by the
    /// `NOTIFY` trigger sooner).
    #[arg(long, default_value_t = 500)]
    poll_interval_ms: u64,
    /// Partitions of the topics the relays create.
    #[arg(long, default_value_t = 1)]
    topic_partitions: i32,
    /// Print the results as JSON on standard output (the readable report
    /// then goes to standard error).
    #[arg(long)]
    json: bool,
}

/// A part of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    /// Draining a backlog.
    Throughput,
    /// Commit-to-ack latency at a fixed rate.
    Latency,
}

/// A relay and the way events are written for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    /// `run --mode poll`: claims pending rows, publishes, marks them.
    Poll,
    /// `run --mode cdc`: reads the inserts from the slot, publishes, marks
    /// the rows.
    Cdc,
    /// `run --mode cdc` with the insert+delete idiom: each transaction
    /// deletes the rows it inserted (`append_transient`), the table stays
    /// empty and there is nothing to mark.
    CdcInsertDelete,
}

impl Mode {
    fn is_cdc(self) -> bool {
        self != Mode::Poll
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Poll => "polling",
            Mode::Cdc => "CDC",
            Mode::CdcInsertDelete => "CDC, insert+delete",
        })
    }
}

/// The `application_name` of the relays' ordinary connections, to find
/// their backends' CPU time (the CDC relay's replication connection is
/// found through the slot).
const RELAY_APPLICATION_NAME: &str = "outbox-bench-cdc";

/// The targets.
const TARGET_CDC_OVER_POLL: f64 = 1.5;
const TARGET_CDC_P99_MS: f64 = 15.0;

/// What the run works with.
struct Bench {
    options: Options,
    /// The schema's URL.
    url: String,
    /// Loads and cleans the table.
    pool: PgPool,
    /// Business transactions of the latency part.
    db: DatabaseConnection,
    /// The relays' source (the polling relay claims through it, the CDC
    /// relay marks through it).
    source: Arc<PostgresSource>,
    kafka: Arc<dyn Sink>,
    replication: Replication,
}

/// A relay running in this process.
enum Running {
    Poll(tokio::task::JoinHandle<Result<(), outbox_relay::relay::RelayError>>),
    Cdc(tokio::task::JoinHandle<anyhow::Result<()>>),
}

impl Running {
    fn is_finished(&self) -> bool {
        match self {
            Running::Poll(task) => task.is_finished(),
            Running::Cdc(task) => task.is_finished(),
        }
    }

    /// Waits for the relay to return after its shutdown was triggered.
    async fn stopped(self) -> anyhow::Result<()> {
        match self {
            Running::Poll(task) => task.await?.map_err(anyhow::Error::from),
            Running::Cdc(task) => task.await?,
        }
    }
}

/// One drain of a backlog.
#[derive(Debug, Clone, Serialize)]
struct Drain {
    events: usize,
    /// From the start (the polling relay's first claim, the CDC relay's
    /// start, connecting included) to the last acknowledgement.
    seconds: f64,
    events_per_second: f64,
    /// From the first hand-over to the sink to the last acknowledgement:
    /// the drain without the relay's start.
    steady_events_per_second: f64,
    /// From the start to the first hand-over to the sink.
    first_handover_ms: f64,
    /// For CDC mode, the WAL the server reads for the slot when the relay
    /// starts (from the slot's restart position), and the part of it after
    /// the confirmed position (the backlog itself), in MiB.
    slot_wal_read_mib: Option<f64>,
    slot_backlog_mib: Option<f64>,
    /// For CDC mode, the CPU time of the server process decoding the WAL
    /// for the relay (the WAL sender), in seconds: next to the drain's
    /// duration, how busy it was.
    wal_sender_cpu_seconds: Option<f64>,
    /// Sink calls and their mean size.
    batches: usize,
    mean_batch_size: f64,
    /// Mean time per batch in the sink (send and wait for every ack).
    sink_ms_per_batch: f64,
    /// Mean time per batch outside the sink: the relay and the database.
    outside_sink_ms_per_batch: f64,
    /// CPU per 1,000 events: this process (relay and librdkafka), the
    /// relay's backends (with the CDC relay's WAL sender), every
    /// PostgreSQL process, the broker.
    cpu_per_thousand_events: CpuPerThousand,
}

impl Drain {
    fn new(
        events: usize,
        start: Instant,
        calls: &[Call],
        cpu: CpuPerThousand,
        slot: Option<&SlotStatus>,
    ) -> Self {
        let last_ack = calls
            .iter()
            .map(|call| call.answered)
            .max()
            .unwrap_or(start);
        let elapsed = last_ack.saturating_duration_since(start);
        let first = calls.iter().map(|call| call.started).min().unwrap_or(start);
        let batches = calls.len();
        let sink_time: Duration = calls.iter().map(Call::took).sum();
        let per_batch = |time: Duration| {
            if batches == 0 {
                0.0
            } else {
                time.as_secs_f64() * 1000.0 / batches as f64
            }
        };
        Self {
            events,
            seconds: elapsed.as_secs_f64(),
            events_per_second: stats::per_second(events, elapsed),
            steady_events_per_second: stats::per_second(
                events,
                last_ack.saturating_duration_since(first),
            ),
            slot_wal_read_mib: slot.and_then(|slot| slot.retained_wal_bytes).map(mib),
            slot_backlog_mib: slot.and_then(|slot| slot.behind_bytes).map(mib),
            wal_sender_cpu_seconds: None,
            first_handover_ms: first.saturating_duration_since(start).as_secs_f64() * 1000.0,
            batches,
            mean_batch_size: if batches == 0 {
                0.0
            } else {
                calls.iter().map(|call| call.messages).sum::<usize>() as f64 / batches as f64
            },
            sink_ms_per_batch: per_batch(sink_time),
            outside_sink_ms_per_batch: per_batch(elapsed.saturating_sub(sink_time)),
            cpu_per_thousand_events: cpu,
        }
    }
}

/// One mode's drains.
#[derive(Debug, Serialize)]
struct ModeDrains {
    mode: Mode,
    runs: Vec<Drain>,
}

impl ModeDrains {
    /// The run with the median throughput (the lower one of an even count).
    fn median(&self) -> &Drain {
        let mut runs: Vec<&Drain> = self.runs.iter().collect();
        runs.sort_by(|a, b| a.events_per_second.total_cmp(&b.events_per_second));
        runs[(runs.len() - 1) / 2]
    }
}

/// The median over repetitions of one figure of a drain (the lower one of
/// an even count).
fn median_of(drains: &ModeDrains, figure: fn(&Drain) -> f64) -> f64 {
    let mut values: Vec<f64> = drains.runs.iter().map(figure).collect();
    values.sort_by(f64::total_cmp);
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}

/// One mode's latency measurement.
#[derive(Debug, Serialize)]
struct LatencyResult {
    mode: Mode,
    /// Events committed in the measured window per second of it.
    achieved_rate: f64,
    events: usize,
    /// Events committed but never acknowledged within 30 s of the last
    /// commit.
    unacknowledged: usize,
    /// Commit (the writer's `commit()` returned) to acknowledgement (the
    /// sink answered `Ok` to the relay).
    commit_to_ack: LatencySummary,
    /// Commit to the relay handing the event to the sink.
    commit_to_handover: LatencySummary,
    /// Handed to the sink to acknowledged: the broker's part.
    handover_to_ack: LatencySummary,
    /// How late writers committed against their schedule.
    commit_lag: LatencySummary,
    /// Sink calls while measuring, and their mean size.
    batches: usize,
    mean_batch_size: f64,
    /// Acknowledgements that came before the writer saw its commit return.
    acked_before_commit_returned: usize,
    /// CPU per 1,000 events over the whole measurement, writers included.
    cpu_per_thousand_events: CpuPerThousand,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    code: String,
    options: Options,
    target_cdc_over_poll: f64,
    target_cdc_p99_ms: f64,
    throughput: Vec<ModeDrains>,
    latency: Vec<LatencyResult>,
}

impl Bench {
    /// A fresh topic template, so every measurement starts on empty topics.
    fn topics() -> TopicTemplate {
        TopicTemplate::new(format!(
            "{}.{{aggregatetype}}",
            outbox_tests::kafka::topic_prefix("bench-cdc")
        ))
    }

    /// The process ids of the relays' ordinary PostgreSQL backends.
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

    /// The relay's backends and, for a CDC relay, its WAL sender.
    async fn backends_with(&self, wal_sender: Option<i32>) -> anyhow::Result<Vec<u32>> {
        let mut pids = self.relay_backends().await?;
        pids.extend(wal_sender.and_then(|pid| u32::try_from(pid).ok()));
        Ok(pids)
    }

    /// Starts the relay of `mode` on `sink`.
    fn start(&self, mode: Mode, sink: Arc<dyn Sink>, shutdown: Shutdown) -> Running {
        let batch_size = self.options.batch_size;
        if mode.is_cdc() {
            let relay = CdcRelay::new(
                self.url.clone(),
                self.source.clone(),
                sink,
                Self::topics(),
                CdcOptions {
                    slot: self.replication.name.clone(),
                    publication: self.replication.name.clone(),
                    batch_size,
                    retention: None,
                    metrics_interval: None,
                    ..CdcOptions::default()
                },
            );
            Running::Cdc(tokio::spawn(async move {
                relay.run(shutdown).await.map_err(anyhow::Error::from)
            }))
        } else {
            let source: Arc<dyn Source> = self.source.clone();
            let relay = Relay::new(
                source,
                sink,
                Self::topics(),
                RelayOptions {
                    batch_size,
                    drain: false,
                    poll_interval: Duration::from_millis(self.options.poll_interval_ms),
                    retention: None,
                    ..RelayOptions::default()
                },
            );
            Running::Poll(tokio::spawn(async move { relay.run(shutdown).await }))
        }
    }

    /// Loads a backlog for `mode` and drains it.
    async fn drain(&self, mode: Mode) -> anyhow::Result<Drain> {
        let options = &self.options;
        if mode.is_cdc() {
            // The CDC relay publishes only this measurement's backlog
            // (this checkpoints too).
            self.replication.skip_to_now(&self.pool).await?;
        } else {
            // Every mode's backlog is written right after a checkpoint.
            sqlx::raw_sql("CHECKPOINT").execute(&self.pool).await?;
        }
        load::truncate(&self.pool).await?;
        load::backlog(
            &self.url,
            &self.pool,
            Backlog {
                events: options.events,
                aggregates: options.aggregates,
                per_transaction: options.backlog_events_per_transaction,
                transient: mode == Mode::CdcInsertDelete,
            },
        )
        .await
        .context("loading the backlog")?;
        let events = options.events;
        let slot = if mode.is_cdc() {
            slot::slot_status(&self.pool, &self.replication.name).await?
        } else {
            None
        };
        let sink = Arc::new(RecordingSink::new(self.kafka.clone()));
        let cpu = CpuTimes::now(&self.relay_backends().await?);
        let start = Instant::now();
        let (cpu, wal_sender_cpu) = if mode.is_cdc() {
            let (stop, shutdown) = Shutdown::manual();
            let relay = self.start(mode, sink.clone(), shutdown);
            let deadline = Instant::now() + Duration::from_secs(600);
            let mut wal_sender = None;
            while sink.acknowledged() < events {
                if relay.is_finished() {
                    anyhow::bail!("the CDC relay stopped early: {:?}", relay.stopped().await);
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the CDC relay acknowledged {} of {events} events in 10 minutes",
                    sink.acknowledged()
                );
                if wal_sender.is_none() {
                    wal_sender = self.replication.reader_pid(&self.pool).await?;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Before the WAL sender exits with the relay.
            let cpu = CpuTimes::now(&self.backends_with(wal_sender).await?)
                .per_thousand_since(&cpu, events);
            // It started with the relay: all its time is this drain's.
            let wal_sender_cpu = wal_sender
                .and_then(|pid| u32::try_from(pid).ok())
                .map(|pid| {
                    CpuTimes::now(&[pid])
                        .backends
                        .values()
                        .sum::<Duration>()
                        .as_secs_f64()
                });
            stop.trigger();
            relay.stopped().await?;
            (cpu, wal_sender_cpu)
        } else {
            // `outbox-relay run --drain`.
            let source: Arc<dyn Source> = self.source.clone();
            let relay = Relay::new(
                source,
                sink.clone(),
                Self::topics(),
                RelayOptions {
                    batch_size: options.batch_size,
                    drain: true,
                    retention: None,
                    ..RelayOptions::default()
                },
            );
            let (_stop, shutdown) = Shutdown::manual();
            relay.run(shutdown).await?;
            let cpu = CpuTimes::now(&self.relay_backends().await?).per_thousand_since(&cpu, events);
            (cpu, None)
        };
        anyhow::ensure!(
            sink.refused() == 0,
            "the broker refused {} sends while draining; the measurement is void",
            sink.refused()
        );
        let Recorded { acks, calls } = sink.take();
        anyhow::ensure!(
            acks.len() == events,
            "{} acknowledgements for {events} events",
            acks.len()
        );
        let pending = load::pending(&self.pool).await?;
        anyhow::ensure!(pending == 0, "{pending} rows left pending after the drain");
        let mut drain = Drain::new(events, start, &calls, cpu, slot.as_ref());
        drain.wal_sender_cpu_seconds = wal_sender_cpu;
        Ok(drain)
    }

    async fn throughput(&self) -> anyhow::Result<Vec<ModeDrains>> {
        let mut results: Vec<ModeDrains> = self
            .options
            .modes
            .iter()
            .map(|&mode| ModeDrains {
                mode,
                runs: Vec::new(),
            })
            .collect();
        // Repetitions go round the modes, so drift spreads over all.
        for repetition in 0..self.options.repetitions {
            for result in &mut results {
                let drain = self.drain(result.mode).await?;
                progress!(
                    "repetition {}: {}: {} events/s ({} batches of {:.0}, {} ms in the sink each)",
                    repetition + 1,
                    result.mode,
                    report::rate(drain.events_per_second),
                    drain.batches,
                    drain.mean_batch_size,
                    report::ms(drain.sink_ms_per_batch)
                );
                result.runs.push(drain);
            }
        }
        Ok(results)
    }

    async fn latency(&self, mode: Mode) -> anyhow::Result<LatencyResult> {
        let options = &self.options;
        anyhow::ensure!(
            options.rate > 0 && options.writers > 0,
            "--rate and --writers must be positive"
        );
        load::truncate(&self.pool).await?;
        load::history(&self.pool, options.latency_history_rows, options.aggregates)
            .await
            .context("loading published history")?;
        if mode.is_cdc() {
            self.replication.skip_to_now(&self.pool).await?;
        }
        let sink = Arc::new(RecordingSink::new(self.kafka.clone()));
        let (stop, shutdown) = Shutdown::manual();
        let relay = self.start(mode, sink.clone(), shutdown);
        let wal_sender = if mode.is_cdc() {
            Some(self.replication.wait_reading(&self.pool).await?)
        } else {
            None
        };
        let cpu = CpuTimes::now(&self.backends_with(wal_sender).await?);

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
        let transient = mode == Mode::CdcInsertDelete;
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
                    let appended = if transient {
                        outbox_core::append_transient(&txn, events).await?
                    } else {
                        outbox_core::append(&txn, events).await?
                    };
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
        progress!("latency, {mode}: {total} events committed; waiting for the last acks");
        let deadline = Instant::now() + Duration::from_secs(30);
        while sink.acknowledged() < total && Instant::now() < deadline && !relay.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cpu = CpuTimes::now(&self.backends_with(wal_sender).await?)
            .per_thousand_since(&cpu, sink.acknowledged());
        stop.trigger();
        relay.stopped().await.context("the relay failed")?;

        let window_start = start.into_std() + period * warmup as u32;
        let measured = CommitToAck::measure(&commits, sink.take(), warmup, window_start);
        Ok(LatencyResult {
            mode,
            achieved_rate: measured.achieved_rate,
            events: measured.events,
            unacknowledged: measured.unacknowledged,
            commit_to_ack: measured.commit_to_ack,
            commit_to_handover: measured.commit_to_handover,
            handover_to_ack: measured.handover_to_ack,
            commit_lag: measured.commit_lag,
            batches: measured.batches,
            mean_batch_size: measured.mean_batch_size,
            acked_before_commit_returned: measured.acked_before_commit_returned,
            cpu_per_thousand_events: cpu,
        })
    }
}

impl Results {
    fn poll_drains(&self) -> Option<&ModeDrains> {
        self.throughput
            .iter()
            .find(|drains| drains.mode == Mode::Poll)
    }

    fn render(&self) -> String {
        let mut out = format!("# bench-cdc\n\n{}\ncode: {}\n", self.machine, self.code);
        let options = &self.options;
        if !self.throughput.is_empty() {
            out.push_str(&format!(
                "\n## Throughput: a backlog of {} events ({} per transaction, {} aggregates), \
                 batch {}, median of {}\n\n",
                options.events,
                options.backlog_events_per_transaction,
                options.aggregates,
                options.batch_size,
                options.repetitions
            ));
            let poll = self.poll_drains();
            let mut table = Table::new([
                "mode",
                "events/s from start",
                "vs polling (target CDC >= 1.50x)",
                "per repetition",
                "events/s from first hand-over",
                "vs polling",
                "per repetition",
            ]);
            let versus = |mode: Mode, value: f64, poll: Option<f64>| match (mode, poll) {
                (Mode::Poll, _) => "1.00x".to_owned(),
                (_, Some(poll)) => {
                    let ratio = value / poll;
                    format!(
                        "{} {}",
                        report::ratio(ratio),
                        verdict(ratio >= self.target_cdc_over_poll)
                    )
                }
                (_, None) => "-".to_owned(),
            };
            for drains in &self.throughput {
                let from_start = median_of(drains, |run| run.events_per_second);
                let steady = median_of(drains, |run| run.steady_events_per_second);
                let per_repetition = |rate: fn(&Drain) -> f64| {
                    drains
                        .runs
                        .iter()
                        .map(|run| report::rate(rate(run)))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                table.row([
                    drains.mode.to_string(),
                    report::rate(from_start),
                    versus(
                        drains.mode,
                        from_start,
                        poll.map(|poll| median_of(poll, |run| run.events_per_second)),
                    ),
                    per_repetition(|run| run.events_per_second),
                    report::rate(steady),
                    versus(
                        drains.mode,
                        steady,
                        poll.map(|poll| median_of(poll, |run| run.steady_events_per_second)),
                    ),
                    per_repetition(|run| run.steady_events_per_second),
                ]);
            }
            out.push_str(&table.to_string());
            out.push_str("\n### Where the time goes (median runs)\n\n");
            let mut table = Table::new([
                "mode",
                "batches x mean size",
                "first hand-over ms",
                "slot WAL read / backlog MiB",
                "WAL sender CPU s / drain s",
                "ms/batch in sink",
                "ms/batch outside sink",
                "CPU ms/1k events: relay",
                "its backends",
                "all postgres",
                "broker",
            ]);
            for drains in &self.throughput {
                let drain = drains.median();
                let cpu = &drain.cpu_per_thousand_events;
                table.row([
                    drains.mode.to_string(),
                    format!("{} x {:.0}", drain.batches, drain.mean_batch_size),
                    format!("{:.0}", drain.first_handover_ms),
                    match (drain.slot_wal_read_mib, drain.slot_backlog_mib) {
                        (Some(read), Some(backlog)) => format!("{read:.1} / {backlog:.1}"),
                        _ => "-".to_owned(),
                    },
                    drain.wal_sender_cpu_seconds.map_or_else(
                        || "-".to_owned(),
                        |cpu| format!("{cpu:.2} / {:.2}", drain.seconds),
                    ),
                    report::ms(drain.sink_ms_per_batch),
                    report::ms(drain.outside_sink_ms_per_batch),
                    format!("{:.0}", cpu.this_process_ms),
                    format!("{:.0}", cpu.backends_ms),
                    format!("{:.0}", cpu.postgres_ms),
                    format!("{:.0}", cpu.broker_ms),
                ]);
            }
            out.push_str(&table.to_string());
        }
        if !self.latency.is_empty() {
            out.push_str(&format!(
                "\n## Commit-to-ack latency: {} events/s for {} s per mode ({} writers, {} \
                 event(s) per transaction, batch {}, {} published rows in the table; polling \
                 woken by NOTIFY, poll interval {} ms)\n\n",
                options.rate,
                options.latency_seconds,
                options.writers,
                options.events_per_transaction,
                options.batch_size,
                options.latency_history_rows,
                options.poll_interval_ms,
            ));
            let mut table = Table::new([
                "mode",
                "achieved events/s",
                "unacked",
                "commit->ack p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms",
                "commit->hand-over p50/p99 ms",
                "hand-over->ack p50/p99 ms",
                "batches x mean size",
                "writer lag p99 ms",
            ]);
            for latency in &self.latency {
                let ack = &latency.commit_to_ack;
                table.row([
                    latency.mode.to_string(),
                    report::rate(latency.achieved_rate),
                    latency.unacknowledged.to_string(),
                    report::ms(ack.p50_ms),
                    report::ms(ack.p90_ms),
                    report::ms(ack.p99_ms),
                    report::ms(ack.max_ms),
                    format!(
                        "{}/{}",
                        report::ms(latency.commit_to_handover.p50_ms),
                        report::ms(latency.commit_to_handover.p99_ms)
                    ),
                    format!(
                        "{}/{}",
                        report::ms(latency.handover_to_ack.p50_ms),
                        report::ms(latency.handover_to_ack.p99_ms)
                    ),
                    format!("{} x {:.1}", latency.batches, latency.mean_batch_size),
                    report::ms(latency.commit_lag.p99_ms),
                ]);
            }
            out.push_str(&table.to_string());
            out.push_str("\nCPU ms per 1,000 events while measuring (writers included):\n\n");
            let mut table = Table::new([
                "mode",
                "bench process (relay + writers)",
                "relay backends",
                "all postgres",
                "broker",
            ]);
            for latency in &self.latency {
                let cpu = &latency.cpu_per_thousand_events;
                table.row([
                    latency.mode.to_string(),
                    format!("{:.0}", cpu.this_process_ms),
                    format!("{:.0}", cpu.backends_ms),
                    format!("{:.0}", cpu.postgres_ms),
                    format!("{:.0}", cpu.broker_ms),
                ]);
            }
            out.push_str(&table.to_string());
            for latency in self.latency.iter().filter(|latency| latency.mode.is_cdc()) {
                out.push_str(&format!(
                    "\n{}: p99 commit -> ack {} ms (target <= {} ms): {}",
                    latency.mode,
                    report::ms(latency.commit_to_ack.p99_ms),
                    self.target_cdc_p99_ms,
                    verdict(latency.commit_to_ack.p99_ms <= self.target_cdc_p99_ms)
                ));
            }
            out.push('\n');
        }
        out
    }
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// The commit checked out, if this runs in a Git work tree.
fn code_version() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map_or_else(|| "unknown".to_owned(), |version| version.trim().to_owned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    report::elapsed_seconds();
    let options = Options::parse();
    anyhow::ensure!(options.batch_size > 0, "--batch-size must be positive");
    anyhow::ensure!(!options.modes.is_empty(), "--modes lists no mode");
    // Fails loudly, naming the command that starts it, without a broker.
    let brokers = outbox_tests::kafka::brokers();
    let kafka: Arc<dyn Sink> = Arc::new(
        KafkaSink::connect(KafkaOptions {
            brokers,
            topic_partitions: options.topic_partitions,
            ..KafkaOptions::default()
        })
        .await
        .context("connecting to the Kafka-API broker (start it with `scripts/kafka.sh start`)")?,
    );
    let schema = TestDb::new(Backend::Postgres).await;
    let machine = Machine::describe(&schema.db).await?;
    progress!("{machine}");
    let replication = Replication::new();
    // Created, used and dropped by the run; everything from here on ends
    // in the cleanup below, whatever happens.
    let mut body = tokio::spawn(run(
        options.clone(),
        schema.url.clone(),
        schema.db.clone(),
        kafka,
        replication.clone(),
        machine,
    ));
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let outcome = tokio::select! {
        joined = &mut body => joined.unwrap_or_else(|error| Err(anyhow::anyhow!("the run panicked: {error}"))),
        _ = interrupt.recv() => stop_run(body).await,
        _ = terminate.recv() => stop_run(body).await,
    };
    let dropped = replication.drop(&Backend::Postgres.admin_url()).await;
    if let Err(error) = &dropped {
        eprintln!("error: {error:#}");
    } else {
        progress!("dropped slot and publication {}", replication.name);
    }
    schema.drop().await;
    let results = outcome?;
    dropped?;
    report::emit(options.json, &results.render(), &results)
}

/// Stops the run after a signal; the cleanup follows.
async fn stop_run(
    body: tokio::task::JoinHandle<anyhow::Result<Results>>,
) -> anyhow::Result<Results> {
    progress!("interrupted: stopping, then dropping the slot, the publication and the schema");
    body.abort();
    let _ = body.await;
    Err(anyhow::anyhow!("interrupted"))
}

async fn run(
    options: Options,
    url: String,
    db: DatabaseConnection,
    kafka: Arc<dyn Sink>,
    replication: Replication,
    machine: Machine,
) -> anyhow::Result<Results> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .context("connecting the loader")?;
    replication::drop_stale(&pool).await?;
    replication.create(&pool).await?;
    progress!("created slot and publication {}", replication.name);
    let relay_url = format!("{url}&application_name={RELAY_APPLICATION_NAME}");
    let source = Arc::new(
        outbox_relay::source::connect_postgres(
            &relay_url,
            SourceOptions {
                delete_on_publish: false,
                shards: None,
                creation_times: false,
                extra: Default::default(),
            },
        )
        .await?,
    );
    let bench = Bench {
        options: options.clone(),
        url: relay_url,
        pool,
        db,
        source,
        kafka,
        replication,
    };
    let mut results = Results {
        machine,
        code: code_version(),
        options: options.clone(),
        target_cdc_over_poll: TARGET_CDC_OVER_POLL,
        target_cdc_p99_ms: TARGET_CDC_P99_MS,
        throughput: Vec::new(),
        latency: Vec::new(),
    };
    if options.phases.contains(&Phase::Throughput) {
        results.throughput = bench.throughput().await?;
    }
    if options.phases.contains(&Phase::Latency) {
        for &mode in &options.modes {
            let latency = bench.latency(mode).await?;
            progress!(
                "latency, {mode}: p50 {} ms, p99 {} ms commit -> ack",
                report::ms(latency.commit_to_ack.p50_ms),
                report::ms(latency.commit_to_ack.p99_ms)
            );
            results.latency.push(latency);
        }
    }
    bench.source.close().await;
    bench.pool.close().await;
    Ok(results)
}
