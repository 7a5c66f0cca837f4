//! The command line: `outbox-relay <run|migrate|partitions|status|cleanup|retry|replay|cdc>`.
//!
//! Every option can also come from an environment variable or from the TOML
//! file given with `--config`; the command line wins over the environment,
//! which wins over the file, which wins over the defaults.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Publishes committed outbox rows to Kafka in the message shape of
/// Debezium's Outbox Event Router (topic `outbox.event.<aggregatetype>`,
/// key `aggregateid`, the payload as value, `id` and `eventType` headers).
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, max_term_width = 100)]
pub struct Cli {
    /// Options of every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options of every command.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Database holding the outbox table: postgres://, mysql:// (mariadb://)
    /// or sqlite:// [default: sqlite://outbox.db]
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    /// TOML file with values for any option (keys as the long option names,
    /// with `_` for `-`; librdkafka settings under `[kafka]`)
    #[arg(long, short = 'c', env = "OUTBOX_RELAY_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// Log lines as text or as JSON objects (levels from RUST_LOG)
    #[arg(
        long,
        env = "OUTBOX_LOG_FORMAT",
        value_enum,
        global = true,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines
    Text,
    /// One JSON object per line
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Publish pending rows until stopped (SIGINT/SIGTERM finish the batch in flight)
    Run(Box<RunArgs>),
    /// Create or update the outbox tables
    Migrate(MigrateArgs),
    /// List the day partitions of a partitioned outbox (PostgreSQL,
    /// MariaDB/MySQL), or maintain them
    Partitions(PartitionsArgs),
    /// Show pending, published and dead-lettered row counts
    Status(StatusArgs),
    /// Delete published rows older than the retention window, in small batches
    Cleanup(CleanupArgs),
    /// Make dead-lettered rows pending again (all, or those selected), once
    /// their cause is fixed
    Retry(RetryArgs),
    /// Send already published events again (those selected), to their own
    /// topics or another, for a consumer that lost its state
    Replay(Box<ReplayArgs>),
    /// Manage CDC mode's replication slot (PostgreSQL)
    #[command(subcommand)]
    Cdc(CdcCommand),
}

/// Where `run` reads committed rows from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    /// Claim pending rows from the outbox table (every database)
    #[default]
    Poll,
    /// Read the outbox table's inserts from PostgreSQL's write-ahead log
    /// through a logical replication slot (needs wal_level = logical)
    Cdc,
}

/// The `cdc` commands.
#[derive(Debug, Subcommand)]
pub enum CdcCommand {
    /// Drop the replication slot of a retired CDC relay, so the server stops
    /// keeping WAL for it (and, with --publication, its publication)
    DropSlot(DropSlotArgs),
}

/// Options of `cdc drop-slot`.
#[derive(Debug, Args)]
pub struct DropSlotArgs {
    /// The replication slot to drop [default: outbox_relay]
    #[arg(long, env = "OUTBOX_SLOT")]
    pub slot: Option<String>,

    /// Also drop this publication
    #[arg(long)]
    pub publication: Option<String>,
}

/// Where messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// A Kafka-API broker (acks=all, idempotent producer)
    Kafka,
    /// A RabbitMQ topic exchange (persistent messages, publisher confirms)
    #[value(name = "rabbitmq")]
    #[serde(rename = "rabbitmq")]
    RabbitMq,
    /// A NATS JetStream stream (PubAcks awaited, Nats-Msg-Id deduplication)
    Nats,
    /// One JSON object per line on standard output
    Stdout,
}

impl SinkKind {
    /// The name the command line and metrics use (`kafka`, `rabbitmq`, ...).
    ///
    /// ```
    /// assert_eq!(outbox_relay::cli::SinkKind::Nats.name(), "nats");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Self::Kafka => "kafka",
            Self::RabbitMq => "rabbitmq",
            Self::Nats => "nats",
            Self::Stdout => "stdout",
        }
    }
}

