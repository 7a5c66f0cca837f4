//! Resolves each command's settings from the command line, the environment
//! (through clap) and the optional TOML file, in that order of precedence,
//! and checks them before anything connects: a value outside its range, or
//! two values that contradict each other, stop the relay with a one-line
//! [`SettingsError`] naming the setting and what is allowed.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cdc::slot::{DEFAULT_NAME, check_name};
use crate::cli::{
    CleanupArgs, Cli, Command, GlobalArgs, MaintainArgs, RunArgs, RunMode, SinkArgs, SinkKind,
    parse_duration, parse_key_value,
};
use crate::cloudevents::{CloudEvents, Format};
use crate::database::Backend;
use crate::redact;
use crate::relay::{RelayOptions, Retention};
use crate::router::Router;
use crate::sink::kafka::KafkaOptions;
use crate::sink::nats::subject::SubjectTemplate;
use crate::sink::nats::{self, NatsOptions, ResendBound};
use crate::sink::rabbitmq::{self, RabbitMqOptions};
use crate::source::SourceOptions;
use crate::source::shards::{ShardConfig, default_instance_id};
use crate::tls::CertificateFiles;

/// The database of the embedded default.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://outbox.db";

/// Allowed `--shards`: every relay of a database needs the same number, and
/// a relay prepares and renews one row per shard.
pub const SHARDS: RangeInclusive<u64> = 1..=4096;
/// Allowed `--batch-size` of `run`: a batch is one claim, one send and one
/// mark, whose statements list every row.
pub const BATCH_SIZE: RangeInclusive<u64> = 1..=10_000;
/// Allowed `--max-batch-bytes` of `run`: a batch is held in memory while
/// it is sent, so the bound is what bounds the relay's memory.
pub const MAX_BATCH_BYTES: RangeInclusive<u64> = 1024..=(1 << 30);
/// Allowed `--lease`: renewed every third of it (at least every second),
/// so shorter leases expire on ordinary database latency.
pub const LEASE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);
/// Allowed `--send-timeout`. With [`LEASE`], it keeps the batch timeout
/// (send timeout plus lease, a server-side transaction timeout) within what
/// PostgreSQL and MariaDB accept.
pub const SEND_TIMEOUT: RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);
/// Allowed `--poll-interval`: zero would claim in a busy loop.
pub const POLL_INTERVAL: RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(3600);
/// Allowed `--metrics-interval`: each round queries the database.
pub const METRICS_INTERVAL: RangeInclusive<Duration> =
    Duration::from_millis(100)..=Duration::from_secs(3600);
/// Allowed `--cleanup-interval`: each round deletes in a loop.
pub const CLEANUP_INTERVAL: RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(30 * 86400);
/// Allowed `--retention` and `cleanup --older-than`: ten years keeps the
/// databases' date arithmetic far from overflowing.
pub const RETENTION: RangeInclusive<Duration> = Duration::ZERO..=Duration::from_secs(3650 * 86400);
/// Allowed rows per cleanup `DELETE`: more would hold locks for long.
pub const CLEANUP_BATCH_SIZE: RangeInclusive<u64> = 1..=100_000;
/// Days after today `partitions maintain` keeps partitions for.
pub const PARTITIONS_AHEAD: RangeInclusive<u64> = 1..=366;
/// Days after today `partitions maintain` keeps partitions for, by default.
pub const DEFAULT_PARTITIONS_AHEAD: u32 = 7;
/// Allowed `--max-attempts`.
pub const MAX_ATTEMPTS: RangeInclusive<u64> = 1..=i32::MAX as u64;
/// Allowed `--topic-partitions`.
pub const TOPIC_PARTITIONS: RangeInclusive<u64> = 1..=i32::MAX as u64;
/// Allowed `--topic-replication-factor` (a 16-bit field in Kafka's protocol).
pub const TOPIC_REPLICATION_FACTOR: RangeInclusive<u64> = 1..=i16::MAX as u64;
/// Allowed `--amqp-max-unconfirmed`: each unconfirmed message is kept in
/// memory until its confirm.
pub const AMQP_MAX_UNCONFIRMED: RangeInclusive<u64> = 1..=100_000;
/// Allowed `--nats-max-pending`: each message awaiting its PubAck is kept
/// in memory until it comes.
pub const NATS_MAX_PENDING: RangeInclusive<u64> = 1..=100_000;
/// Longest `--instance-id`: the width of the shard tables' owner column.
pub const MAX_INSTANCE_ID_LEN: usize = 64;
/// The send timeout when none is given.
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// A setting the relay cannot work with: a value out of its range, or two
/// values that contradict each other. A usage error: the binary exits with
/// code 2, like clap does for malformed options.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(String);

impl SettingsError {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Why [`RunSettings::resolve`] refused the settings of `run`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunSettingsError {
    /// A setting out of its range or contradicting another: a usage error.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// CDC mode on a database other than PostgreSQL: each setting is
    /// fine, the database is not the kind CDC mode needs.
    #[error(
        "--mode cdc reads PostgreSQL's write-ahead log, but the database is {scheme}; \
         use --mode poll"
    )]
    CdcNeedsPostgres {
        /// The URL's scheme when it is well formed, else "not PostgreSQL"
        /// (anything else may be a connection string with a password).
        scheme: String,
    },
    /// Partition maintenance on SQLite.
    #[error(
        "--partition-maintenance keeps a day-partitioned outbox, which needs PostgreSQL or \
         MariaDB/MySQL, but the database is sqlite; use the periodic cleanup"
    )]
    PartitionsNeedServer,
}

/// The optional TOML file: every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    database_url: Option<String>,
    mode: Option<RunMode>,
    slot: Option<String>,
    publication: Option<String>,
    sink: Option<SinkKind>,
    brokers: Option<String>,
    amqp_url: Option<String>,
    amqp_exchange: Option<String>,
    amqp_max_unconfirmed: Option<u64>,
    amqp_allow_unroutable: Option<bool>,
    nats_url: Option<String>,
    nats_stream: Option<String>,
    nats_subject: Option<String>,
    nats_max_pending: Option<u64>,
    nats_ca: Option<PathBuf>,
    nats_cert: Option<PathBuf>,
    nats_key: Option<PathBuf>,
    topic_template: Option<String>,
    format: Option<crate::cloudevents::Format>,
    ce_source: Option<String>,
    ce_type: Option<String>,
    batch_size: Option<u64>,
    max_batch_bytes: Option<u64>,
    poll_interval: Option<String>,
    max_attempts: Option<i64>,
    create_topics: Option<bool>,
    topic_partitions: Option<i64>,
    topic_replication_factor: Option<i64>,
    send_timeout: Option<String>,
    delete_on_publish: Option<bool>,
    partition_maintenance: Option<bool>,
    partitions_ahead: Option<u32>,
    retention: Option<String>,
    cleanup_interval: Option<String>,
    cleanup: Option<bool>,
    cleanup_batch_size: Option<u64>,
    shards: Option<u64>,
    lease: Option<String>,
    instance_id: Option<String>,
    metrics_addr: Option<std::net::SocketAddr>,
    metrics_interval: Option<String>,
    #[serde(default)]
    kafka: BTreeMap<String, String>,
    /// Debezium router options by their names (`"route.topic.regex"`).
    #[serde(default)]
    router: BTreeMap<String, String>,
}

impl FileConfig {
    /// Reads the file named by `--config`, or nothing.
    pub fn load(path: Option<&Path>) -> Result<Self, SettingsError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path).map_err(|error| {
            SettingsError::new(format!(
                "cannot read the config file {}: {error}",
                path.display()
            ))
        })?;
        toml::from_str(&text).map_err(|error| {
            SettingsError::new(format!(
                "invalid config file {}: {}",
                path.display(),
                error.message().trim()
            ))
        })
    }

    fn duration(
        &self,
        key: &str,
        value: &Option<String>,
    ) -> Result<Option<Duration>, SettingsError> {
        value
            .as_deref()
            .map(|text| {
                parse_duration(text)
                    .map_err(|error| SettingsError::new(format!("config key `{key}`: {error}")))
            })
            .transpose()
    }
}

