//! The inbox's cost per event on PostgreSQL: the order summary's effect
//! (one upsert) applied in a transaction per event with and without
//! `Inbox::apply`, the same in batches of 100 events per transaction, and
//! the cost of skipping a redelivered event.
//!
//! ```sh
//! cargo bench -p order-consumer --bench inbox               # 3 rounds of 2000 events
//! cargo bench -p order-consumer --bench inbox -- --events 5000 --rounds 5
//! ```
//!
//! Runs in a schema of its own on `OUTBOX_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), dropped at the end. Modes
//! take turns within each round, in an order rotating every round (the
//! redelivery always right after the inbox run whose events it replays), so
//! drift on a shared machine hits them alike; the overhead is also given as
//! the median over rounds of the ratio measured back to back.
//!
//! Per event, the effect is one statement (an upsert of the order's row);
//! the inbox adds three (lock the aggregate's high-water row with an
//! upsert, insert the event id, raise the high-water mark), and skips a
//! redelivery with two (the upsert, then a lookup of the event id).

use std::time::{Duration, Instant};

use clap::Parser;
use order_consumer::events::{OrderEvent, OrderLineAdded};
use order_consumer::summary;
use outbox_core::{EventMetadata, GapPolicy, Inbox, Outcome};
use outbox_tests::{Backend, TestDb};
use sea_orm::{DatabaseConnection, DbErr, TransactionTrait};

/// Inbox overhead per event on PostgreSQL.
#[derive(Parser)]
struct Args {
    /// Events per mode and round.
    #[arg(long, default_value_t = 2000)]
    events: usize,
    /// Orders the events are spread over (each gets consecutive sequences).
    #[arg(long, default_value_t = 100)]
    orders: i64,
    /// Rounds; modes alternate within each.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Events per transaction in the batched modes.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Effect,
    EffectWithInbox,
    Redelivered,
    BatchEffect,
    BatchEffectWithInbox,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::Effect,
        Mode::EffectWithInbox,
        Mode::Redelivered,
        Mode::BatchEffect,
        Mode::BatchEffectWithInbox,
    ];

    fn label(self) -> &'static str {
        match self {
            Mode::Effect => "effect only, 1 event/txn",
            Mode::EffectWithInbox => "effect + inbox, 1 event/txn",
            Mode::Redelivered => "redelivery skipped by inbox, 1 event/txn",
            Mode::BatchEffect => "effect only, batched",
            Mode::BatchEffectWithInbox => "effect + inbox, batched",
        }
    }
}

/// Timings of one mode: per event (or per batch, divided by its size).
#[derive(Default)]
struct Samples {
    per_event: Vec<Duration>,
    total: Duration,
    events: usize,
    /// Mean time per event of each measured round, in microseconds.
    round_means_us: Vec<f64>,
}

impl Samples {
    fn events_per_second(&self) -> f64 {
        self.events as f64 / self.total.as_secs_f64()
    }

    fn mean_us(&self) -> f64 {
        self.total.as_secs_f64() * 1e6 / self.events as f64
    }

    fn percentile_us(&mut self, p: f64) -> f64 {
        self.per_event.sort_unstable();
        let index = ((self.per_event.len() as f64 - 1.0) * p).round() as usize;
        self.per_event[index].as_secs_f64() * 1e6
    }
}