/// Where and how messages are published: the options `run` and `replay`
/// share.
#[derive(Debug, Args, Default, Clone)]
pub struct SinkArgs {
    /// Where to publish [default: kafka when brokers are given, rabbitmq when
    /// an AMQP URL is, nats when a NATS URL is, else stdout]
    #[arg(long, env = "OUTBOX_SINK", value_enum)]
    pub sink: Option<SinkKind>,

    /// Kafka bootstrap servers, comma-separated host:port [default: 127.0.0.1:9092]
    #[arg(long, env = "KAFKA_BROKERS")]
    pub brokers: Option<String>,

    /// RabbitMQ to publish to, amqp://user:password@host:port/vhost, or
    /// amqps:// with `?cacertfile=..&certfile=..&keyfile=..` for a private
    /// root and a client certificate [default: amqp://guest:guest@127.0.0.1:5672/%2f]
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,

    /// RabbitMQ exchange, declared at start as a durable topic exchange if
    /// missing; the topic is the routing key [default: outbox]
    #[arg(long, env = "OUTBOX_AMQP_EXCHANGE")]
    pub amqp_exchange: Option<String>,

    /// Most RabbitMQ messages awaiting their publisher confirm at once,
    /// 1 to 100000 [default: 1000]
    #[arg(long, env = "OUTBOX_AMQP_MAX_UNCONFIRMED")]
    pub amqp_max_unconfirmed: Option<u64>,

    /// Publish to RabbitMQ without `mandatory`: a message no queue is bound
    /// for is then acked and dropped by RabbitMQ and its row marked
    /// published (by default it is retried, then dead-lettered as unroutable)
    #[arg(long)]
    pub amqp_allow_unroutable: bool,

    /// NATS server(s) to publish to, nats://[user:password@]host:port or
    /// tls://, comma-separated [default: nats://127.0.0.1:4222]
    #[arg(long, env = "NATS_URL", hide_env_values = true)]
    pub nats_url: Option<String>,

    /// JetStream stream the events are stored in, created at start if
    /// missing (file storage, capturing the subjects); an existing one must
    /// capture them and keep message ids longer than the relay may take to
    /// re-send [default: OUTBOX]
    #[arg(long, env = "OUTBOX_NATS_STREAM")]
    pub nats_stream: Option<String>,

    /// Subject of each row on NATS; {aggregatetype} and {aggregateid} are
    /// replaced by the row's values, encoded as one subject token each
    /// [default: outbox.event.{aggregatetype}.{aggregateid}]
    #[arg(long, env = "OUTBOX_NATS_SUBJECT")]
    pub nats_subject: Option<String>,

    /// Most NATS messages awaiting their PubAck at once, 1 to 100000
    /// [default: 256]
    #[arg(long, env = "OUTBOX_NATS_MAX_PENDING")]
    pub nats_max_pending: Option<u64>,

    /// Root certificates (PEM) the NATS server's certificate must chain
    /// to; given, TLS is required and only these roots are trusted
    /// [default: the system's roots, for tls:// URLs]
    #[arg(long, env = "NATS_CA", value_name = "FILE")]
    pub nats_ca: Option<std::path::PathBuf>,

    /// Client certificate (PEM) for NATS servers that verify clients;
    /// needs --nats-key
    #[arg(long, env = "NATS_CERT", value_name = "FILE", requires = "nats_key")]
    pub nats_cert: Option<std::path::PathBuf>,

    /// The client certificate's private key (PEM); needs --nats-cert
    #[arg(long, env = "NATS_KEY", value_name = "FILE", requires = "nats_cert")]
    pub nats_key: Option<std::path::PathBuf>,

    /// Topic of each row (the routing key on RabbitMQ); {aggregatetype} is
    /// replaced by the row's aggregate type [default: outbox.event.{aggregatetype}]
    #[arg(long, env = "OUTBOX_TOPIC_TEMPLATE")]
    pub topic_template: Option<String>,

    /// Do not create missing topics; their rows stay pending until the topic exists
    #[arg(long)]
    pub no_create_topics: bool,

    /// Partitions of a created topic, at least 1 [default: 1]
    #[arg(long)]
    pub topic_partitions: Option<i64>,

