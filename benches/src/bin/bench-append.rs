//! `bench-append`: what appending events costs a business transaction.
//!
//! The transaction places an order through SeaORM (`BEGIN`, `INSERT ..
//! RETURNING`, `COMMIT`) without events, with one event and with ten
//! (`ActiveModelOutboxExt::insert_with_events`). Variants take turns in
//! rounds, in an order that rotates every round, so drift on a shared
//! machine hits them alike; each is run sequentially (one writer) and by
//! several concurrent writers, each writer holding one connection. The
//! headline cost of a variant is the median over rounds of the no-event
//! rate divided by its rate, both measured back to back: a burst of other
//! work on the machine spoils a few rounds, not the figure.
//!
//! On PostgreSQL `insert_with_events` writes the order and its events in
//! one statement (a data-modifying CTE: the order's `INSERT .. RETURNING`,
//! the reservation of the aggregate's sequence numbers, the outbox rows),
//! so one event or ten add no round trip to the transaction, only the
//! statement's extra work.
//!
//! Diagnostic variants explain the cost rather than measure the library:
//!
//! - the order insert, then the library's append of its event in a second
//!   statement (what other databases do, and PostgreSQL did before the
//!   one-statement insert);
//! - the order insert plus one `SELECT 1` (the round trip a separate
//!   append adds, without its work);
//! - the outbox row inserted by a second statement without a sequence
//!   number (plain SQL, no reservation);
//! - the order and the outbox row in one statement without a sequence
//!   number (the library's statement without the reservation);
//! - the library on a schema without the `NOTIFY` trigger;
//! - the library while a relay waits for rows: a connection holds the
//!   wake-up advisory locks a waiting relay holds, so every commit
//!   notifies (the trigger notifies only while a relay waits; in the other
//!   variants none does, as when every relay is busy).
//!
//! PostgreSQL comes from `OUTBOX_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); each run works in schemas of
//! its own, dropped at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use outbox_bench::cpu::CpuTimes;
use outbox_bench::order::{self, new_order, order_events, order_placed};
use outbox_bench::progress;
use outbox_bench::report::{self, Machine, Table};
use outbox_bench::stats::{self, LatencySummary};
use outbox_core::{ActiveModelOutboxExt, DomainEvent};
use outbox_relay::source::postgres::take_wake_slots_sql;
use outbox_tests::events::OrderPlaced;
use outbox_tests::{Backend, TestDb};
use sea_orm::{
    ActiveModelTrait, ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend,
    EntityTrait, FromQueryResult, QueryTrait, Statement, TransactionTrait,
};
use serde::Serialize;
use tokio::task::JoinSet;

/// Measures the cost of appending outbox events to a business transaction.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "bench-append", version)]
struct Options {
    /// Transactions per variant in each round, shared among the writers.
    #[arg(long, default_value_t = 100)]
    transactions_per_round: usize,
    /// Measured rounds; in each, every variant runs once, in rotating order.
    /// Short rounds, many of them: a burst of other work on the machine
    /// then spoils a few rounds, which the median ratio ignores.
    #[arg(long, default_value_t = 40)]
    rounds: usize,
    /// Unmeasured rounds first (connections, statement caches, buffers).
    #[arg(long, default_value_t = 1)]
    warmup_rounds: usize,
    /// Numbers of concurrent writers to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4])]
    writers: Vec<usize>,
    /// Leave out the diagnostic variants.
    #[arg(long)]
    no_diagnostics: bool,
    /// Print the results as JSON on standard output (the readable report
    /// then goes to standard error).
    #[arg(long)]
    json: bool,
}