/// A value from the command line (or its environment variable) or from
/// the file, with the name to report it under.
struct Given<T> {
    value: T,
    name: String,
}

/// The command line's value, else the file's, else none; named as the user
/// gave it (`--flag`, or `config key `key``).
fn given<T>(flag: &str, key: &str, arg: Option<T>, file: Option<T>) -> Option<Given<T>> {
    match (arg, file) {
        (Some(value), _) => Some(Given {
            value,
            name: flag.to_owned(),
        }),
        (None, Some(value)) => Some(Given {
            value,
            name: format!("config key `{key}`"),
        }),
        (None, None) => None,
    }
}

/// `value` if `range` holds it; else an error naming the setting and the range.
fn check_count(
    name: &str,
    value: impl TryInto<u64> + Display + Copy,
    range: &RangeInclusive<u64>,
) -> Result<u64, SettingsError> {
    match TryInto::<u64>::try_into(value) {
        Ok(number) if range.contains(&number) => Ok(number),
        _ if *range.end() >= i32::MAX as u64 => Err(SettingsError::new(format!(
            "{name} is {value}; it must be at least {}",
            range.start()
        ))),
        _ => Err(SettingsError::new(format!(
            "{name} is {value}; it must be {} to {}",
            range.start(),
            range.end()
        ))),
    }
}

/// `value` if `range` holds it; else an error naming the setting and the range.
fn check_duration(
    name: &str,
    value: Duration,
    range: &RangeInclusive<Duration>,
) -> Result<Duration, SettingsError> {
    if range.contains(&value) {
        return Ok(value);
    }
    Err(SettingsError::new(format!(
        "{name} is {}; it must be {} to {}",
        shown(value),
        shown(*range.start()),
        shown(*range.end())
    )))
}

/// `duration` in the largest unit that shows it exactly (`4000days`,
/// `1h`, `500ms`), as `--help` and the error messages write the ranges.
fn shown(duration: Duration) -> String {
    const UNITS: [(u128, &str); 4] = [
        (86_400_000, "days"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    let millis = duration.as_millis();
    if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        return humantime::format_duration(duration).to_string();
    }
    if millis == 0 {
        return "0s".to_owned();
    }
    UNITS
        .iter()
        .find(|(unit, _)| millis.is_multiple_of(*unit))
        .map_or_else(
            || format!("{millis}ms"),
            |(unit, name)| format!("{}{name}", millis / unit),
        )
}

/// A duration from the command line or the file (named), or `None`.
fn given_duration(
    flag: &str,
    key: &str,
    arg: Option<Duration>,
    file: &FileConfig,
    file_value: &Option<String>,
) -> Result<Option<Given<Duration>>, SettingsError> {
    Ok(given(flag, key, arg, file.duration(key, file_value)?))
}

/// The duration given, checked against `range`, else `default`.
fn checked_duration(
    given: Option<Given<Duration>>,
    range: &RangeInclusive<Duration>,
    default: Duration,
) -> Result<Duration, SettingsError> {
    given.map_or(Ok(default), |given| {
        check_duration(&given.name, given.value, range)
    })
}

/// The count given, checked against `range` (which `T` holds), else
/// `default`.
fn checked_count<T: TryFrom<u64>>(
    given: Option<Given<impl TryInto<u64> + Display + Copy>>,
    range: &RangeInclusive<u64>,
    default: T,
) -> Result<T, SettingsError> {
    let Some(given) = given else {
        return Ok(default);
    };
    let count = check_count(&given.name, given.value, range)?;
    T::try_from(count)
        .map_err(|_| SettingsError::new(format!("{} is {count}; it is too large", given.name)))
}

/// The database URL from the command line, environment, file or default.
pub fn database_url(global: &GlobalArgs, file: &FileConfig) -> String {
    global
        .database_url
        .clone()
        .or_else(|| file.database_url.clone())
        .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned())
}

/// Remembers every credential in the settings (the database URL's, the
/// AMQP URL's and the NATS URL's, secret librdkafka settings of `-X` and of the file's
/// `[kafka]` table), so that no output of this process shows them; see
/// [`crate::redact`].
pub fn remember_credentials(cli: &Cli, file: &FileConfig) {
    redact::remember_url_credentials(&database_url(&cli.global, file));
    if let Some(url) = &file.amqp_url {
        redact::remember_url_credentials(url);
    }
    if let Some(url) = &file.nats_url {
        remember_nats_credentials(url);
    }
    for (key, value) in &file.kafka {
        redact::remember_setting(key, value);
    }
    let output = match &cli.command {
        Command::Run(args) => Some(&args.output),
        Command::Replay(args) => Some(&args.output),
        _ => None,
    };
    if let Some(args) = output {
        if let Some(url) = &args.amqp_url {
            redact::remember_url_credentials(url);
        }
        if let Some(url) = &args.nats_url {
            remember_nats_credentials(url);
        }
        for (key, value) in args
            .kafka_options
            .iter()
            .filter_map(|option| option.split_once('='))
        {
            redact::remember_setting(key.trim(), value.trim());
        }
    }
}

/// Remembers the passwords of NATS server URLs (comma-separated), and the
/// token of `nats://TOKEN@host`, which stands where a user name would.
fn remember_nats_credentials(urls: &str) {
    for server in urls.split(',').map(str::trim) {
        redact::remember_url_credentials(server);
        if let Ok(parsed) = url::Url::parse(server)
            && parsed.password().is_none()
        {
            redact::remember_setting("token", parsed.username());
        }
    }
}

/// The replication slot named on the command line, environment or file.
pub fn slot_name(arg: Option<String>, file: &FileConfig) -> Result<String, SettingsError> {
    let slot = arg
        .or_else(|| file.slot.clone())
        .unwrap_or_else(|| DEFAULT_NAME.to_owned());
    check_name("--slot", &slot).map_err(|error| SettingsError::new(error.to_string()))?;
    Ok(slot)
}

/// Everything `run` needs.
#[derive(Debug)]
pub struct RunSettings {
    /// The database URL.
    pub database_url: String,
    /// Polling or CDC.
    pub mode: RunMode,
    /// CDC mode's replication slot.
    pub slot: String,
    /// CDC mode's publication.
    pub publication: String,
    /// Where and how messages are published.
    pub output: SinkSettings,
    /// The source's settlement options.
    pub source: SourceOptions,
    /// The loop's options.
    pub relay: RelayOptions,
    /// Where to serve /metrics, /healthz and /readyz, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How often the gauges and connection checks are refreshed.
    pub metrics_interval: Duration,
    /// Maintenance of a partitioned outbox's day partitions, when asked
    /// for (it then takes the place of the periodic cleanup).
    pub partition_maintenance: Option<PartitionMaintenance>,
}

/// Where and how messages are published: what `run` and `replay` share.
#[derive(Debug)]
pub struct SinkSettings {
    /// The sink.
    pub sink: SinkKind,
    /// Kafka settings, used when the sink is Kafka.
    pub kafka: KafkaOptions,
    /// RabbitMQ settings, used when the sink is RabbitMQ.
    pub rabbitmq: RabbitMqOptions,
    /// NATS settings, used when the sink is NATS.
    pub nats: NatsOptions,
    /// The topic template.
    pub topic_template: String,
    /// Debezium router options, when any is given: they decide the topic
    /// (instead of the template) and tombstones.
    pub router: Option<Router>,
    /// With `--format cloudevents` or `cloudevents-structured`: how rows
    /// become CloudEvents.
    pub cloudevents: Option<CloudEvents>,
}