    /// Replication factor of a created topic, 1 to 32767 [default: 1]
    #[arg(long)]
    pub topic_replication_factor: Option<i64>,

    /// How long to wait for a batch's acknowledgements, 1s to 1h (longer
    /// than any producer linger); past it, the unacknowledged rows stay
    /// pending and the producer is replaced [default: 30s]
    #[arg(long, env = "OUTBOX_SEND_TIMEOUT", value_parser = parse_duration)]
    pub send_timeout: Option<Duration>,

    /// A librdkafka setting such as security.protocol=SASL_SSL (repeatable);
    /// secret values (sasl.password, ssl.key.password, ...) are never printed,
    /// and the settings delivery rests on (acks, enable.idempotence,
    /// message.timeout.ms, enable.gapless.guarantee) cannot be changed
    #[arg(long = "kafka-option", short = 'X', value_name = "KEY=VALUE")]
    pub kafka_options: Vec<String>,

    /// What each message looks like: `debezium` (the payload as value, the
    /// event id, type and version as headers), `cloudevents` (CloudEvents
    /// 1.0, binary content mode) or `cloudevents-structured` (the JSON
    /// envelope with the payload as `data`) [default: debezium]
    #[arg(long, env = "OUTBOX_FORMAT", value_enum)]
    pub format: Option<crate::cloudevents::Format>,

    /// The CloudEvents `source` of each event; {service} (OTEL_SERVICE_NAME,
    /// else `outbox`), {aggregatetype}, {eventtype} and {version} are
    /// replaced [default: /{service}/{aggregatetype}]
    #[arg(long, env = "OUTBOX_CE_SOURCE")]
    pub ce_source: Option<String>,

    /// The CloudEvents `type` of each event, with the placeholders of
    /// --ce-source; the version is also the `eventversion` attribute
    /// [default: {eventtype}]
    #[arg(long, env = "OUTBOX_CE_TYPE")]
    pub ce_type: Option<String>,

    /// An option of Debezium's Outbox Event Router under its own name
    /// (repeatable): route.by.field, route.topic.regex,
    /// route.topic.replacement, route.tombstone.on.empty.payload; the
    /// route.* options take the place of --topic-template
    #[arg(long = "router", value_name = "NAME=VALUE")]
    pub router_options: Vec<String>,
}

/// Options of `run`.
#[derive(Debug, Args, Default)]
pub struct RunArgs {
    /// Where committed rows are read from: `poll` claims them from the
    /// outbox table; `cdc` reads the table's inserts from PostgreSQL's
    /// write-ahead log [default: poll]
    #[arg(long, env = "OUTBOX_MODE", value_enum)]
    pub mode: Option<RunMode>,

    /// CDC mode's replication slot, created if missing; one relay reads it
    /// at a time, others stand by and take over within 10s of the reader
    /// stopping or going silent [default: outbox_relay]
    #[arg(long, env = "OUTBOX_SLOT")]
    pub slot: Option<String>,

    /// CDC mode's publication of the outbox table's inserts, created if
    /// missing [default: outbox_relay]
    #[arg(long, env = "OUTBOX_PUBLICATION")]
    pub publication: Option<String>,

    /// Rows claimed and published at once, 1 to 10000 [default: 500]
    #[arg(long, env = "OUTBOX_BATCH_SIZE")]
    pub batch_size: Option<u64>,

    /// Bytes of rows claimed and published at once, about (payloads and
    /// the other columns), 1024 to 1073741824: a batch of large payloads
    /// stops short of --batch-size at this bound, taking at least one row
    /// [default: 2097152, 2 MiB]
    #[arg(long, env = "OUTBOX_MAX_BATCH_BYTES")]
    pub max_batch_bytes: Option<u64>,

    /// Longest wait between checks for new rows, 10ms to 1h; PostgreSQL is
    /// also woken by LISTEN/NOTIFY at once [default: 1s on PostgreSQL, 100ms
    /// otherwise]
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", value_parser = parse_duration)]
    pub poll_interval: Option<Duration>,