/// One kind of business transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Variant {
    /// The order insert alone.
    NoEvents,
    /// The order insert and one event, through the library.
    OneEvent,
    /// The order insert and ten events of the order, through the library.
    TenEvents,
    /// Diagnostic: the order insert, then one event appended by the
    /// library in a statement of its own.
    InsertThenAppend,
    /// Diagnostic: the order insert and one `SELECT 1`, the round trip of
    /// an append without its work.
    EmptyRoundTrip,
    /// Diagnostic: one event through the library, on a schema whose outbox
    /// has no `NOTIFY` trigger.
    OneEventWithoutNotify,
    /// Diagnostic: the outbox row inserted alone, without reserving a
    /// sequence number (`aggregate_seq` NULL).
    OutboxInsertOnly,
    /// Diagnostic: the order and its outbox row in one statement, as the
    /// library writes them but without reserving a sequence number.
    OneStatementWithoutSequence,
    /// Diagnostic: one event through the library while a relay waits for
    /// rows, so that the trigger notifies at every commit.
    OneEventRelayWaiting,
    /// Diagnostic: one event through the library, on a schema whose outbox
    /// has no `outbox_pending_aggregate_idx` (migration 0005, the claim's
    /// per-aggregate index): what that index costs an append.
    OneEventWithoutAggregateIndex,
}

impl Variant {
    const MEASURED: [Variant; 3] = [Variant::NoEvents, Variant::OneEvent, Variant::TenEvents];
    const DIAGNOSTIC: [Variant; 7] = [
        Variant::InsertThenAppend,
        Variant::EmptyRoundTrip,
        Variant::OutboxInsertOnly,
        Variant::OneStatementWithoutSequence,
        Variant::OneEventWithoutNotify,
        Variant::OneEventRelayWaiting,
        Variant::OneEventWithoutAggregateIndex,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::NoEvents => "no events",
            Variant::OneEvent => "1 event",
            Variant::TenEvents => "10 events",
            Variant::InsertThenAppend => "diag: 1 event, insert then append",
            Variant::EmptyRoundTrip => "diag: no events + 1x SELECT 1",
            Variant::OneEventWithoutNotify => "diag: 1 event, no NOTIFY trigger",
            Variant::OutboxInsertOnly => "diag: 1 outbox INSERT, no sequence",
            Variant::OneStatementWithoutSequence => "diag: order + outbox row in 1 stmt, no seq",
            Variant::OneEventRelayWaiting => "diag: 1 event, a relay waiting (notifies)",
            Variant::OneEventWithoutAggregateIndex => "diag: 1 event, no aggregate index (0005)",
        }
    }

    /// Client-server round trips of one transaction: `BEGIN`, the order
    /// insert (with the library's events on PostgreSQL), `COMMIT`, and the
    /// diagnostic's second statement where it has one.
    fn round_trips(self) -> usize {
        match self {
            Variant::InsertThenAppend | Variant::EmptyRoundTrip | Variant::OutboxInsertOnly => 4,
            _ => 3,
        }
    }
}

/// The `application_name` of the benchmark's connections, to find their
/// backends' CPU time.
const APPLICATION_NAME: &str = "outbox-bench-append";

/// The schemas the transactions write to.
struct Databases {
    /// Outbox as migrated, with its `NOTIFY` trigger.
    main: DatabaseConnection,
    /// Outbox without the `NOTIFY` trigger, for the diagnostic variant.
    quiet: Option<DatabaseConnection>,
    /// Outbox without the per-aggregate index, for the diagnostic variant.
    unindexed: Option<DatabaseConnection>,
    /// One connection that stands for a waiting relay, for the diagnostic
    /// variant.
    waiting_relay: Option<DatabaseConnection>,
}

impl Databases {
    /// The process ids of the benchmark's PostgreSQL backends.
    async fn backends(&self) -> anyhow::Result<Vec<u32>> {
        let rows = self
            .main
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                [APPLICATION_NAME.into()],
            ))
            .await?;
        rows.iter()
            .map(|row| Ok(u32::try_from(row.try_get_by_index::<i32>(0)?)?))
            .collect()
    }
}