impl SinkSettings {
    /// Merges the command line, environment and file; `send_timeout` is
    /// `--send-timeout` resolved, `resend_bound` how long an event may take
    /// to be sent again (NATS keeps message ids that long).
    fn resolve(
        args: &SinkArgs,
        file: &FileConfig,
        send_timeout: &Given<Duration>,
        resend_bound: ResendBound,
    ) -> Result<Self, SettingsError> {
        let sink = sink_kind(args, file);
        let kafka = kafka_options(sink, args, file, send_timeout)?;
        let rabbitmq = rabbitmq_options(
            sink,
            given(
                "--amqp-url",
                "amqp_url",
                args.amqp_url.clone(),
                file.amqp_url.clone(),
            ),
            &args.amqp_exchange,
            args.amqp_max_unconfirmed,
            args.amqp_allow_unroutable,
            file,
            send_timeout.value,
        )?;
        let nats = nats_options(sink, args, file, send_timeout.value, resend_bound)?;
        Ok(Self {
            sink,
            kafka,
            rabbitmq,
            nats,
            router: router(args, file)?,
            cloudevents: cloudevents(args, file)?,
            topic_template: args
                .topic_template
                .clone()
                .or_else(|| file.topic_template.clone())
                .unwrap_or_else(|| outbox_contract::topic::DEFAULT_TEMPLATE.to_owned()),
        })
    }

    /// The settings of `replay`, which sends each selected event once: an
    /// event is sent again only when its send times out or fails.
    pub fn for_replay(args: &SinkArgs, file: &FileConfig) -> Result<Self, SettingsError> {
        let send_timeout = send_timeout(args, file)?;
        let bound = ResendBound {
            longest: send_timeout.value + crate::relay::RelayOptions::default().max_backoff,
            made_of: format!("{} --send-timeout + backoff", shown(send_timeout.value)),
        };
        Self::resolve(args, file, &send_timeout, bound)
    }
}

/// Allowed `--rate` of `replay`, events per second.
pub const REPLAY_RATE: RangeInclusive<u64> = 1..=1_000_000;

/// Everything `replay` needs besides its selection.
#[derive(Debug)]
pub struct ReplaySettings {
    /// Where the events go, `--to` applied.
    pub output: SinkSettings,
    /// Chunk size and rate.
    pub pace: crate::replay::Pace,
    /// Replays of more events ask for confirmation.
    pub confirm_over: u64,
}

impl ReplaySettings {
    /// Merges the command line, environment and file; `to` (the
    /// replay's `--to`, or a resumed replay's) replaces the topic template,
    /// or the subject template on NATS, and the router's routing.
    pub fn resolve(
        args: &crate::cli::ReplayArgs,
        to: Option<&str>,
        file: &FileConfig,
    ) -> Result<Self, SettingsError> {
        let mut output = SinkSettings::for_replay(&args.output, file)?;
        if let Some(to) = to {
            if to.is_empty() {
                return Err(SettingsError::new("--to is empty; name a topic"));
            }
            output.topic_template = to.to_owned();
            output.router = output.router.map(|router| router.without_routes());
            if output.sink == SinkKind::Nats {
                output.nats.subject_template = SubjectTemplate::parse(to)
                    .map_err(|error| SettingsError::new(format!("--to: {error}")))?;
            }
        }
        let chunk = checked_count(
            given("--chunk-size", "chunk_size", args.chunk_size, None),
            &BATCH_SIZE,
            500i64,
        )?;
        let rate = args
            .rate
            .map(|rate| check_count("--rate", rate, &REPLAY_RATE))
            .transpose()?;
        Ok(Self {
            output,
            pace: crate::replay::Pace { chunk, rate },
            confirm_over: args.confirm_over.unwrap_or(10_000),
        })
    }
}

/// What the running relay's partition maintenance does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMaintenance {
    /// Drop days that ended longer ago than this (`None`: never drop,
    /// with `--no-cleanup`).
    pub retain: Option<Duration>,
    /// Days after today to have partitions for.
    pub ahead: u32,
    /// How often.
    pub interval: Duration,
}

impl RunSettings {
    /// Merges the command line, environment and file, and checks every
    /// value against its range ([`SHARDS`], [`LEASE`], ...) and the
    /// relations between them (a producer linger shorter than the send
    /// timeout); those failures are [`RunSettingsError::Settings`]. CDC
    /// mode on a database other than PostgreSQL fails with
    /// [`RunSettingsError::CdcNeedsPostgres`].
    pub fn resolve(
        global: &GlobalArgs,
        args: RunArgs,
        file: &FileConfig,
    ) -> Result<Self, RunSettingsError> {
        let database_url = database_url(global, file);
        let (mode, slot, publication) = mode_settings(&database_url, &args, file)?;
        let mut relay = relay_options(&database_url, &args, file)?;
        let partition_maintenance = partition_maintenance(&database_url, &args, file)?;
        if partition_maintenance.is_some() {
            // Days are dropped whole instead.
            relay.retention = None;
        }
        let (shards, lease) = shard_count_and_lease(&args, file)?;
        let send_timeout = send_timeout(&args.output, file)?;
        relay.shutdown_timeout = send_timeout.value;
        let shard_config = shard_config(
            &database_url,
            &args,
            file,
            shards,
            lease,
            send_timeout.value,
        )?;
        let metrics_interval = checked_duration(
            given_duration(
                "--metrics-interval",
                "metrics_interval",
                args.metrics_interval,
                file,
                &file.metrics_interval,
            )?,
            &METRICS_INTERVAL,
            Duration::from_secs(5),
        )?;
        let bound = resend_bound(mode, &relay, shard_config.as_ref(), send_timeout.value);
        let output = SinkSettings::resolve(&args.output, file, &send_timeout, bound)?;
        let creation_times = output.cloudevents.is_some();
        let extra = output
            .router
            .as_ref()
            .map(|router| router.extra_columns().clone())
            .unwrap_or_default();
        let delete_on_publish = relay_deletes_on_publish(&args, file);
        Ok(Self {
            database_url,
            mode,
            slot,
            publication,
            output,
            source: SourceOptions {
                delete_on_publish,
                shards: shard_config,
                creation_times,
                extra,
            },
            relay,
            metrics_addr: args.metrics_addr.or(file.metrics_addr),
            metrics_interval,
            partition_maintenance,
        })
    }
}

/// `--partition-maintenance` (PostgreSQL, MariaDB/MySQL) with its
/// retention (`--retention`, none with `--no-cleanup`), interval
/// (`--cleanup-interval`) and `--partitions-ahead`.
fn partition_maintenance(
    database_url: &str,
    args: &RunArgs,
    file: &FileConfig,
) -> Result<Option<PartitionMaintenance>, RunSettingsError> {
    if !(args.partition_maintenance || file.partition_maintenance.unwrap_or(false)) {
        return Ok(None);
    }
    if Backend::of(database_url) == Some(Backend::Sqlite) {
        return Err(RunSettingsError::PartitionsNeedServer);
    }
    let ahead = partitions_ahead("--partitions-ahead", args.partitions_ahead, file)?;
    // The cleanup's settings, whether or not rows would be deleted.
    let cleanup = !args.no_cleanup && file.cleanup.unwrap_or(true);
    let retention = retention_settings(args, file)?;
    Ok(Some(PartitionMaintenance {
        retain: cleanup.then_some(retention.keep_for),
        ahead,
        interval: retention.interval,
    }))
}

/// Polling or CDC mode, with CDC mode's slot and publication; CDC mode
/// needs PostgreSQL.
fn mode_settings(
    database_url: &str,
    args: &RunArgs,
    file: &FileConfig,
) -> Result<(RunMode, String, String), RunSettingsError> {
    let mode = args.mode.or(file.mode).unwrap_or_default();
    if mode == RunMode::Cdc && Backend::of(database_url) != Some(Backend::Postgres) {
        // Only a well-formed scheme is shown: anything else may be a
        // connection string with a password in it.
        let scheme = crate::database::scheme(database_url).unwrap_or("not PostgreSQL");
        // Not a SettingsError: each setting is fine, the database is
        // not the kind CDC mode needs (exit code 1).
        return Err(RunSettingsError::CdcNeedsPostgres {
            scheme: scheme.to_owned(),
        });
    }
    let slot = slot_name(args.slot.clone(), file)?;
    let publication = args
        .publication
        .clone()
        .or_else(|| file.publication.clone())
        .unwrap_or_else(|| DEFAULT_NAME.to_owned());
    check_name("--publication", &publication)
        .map_err(|error| SettingsError::new(error.to_string()))?;
    Ok((mode, slot, publication))
}