    /// Attempts before a message the broker refuses for good (too large,
    /// invalid topic) is dead-lettered, at least 1 [default: 10]
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS")]
    pub max_attempts: Option<i64>,

    /// Delete rows once published instead of marking them
    #[arg(long)]
    pub delete_on_publish: bool,

    /// Keep published rows this long before the periodic cleanup deletes
    /// them, 0s to 3650days [default: 7d]
    #[arg(long, env = "OUTBOX_RETENTION", value_parser = parse_duration)]
    pub retention: Option<Duration>,

    /// How often the periodic cleanup runs, 1s to 30days [default: 10m]
    #[arg(long, value_parser = parse_duration)]
    pub cleanup_interval: Option<Duration>,

    /// Never delete published rows while running
    #[arg(long)]
    pub no_cleanup: bool,

    /// A partitioned outbox: every --cleanup-interval, create
    /// the coming days' partitions and drop the days past --retention whose
    /// rows are all published, instead of deleting rows (with --no-cleanup,
    /// only create)
    #[arg(long, env = "OUTBOX_PARTITION_MAINTENANCE")]
    pub partition_maintenance: bool,

    /// Days after today that partition maintenance keeps partitions for, 1
    /// to 366 [default: 7]
    #[arg(long)]
    pub partitions_ahead: Option<u32>,

    /// Exit once no row is pending, instead of waiting for new ones
    #[arg(long)]
    pub drain: bool,

    /// Shards the aggregates are spread over, 1 to 4096; relays on one
    /// database share them, one owner per shard. Every relay of a database
    /// needs the same number (PostgreSQL and MariaDB/MySQL) [default: 16]
    #[arg(long, env = "OUTBOX_SHARDS")]
    pub shards: Option<u64>,

    /// How long a relay keeps its shards without renewing them, 1s to 1h
    /// (renewed every third of it, at least every second): a relay that
    /// stops (killed, paused, frozen, cut off) loses its shards within the
    /// lease plus about 2s, and sends nothing more of them [default: 10s]
    #[arg(long, env = "OUTBOX_LEASE", value_parser = parse_duration)]
    pub lease: Option<Duration>,

    /// This relay's name among the relays of the database, 1 to 64
    /// characters [default: host-pid-random]
    #[arg(long, env = "OUTBOX_INSTANCE_ID")]
    pub instance_id: Option<String>,

    /// Serve /metrics (Prometheus), /healthz and /readyz on this address,
    /// for example 127.0.0.1:9464 [default: off]
    #[arg(long, env = "OUTBOX_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// How often the backlog gauges and connection checks are refreshed,
    /// 100ms to 1h [default: 5s]
    #[arg(long, value_parser = parse_duration)]
    pub metrics_interval: Option<Duration>,

    /// Where and how messages are published.
    #[command(flatten, next_help_heading = "Where and how to publish")]
    pub output: SinkArgs,
}

/// Options of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,

    /// Exit with code 1 when the oldest pending row is older than this (a check)
    #[arg(long, value_parser = parse_duration)]
    pub max_lag: Option<Duration>,

    /// CDC mode's replication slot to report on (PostgreSQL) [default: outbox_relay]
    #[arg(long, env = "OUTBOX_SLOT")]
    pub slot: Option<String>,
}

/// Options of `migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Partition the outbox by day on its creation time (PostgreSQL,
    /// MariaDB/MySQL), so
    /// that retention drops whole days (`partitions maintain`); converts
    /// an existing plain outbox in place, keeping its rows
    #[arg(long)]
    pub partitioned: bool,
}

/// Options of `partitions`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PartitionsArgs {
    /// What to do instead of listing.
    #[command(subcommand)]
    pub command: Option<PartitionsCommand>,

    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

/// The `partitions` commands.
#[derive(Debug, Subcommand)]
pub enum PartitionsCommand {
    /// Create the partitions of today and the coming days (moving rows out
    /// of the default partition), and drop day partitions past the
    /// retention whose rows are all published
    Maintain(MaintainArgs),
}

