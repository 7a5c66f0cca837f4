//! Resolves each command's settings from the command line, the environment
//! (through clap) and the optional TOML file, in that order of precedence.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::cdc::slot::{DEFAULT_NAME, check_name};
use crate::cli::{CleanupArgs, GlobalArgs, RunArgs, RunMode, SinkKind, parse_duration};
use crate::message::DEFAULT_TOPIC_TEMPLATE;
use crate::relay::{RelayOptions, Retention};
use crate::sink::kafka::KafkaOptions;
use crate::source::SourceOptions;
use crate::source::shards::{ShardConfig, default_instance_id};

/// The database of the embedded default.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://outbox.db";

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
    topic_template: Option<String>,
    batch_size: Option<usize>,
    poll_interval: Option<String>,
    max_attempts: Option<i32>,
    create_topics: Option<bool>,
    topic_partitions: Option<i32>,
    topic_replication_factor: Option<i32>,
    send_timeout: Option<String>,
    delete_on_publish: Option<bool>,
    retention: Option<String>,
    cleanup_interval: Option<String>,
    cleanup: Option<bool>,
    cleanup_batch_size: Option<u64>,
    shards: Option<u32>,
    lease: Option<String>,
    instance_id: Option<String>,
    metrics_addr: Option<std::net::SocketAddr>,
    metrics_interval: Option<String>,
    #[serde(default)]
    kafka: BTreeMap<String, String>,
}

impl FileConfig {
    /// Reads the file named by `--config`, or nothing.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {}", path.display()))?;
        toml::from_str(&text).map_err(|error| {
            let message = error.message().to_owned();
            anyhow::anyhow!("invalid config file {}: {message}", path.display())
        })
    }

    fn duration(&self, key: &str, value: &Option<String>) -> anyhow::Result<Option<Duration>> {
        value
            .as_deref()
            .map(|text| {
                parse_duration(text).map_err(|error| anyhow::anyhow!("config key `{key}`: {error}"))
            })
            .transpose()
    }
}

/// The database URL from the command line, environment, file or default.
pub fn database_url(global: &GlobalArgs, file: &FileConfig) -> String {
    global
        .database_url
        .clone()
        .or_else(|| file.database_url.clone())
        .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned())
}

/// The replication slot named on the command line, environment or file.
pub fn slot_name(arg: Option<String>, file: &FileConfig) -> anyhow::Result<String> {
    let slot = arg
        .or_else(|| file.slot.clone())
        .unwrap_or_else(|| DEFAULT_NAME.to_owned());
    check_name("--slot", &slot)?;
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
    /// The sink.
    pub sink: SinkKind,
    /// Kafka settings, used when the sink is Kafka.
    pub kafka: KafkaOptions,
    /// The topic template.
    pub topic_template: String,
    /// The source's settlement options.
    pub source: SourceOptions,
    /// The loop's options.
    pub relay: RelayOptions,
    /// Where to serve /metrics, /healthz and /readyz, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How often the gauges and connection checks are refreshed.
    pub metrics_interval: Duration,
}