/// The sink named, else the one whose address is given, else stdout.
fn sink_kind(args: &SinkArgs, file: &FileConfig) -> SinkKind {
    args.sink
        .or(file.sink)
        .unwrap_or(if args.brokers.is_some() || file.brokers.is_some() {
            SinkKind::Kafka
        } else if args.amqp_url.is_some() || file.amqp_url.is_some() {
            SinkKind::RabbitMq
        } else if args.nats_url.is_some() || file.nats_url.is_some() {
            SinkKind::Nats
        } else {
            SinkKind::Stdout
        })
}

fn relay_deletes_on_publish(args: &RunArgs, file: &FileConfig) -> bool {
    args.delete_on_publish || file.delete_on_publish.unwrap_or(false)
}

/// The loop's batch size, attempts, poll interval and retention.
fn relay_options(
    database_url: &str,
    args: &RunArgs,
    file: &FileConfig,
) -> Result<RelayOptions, SettingsError> {
    let batch_size = checked_count(
        given(
            "--batch-size",
            "batch_size",
            args.batch_size,
            file.batch_size,
        ),
        &BATCH_SIZE,
        500,
    )?;
    let max_batch_bytes = checked_count(
        given(
            "--max-batch-bytes",
            "max_batch_bytes",
            args.max_batch_bytes,
            file.max_batch_bytes,
        ),
        &MAX_BATCH_BYTES,
        crate::relay::DEFAULT_MAX_BATCH_BYTES,
    )?;
    let max_attempts = checked_count(
        given(
            "--max-attempts",
            "max_attempts",
            args.max_attempts,
            file.max_attempts,
        ),
        &MAX_ATTEMPTS,
        10,
    )?;
    let default_poll = if Backend::of(database_url).is_some_and(Backend::notifies) {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(100)
    };
    let poll_interval = checked_duration(
        given_duration(
            "--poll-interval",
            "poll_interval",
            args.poll_interval,
            file,
            &file.poll_interval,
        )?,
        &POLL_INTERVAL,
        default_poll,
    )?;
    Ok(RelayOptions {
        batch_size,
        max_batch_bytes,
        poll_interval,
        max_attempts,
        drain: args.drain,
        retention: retention(args, file)?,
        ..RelayOptions::default()
    })
}

/// The periodic cleanup, unless turned off or rows are deleted on publish.
fn retention(args: &RunArgs, file: &FileConfig) -> Result<Option<Retention>, SettingsError> {
    let cleanup =
        !args.no_cleanup && file.cleanup.unwrap_or(true) && !relay_deletes_on_publish(args, file);
    Ok(cleanup.then_some(retention_settings(args, file)?))
}

/// `--retention`, `--cleanup-interval` and the file's cleanup batch size.
fn retention_settings(args: &RunArgs, file: &FileConfig) -> Result<Retention, SettingsError> {
    let defaults = Retention::default();
    let keep_for = keep_for("--retention", args.retention, file)?;
    let interval = checked_duration(
        given_duration(
            "--cleanup-interval",
            "cleanup_interval",
            args.cleanup_interval,
            file,
            &file.cleanup_interval,
        )?,
        &CLEANUP_INTERVAL,
        defaults.interval,
    )?;
    let batch_size = match file.cleanup_batch_size {
        Some(size) => check_count("config key `cleanup_batch_size`", size, &CLEANUP_BATCH_SIZE)?,
        None => defaults.batch_size,
    };
    Ok(Retention {
        keep_for,
        interval,
        batch_size,
    })
}

/// `--shards` and `--lease`.
fn shard_count_and_lease(
    args: &RunArgs,
    file: &FileConfig,
) -> Result<(u32, Duration), SettingsError> {
    let shards = checked_count(
        given("--shards", "shards", args.shards, file.shards),
        &SHARDS,
        16,
    )?;
    let lease = checked_duration(
        given_duration("--lease", "lease", args.lease, file, &file.lease)?,
        &LEASE,
        Duration::from_secs(10),
    )?;
    Ok((shards, lease))
}

/// `--send-timeout`, named as the user gave it.
fn send_timeout(args: &SinkArgs, file: &FileConfig) -> Result<Given<Duration>, SettingsError> {
    match given_duration(
        "--send-timeout",
        "send_timeout",
        args.send_timeout,
        file,
        &file.send_timeout,
    )? {
        Some(timeout) => Ok(Given {
            value: check_duration(&timeout.name, timeout.value, &SEND_TIMEOUT)?,
            name: timeout.name,
        }),
        None => Ok(Given {
            value: DEFAULT_SEND_TIMEOUT,
            name: "--send-timeout".into(),
        }),
    }
}

/// How this relay shares the shards, or `None` on SQLite (one relay per
/// file: nothing to share).
fn shard_config(
    database_url: &str,
    args: &RunArgs,
    file: &FileConfig,
    count: u32,
    lease: Duration,
    send_timeout: Duration,
) -> Result<Option<ShardConfig>, SettingsError> {
    // SQLite serves one relay per file: nothing to share.
    let sharding = Backend::of(database_url).is_none_or(Backend::shares_work);
    let instance = match given(
        "--instance-id",
        "instance_id",
        args.instance_id.clone(),
        file.instance_id.clone(),
    ) {
        Some(id) => check_instance_id(&id.name, id.value)?,
        None => shorten_instance_id(default_instance_id()),
    };
    Ok(sharding.then(|| ShardConfig {
        count,
        lease,
        instance,
        batch_timeout: send_timeout + lease,
    }))
}

/// The `key = value` pairs of a file table, then those of a repeatable
/// `KEY=VALUE` option (`flag`), in that order.
fn key_values(
    table: &BTreeMap<String, String>,
    given: &[String],
    flag: &str,
) -> Result<Vec<(String, String)>, SettingsError> {
    let mut pairs: Vec<(String, String)> = table
        .iter()
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    for option in given {
        pairs.push(
            parse_key_value(option)
                .map_err(|error| SettingsError::new(format!("{flag}: {error}")))?,
        );
    }
    Ok(pairs)
}

/// The CloudEvents settings of `--format cloudevents` or
/// `cloudevents-structured`; the `--ce-*` options need one of them.
fn cloudevents(args: &SinkArgs, file: &FileConfig) -> Result<Option<CloudEvents>, SettingsError> {
    let format = args.format.or(file.format).unwrap_or_default();
    let source = args.ce_source.clone().or_else(|| file.ce_source.clone());
    let ty = args.ce_type.clone().or_else(|| file.ce_type.clone());
    let structured = match format {
        Format::Debezium => {
            if source.is_some() || ty.is_some() {
                return Err(SettingsError::new(
                    "--ce-source and --ce-type shape CloudEvents; add --format cloudevents \
                     (or cloudevents-structured)",
                ));
            }
            return Ok(None);
        }
        Format::Cloudevents => false,
        Format::CloudeventsStructured => true,
    };
    let source = source.unwrap_or_else(|| crate::cloudevents::DEFAULT_SOURCE.to_owned());
    let ty = ty.unwrap_or_else(|| crate::cloudevents::DEFAULT_TYPE.to_owned());
    CloudEvents::check_template("--ce-source", &source).map_err(SettingsError::new)?;
    CloudEvents::check_template("--ce-type", &ty).map_err(SettingsError::new)?;
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "outbox".to_owned());
    Ok(Some(CloudEvents {
        structured,
        source,
        ty,
        service,
    }))
}

/// Debezium's router options from the file, then `--router` (later ones
/// winning), if any is given; they and a topic template cannot both name
/// the topic.
fn router(args: &SinkArgs, file: &FileConfig) -> Result<Option<Router>, SettingsError> {
    let options = key_values(&file.router, &args.router_options, "--router")?;
    if options.is_empty() {
        return Ok(None);
    }
    let router = Router::from_options(&options)
        .map_err(|error| SettingsError::new(format!("--router: {error}")))?;
    let sink = sink_kind(args, file);
    if router.places_partitions() && matches!(sink, SinkKind::RabbitMq | SinkKind::Nats) {
        return Err(SettingsError::new(format!(
            "--router: a partition placement names a Kafka partition; the {} sink has none",
            sink.name()
        )));
    }
    if router.routes() && (args.topic_template.is_some() || file.topic_template.is_some()) {
        return Err(SettingsError::new(
            "--topic-template and the router's route.* options both name the topic; use one",
        ));
    }
    Ok(Some(router))
}