/// Runs one transaction of `variant`, placing the `n`th order.
async fn transaction(variant: Variant, databases: &Databases, n: i64) -> anyhow::Result<()> {
    let db = match variant {
        Variant::OneEventWithoutNotify => databases
            .quiet
            .as_ref()
            .context("the schema without trigger exists with diagnostics")?,
        Variant::OneEventWithoutAggregateIndex => databases
            .unindexed
            .as_ref()
            .context("the schema without the aggregate index exists with diagnostics")?,
        _ => &databases.main,
    };
    let txn = db.begin().await?;
    match variant {
        Variant::NoEvents => {
            new_order(n).insert(&txn).await?;
        }
        Variant::OneEvent
        | Variant::OneEventWithoutNotify
        | Variant::OneEventRelayWaiting
        | Variant::OneEventWithoutAggregateIndex => {
            new_order(n)
                .insert_with_events(&txn, order_events(n, 1))
                .await?;
        }
        Variant::TenEvents => {
            new_order(n)
                .insert_with_events(&txn, order_events(n, 10))
                .await?;
        }
        Variant::InsertThenAppend => {
            let saved = new_order(n).insert(&txn).await?;
            let id = saved.id.to_string();
            let events = order_events(n, 1)
                .into_iter()
                .map(|event| event.aggregate_id(id.clone()));
            outbox_core::append(&txn, events).await?;
        }
        Variant::EmptyRoundTrip => {
            new_order(n).insert(&txn).await?;
            txn.query_one_raw(Statement::from_string(DbBackend::Postgres, "SELECT 1"))
                .await?;
        }
        Variant::OutboxInsertOnly => {
            let saved = new_order(n).insert(&txn).await?;
            txn.execute_raw(outbox_insert(saved.id.to_string(), n)?)
                .await?;
        }
        Variant::OneStatementWithoutSequence => {
            let row = txn
                .query_one_raw(order_and_outbox_insert(n)?)
                .await?
                .context("the order insert returns its row")?;
            order::Model::from_query_result(&row, "")?;
        }
    }
    txn.commit().await?;
    Ok(())
}

/// The outbox row alone, as plain SQL writes it (no sequence number).
const OUTBOX_INSERT: &str = "INSERT INTO outbox \
     (id, aggregatetype, aggregateid, type, payload, event_version) \
     VALUES ($3, $1, $2, $4, $5::jsonb, $6)";

/// [`OUTBOX_INSERT`] with the `OrderPlaced` event of the `n`th order bound
/// as `$1` (aggregate type) to `$6` (version).
fn outbox_insert(aggregate_id: String, n: i64) -> anyhow::Result<Statement> {
    let payload = serde_json::to_string(&order_placed(n))?;
    Ok(Statement::from_sql_and_values(
        DbBackend::Postgres,
        OUTBOX_INSERT,
        [
            OrderPlaced::AGGREGATE_TYPE.into(),
            aggregate_id.into(),
            uuid::Uuid::now_v7().into(),
            OrderPlaced::EVENT_TYPE.into(),
            payload.into(),
            (OrderPlaced::VERSION as i32).into(),
        ],
    ))
}

/// The order's `INSERT .. RETURNING`, as SeaORM builds it, and its
/// `OrderPlaced` row inserted by the same statement without a sequence
/// number: the library's statement without the reservation.
fn order_and_outbox_insert(n: i64) -> anyhow::Result<Statement> {
    let mut insert = order::Entity::insert(new_order(n));
    insert.query().returning_all();
    let order = insert.build(DbBackend::Postgres);
    let mut values = order.values.map(|values| values.0).unwrap_or_default();
    let first = values.len();
    let placeholder = |offset: usize| format!("${}", first + offset);
    let sql = format!(
        "WITH saved AS ({}), appended AS (INSERT INTO outbox \
           (id, aggregatetype, aggregateid, type, payload, event_version) \
           SELECT {}::uuid, {}::text, saved.id::text, {}::text, {}::jsonb, {}::int FROM saved) \
         SELECT * FROM saved",
        order.sql,
        placeholder(1),
        placeholder(2),
        placeholder(3),
        placeholder(4),
        placeholder(5)
    );
    values.extend([
        uuid::Uuid::now_v7().into(),
        OrderPlaced::AGGREGATE_TYPE.into(),
        OrderPlaced::EVENT_TYPE.into(),
        serde_json::to_string(&order_placed(n))?.into(),
        (OrderPlaced::VERSION as i32).into(),
    ]);
    Ok(Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        values,
    ))
}