impl RunSettings {
    /// Merges the command line, environment and file.
    pub fn resolve(global: &GlobalArgs, args: RunArgs, file: &FileConfig) -> anyhow::Result<Self> {
        let database_url = database_url(global, file);
        let mode = args.mode.or(file.mode).unwrap_or_default();
        if mode == RunMode::Cdc && !crate::source::is_postgres(&database_url) {
            let scheme = database_url.split(':').next().unwrap_or_default();
            bail!(
                "--mode cdc reads PostgreSQL's write-ahead log, but the database is {scheme}; \
                 use --mode poll"
            );
        }
        let slot = slot_name(args.slot.clone(), file)?;
        let publication = args
            .publication
            .clone()
            .or_else(|| file.publication.clone())
            .unwrap_or_else(|| DEFAULT_NAME.to_owned());
        check_name("--publication", &publication)?;
        let brokers = args.brokers.or_else(|| file.brokers.clone());
        let sink = args.sink.or(file.sink).unwrap_or(if brokers.is_some() {
            SinkKind::Kafka
        } else {
            SinkKind::Stdout
        });
        let batch_size = args.batch_size.or(file.batch_size).unwrap_or(500);
        if batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        let max_attempts = args.max_attempts.or(file.max_attempts).unwrap_or(10);
        if max_attempts < 1 {
            bail!("--max-attempts must be at least 1");
        }
        let default_poll = if database_url.starts_with("postgres") {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(100)
        };
        let poll_interval = match args.poll_interval {
            Some(interval) => interval,
            None => file
                .duration("poll_interval", &file.poll_interval)?
                .unwrap_or(default_poll),
        };
        let send_timeout = match args.send_timeout {
            Some(timeout) => timeout,
            None => file
                .duration("send_timeout", &file.send_timeout)?
                .unwrap_or(Duration::from_secs(30)),
        };
        let delete_on_publish = args.delete_on_publish || file.delete_on_publish.unwrap_or(false);
        let cleanup = !args.no_cleanup && file.cleanup.unwrap_or(true) && !delete_on_publish;
        let retention = if cleanup {
            let keep_for = match args.retention {
                Some(keep_for) => keep_for,
                None => file
                    .duration("retention", &file.retention)?
                    .unwrap_or(Retention::default().keep_for),
            };
            let interval = match args.cleanup_interval {
                Some(interval) => interval,
                None => file
                    .duration("cleanup_interval", &file.cleanup_interval)?
                    .unwrap_or(Retention::default().interval),
            };
            Some(Retention {
                keep_for,
                interval,
                batch_size: file
                    .cleanup_batch_size
                    .unwrap_or(Retention::default().batch_size),
            })
        } else {
            None
        };
        let shards = args.shards.or(file.shards).unwrap_or(16);
        if shards == 0 {
            bail!("--shards must be at least 1");
        }
        let lease = match args.lease {
            Some(lease) => lease,
            None => file
                .duration("lease", &file.lease)?
                .unwrap_or(Duration::from_secs(10)),
        };
        // SQLite serves one relay per file: nothing to share.
        let sharding = !database_url.starts_with("sqlite:");
        let shard_config = sharding.then(|| ShardConfig {
            count: shards,
            lease,
            instance: args
                .instance_id
                .clone()
                .or_else(|| file.instance_id.clone())
                .unwrap_or_else(default_instance_id),
            batch_timeout: send_timeout + lease,
        });
        let metrics_interval = match args.metrics_interval {
            Some(interval) => interval,
            None => file
                .duration("metrics_interval", &file.metrics_interval)?
                .unwrap_or(Duration::from_secs(5)),
        };
        let mut client_options: Vec<(String, String)> = file
            .kafka
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        client_options.extend(args.kafka_options);
        let defaults = KafkaOptions::default();
        Ok(Self {
            database_url,
            mode,
            slot,
            publication,
            sink,
            kafka: KafkaOptions {
                brokers: brokers.unwrap_or(defaults.brokers),
                create_topics: !args.no_create_topics && file.create_topics.unwrap_or(true),
                topic_partitions: args
                    .topic_partitions
                    .or(file.topic_partitions)
                    .unwrap_or(defaults.topic_partitions),
                topic_replication_factor: args
                    .topic_replication_factor
                    .or(file.topic_replication_factor)
                    .unwrap_or(defaults.topic_replication_factor),
                send_timeout,
                client_options,
            },
            topic_template: args
                .topic_template
                .or_else(|| file.topic_template.clone())
                .unwrap_or_else(|| DEFAULT_TOPIC_TEMPLATE.to_owned()),
            source: SourceOptions {
                delete_on_publish,
                shards: shard_config,
            },
            relay: RelayOptions {
                batch_size,
                poll_interval,
                max_attempts,
                drain: args.drain,
                retention,
                shutdown_timeout: send_timeout,
                ..RelayOptions::default()
            },
            metrics_addr: args.metrics_addr.or(file.metrics_addr),
            metrics_interval,
        })
    }
}

/// Everything `cleanup` needs.
pub fn cleanup_retention(args: &CleanupArgs, file: &FileConfig) -> anyhow::Result<Retention> {
    let defaults = Retention::default();
    let keep_for = match args.older_than {
        Some(keep_for) => keep_for,
        None => file
            .duration("retention", &file.retention)?
            .unwrap_or(defaults.keep_for),
    };
    let batch_size = args
        .batch_size
        .or(file.cleanup_batch_size)
        .unwrap_or(defaults.batch_size);
    if batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
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
        assert_eq!(settings.sink, SinkKind::Stdout);
        assert_eq!(settings.topic_template, "outbox.event.{aggregatetype}");
        assert_eq!(settings.relay.poll_interval, Duration::from_millis(100));
        assert!(settings.kafka.create_topics);
        assert!(
            settings.source.shards.is_none(),
            "one relay per SQLite file"
        );
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
        assert_eq!(settings.sink, SinkKind::Kafka);
        assert_eq!(settings.kafka.brokers, "file:9092");
        assert_eq!(settings.relay.batch_size, 7);
        assert_eq!(settings.relay.poll_interval, Duration::from_secs(2));
        let shards = settings.source.shards.expect("PostgreSQL shares shards");
        assert_eq!((shards.count, shards.lease), (16, Duration::from_secs(10)));
        assert!(!settings.kafka.create_topics);
        assert_eq!(
            settings.kafka.client_options,
            [("compression.type".to_owned(), "lz4".to_owned())]
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
    fn bad_values_are_reported_by_name() {
        let file: FileConfig = toml::from_str(r#"retention = "a while""#).unwrap();
        let error = RunSettings::resolve(&global(None), RunArgs::default(), &file).unwrap_err();
        assert!(error.to_string().contains("`retention`"), "{error}");
        assert!(toml::from_str::<FileConfig>("bacth_size = 5").is_err());
    }
}