/// The Kafka sink's settings; the producer settings are checked when it
/// is the sink.
fn kafka_options(
    sink: SinkKind,
    args: &SinkArgs,
    file: &FileConfig,
    send_timeout: &Given<Duration>,
) -> Result<KafkaOptions, SettingsError> {
    let client_options = key_values(&file.kafka, &args.kafka_options, "-X/--kafka-option")?;
    if sink == SinkKind::Kafka {
        check_producer_options(&client_options, send_timeout.value, &send_timeout.name)?;
    }
    let defaults = KafkaOptions::default();
    let topic_partitions = checked_count(
        given(
            "--topic-partitions",
            "topic_partitions",
            args.topic_partitions,
            file.topic_partitions,
        ),
        &TOPIC_PARTITIONS,
        defaults.topic_partitions,
    )?;
    let topic_replication_factor = checked_count(
        given(
            "--topic-replication-factor",
            "topic_replication_factor",
            args.topic_replication_factor,
            file.topic_replication_factor,
        ),
        &TOPIC_REPLICATION_FACTOR,
        defaults.topic_replication_factor,
    )?;
    Ok(KafkaOptions {
        brokers: args
            .brokers
            .clone()
            .or_else(|| file.brokers.clone())
            .unwrap_or(defaults.brokers),
        create_topics: !args.no_create_topics && file.create_topics.unwrap_or(true),
        topic_partitions,
        topic_replication_factor,
        send_timeout: send_timeout.value,
        client_options,
    })
}

/// The RabbitMQ sink's settings; the URL is checked when it is the sink.
fn rabbitmq_options(
    sink: SinkKind,
    url: Option<Given<String>>,
    exchange: &Option<String>,
    max_unconfirmed: Option<u64>,
    allow_unroutable: bool,
    file: &FileConfig,
    send_timeout: Duration,
) -> Result<RabbitMqOptions, SettingsError> {
    let defaults = RabbitMqOptions::default();
    let url = url.unwrap_or(Given {
        value: defaults.url.clone(),
        name: "--amqp-url".into(),
    });
    if sink == SinkKind::RabbitMq {
        rabbitmq::check_url(&url.value)
            .map_err(|error| SettingsError::new(format!("{}: {error}", url.name)))?;
    }
    let exchange = exchange
        .clone()
        .or_else(|| file.amqp_exchange.clone())
        .unwrap_or(defaults.exchange);
    if exchange.is_empty() || exchange.len() > 255 {
        return Err(SettingsError::new(format!(
            "--amqp-exchange must be 1 to 255 bytes (got {}); the default exchange cannot be used",
            exchange.len()
        )));
    }
    let max_unconfirmed = checked_count(
        given(
            "--amqp-max-unconfirmed",
            "amqp_max_unconfirmed",
            max_unconfirmed,
            file.amqp_max_unconfirmed,
        ),
        &AMQP_MAX_UNCONFIRMED,
        defaults.max_unconfirmed,
    )?;
    Ok(RabbitMqOptions {
        url: url.value,
        exchange,
        max_unconfirmed,
        mandatory: !allow_unroutable && !file.amqp_allow_unroutable.unwrap_or(false),
        send_timeout,
    })
}

/// The NATS sink's settings; the URL, stream and subject template are
/// checked when it is the sink.
fn nats_options(
    sink: SinkKind,
    args: &SinkArgs,
    file: &FileConfig,
    send_timeout: Duration,
    resend_bound: ResendBound,
) -> Result<NatsOptions, SettingsError> {
    let defaults = NatsOptions::default();
    let url = given(
        "--nats-url",
        "nats_url",
        args.nats_url.clone(),
        file.nats_url.clone(),
    )
    .unwrap_or(Given {
        value: defaults.url.clone(),
        name: "--nats-url".into(),
    });
    let stream = given(
        "--nats-stream",
        "nats_stream",
        args.nats_stream.clone(),
        file.nats_stream.clone(),
    )
    .unwrap_or(Given {
        value: defaults.stream.clone(),
        name: "--nats-stream".into(),
    });
    let template = given(
        "--nats-subject",
        "nats_subject",
        args.nats_subject.clone(),
        file.nats_subject.clone(),
    );
    let subject_template = match &template {
        Some(template) => SubjectTemplate::parse(&template.value)
            .map_err(|error| SettingsError::new(format!("{}: {error}", template.name))),
        None => Ok(defaults.subject_template.clone()),
    };
    if sink == SinkKind::Nats {
        nats::check_url(&url.value)
            .map_err(|error| SettingsError::new(format!("{}: {error}", url.name)))?;
        nats::check_stream_name(&stream.value)
            .map_err(|error| SettingsError::new(format!("{}: {error}", stream.name)))?;
    }
    // Checked whatever the sink, like the topic template: a default that
    // fails would fail every NATS run.
    let subject_template = match subject_template {
        Ok(template) => template,
        Err(error) if sink == SinkKind::Nats => return Err(error),
        Err(_) => defaults.subject_template.clone(),
    };
    let max_pending = checked_count(
        given(
            "--nats-max-pending",
            "nats_max_pending",
            args.nats_max_pending,
            file.nats_max_pending,
        ),
        &NATS_MAX_PENDING,
        defaults.max_pending,
    )?;
    let tls = nats_tls(sink, args, file)?;
    Ok(NatsOptions {
        url: url.value,
        stream: stream.value,
        subject_template,
        max_pending,
        send_timeout,
        resend_bound,
        tls,
    })
}

/// The NATS sink's certificate files: each must be readable when NATS is
/// the sink, and a client certificate comes with its key.
fn nats_tls(
    sink: SinkKind,
    args: &SinkArgs,
    file: &FileConfig,
) -> Result<CertificateFiles, SettingsError> {
    let pick = |flag: &str, key: &str, arg: &Option<PathBuf>, from_file: &Option<PathBuf>| {
        given(flag, key, arg.clone(), from_file.clone())
    };
    let root = pick("--nats-ca", "nats_ca", &args.nats_ca, &file.nats_ca);
    let cert = pick("--nats-cert", "nats_cert", &args.nats_cert, &file.nats_cert);
    let key = pick("--nats-key", "nats_key", &args.nats_key, &file.nats_key);
    if sink == SinkKind::Nats {
        match (&cert, &key) {
            (Some(cert), None) => {
                return Err(SettingsError::new(format!(
                    "{} needs the client key too (--nats-key, or nats_key in the file)",
                    cert.name
                )));
            }
            (None, Some(key)) => {
                return Err(SettingsError::new(format!(
                    "{} needs the client certificate too (--nats-cert, or nats_cert in the file)",
                    key.name
                )));
            }
            _ => {}
        }
        for given in [&root, &cert, &key].into_iter().flatten() {
            if let Err(error) = std::fs::File::open(&given.value) {
                return Err(SettingsError::new(format!(
                    "{}: cannot read {}: {error}",
                    given.name,
                    given.value.display()
                )));
            }
        }
    }
    Ok(CertificateFiles {
        root: root.map(|given| given.value),
        client_cert: cert.map(|given| given.value),
        client_key: key.map(|given| given.value),
    })
}

/// How much longer than the lease a relay's shards take to change owner
/// (the `--lease` documentation's "lease plus about 2s").
const SHARD_TAKEOVER_SLACK: Duration = Duration::from_secs(2);