/// One variant's turn in one round.
struct Turn {
    transactions: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

/// Runs `transactions` of `variant` on `writers` concurrent writers.
async fn run_turn(
    variant: Variant,
    databases: &Arc<Databases>,
    writers: usize,
    transactions: usize,
    next_order: &Arc<AtomicI64>,
) -> anyhow::Result<Turn> {
    let relay_waits = variant == Variant::OneEventRelayWaiting;
    if relay_waits {
        waiting_relay(databases)?
            .execute_unprepared(&take_wake_slots_sql())
            .await?;
    }
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for writer in 0..writers {
        let count = transactions / writers + usize::from(writer < transactions % writers);
        let databases = databases.clone();
        let next_order = next_order.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(count);
            for _ in 0..count {
                let n = next_order.fetch_add(1, Ordering::Relaxed);
                let began = Instant::now();
                transaction(variant, &databases, n).await?;
                latencies.push(began.elapsed());
            }
            anyhow::Ok(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(transactions);
    while let Some(writer) = tasks.join_next().await {
        latencies.extend(writer??);
    }
    let elapsed = start.elapsed();
    if relay_waits {
        waiting_relay(databases)?
            .execute_unprepared("SELECT pg_advisory_unlock_all()")
            .await?;
    }
    Ok(Turn {
        transactions,
        elapsed,
        latencies,
    })
}

/// The connection that stands for a waiting relay.
fn waiting_relay(databases: &Databases) -> anyhow::Result<&DatabaseConnection> {
    databases
        .waiting_relay
        .as_ref()
        .context("the waiting relay's connection exists with diagnostics")
}

/// Everything measured of one variant at one concurrency.
#[derive(Default)]
struct Totals {
    transactions: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    /// Transactions per second of each round.
    round_rates: Vec<f64>,
    /// CPU used by this process and by its PostgreSQL backends during the
    /// variant's turns, per 1,000 transactions, summed over rounds.
    client_cpu_ms: f64,
    postgres_cpu_ms: f64,
}

/// The results of one variant at one concurrency.
#[derive(Debug, Serialize)]
struct VariantResult {
    variant: Variant,
    label: &'static str,
    round_trips: usize,
    transactions: usize,
    transactions_per_second: f64,
    latency: LatencySummary,
    /// Time per transaction relative to the no-event variant (its rate
    /// divided by this one's), in each round (both variants measured back
    /// to back): the median, the headline figure.
    cost_ratio: f64,
    /// The same per-round ratio: first and third quartiles.
    cost_ratio_quartiles: [f64; 2],
    /// The ratio of the rates over all rounds together.
    overall_cost_ratio: f64,
    /// Median latency relative to the no-event variant's.
    p50_ratio: f64,
    /// CPU per transaction in this process (SeaORM, sqlx, serde).
    client_cpu_us_per_transaction: f64,
    /// CPU per transaction in this run's PostgreSQL backends.
    postgres_cpu_us_per_transaction: f64,
}

/// The results at one concurrency.
#[derive(Debug, Serialize)]
struct ConcurrencyResult {
    writers: usize,
    variants: Vec<VariantResult>,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    options: Options,
    /// The target: one event costs at most this times the transaction without it.
    target_cost_ratio: f64,
    concurrency: Vec<ConcurrencyResult>,
}

const TARGET_COST_RATIO: f64 = 1.25;

async fn measure(
    options: &Options,
    databases: &Arc<Databases>,
    writers: usize,
) -> anyhow::Result<ConcurrencyResult> {
    let variants: Vec<Variant> = if options.no_diagnostics {
        Variant::MEASURED.to_vec()
    } else {
        Variant::MEASURED
            .into_iter()
            .chain(Variant::DIAGNOSTIC)
            .collect()
    };
    let next_order = Arc::new(AtomicI64::new(1));
    let mut totals: Vec<Totals> = variants.iter().map(|_| Totals::default()).collect();
    let rounds = options.warmup_rounds + options.rounds;
    for round in 0..rounds {
        let measured = round >= options.warmup_rounds;
        for offset in 0..variants.len() {
            let index = (round + offset) % variants.len();
            let backends = databases.backends().await?;
            let cpu_before = CpuTimes::now(&backends);
            let turn = run_turn(
                variants[index],
                databases,
                writers,
                options.transactions_per_round,
                &next_order,
            )
            .await
            .with_context(|| format!("{} with {writers} writers", variants[index].label()))?;
            let cpu = CpuTimes::now(&databases.backends().await?)
                .per_thousand_since(&cpu_before, turn.transactions);
            if measured {
                let total = &mut totals[index];
                total.client_cpu_ms += cpu.this_process_ms;
                total.postgres_cpu_ms += cpu.backends_ms;
                total.transactions += turn.transactions;
                total.elapsed += turn.elapsed;
                total
                    .round_rates
                    .push(stats::per_second(turn.transactions, turn.elapsed));
                total.latencies.extend(turn.latencies);
            }
        }
        progress!(
            "{writers} writer(s): round {}/{rounds}{}",
            round + 1,
            if measured { "" } else { " (warm-up)" }
        );
    }

    let rounds_measured = options.rounds.max(1) as f64;
    let baseline_rate = stats::per_second(totals[0].transactions, totals[0].elapsed);
    let baseline_rounds = totals[0].round_rates.clone();
    let mut baseline_latencies = totals[0].latencies.clone();
    let baseline_p50 = LatencySummary::of(&mut baseline_latencies).p50_ms;
    let results = variants
        .iter()
        .zip(totals)
        .map(|(&variant, mut total)| {
            let rate = stats::per_second(total.transactions, total.elapsed);
            let latency = LatencySummary::of(&mut total.latencies);
            let mut per_round: Vec<f64> = baseline_rounds
                .iter()
                .zip(&total.round_rates)
                .map(|(baseline, this)| baseline / this)
                .collect();
            let [q1, median, q3] = stats::quartiles(&mut per_round).unwrap_or([f64::NAN; 3]);
            VariantResult {
                variant,
                label: variant.label(),
                round_trips: variant.round_trips(),
                transactions: total.transactions,
                transactions_per_second: rate,
                latency,
                cost_ratio: median,
                cost_ratio_quartiles: [q1, q3],
                overall_cost_ratio: baseline_rate / rate,
                p50_ratio: latency.p50_ms / baseline_p50,
                // Milliseconds per 1,000 are microseconds per one; rounds
                // have equal sizes, so their mean is the mean.
                client_cpu_us_per_transaction: total.client_cpu_ms / rounds_measured,
                postgres_cpu_us_per_transaction: total.postgres_cpu_ms / rounds_measured,
            }
        })
        .collect();
    Ok(ConcurrencyResult {
        writers,
        variants: results,
    })
}

fn render(results: &Results) -> String {
    let mut out = format!(
        "# bench-append\n\n{}\n{} rounds x {} transactions per variant (+{} warm-up round), \
         variants interleaved\n",
        results.machine,
        results.options.rounds,
        results.options.transactions_per_round,
        results.options.warmup_rounds
    );
    for concurrency in &results.concurrency {
        let mut table = Table::new([
            "variant",
            "round trips",
            "txn/s",
            "p50 ms",
            "p99 ms",
            "cost vs no events: median of rounds [quartiles]",
            "overall",
            "p50 vs no events",
            "CPU us/txn: client",
            "its backends",
        ]);
        for result in &concurrency.variants {
            let [q1, q3] = result.cost_ratio_quartiles;
            table.row([
                result.label.to_owned(),
                result.round_trips.to_string(),
                report::rate(result.transactions_per_second),
                report::ms(result.latency.p50_ms),
                report::ms(result.latency.p99_ms),
                format!(
                    "{} [{}-{}]",
                    report::ratio(result.cost_ratio),
                    report::ratio(q1),
                    report::ratio(q3)
                ),
                report::ratio(result.overall_cost_ratio),
                report::ratio(result.p50_ratio),
                format!("{:.0}", result.client_cpu_us_per_transaction),
                format!("{:.0}", result.postgres_cpu_us_per_transaction),
            ]);
        }
        out.push_str(&format!(
            "\n## {} writer(s)\n\n{table}",
            concurrency.writers
        ));
        if let Some(one) = concurrency
            .variants
            .iter()
            .find(|result| result.variant == Variant::OneEvent)
        {
            let verdict = if one.cost_ratio <= results.target_cost_ratio {
                "met"
            } else {
                "MISSED"
            };
            out.push_str(&format!(
                "\n1 event costs {:.3}x the transaction without it (median of rounds; target <= \
                 {}): {verdict}\n",
                one.cost_ratio,
                report::ratio(results.target_cost_ratio)
            ));
        }
    }
    out
}

/// A pool on `schema` whose connections carry [`APPLICATION_NAME`].
async fn connect(schema: &TestDb) -> DatabaseConnection {
    outbox_tests::db::connect(&format!(
        "{}&application_name={APPLICATION_NAME}",
        schema.url
    ))
    .await
}

/// A schema of this run's own, with the outbox and the order table.
async fn schema() -> TestDb {
    let db = TestDb::new(Backend::Postgres).await;
    outbox_tests::db::create_table(&db.db, order::Entity).await;
    db
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    report::elapsed_seconds();
    let options = Options::parse();
    anyhow::ensure!(
        options.writers.iter().all(|&writers| writers > 0),
        "--writers takes positive numbers"
    );
    let main_schema = schema().await;
    let quiet_schema = if options.no_diagnostics {
        None
    } else {
        let quiet = schema().await;
        quiet
            .db
            .execute_unprepared("DROP TRIGGER outbox_notify ON outbox")
            .await?;
        Some(quiet)
    };
    let unindexed_schema = if options.no_diagnostics {
        None
    } else {
        let unindexed = schema().await;
        unindexed
            .db
            .execute_unprepared("DROP INDEX IF EXISTS outbox_pending_aggregate_idx")
            .await?;
        Some(unindexed)
    };
    let machine = Machine::describe(&main_schema.db).await?;
    progress!("{machine}");
    let databases = Arc::new(Databases {
        main: connect(&main_schema).await,
        quiet: match &quiet_schema {
            Some(quiet) => Some(connect(quiet).await),
            None => None,
        },
        unindexed: match &unindexed_schema {
            Some(unindexed) => Some(connect(unindexed).await),
            None => None,
        },
        waiting_relay: if options.no_diagnostics {
            None
        } else {
            let mut one = ConnectOptions::new(main_schema.url.clone());
            one.max_connections(1)
                .min_connections(1)
                .sqlx_logging(false);
            Some(Database::connect(one).await?)
        },
    });

    let mut concurrency = Vec::new();
    let mut failure = None;
    for &writers in &options.writers {
        match measure(&options, &databases, writers).await {
            Ok(result) => concurrency.push(result),
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    if let Ok(databases) = Arc::try_unwrap(databases) {
        databases.main.close().await.ok();
        if let Some(quiet) = databases.quiet {
            quiet.close().await.ok();
        }
        if let Some(unindexed) = databases.unindexed {
            unindexed.close().await.ok();
        }
    }
    main_schema.drop().await;
    if let Some(quiet) = quiet_schema {
        quiet.drop().await;
    }
    if let Some(unindexed) = unindexed_schema {
        unindexed.drop().await;
    }
    if let Some(error) = failure {
        return Err(error);
    }

    let results = Results {
        machine,
        options: options.clone(),
        target_cost_ratio: TARGET_COST_RATIO,
        concurrency,
    };
    report::emit(options.json, &render(&results), &results)
}