/// Options of `partitions maintain`.
#[derive(Debug, Args)]
pub struct MaintainArgs {
    /// Drop day partitions that ended longer ago than this, once every row
    /// in them is published, 0s to 3650days [default: 7d]
    #[arg(long, value_parser = parse_duration)]
    pub retain: Option<Duration>,

    /// Days after today to have partitions for, 1 to 366 [default: 7]
    #[arg(long)]
    pub ahead: Option<u32>,

    /// Print what was done as JSON
    #[arg(long)]
    pub json: bool,
}

/// Options of `cleanup`.
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Delete published rows older than this, 0s to 3650days [default: 7d]
    #[arg(long, value_parser = parse_duration)]
    pub older_than: Option<Duration>,

    /// Rows per DELETE statement, 1 to 100000 [default: 1000]
    #[arg(long)]
    pub batch_size: Option<u64>,
}

/// Options of `retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// Re-drive only this event id (repeatable)
    #[arg(long = "id", value_name = "EVENT_ID")]
    pub ids: Vec<String>,

    /// Re-drive only dead letters of this aggregate type
    #[arg(long)]
    pub aggregate_type: Option<String>,
}

/// Options of `replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Replay events of this aggregate type (repeatable)
    #[arg(long = "aggregate-type", value_name = "TYPE")]
    pub aggregate_types: Vec<String>,

    /// Replay events of this aggregate id (repeatable)
    #[arg(long = "aggregate-id", value_name = "ID")]
    pub aggregate_ids: Vec<String>,

    /// Replay events of this event type (repeatable)
    #[arg(long = "event-type", value_name = "TYPE")]
    pub event_types: Vec<String>,

    /// Replay events created at or after this time: RFC 3339
    /// (2026-12-01T08:00:00Z), a UTC date (2026-12-01), or an age (24h:
    /// that long ago)
    #[arg(long, value_parser = parse_time, value_name = "TIME")]
    pub since: Option<chrono::DateTime<chrono::Utc>>,

    /// Replay events created before this time (same forms as --since)
    #[arg(long, value_parser = parse_time, value_name = "TIME")]
    pub until: Option<chrono::DateTime<chrono::Utc>>,

    /// Replay events whose id is this one or later (the ids outbox-core
    /// gives, UUIDv7, are in creation order)
    #[arg(long, value_name = "EVENT_ID")]
    pub from_id: Option<String>,

    /// Replay events whose id is this one or earlier
    #[arg(long, value_name = "EVENT_ID")]
    pub to_id: Option<String>,

    /// Replay the events of this day partition of a partitioned outbox, as
    /// `outbox-relay partitions` lists them (outbox_p20261201)
    #[arg(long, value_name = "NAME")]
    pub partition: Option<String>,

    /// Send to this topic (routing key on RabbitMQ, subject template on
    /// NATS) instead of each event's own; {aggregatetype} is replaced
    #[arg(long, value_name = "TOPIC")]
    pub to: Option<String>,

    /// Show what would be sent (events per aggregate type, the largest
    /// aggregates, the time range) and send nothing
    #[arg(long)]
    pub dry_run: bool,

    /// Print the dry run, or the finished replay's record, as JSON
    #[arg(long)]
    pub json: bool,

    /// Send more than --confirm-over events without asking
    #[arg(long, short = 'y')]
    pub yes: bool,

    /// Replays of more events than this ask for confirmation (--yes) [default: 10000]
    #[arg(long, value_name = "EVENTS")]
    pub confirm_over: Option<u64>,

    /// Events sent per second at most, 1 to 1000000 [default: no limit]
    #[arg(long, value_name = "PER_SECOND")]
    pub rate: Option<u64>,

    /// Events read and sent at once, 1 to 10000 [default: 500]
    #[arg(long)]
    pub chunk_size: Option<u64>,

    /// Continue the replay with this id after its last acknowledged chunk
    /// (its selection and --to are its own)
    #[arg(
        long,
        value_name = "REPLAY_ID",
        conflicts_with_all = [
            "aggregate_types", "aggregate_ids", "event_types", "since", "until", "from_id",
            "to_id", "partition", "to", "dry_run"
        ]
    )]
    pub resume: Option<String>,

    /// Where and how messages are published.
    #[command(flatten, next_help_heading = "Where and how to publish")]
    pub output: SinkArgs,
}