#[tokio::main]
async fn main() -> Result<(), DbErr> {
    let args = Args::parse();
    if !args.bench {
        // `cargo test --all-targets` builds and runs benches without
        // `--bench`: nothing to measure then.
        println!("run with `cargo bench -p order-consumer --bench inbox`");
        return Ok(());
    }
    assert!(
        args.events > 0 && args.rounds > 0 && args.orders > 0 && args.batch > 0,
        "--events, --rounds, --orders and --batch must be positive"
    );
    let t = TestDb::new(Backend::Postgres).await;
    summary::create_table(&t.db).await?;
    let inbox = Inbox::new("bench", GapPolicy::Apply);

    let load_before = load_average();
    let mut samples: Vec<Samples> = Mode::ALL.iter().map(|_| Samples::default()).collect();
    // One warm-up round, not counted.
    for round in 0..=args.rounds {
        let mut redeliveries = Vec::new();
        for mode in round_order(round) {
            let index = Mode::ALL.iter().position(|m| *m == mode).expect("a mode");
            let events = match mode {
                Mode::Redelivered => std::mem::take(&mut redeliveries),
                _ => events(&args, round, index),
            };
            let started = Instant::now();
            let timings = run(&t.db, &inbox, mode, &events, args.batch).await?;
            let elapsed = started.elapsed();
            if mode == Mode::EffectWithInbox {
                redeliveries = events;
            }
            if round > 0 {
                let sample = &mut samples[index];
                sample.per_event.extend(timings);
                sample.total += elapsed;
                sample.events += args.events;
                sample
                    .round_means_us
                    .push(elapsed.as_secs_f64() * 1e6 / args.events as f64);
            }
        }
    }

    println!(
        "inbox overhead on PostgreSQL: {} events x {} rounds per mode (+1 warm-up round), \
         {} orders, batches of {}; load average {load_before} -> {}",
        args.events,
        args.rounds,
        args.orders,
        args.batch,
        load_average()
    );
    println!(
        "{:<42} {:>10} {:>10} {:>10} {:>10}",
        "mode", "events/s", "mean us", "p50 us", "p99 us"
    );
    for (mode, sample) in Mode::ALL.iter().zip(samples.iter_mut()) {
        println!(
            "{:<42} {:>10.0} {:>10.0} {:>10.0} {:>10.0}",
            mode.label(),
            sample.events_per_second(),
            sample.mean_us(),
            sample.percentile_us(0.5),
            sample.percentile_us(0.99)
        );
    }
    let sample = |mode: Mode| &samples[Mode::ALL.iter().position(|m| *m == mode).unwrap()];
    for (label, without, with) in [
        (
            "a transaction per event",
            Mode::Effect,
            Mode::EffectWithInbox,
        ),
        ("batches", Mode::BatchEffect, Mode::BatchEffectWithInbox),
    ] {
        let (without, with) = (sample(without), sample(with));
        let mut ratios: Vec<f64> = without
            .round_means_us
            .iter()
            .zip(&with.round_means_us)
            .map(|(without, with)| with / without)
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "inbox overhead with {label}: +{:.0} us per event ({:.2}x overall; per round \
             {:.2}x median, {:.2}x-{:.2}x)",
            with.mean_us() - without.mean_us(),
            with.mean_us() / without.mean_us(),
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
        );
    }
    t.drop().await;
    Ok(())
}

/// The modes of round `round`: the order rotates every round, and the
/// redelivery follows the inbox run whose events it replays.
fn round_order(round: usize) -> Vec<Mode> {
    let slots = [
        Mode::Effect,
        Mode::EffectWithInbox,
        Mode::BatchEffect,
        Mode::BatchEffectWithInbox,
    ];
    (0..slots.len())
        .flat_map(|offset| match slots[(round + offset) % slots.len()] {
            Mode::EffectWithInbox => vec![Mode::EffectWithInbox, Mode::Redelivered],
            mode => vec![mode],
        })
        .collect()
}

/// The 1-minute load average (`/proc/loadavg`), `?` where there is none.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// `args.events` line events over `args.orders` orders of their own (per
/// round and mode), each order's sequence numbers in order.
fn events(args: &Args, round: usize, mode: usize) -> Vec<(EventMetadata, OrderEvent)> {
    let first_order = ((round * Mode::ALL.len() + mode) as i64) * args.orders;
    let mut sequences = vec![0_i64; args.orders as usize];
    (0..args.events)
        .map(|n| {
            let slot = n % args.orders as usize;
            let order_id = first_order + slot as i64;
            sequences[slot] += 1;
            let metadata = EventMetadata {
                id: uuid::Uuid::now_v7(),
                event_type: "OrderLineAdded".into(),
                version: 1,
                topic: "outbox.event.Order".into(),
                aggregate_id: Some(order_id.to_string()),
                aggregate_sequence: Some(sequences[slot]),
                traceparent: None,
                replay_id: None,
            };
            let event = OrderEvent::LineAdded(OrderLineAdded {
                order_id,
                quantity: 1,
                unit_price_cents: 2500,
            });
            (metadata, event)
        })
        .collect()
}

/// Applies `events` in `mode`; returns the time per event.
async fn run(
    db: &DatabaseConnection,
    inbox: &Inbox,
    mode: Mode,
    events: &[(EventMetadata, OrderEvent)],
    batch: usize,
) -> Result<Vec<Duration>, DbErr> {
    let per_txn = match mode {
        Mode::BatchEffect | Mode::BatchEffectWithInbox => batch,
        _ => 1,
    };
    let with_inbox = mode != Mode::Effect && mode != Mode::BatchEffect;
    let mut timings = Vec::with_capacity(events.len());
    for chunk in events.chunks(per_txn) {
        let started = Instant::now();
        let txn = db.begin().await?;
        for (metadata, event) in chunk {
            if with_inbox {
                let outcome = inbox
                    .apply(&txn, metadata, |txn| summary::apply(txn, event))
                    .await?;
                let expected_applied = mode != Mode::Redelivered;
                assert_eq!(
                    outcome.is_applied(),
                    expected_applied,
                    "{mode:?}: {outcome:?}"
                );
                if !expected_applied {
                    assert_eq!(outcome, Outcome::Duplicate);
                }
            } else {
                summary::apply(&txn, event).await?;
            }
        }
        txn.commit().await?;
        let per_event = started.elapsed() / chunk.len() as u32;
        timings.extend(std::iter::repeat_n(per_event, chunk.len()));
    }
    Ok(timings)
}