/// The longest gap between two sends of one event: a send stored but not
/// acknowledged in time is retried after the aggregate's backoff; one
/// acknowledged by a relay that stopped before marking it is sent again by
/// the relay that takes over its shards (or CDC slot). Either waits for the
/// next claim (the poll interval) too.
fn resend_bound(
    mode: RunMode,
    relay: &RelayOptions,
    shards: Option<&ShardConfig>,
    send_timeout: Duration,
) -> ResendBound {
    let takeover = match (mode, shards) {
        (RunMode::Cdc, _) => Some((crate::cdc::TAKEOVER_BOUND, "CDC takeover".to_owned())),
        (RunMode::Poll, Some(shards)) => Some((
            shards.lease + SHARD_TAKEOVER_SLACK,
            format!(
                "--lease {} + {} shard takeover",
                shown(shards.lease),
                shown(SHARD_TAKEOVER_SLACK)
            ),
        )),
        (RunMode::Poll, None) => None,
    };
    let backoff = (
        relay.max_backoff,
        format!("{} backoff cap", shown(relay.max_backoff)),
    );
    let (wait, wait_made_of) = match takeover {
        Some(takeover) if takeover.0 > backoff.0 => takeover,
        _ => backoff,
    };
    ResendBound {
        longest: send_timeout + wait + relay.poll_interval,
        made_of: format!(
            "--send-timeout {} + {wait_made_of} + --poll-interval {}",
            shown(send_timeout),
            shown(relay.poll_interval)
        ),
    }
}

/// librdkafka settings the relay sets itself because its guarantees rest on
/// them, with the values it accepts from `-X`/`[kafka]` (its own).
const GUARANTEED_PRODUCER_SETTINGS: [(&str, &[&str], &str); 6] = [
    ("acks", &["all", "-1"], "acks=all"),
    ("request.required.acks", &["all", "-1"], "acks=all"),
    ("enable.idempotence", &["true"], "enable.idempotence=true"),
    (
        "enable.gapless.guarantee",
        &["true"],
        "enable.gapless.guarantee=true",
    ),
    // Messages expire after the send timeout, so that a relay resumed
    // after losing its shards does not send what it had queued.
    (
        "message.timeout.ms",
        &[],
        "message.timeout.ms to the --send-timeout",
    ),
    (
        "delivery.timeout.ms",
        &[],
        "message.timeout.ms to the --send-timeout",
    ),
];

/// Refuses producer settings the relay cannot work with: a linger that
/// outlasts the send timeout (every batch would time out before it is
/// sent), and changes to the settings no loss and per-aggregate order rest
/// on.
fn check_producer_options(
    options: &[(String, String)],
    send_timeout: Duration,
    send_timeout_name: &str,
) -> Result<(), SettingsError> {
    for (key, value) in options {
        let key = key.to_ascii_lowercase();
        if let Some((_, allowed, own)) = GUARANTEED_PRODUCER_SETTINGS
            .iter()
            .find(|(name, _, _)| *name == key)
            && !allowed.contains(&value.to_ascii_lowercase().as_str())
        {
            return Err(SettingsError::new(format!(
                "-X {key}={value} is not allowed: the relay sets {own} itself, which \
                 publishing every committed row in per-aggregate order rests on; remove it"
            )));
        }
        if matches!(key.as_str(), "linger.ms" | "queue.buffering.max.ms")
            && let Ok(millis) = value.parse::<f64>()
            && millis >= 0.0
            && Duration::from_secs_f64(millis.min(1e12) / 1000.0) >= send_timeout
        {
            return Err(SettingsError::new(format!(
                "-X {key}={value} is not shorter than {send_timeout_name} {}: every batch would \
                 time out before the producer sends it; use a linger well below the send timeout",
                shown(send_timeout)
            )));
        }
    }
    Ok(())
}

/// An instance id that fits the shard tables' owner column.
fn check_instance_id(name: &str, id: String) -> Result<String, SettingsError> {
    let length = id.chars().count();
    if id.trim().is_empty() || length > MAX_INSTANCE_ID_LEN || id.contains(char::is_control) {
        return Err(SettingsError::new(format!(
            "{name} must be 1 to {MAX_INSTANCE_ID_LEN} printable characters, \
             unique among the relays of the database (got {length} characters)"
        )));
    }
    Ok(id)
}

/// The default `host-pid-random` id, keeping its unique end when a long
/// host name would make it too long for the owner column.
fn shorten_instance_id(id: String) -> String {
    let length = id.chars().count();
    if length <= MAX_INSTANCE_ID_LEN {
        return id;
    }
    id.chars().skip(length - MAX_INSTANCE_ID_LEN).collect()
}

/// How long published rows are kept: `flag` (`--retention` of `run`,
/// `--older-than` of `cleanup`), else the file's `retention`, else the
/// default.
fn keep_for(
    flag: &str,
    arg: Option<Duration>,
    file: &FileConfig,
) -> Result<Duration, SettingsError> {
    checked_duration(
        given_duration(flag, "retention", arg, file, &file.retention)?,
        &RETENTION,
        Retention::default().keep_for,
    )
}

/// Days after today to have partitions for: `flag`, else the file's
/// `partitions_ahead`, else [`DEFAULT_PARTITIONS_AHEAD`].
fn partitions_ahead(flag: &str, arg: Option<u32>, file: &FileConfig) -> Result<u32, SettingsError> {
    checked_count(
        given(flag, "partitions_ahead", arg, file.partitions_ahead),
        &PARTITIONS_AHEAD,
        DEFAULT_PARTITIONS_AHEAD,
    )
}

/// What `partitions maintain` needs: how long published days are kept
/// (`--retain`, or the file's `retention`, as for `cleanup`) and how many
/// days after today get partitions.
pub fn maintenance_settings(
    args: &MaintainArgs,
    file: &FileConfig,
) -> Result<(Duration, u32), SettingsError> {
    let retain = keep_for("--retain", args.retain, file)?;
    Ok((retain, partitions_ahead("--ahead", args.ahead, file)?))
}