/// Parses a time for `replay`: RFC 3339, a date (midnight UTC), or an age
/// (that long before now).
pub fn parse_time(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    use chrono::{DateTime, NaiveDate, Utc};
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(date.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    match humantime::parse_duration(text).map(chrono::Duration::from_std) {
        Ok(Ok(age)) => Ok(Utc::now() - age),
        _ => Err(
            "expected an RFC 3339 time (2026-12-01T08:00:00Z), a date (2026-12-01) or an age \
             (24h)"
                .to_owned(),
        ),
    }
}

/// Parses `500ms`, `30s`, `10m`, `7d`, ...
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|error| format!("{error} (use a duration such as 500ms, 30s, 10m or 7d)"))
}

/// Parses `KEY=VALUE`, such as a librdkafka setting. The error does not
/// repeat the text: it may be a secret with a mistyped separator.
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        Some(_) => Err("expected KEY=VALUE, got an empty KEY".to_owned()),
        None => Err(
            "expected KEY=VALUE such as compression.type=lz4, got no `=` \
             (the value is not shown: it may hold a secret)"
                .to_owned(),
        ),
    }
}

/// A usage error as one line: clap's message, its `[possible values: ..]`
/// and tips joined, without the usage block and the `--help` pointer.
///
/// ```
/// use clap::Parser;
/// use outbox_relay::cli::{Cli, usage_error_line};
///
/// let error = Cli::try_parse_from(["outbox-relay", "run", "--sink", "rabbit"]).unwrap_err();
/// let line = usage_error_line(&error);
/// assert!(!line.contains('\n'));
/// assert!(line.starts_with("error: invalid value 'rabbit' for '--sink <SINK>'"), "{line}");
/// assert!(line.contains("[possible values: kafka, rabbitmq, nats, stdout]"), "{line}");
/// ```
pub fn usage_error_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let mut parts: Vec<&str> = Vec::new();
    let mut in_usage = false;
    for line in rendered.lines().map(str::trim) {
        if line.starts_with("Usage:") {
            in_usage = true;
            continue;
        }
        if line.is_empty() {
            in_usage = false;
            continue;
        }
        if in_usage || line.starts_with("For more information, try") {
            continue;
        }
        parts.push(line);
    }
    let mut line = String::new();
    for part in parts {
        if !line.is_empty() {
            line.push_str(if part.starts_with("tip:") { "; " } else { " " });
        }
        line.push_str(part);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_are_one_line() {
        for args in [
            &["outbox-relay", "run", "--sink", "rabbit"][..],
            &["outbox-relay", "run", "--poll-interval", "soon"],
            &["outbox-relay", "run", "--snik", "kafka"],
            &["outbox-relay", "launch"],
        ] {
            let error = Cli::try_parse_from(args).unwrap_err();
            let line = usage_error_line(&error);
            assert!(!line.contains('\n'), "{args:?}: {line}");
            assert!(line.starts_with("error: "), "{args:?}: {line}");
        }
        let error =
            Cli::try_parse_from(["outbox-relay", "run", "--poll-interval", "soon"]).unwrap_err();
        assert!(usage_error_line(&error).contains("500ms"));
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_and_settings_parse() {
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("soon").unwrap_err().contains("500ms"));
        assert_eq!(
            parse_key_value("compression.type=lz4").unwrap(),
            ("compression.type".into(), "lz4".into())
        );
        let error = parse_key_value("sasl.password:s3cret").unwrap_err();
        assert!(
            error.contains("KEY=VALUE") && !error.contains("s3cret"),
            "{error}"
        );
        assert!(
            parse_key_value("=s3cret")
                .unwrap_err()
                .contains("empty KEY")
        );
    }
}
