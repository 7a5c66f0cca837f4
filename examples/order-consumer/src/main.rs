//! Keeps an order summary from the order service's events on Kafka,
//! RabbitMQ or NATS JetStream, each event's effect applied exactly once.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test KAFKA_BROKERS=127.0.0.1:9092
//! cargo run -p order-service && cargo run -p outbox-relay -- run --drain
//! cargo run -p order-consumer        # Ctrl-C to stop
//! # or, with the relay run with --sink rabbitmq / --sink nats:
//! cargo run -p order-consumer -- --broker rabbitmq
//! cargo run -p order-consumer -- --broker nats
//! ```

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use order_consumer::consumer::{OrderConsumer, OrderHandler, Stats};
use order_consumer::kafka::{self, KafkaSettings};
use order_consumer::nats::{self, NatsSettings};
use order_consumer::rabbitmq::{self, RabbitMqSettings};
use order_consumer::summary;
use outbox_core::consume::inbox::MAX_CONSUMER_NAME_LEN;
use outbox_core::{GapPolicy, Inbox};
use outbox_migrations::{CreateInbox, CreateInboxGaps};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};
use sea_orm_migration::sea_query::{Alias, IntoIden};
use sea_orm_migration::{MigrationTrait, MigratorTrait};

/// Keeps the `order_summary` table from the order events on Kafka, RabbitMQ
/// or NATS JetStream: each event's effect is applied exactly once, in a
/// transaction that also records it in the inbox; a message is acknowledged
/// (its offset committed) after that transaction.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Database of the summary and the inbox tables (created if missing).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://order-summary.db?mode=rwc"
    )]
    database_url: String,
    /// The broker the relay publishes to.
    #[arg(long, env = "ORDER_CONSUMER_BROKER", value_enum, default_value_t = BrokerKind::Kafka)]
    broker: BrokerKind,
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// RabbitMQ: the broker's URL.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp_url: String,
    /// RabbitMQ: the relay's exchange.
    #[arg(long, env = "AMQP_EXCHANGE", default_value = "outbox")]
    amqp_exchange: String,
    /// RabbitMQ: the consumer's durable queue, bound to the exchange for
    /// the topic (default: the group name).
    #[arg(long, env = "ORDER_CONSUMER_QUEUE")]
    amqp_queue: Option<String>,
    /// NATS: the server's URL.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// NATS: the relay's JetStream stream; the group names the durable
    /// consumer.
    #[arg(long, env = "NATS_STREAM", default_value = "OUTBOX")]
    nats_stream: String,
    /// Topic of the order events (on RabbitMQ the routing key, on NATS the
    /// subjects' prefix before the aggregate id).
    #[arg(
        long,
        env = "ORDER_CONSUMER_TOPIC",
        default_value = "outbox.event.Order"
    )]
    topic: String,
    /// Consumer group; also this consumer's name in the inbox tables.
    #[arg(
        long,
        env = "ORDER_CONSUMER_GROUP",
        default_value = "order-summary",
        value_parser = consumer_name
    )]
    group: String,
    /// What to do with an event that follows a gap in its order's sequence.
    #[arg(long, env = "ORDER_CONSUMER_ON_GAP", value_enum, default_value_t = OnGap::Apply)]
    on_gap: OnGap,
    /// Skip messages that cannot be decoded instead of stopping.
    #[arg(long, env = "ORDER_CONSUMER_SKIP_INVALID")]
    skip_invalid: bool,
    /// Keep applied event ids this long (dedupe of redeliveries).
    #[arg(
        long,
        env = "ORDER_CONSUMER_RETENTION",
        default_value = "7d",
        value_parser = humantime::parse_duration
    )]
    retention: Duration,
    /// A librdkafka setting, e.g. `-X session.timeout.ms=10000` (repeatable).
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = key_value)]
    kafka_options: Vec<(String, String)>,
}

/// `--broker`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum BrokerKind {
    /// Kafka, a consumer group.
    Kafka,
    /// RabbitMQ, a durable queue bound to the relay's exchange.
    Rabbitmq,
    /// NATS JetStream, a durable pull consumer of the relay's stream.
    Nats,
}

/// `--on-gap`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum OnGap {
    /// Apply it, warn, and skip the missing events should they come later.
    Apply,
    /// Stop without committing its offset, to investigate.
    Stop,
}

/// The consumer's own migrations: only the inbox tables.
struct ConsumerMigrator;