/// Everything `cleanup` needs.
pub fn cleanup_retention(
    args: &CleanupArgs,
    file: &FileConfig,
) -> Result<Retention, SettingsError> {
    let defaults = Retention::default();
    let keep_for = keep_for("--older-than", args.older_than, file)?;
    let batch_size = checked_count(
        given(
            "--batch-size",
            "cleanup_batch_size",
            args.batch_size,
            file.cleanup_batch_size,
        ),
        &CLEANUP_BATCH_SIZE,
        defaults.batch_size,
    )?;
    Ok(Retention {
        keep_for,
        batch_size,
        ..defaults
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global(url: Option<&str>) -> GlobalArgs {
        GlobalArgs {
            database_url: url.map(str::to_owned),
            config: None,
            log_format: crate::cli::LogFormat::Text,
        }
    }

    #[test]
    fn defaults_are_the_embedded_setup() {
        let settings =
            RunSettings::resolve(&global(None), RunArgs::default(), &FileConfig::default())
                .unwrap();
        assert_eq!(settings.database_url, DEFAULT_DATABASE_URL);
        assert_eq!(settings.output.sink, SinkKind::Stdout);
        assert_eq!(
            settings.output.topic_template,
            "outbox.event.{aggregatetype}"
        );
        assert_eq!(settings.relay.poll_interval, Duration::from_millis(100));
        assert!(settings.output.kafka.create_topics);
        assert!(
            settings.source.shards.is_none(),
            "one relay per SQLite file"
        );
    }

    #[test]
    fn partition_maintenance_takes_the_place_of_the_row_cleanup() {
        let postgres = global(Some("postgres://db/test"));
        let file: FileConfig = toml::from_str(
            r#"
            partition_maintenance = true
            retention = "3d"
            cleanup_interval = "15m"
            "#,
        )
        .unwrap();
        let settings = RunSettings::resolve(&postgres, RunArgs::default(), &file).unwrap();
        assert!(settings.relay.retention.is_none(), "no rows deleted");
        assert_eq!(
            settings.partition_maintenance,
            Some(PartitionMaintenance {
                retain: Some(Duration::from_secs(3 * 86_400)),
                ahead: DEFAULT_PARTITIONS_AHEAD,
                interval: Duration::from_secs(900),
            })
        );
        let args = RunArgs {
            no_cleanup: true,
            partitions_ahead: Some(30),
            ..RunArgs::default()
        };
        let settings = RunSettings::resolve(&postgres, args, &file).unwrap();
        let maintenance = settings.partition_maintenance.unwrap();
        assert_eq!((maintenance.retain, maintenance.ahead), (None, 30));

        let args = RunArgs {
            partitions_ahead: Some(0),
            ..RunArgs::default()
        };
        let error = RunSettings::resolve(&postgres, args, &file).unwrap_err();
        assert!(error.to_string().contains("--partitions-ahead"), "{error}");
        let error = RunSettings::resolve(&global(Some("sqlite://o.db")), RunArgs::default(), &file)
            .unwrap_err();
        assert!(
            matches!(error, RunSettingsError::PartitionsNeedServer),
            "{error}"
        );
        let plain = RunSettings::resolve(&postgres, RunArgs::default(), &FileConfig::default());
        assert_eq!(plain.unwrap().partition_maintenance, None);
    }

    #[test]
    fn brokers_select_kafka_and_the_command_line_wins_over_the_file() {
        let file: FileConfig = toml::from_str(
            r#"
            brokers = "file:9092"
            batch_size = 50
            poll_interval = "2s"
            create_topics = false
            [kafka]
            "compression.type" = "lz4"
            "#,
        )
        .unwrap();
        let args = RunArgs {
            batch_size: Some(7),
            ..RunArgs::default()
        };
        let settings =
            RunSettings::resolve(&global(Some("postgres://db/test")), args, &file).unwrap();
        assert_eq!(settings.output.sink, SinkKind::Kafka);
        assert_eq!(settings.output.kafka.brokers, "file:9092");
        assert_eq!(settings.relay.batch_size, 7);
        assert_eq!(settings.relay.poll_interval, Duration::from_secs(2));
        let shards = settings.source.shards.expect("PostgreSQL shares shards");
        assert_eq!((shards.count, shards.lease), (16, Duration::from_secs(10)));
        assert!(!settings.output.kafka.create_topics);
        assert_eq!(
            settings.output.kafka.client_options,
            [("compression.type".to_owned(), "lz4".to_owned())]
        );
    }

    #[test]
    fn an_amqp_url_selects_rabbitmq_and_its_settings_are_checked() {
        let file: FileConfig = toml::from_str(
            r#"
            amqp_url = "amqp://app:s3cret@rabbit:5672/prod"
            amqp_exchange = "events"
            amqp_max_unconfirmed = 64
            "#,
        )
        .unwrap();
        let settings = RunSettings::resolve(&global(None), RunArgs::default(), &file).unwrap();
        assert_eq!(settings.output.sink, SinkKind::RabbitMq);
        assert_eq!(
            settings.output.rabbitmq.url,
            "amqp://app:s3cret@rabbit:5672/prod"
        );
        assert_eq!(settings.output.rabbitmq.exchange, "events");
        assert_eq!(settings.output.rabbitmq.max_unconfirmed, 64);
        assert!(settings.output.rabbitmq.mandatory);

        let resolve = |args: RunArgs| {
            RunSettings::resolve(&global(None), args, &FileConfig::default())
                .unwrap_err()
                .to_string()
        };
        let error = resolve(RunArgs {
            output: SinkArgs {
                sink: Some(SinkKind::RabbitMq),
                amqp_url: Some("amqp://app:s3cret@rabbit:port/".into()),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        });
        assert!(error.starts_with("--amqp-url: not a URL"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
        let error = resolve(RunArgs {
            output: SinkArgs {
                sink: Some(SinkKind::RabbitMq),
                amqp_max_unconfirmed: Some(0),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        });
        assert_eq!(error, "--amqp-max-unconfirmed is 0; it must be 1 to 100000");
        // Another sink does not look at the URL.
        let args = RunArgs {
            output: SinkArgs {
                sink: Some(SinkKind::Stdout),
                amqp_url: Some("nonsense".into()),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        };
        assert!(RunSettings::resolve(&global(None), args, &FileConfig::default()).is_ok());
    }

    #[test]
    fn a_nats_url_selects_nats_and_its_settings_are_checked() {
        let file: FileConfig = toml::from_str(
            r#"
            nats_url = "nats://app:s3cret@nats:4222"
            nats_stream = "EVENTS"
            nats_subject = "events.{aggregatetype}.{aggregateid}"
            nats_max_pending = 64
            "#,
        )
        .unwrap();
        let settings = RunSettings::resolve(
            &global(Some("postgres://db/test")),
            RunArgs::default(),
            &file,
        )
        .unwrap();
        assert_eq!(settings.output.sink, SinkKind::Nats);
        assert_eq!(settings.output.nats.url, "nats://app:s3cret@nats:4222");
        assert_eq!(settings.output.nats.stream, "EVENTS");
        assert_eq!(
            settings
                .output
                .nats
                .subject_template
                .subject("Order", "4.2"),
            "events.Order.4%2E2"
        );
        assert_eq!(settings.output.nats.max_pending, 64);

        let resolve = |args: RunArgs| {
            RunSettings::resolve(&global(None), args, &FileConfig::default())
                .unwrap_err()
                .to_string()
        };
        let nats = |args: RunArgs| RunArgs {
            output: SinkArgs {
                sink: Some(SinkKind::Nats),
                ..args.output
            },
            ..args
        };
        let error = resolve(nats(RunArgs {
            output: SinkArgs {
                nats_url: Some("nats://app:s3cret@nats:port".into()),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        }));
        assert!(error.starts_with("--nats-url: not a URL"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
        let error = resolve(nats(RunArgs {
            output: SinkArgs {
                nats_max_pending: Some(0),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        }));
        assert_eq!(error, "--nats-max-pending is 0; it must be 1 to 100000");
        let error = resolve(nats(RunArgs {
            output: SinkArgs {
                nats_cert: Some("/etc/hostname".into()),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        }));
        assert_eq!(
            error,
            "--nats-cert needs the client key too (--nats-key, or nats_key in the file)"
        );
        let error = resolve(nats(RunArgs {
            output: SinkArgs {
                nats_ca: Some("/nonexistent/ca.pem".into()),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        }));
        assert!(
            error.starts_with("--nats-ca: cannot read /nonexistent/ca.pem: "),
            "{error}"
        );
        let error = resolve(nats(RunArgs {
            output: SinkArgs {
                nats_subject: Some("outbox.>".into()),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        }));
        assert!(
            error.starts_with("--nats-subject: the subject template"),
            "{error}"
        );
        let error = resolve(nats(RunArgs {
            output: SinkArgs {
                nats_stream: Some("OUT BOX".into()),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        }));
        assert!(error.starts_with("--nats-stream:"), "{error}");
        // Another sink does not look at them.
        let args = RunArgs {
            output: SinkArgs {
                sink: Some(SinkKind::Stdout),
                nats_url: Some("nonsense://".into()),
                nats_subject: Some("a..b".into()),
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        };
        assert!(RunSettings::resolve(&global(None), args, &FileConfig::default()).is_ok());
    }

    #[test]
    fn the_resend_bound_is_the_longest_wait_before_an_event_is_sent_again() {
        let bound = |database: &str, args: RunArgs| {
            RunSettings::resolve(
                &global(Some(database)),
                RunArgs {
                    output: SinkArgs {
                        sink: Some(SinkKind::Nats),
                        ..args.output
                    },
                    ..args
                },
                &FileConfig::default(),
            )
            .unwrap()
            .output
            .nats
            .resend_bound
        };
        let defaults = bound("postgres://db/test", RunArgs::default());
        assert_eq!(defaults.longest, Duration::from_secs(61));
        assert_eq!(
            defaults.made_of,
            "--send-timeout 30s + 30s backoff cap + --poll-interval 1s"
        );
        let long_lease = bound(
            "postgres://db/test",
            RunArgs {
                lease: Some(Duration::from_secs(60)),
                output: SinkArgs {
                    send_timeout: Some(Duration::from_secs(5)),
                    ..SinkArgs::default()
                },
                ..RunArgs::default()
            },
        );
        assert_eq!(long_lease.longest, Duration::from_secs(5 + 62 + 1));
        assert_eq!(
            long_lease.made_of,
            "--send-timeout 5s + --lease 1m + 2s shard takeover + --poll-interval 1s"
        );
        let sqlite = bound(
            "sqlite://x.db",
            RunArgs {
                lease: Some(Duration::from_secs(60)),
                ..RunArgs::default()
            },
        );
        assert_eq!(
            sqlite.longest,
            Duration::from_millis(60_100),
            "one relay per SQLite file: no takeover"
        );
    }

    #[test]
    fn router_options_come_from_the_file_and_the_command_line() {
        let file: FileConfig = toml::from_str(
            r#"
            [router]
            "route.by.field" = "type"
            "route.topic.replacement" = "file.${routedByValue}"
            "#,
        )
        .unwrap();
        let args = RunArgs {
            output: SinkArgs {
                router_options: vec!["route.topic.replacement=events.${routedByValue}".into()],
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        };
        let settings = RunSettings::resolve(&global(Some("sqlite://x.db")), args, &file).unwrap();
        let router = settings.output.router.expect("router options given");
        let mut row = crate::record::test_record("e-1", "42", 0);
        row.event_type = "OrderPlaced".into();
        assert_eq!(router.topic(&row), "events.OrderPlaced");

        let none = RunSettings::resolve(
            &global(Some("sqlite://x.db")),
            RunArgs::default(),
            &FileConfig::default(),
        )
        .unwrap();
        assert!(none.output.router.is_none());

        let error = |args: RunArgs| {
            RunSettings::resolve(&global(Some("sqlite://x.db")), args, &FileConfig::default())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            error(RunArgs {
                output: SinkArgs {
                    router_options: vec!["route.by.feld=type".into()],
                    ..SinkArgs::default()
                },
                ..RunArgs::default()
            }),
            "--router: unknown router option \"route.by.feld\"; did you mean \"route.by.field\"?"
        );
        assert_eq!(
            error(RunArgs {
                output: SinkArgs {
                    router_options: vec!["route.by.field=aggregateid".into()],
                    topic_template: Some("t.{aggregatetype}".into()),
                    ..SinkArgs::default()
                },
                ..RunArgs::default()
            }),
            "--topic-template and the router's route.* options both name the topic; use one"
        );
        // Tombstones alone leave the template in charge.
        let tombstones = RunSettings::resolve(
            &global(Some("sqlite://x.db")),
            RunArgs {
                output: SinkArgs {
                    router_options: vec!["route.tombstone.on.empty.payload=true".into()],
                    topic_template: Some("t.{aggregatetype}".into()),
                    ..SinkArgs::default()
                },
                ..RunArgs::default()
            },
            &FileConfig::default(),
        )
        .unwrap();
        assert!(
            tombstones
                .output
                .router
                .is_some_and(|router| !router.routes())
        );
    }

    #[test]
    fn cdc_mode_needs_postgres_and_valid_names() {
        let file: FileConfig = toml::from_str(
            r#"
            mode = "cdc"
            slot = "relay_a"
            "#,
        )
        .unwrap();
        let settings = RunSettings::resolve(
            &global(Some("postgres://db/test")),
            RunArgs::default(),
            &file,
        )
        .unwrap();
        assert_eq!(settings.mode, RunMode::Cdc);
        assert_eq!(
            (settings.slot.as_str(), settings.publication.as_str()),
            ("relay_a", "outbox_relay")
        );
        let error =
            RunSettings::resolve(&global(Some("mysql://db/test")), RunArgs::default(), &file)
                .unwrap_err()
                .to_string();
        assert!(error.contains("--mode cdc"), "{error}");
        assert!(error.contains("mysql"), "{error}");
        let args = RunArgs {
            publication: Some("Bad-Name".into()),
            ..RunArgs::default()
        };
        let error = RunSettings::resolve(&global(Some("postgres://db/test")), args, &file)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("--publication"), "{error}");
        let defaults =
            RunSettings::resolve(&global(None), RunArgs::default(), &FileConfig::default())
                .unwrap();
        assert_eq!(defaults.mode, RunMode::Poll);
    }

    #[test]
    fn producer_settings_must_leave_the_relay_able_to_send() {
        let resolve = |send: Option<u64>, options: &[&str]| {
            let args = RunArgs {
                output: SinkArgs {
                    sink: Some(SinkKind::Kafka),
                    send_timeout: send.map(Duration::from_secs),
                    kafka_options: options.iter().map(|option| option.to_string()).collect(),
                    ..SinkArgs::default()
                },
                ..RunArgs::default()
            };
            RunSettings::resolve(
                &global(Some("postgres://db/x")),
                args,
                &FileConfig::default(),
            )
        };
        let error = resolve(Some(2), &["linger.ms=3000"]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "-X linger.ms=3000 is not shorter than --send-timeout 2s: every batch would time out \
             before the producer sends it; use a linger well below the send timeout"
        );
        assert!(resolve(None, &["queue.buffering.max.ms=30000"]).is_err());
        assert!(resolve(None, &["linger.ms=3000", "compression.type=lz4"]).is_ok());
        let error = resolve(None, &["acks=1"]).unwrap_err().to_string();
        assert!(
            error.starts_with("-X acks=1 is not allowed: the relay sets acks=all"),
            "{error}"
        );
        for refused in [
            "enable.idempotence=false",
            "message.timeout.ms=5000",
            "delivery.timeout.ms=5000",
            "enable.gapless.guarantee=false",
            "request.required.acks=0",
        ] {
            assert!(resolve(None, &[refused]).is_err(), "{refused}");
        }
        assert!(resolve(None, &["acks=all", "enable.idempotence=true"]).is_ok());
        // Another sink ignores them.
        let args = RunArgs {
            output: SinkArgs {
                sink: Some(SinkKind::Stdout),
                kafka_options: vec!["acks=1".into()],
                ..SinkArgs::default()
            },
            ..RunArgs::default()
        };
        assert!(RunSettings::resolve(&global(None), args, &FileConfig::default()).is_ok());
    }

    #[test]
    fn ranges_are_written_the_way_they_are_typed() {
        assert_eq!(shown(Duration::ZERO), "0s");
        assert_eq!(shown(Duration::from_millis(10)), "10ms");
        assert_eq!(shown(Duration::from_millis(1500)), "1500ms");
        assert_eq!(shown(Duration::from_secs(90)), "90s");
        assert_eq!(shown(Duration::from_secs(3600)), "1h");
        assert_eq!(shown(Duration::from_secs(4000 * 86400)), "4000days");
        assert_eq!(shown(Duration::from_micros(1)), "1us");
        for text in ["0s", "10ms", "1500ms", "90s", "1h", "4000days"] {
            assert_eq!(shown(parse_duration(text).unwrap()), text);
        }
        let error = check_count("--shards", 3_000_000_000u64, &SHARDS).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--shards is 3000000000; it must be 1 to 4096"
        );
        let error = check_count("--max-attempts", -1i64, &MAX_ATTEMPTS).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--max-attempts is -1; it must be at least 1"
        );
    }

    #[test]
    fn a_long_host_name_keeps_the_default_instance_id_unique_and_short() {
        let id = format!("{}-4242-abcdef", "h".repeat(70));
        let short = shorten_instance_id(id);
        assert_eq!(short.len(), MAX_INSTANCE_ID_LEN);
        assert!(short.ends_with("-4242-abcdef"));
        assert_eq!(shorten_instance_id("relay-1".into()), "relay-1");
        assert!(check_instance_id("--instance-id", "a\nb".into()).is_err());
    }

    #[test]
    fn bad_values_are_reported_by_name() {
        let file: FileConfig = toml::from_str(r#"retention = "a while""#).unwrap();
        let error = RunSettings::resolve(&global(None), RunArgs::default(), &file).unwrap_err();
        assert!(error.to_string().contains("`retention`"), "{error}");
        assert!(toml::from_str::<FileConfig>("bacth_size = 5").is_err());
    }
}