impl MigratorTrait for ConsumerMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(CreateInbox), Box::new(CreateInboxGaps)]
    }

    fn migration_table_name() -> sea_orm_migration::sea_orm::DynIden {
        Alias::new("order_consumer_migrations").into_iden()
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn,sea_orm=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let db = connect(&args.database_url).await?;
    ConsumerMigrator::up(&db, None)
        .await
        .context("cannot create the inbox tables")?;
    summary::create_table(&db)
        .await
        .context("cannot create the order_summary table")?;

    let on_gap = match args.on_gap {
        OnGap::Apply => GapPolicy::Apply,
        OnGap::Stop => GapPolicy::Hold,
    };
    let inbox = Inbox::new(args.group.clone(), on_gap);
    let retention = tokio::spawn(delete_old_ids(db.clone(), inbox.clone(), args.retention));
    let handler = OrderHandler::new(db, inbox, args.skip_invalid);
    let outcome = consume(&args, handler).await;
    retention.abort();
    let stats = outcome?;
    tracing::info!("stopped: {stats}");
    Ok(())
}

/// Consumes from the broker chosen until a signal or an error.
async fn consume(args: &Args, handler: OrderHandler) -> anyhow::Result<Stats> {
    match args.broker {
        BrokerKind::Kafka => {
            let settings = KafkaSettings {
                brokers: args.brokers.clone(),
                group: args.group.clone(),
                client_options: args.kafka_options.clone(),
            };
            let consumer = kafka::consumer(&settings)?;
            kafka::check_brokers(
                &consumer,
                &args.brokers,
                &args.topic,
                Duration::from_secs(10),
            )?;
            tracing::info!(topic = %args.topic, group = %args.group, "consuming from Kafka");
            OrderConsumer::new(consumer, handler)
                .run(&args.topic, shutdown_signal())
                .await
        }
        BrokerKind::Rabbitmq => {
            let settings = RabbitMqSettings {
                url: args.amqp_url.clone(),
                exchange: args.amqp_exchange.clone(),
                queue: args
                    .amqp_queue
                    .clone()
                    .unwrap_or_else(|| args.group.clone()),
                routing_key: args.topic.clone(),
            };
            let (connection, channel) = rabbitmq::channel(&settings).await?;
            tracing::info!(queue = %settings.queue, exchange = %settings.exchange, "consuming from RabbitMQ");
            let outcome =
                rabbitmq::run(&handler, &channel, &settings.queue, shutdown_signal()).await;
            let _ = connection.close(200, "stopping".into()).await;
            outcome
        }
        BrokerKind::Nats => {
            let settings = NatsSettings {
                url: args.nats_url.clone(),
                stream: args.nats_stream.clone(),
                durable: args.group.clone(),
                topic: args.topic.clone(),
            };
            let messages = nats::consumer(&settings).await?;
            tracing::info!(stream = %settings.stream, consumer = %settings.durable, "consuming from NATS JetStream");
            nats::run(&handler, messages, shutdown_signal()).await
        }
    }
}

async fn connect(url: &str) -> anyhow::Result<DatabaseConnection> {
    let mut options = ConnectOptions::new(url);
    options
        .connect_timeout(Duration::from_secs(10))
        .sqlx_logging(false);
    Database::connect(options)
        .await
        .context("cannot connect to the database given by --database-url / DATABASE_URL")
}

/// Deletes the inbox's event ids older than `keep`, hourly.
async fn delete_old_ids(db: DatabaseConnection, inbox: Inbox, keep: Duration) {
    let mut hourly = tokio::time::interval(Duration::from_secs(3600));
    loop {
        hourly.tick().await;
        match inbox.delete_processed(&db, keep).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted old inbox ids"),
            Err(error) => tracing::warn!(%error, "cannot delete old inbox ids"),
        }
    }
}

/// Completes at SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut terminate) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            tracing::info!("shutting down");
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("shutting down");
}

/// The error and its causes on one line, leaving out a cause whose text
/// its parent already quotes.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// A consumer group name that fits the inbox tables' `consumer` column.
fn consumer_name(name: &str) -> Result<String, String> {
    let length = name.chars().count();
    if (1..=MAX_CONSUMER_NAME_LEN).contains(&length) {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "a consumer group name has 1 to {MAX_CONSUMER_NAME_LEN} characters, this one has {length}"
        ))
    }
}

fn key_value(option: &str) -> Result<(String, String), String> {
    match option.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err(format!("expected KEY=VALUE, got {option:?}")),
    }
}
