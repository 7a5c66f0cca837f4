//! What each subcommand does, on resolved settings.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectOptions, Database, DbErr};
use sea_orm_migration::MigratorTrait;

use crate::cdc::slot::{self as cdc_slot, SlotStatus};
use crate::cdc::{CdcError, CdcOptions, CdcRelay};
use crate::cli::{
    CdcCommand, CleanupArgs, Cli, Command, DropSlotArgs, MigrateArgs, PartitionsArgs,
    PartitionsCommand, RetryArgs, RunMode, SinkKind, StatusArgs,
};
use crate::config::{
    FileConfig, RunSettings, RunSettingsError, SettingsError, SinkSettings, cleanup_retention,
    database_url, maintenance_settings, remember_credentials, slot_name,
};
use crate::database::Backend;
use crate::health::{self, Health};
use crate::message::TopicTemplate;
use crate::partitions::{self, Maintenance, Partition, PartitionError};
use crate::progress::Progress;
use crate::redact::{redact_text, redact_url};
use crate::relay::{Relay, RelayError, delete_published};
use crate::server;
use crate::shutdown::{Shutdown, ShutdownTrigger};
use crate::sink::Sink;
use crate::sink::kafka::{KafkaSetupError, KafkaSink};
use crate::sink::nats::{NatsSetupError, NatsSink};
use crate::sink::rabbitmq::{RabbitMqSetupError, RabbitMqSink};
use crate::sink::stdout::StdoutSink;
use crate::source::{self, Source, SourceError, SourceOptions, Status};

/// Why a subcommand failed. Each message is one line that names what
/// failed and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// A setting the relay cannot work with: a usage error.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// Run settings that are each valid but do not suit the database
    /// (CDC mode on a database other than PostgreSQL).
    #[error(transparent)]
    Unsuitable(RunSettingsError),
    /// The signal handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The Prometheus recorder could not be installed.
    #[error("cannot install the metrics recorder")]
    MetricsRecorder(#[source] metrics_exporter_prometheus::BuildError),
    /// The metrics and health endpoint could not listen.
    #[error("cannot serve metrics on {addr}")]
    Serve {
        /// The address asked for.
        addr: SocketAddr,
        /// Why it could not be bound.
        #[source]
        source: std::io::Error,
    },
    /// The database could not be reached (`migrate`, `cdc drop-slot`):
    /// the URL (credentials masked) and why, TLS failures named.
    #[error("{0}")]
    Connect(crate::tls::ConnectFailure),
    /// The migrations failed.
    #[error("migrating {url} failed")]
    Migrate {
        /// The URL, credentials masked.
        url: String,
        /// SeaORM's error.
        #[source]
        source: DbErr,
    },
    /// `cdc drop-slot` on a database other than PostgreSQL.
    #[error("replication slots exist on PostgreSQL only; the database URL is not postgres://")]
    NotPostgres,
    /// `partitions` on SQLite.
    #[error(
        "a day-partitioned outbox needs PostgreSQL or MariaDB/MySQL; SQLite has no table \
         partitioning"
    )]
    PartitionsNeedServer,
    /// Listing or maintaining partitions failed.
    #[error(transparent)]
    Partitions(#[from] PartitionError),
    /// The publication could not be dropped.
    #[error("cannot drop publication {publication}")]
    DropPublication {
        /// The publication.
        publication: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// `status --max-lag`: the oldest pending row is older than allowed.
    #[error("the oldest pending row is {age} old, over --max-lag {max_lag}")]
    Lagging {
        /// Its age, for humans.
        age: String,
        /// The limit, for humans.
        max_lag: String,
    },
    /// The status could not be written as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A source failed: connecting, claiming, marking, counting.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The Kafka sink could not be set up.
    #[error(transparent)]
    Kafka(#[from] KafkaSetupError),
    /// The RabbitMQ sink could not be set up.
    #[error(transparent)]
    RabbitMq(#[from] RabbitMqSetupError),
    /// The NATS JetStream sink could not be set up.
    #[error(transparent)]
    Nats(#[from] NatsSetupError),
    /// The polling relay stopped early.
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// CDC mode, or a replication slot command, failed.
    #[error(transparent)]
    Cdc(#[from] CdcError),
    /// A replay failed or stopped.
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
}

impl CommandError {
    /// Whether this is a usage error (a setting out of range), which the
    /// binary reports with clap's exit code for usage errors.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Settings(_))
    }
}

/// Settings errors of [`RunSettings::resolve`] stay usage errors; the rest
/// are settings that do not suit the database.
impl From<RunSettingsError> for CommandError {
    fn from(error: RunSettingsError) -> Self {
        match error {
            RunSettingsError::Settings(settings) => Self::Settings(settings),
            unsuitable => Self::Unsuitable(unsuitable),
        }
    }
}

/// Runs the parsed command line. Settings that cannot work fail with
/// [`CommandError::Settings`] before anything connects.
pub async fn execute(cli: Cli) -> Result<(), CommandError> {
    let file = FileConfig::load(cli.global.config.as_deref())?;
    // Before anything connects: drivers may echo a credential in their
    // own words from here on.
    remember_credentials(&cli, &file);
    match cli.command {
        Command::Run(args) => {
            let settings = RunSettings::resolve(&cli.global, *args, &file)?;
            run(settings).await
        }
        Command::Migrate(args) => migrate(&database_url(&cli.global, &file), &args).await,
        Command::Partitions(args) => {
            let maintenance = match &args.command {
                Some(PartitionsCommand::Maintain(maintain)) => {
                    Some((maintenance_settings(maintain, &file)?, maintain.json))
                }
                None => None,
            };
            partitions(&database_url(&cli.global, &file), &args, maintenance).await
        }
        Command::Status(args) => {
            let slot = slot_name(args.slot.clone(), &file)?;
            status(&database_url(&cli.global, &file), &args, &slot).await
        }
        Command::Cleanup(args) => cleanup(&database_url(&cli.global, &file), &args, &file).await,
        Command::Retry(args) => retry(&database_url(&cli.global, &file), &args).await,
        Command::Replay(args) => {
            crate::replay::command::execute(&database_url(&cli.global, &file), &args, &file).await
        }
        Command::Cdc(CdcCommand::DropSlot(args)) => {
            let slot = slot_name(args.slot.clone(), &file)?;
            drop_slot(&database_url(&cli.global, &file), &slot, &args).await
        }
    }
}

async fn run(settings: RunSettings) -> Result<(), CommandError> {
    let shutdown = Shutdown::on_signals().map_err(CommandError::Signals)?;
    // Installed first: joining the shards already records metrics.
    let metrics = match settings.metrics_addr {
        Some(_) => Some(
            crate::metrics::install(settings.output.sink.name())
                .map_err(CommandError::MetricsRecorder)?,
        ),
        None => None,
    };
    // Connecting the source joins the shard owners (PostgreSQL, MariaDB):
    // from here on, whatever ends the run, start-up failures included,
    // hands the shards over at once rather than when their lease expires.
    // CDC mode marks and retains rows through a PostgreSQL source of its own.
    let (source, postgres): (Arc<dyn source::Source>, _) = match settings.mode {
        RunMode::Poll => (
            Arc::from(source::connect(&settings.database_url, settings.source.clone()).await?),
            None,
        ),
        RunMode::Cdc => {
            let options = SourceOptions {
                delete_on_publish: settings.source.delete_on_publish,
                shards: None,
                creation_times: false,
                // Checked at start, as for polling; CDC reads them from the log.
                extra: settings.source.extra.clone(),
            };
            let postgres =
                Arc::new(source::connect_postgres(&settings.database_url, options).await?);
            (postgres.clone(), Some(postgres))
        }
    };
    let outcome = relay_from(settings, source.clone(), postgres, metrics, shutdown).await;
    source.close().await;
    outcome
}

/// Connects the sink and runs the relay on a connected source; the caller
/// closes the source however this ends.
async fn relay_from(
    settings: RunSettings,
    source: Arc<dyn Source>,
    postgres: Option<Arc<source::postgres::PostgresSource>>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    shutdown: Shutdown,
) -> Result<(), CommandError> {
    let sink = connect_sink(&settings.output).await?;
    tracing::info!(
        database = %redact_url(&settings.database_url),
        mode = ?settings.mode,
        sink = ?settings.output.sink,
        topics = %topics_shown(&settings.output),
        batch_size = settings.relay.batch_size,
        "relay started"
    );
    let health = settings
        .metrics_addr
        .is_some()
        .then(|| Arc::new(Health::default()));
    let keeper = keep_partitions(&settings, health.clone()).await?;
    if let (Some(addr), Some(metrics), Some(health)) = (settings.metrics_addr, metrics, health) {
        tokio::spawn(health::monitor(
            source.clone(),
            sink.clone(),
            health.clone(),
            settings.metrics_interval,
            shutdown.clone(),
        ));
        if let Err(source) = server::serve(addr, metrics, health, shutdown.clone()).await {
            if let Some(keeper) = keeper {
                keeper.close().await;
            }
            return Err(CommandError::Serve { addr, source });
        }
    }
    let topics = topics(&settings.output);
    let outcome = match postgres {
        None => Relay::new(source, sink, topics, settings.relay)
            .run(shutdown)
            .await
            .map_err(CommandError::from),
        Some(postgres) => {
            let options = CdcOptions {
                slot: settings.slot,
                publication: settings.publication,
                batch_size: settings.relay.batch_size,
                max_backoff: settings.relay.max_backoff,
                shutdown_timeout: settings.relay.shutdown_timeout,
                retention: settings.relay.retention,
                metrics_interval: settings.metrics_addr.map(|_| settings.metrics_interval),
                extra_columns: settings.source.extra.columns.clone(),
                ..CdcOptions::default()
            };
            CdcRelay::new(settings.database_url, postgres, sink, topics, options)
                .run(shutdown)
                .await
                .map_err(CommandError::from)
        }
    };
    if let Some(keeper) = keeper {
        keeper.close().await;
    }
    outcome
}

/// Connects the sink the settings name.
pub(crate) async fn connect_sink(output: &SinkSettings) -> Result<Arc<dyn Sink>, CommandError> {
    Ok(match output.sink {
        SinkKind::Stdout => Arc::new(StdoutSink),
        SinkKind::Kafka => Arc::new(KafkaSink::connect(output.kafka.clone()).await?),
        SinkKind::RabbitMq => Arc::new(RabbitMqSink::connect(output.rabbitmq.clone()).await?),
        SinkKind::Nats => Arc::new(NatsSink::connect(output.nats.clone()).await?),
    })
}

/// How rows become messages: the topic template, or the router's options.
pub(crate) fn topics(output: &SinkSettings) -> TopicTemplate {
    let mut topics = TopicTemplate::new(output.topic_template.clone());
    if let Some(router) = &output.router {
        topics = topics.with_router(router.clone());
    }
    if let Some(cloudevents) = &output.cloudevents {
        topics = topics.with_cloudevents(cloudevents.clone());
    }
    topics
}

/// Where messages go, for the logs.
pub(crate) fn topics_shown(output: &SinkSettings) -> String {
    match &output.router {
        Some(router) if router.routes() => format!("router: {router}"),
        _ => output.topic_template.clone(),
    }
}

/// Keeps a partitioned outbox's partitions while the relay runs.
struct PartitionKeeper {
    store: Arc<dyn partitions::Store>,
    stop: ShutdownTrigger,
    task: tokio::task::JoinHandle<()>,
}

impl PartitionKeeper {
    /// Stops keeping once the turn under way (a maintenance run, say) is
    /// over, then closes the store: never a turn cut short or run on a
    /// closed pool.
    async fn close(self) {
        self.stop.trigger();
        if let Err(error) = self.task.await {
            tracing::warn!(%error, "the partition keeper ended abnormally");
        }
        self.store.close().await;
    }
}

/// With a partitioned outbox, starts keeping its partitions (see
/// [`partitions::keep`]) until the returned keeper is closed.
/// `--partition-maintenance` on a plain outbox fails here, before anything
/// is published.
async fn keep_partitions(
    settings: &RunSettings,
    health: Option<Arc<Health>>,
) -> Result<Option<PartitionKeeper>, CommandError> {
    let Some(store) = partitions::connect(&settings.database_url).await? else {
        return Ok(None);
    };
    let store: Arc<dyn partitions::Store> = Arc::from(store);
    let partitioned = store
        .is_partitioned()
        .await
        .map_err(PartitionError::query("reading the outbox table's kind"))?;
    if !partitioned {
        store.close().await;
        return match settings.partition_maintenance {
            Some(_) => Err(PartitionError::NotPartitioned.into()),
            None => Ok(None),
        };
    }
    let check = match (&settings.metrics_addr, &settings.partition_maintenance) {
        (Some(_), _) => settings.metrics_interval,
        (None, Some(maintenance)) => maintenance.interval,
        (None, None) => Duration::from_secs(3600),
    };
    let (stop, stopped) = Shutdown::manual();
    let task = tokio::spawn(partitions::keep(
        store.clone(),
        settings.partition_maintenance.clone(),
        health,
        check,
        stopped,
    ));
    Ok(Some(PartitionKeeper { store, stop, task }))
}

async fn migrate(url: &str, args: &MigrateArgs) -> Result<(), CommandError> {
    // `mariadb://` is `mysql://` to the driver.
    let url = crate::database::DatabaseUrl::parse(url)
        .map(|parsed| parsed.driver_url())
        .unwrap_or_else(|_| url.to_owned());
    // Creating the tables may create the SQLite file as well.
    let url = if Backend::of(&url) == Some(Backend::Sqlite) && !url.contains("mode=") {
        format!("{url}{}mode=rwc", if url.contains('?') { '&' } else { '?' })
    } else {
        url
    };
    let mut options = ConnectOptions::new(&url);
    options
        .sqlx_logging(false)
        .connect_timeout(Duration::from_secs(10));
    let db = Database::connect(options).await.map_err(|error| {
        CommandError::Connect(crate::tls::ConnectFailure::of_db_err(&url, &error))
    })?;
    // Once partitioned, the history holds a migration the plain migrator
    // does not know: keep migrating with the partitioned one.
    let partitioned = args.partitioned || is_partitioned(&db).await;
    let migrated = if partitioned {
        outbox_migrations::PartitionedMigrator::up(&db, None).await
    } else {
        outbox_migrations::Migrator::up(&db, None).await
    };
    migrated.map_err(|source| CommandError::Migrate {
        url: redact_url(&url),
        source,
    })?;
    let layout = if partitioned {
        " (partitioned by day)"
    } else {
        ""
    };
    eprintln!(
        "the outbox tables in {} are up to date{layout}",
        redact_url(&url)
    );
    Ok(())
}

/// Whether `db` holds a partitioned outbox.
async fn is_partitioned(db: &sea_orm::DatabaseConnection) -> bool {
    use sea_orm::DbBackend;
    let partitioned = match db.get_database_backend() {
        DbBackend::Postgres => {
            partitions::postgres::is_partitioned(db.get_postgres_connection_pool()).await
        }
        DbBackend::MySql => partitions::mysql::is_partitioned(db.get_mysql_connection_pool()).await,
        _ => return false,
    };
    partitioned.unwrap_or(false)
}

async fn partitions(
    url: &str,
    args: &PartitionsArgs,
    maintenance: Option<((Duration, u32), bool)>,
) -> Result<(), CommandError> {
    let Some(store) = partitions::connect(url).await? else {
        return Err(CommandError::PartitionsNeedServer);
    };
    let done = partitions_with(store.as_ref(), args, maintenance).await;
    store.close().await;
    done
}

async fn partitions_with(
    store: &dyn partitions::Store,
    args: &PartitionsArgs,
    maintenance: Option<((Duration, u32), bool)>,
) -> Result<(), CommandError> {
    match maintenance {
        Some(((retain, ahead), json)) => {
            let done = partitions::maintain(store, retain, ahead).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&done)?);
            } else {
                eprint!("{}", maintenance_lines(&done));
            }
        }
        None => {
            let list = partitions::list(store).await?;
            let ahead = partitions::days_ahead(&partitions::ranges(&list), chrono::Utc::now());
            if args.json {
                let json = serde_json::json!({ "partitions": list, "days_ahead": ahead });
                println!("{}", serde_json::to_string_pretty(&json)?);
            } else {
                print!("{}", partitions_table(&list, ahead));
            }
        }
    }
    Ok(())
}

fn partitions_table(list: &[Partition], days_ahead: i64) -> String {
    let bound = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map_or_else(
            || "-".to_owned(),
            |at| at.format("%Y-%m-%d %H:%M").to_string(),
        )
    };
    let mut table = format!(
        "{:<24} {:<16} {:<16} {:>10} {:>8} {:>8} {:>10}\n",
        "partition", "from (UTC)", "to (UTC)", "rows", "pending", "dead", "size"
    );
    for partition in list {
        let (from, to) = if partition.default {
            ("default".to_owned(), String::new())
        } else {
            (bound(partition.from), bound(partition.to))
        };
        let rows = if partition.rows_estimated {
            format!("~{}", partition.rows)
        } else {
            partition.rows.to_string()
        };
        table.push_str(&format!(
            "{:<24} {:<16} {:<16} {:>10} {:>8} {:>8} {:>10}\n",
            partition.name,
            from,
            to,
            rows,
            partition.pending,
            partition.dead_letters,
            format_bytes(partition.bytes)
        ));
    }
    table.push_str(&format!(
        "\n{days_ahead} days from today have partitions; `outbox-relay partitions maintain` \
         creates the coming days'\n"
    ));
    table
}

fn maintenance_lines(done: &Maintenance) -> String {
    let mut lines = format!("created {} partitions\n", done.created);
    for dropped in &done.dropped {
        lines.push_str(&format!(
            "dropped {} ({} published rows) in {} ms, the outbox locked for {} ms\n",
            dropped.name,
            dropped.rows,
            (dropped.seconds * 1000.0).round(),
            (dropped.locked_seconds * 1000.0).round()
        ));
    }
    for kept in &done.kept {
        lines.push_str(&format!(
            "kept {}: {} ({} pending, {} dead letters)\n",
            kept.name, kept.reason, kept.pending, kept.dead_letters
        ));
    }
    if let Some(from) = done.claims_from {
        lines.push_str(&format!(
            "claims read the days from {} on; the days before are settled\n",
            from.format("%Y-%m-%d")
        ));
    }
    if done.default_rows > 0 {
        lines.push_str(&format!(
            "{} rows stay in the catch-all partition: no day partition can hold their creation \
             time\n",
            done.default_rows
        ));
    }
    lines
}

/// `bytes` in kB, MB or GB (powers of 1024), as PostgreSQL's
/// `pg_size_pretty` writes them.
fn format_bytes(bytes: i64) -> String {
    const UNITS: [&str; 4] = ["bytes", "kB", "MB", "GB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 10_240.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", value.round() as i64, UNITS[unit])
}

async fn status(url: &str, args: &StatusArgs, slot: &str) -> Result<(), CommandError> {
    let (mut status, slot) = if Backend::of(url) == Some(Backend::Postgres) {
        let postgres = source::connect_postgres(url, SourceOptions::default()).await?;
        let status = postgres.status().await?;
        (status, cdc_slot::slot_status(postgres.pool(), slot).await?)
    } else {
        let source = source::connect(url, SourceOptions::default()).await?;
        (source.status().await?, None)
    };
    let mut replays = recent_replays(url).await?;
    // Recorded errors are the brokers' and drivers' words.
    for error in status
        .dead_letter_rows
        .iter_mut()
        .filter_map(|row| row.last_error.as_mut())
        .chain(
            replays
                .iter_mut()
                .filter_map(|replay| replay.last_error.as_mut()),
        )
    {
        *error = redact_text(error);
    }
    if args.json {
        let mut json = serde_json::to_value(&status)?;
        if let Some(object) = json.as_object_mut() {
            if let Some(slot) = &slot {
                object.insert("cdc_slot".into(), serde_json::to_value(slot)?);
            }
            object.insert("replays".into(), serde_json::to_value(&replays)?);
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}", status_table(&status));
        if let Some(slot) = &slot {
            print!("{}", slot_table(slot));
        }
        print!("{}", crate::replay::command::replays_table(&replays));
    }
    if let (Some(max_lag), Some(age)) = (args.max_lag, status.backlog.oldest_pending_age_seconds)
        && age > max_lag.as_secs_f64()
    {
        return Err(CommandError::Lagging {
            age: format_age(age),
            max_lag: humantime::format_duration(max_lag).to_string(),
        });
    }
    Ok(())
}

/// How many replays `status` lists.
const REPLAYS_SHOWN: i64 = 5;

/// The latest replays' audit records; none before the replay tables exist.
async fn recent_replays(url: &str) -> Result<Vec<crate::replay::ReplayRecord>, CommandError> {
    let store = crate::replay::store::connect(url, &Default::default()).await?;
    let replays = store.recent(REPLAYS_SHOWN).await;
    store.close().await;
    Ok(replays.map_err(crate::replay::ReplayError::query("reading the replays"))?)
}

fn format_age(seconds: f64) -> String {
    let millis = (seconds.max(0.0) * 1000.0) as u64;
    humantime::format_duration(Duration::from_millis(millis)).to_string()
}

fn status_table(status: &Status) -> String {
    let backlog = &status.backlog;
    let age = |age: Option<f64>| age.map(format_age).unwrap_or_else(|| "-".to_owned());
    let mut table = format!(
        "pending          {}\noldest pending   {}\ndead letters     {}\npublished        {}\n",
        backlog.pending,
        age(backlog.oldest_pending_age_seconds),
        backlog.dead_letters,
        status.published
    );
    if !status.pending_by_type.is_empty() {
        table.push_str("\npending by aggregate type:\n");
        for row in &status.pending_by_type {
            table.push_str(&format!(
                "  {:<24} {:>8}  oldest {}\n",
                row.aggregate_type,
                row.pending,
                age(row.oldest_pending_age_seconds)
            ));
        }
    }
    if !status.dead_letter_rows.is_empty() {
        table.push_str("\ndead letters (oldest first; re-drive with `outbox-relay retry`):\n");
        for row in &status.dead_letter_rows {
            table.push_str(&format!(
                "  {}  {}/{}  {}  attempts {}  {}\n",
                row.id,
                row.aggregate_type,
                row.aggregate_id,
                row.event_type,
                row.attempts,
                row.last_error.as_deref().unwrap_or("-")
            ));
        }
    }
    if !status.shard_owners.is_empty() {
        table.push_str("\nshard owners:\n");
        for owner in &status.shard_owners {
            let lease = match owner.lease_expires_in_seconds {
                Some(seconds) if seconds >= 0.0 => format!("lease {} left", format_age(seconds)),
                Some(_) => "lease expired".to_owned(),
                None => "-".to_owned(),
            };
            table.push_str(&format!(
                "  {:<32} {:>3} shards  {}\n",
                owner.owner, owner.shards, lease
            ));
        }
    }
    table
}

fn slot_table(slot: &SlotStatus) -> String {
    let reader = match (slot.active, slot.active_pid) {
        (true, Some(pid)) => format!("read by server process {pid}"),
        (true, None) => "read".to_owned(),
        (false, _) => "not read by any relay".to_owned(),
    };
    let bytes = |value: Option<i64>| value.map_or_else(|| "-".to_owned(), |b| format!("{b} bytes"));
    format!(
        "\ncdc slot {}: {reader}\n  confirmed up to  {}\n  behind           {}\n  WAL retained     {}\n",
        slot.slot,
        slot.confirmed_flush_lsn.as_deref().unwrap_or("-"),
        bytes(slot.behind_bytes),
        bytes(slot.retained_wal_bytes),
    )
}

async fn drop_slot(url: &str, slot: &str, args: &DropSlotArgs) -> Result<(), CommandError> {
    if Backend::of(url) != Some(Backend::Postgres) {
        return Err(CommandError::NotPostgres);
    }
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|error| CommandError::Connect(crate::tls::ConnectFailure::new(url, &error)))?;
    if cdc_slot::drop_slot(&pool, slot).await? {
        eprintln!("dropped replication slot {slot}");
    } else {
        eprintln!("there is no replication slot {slot} in this database");
    }
    if let Some(publication) = &args.publication {
        cdc_slot::check_name("--publication", publication)?;
        // `publication` passed check_name: it needs no quoting.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP PUBLICATION IF EXISTS {publication}"
        )))
        .execute(&pool)
        .await
        .map_err(|source| CommandError::DropPublication {
            publication: publication.clone(),
            source,
        })?;
        eprintln!("dropped publication {publication}");
    }
    pool.close().await;
    Ok(())
}

async fn cleanup(url: &str, args: &CleanupArgs, file: &FileConfig) -> Result<(), CommandError> {
    let retention = cleanup_retention(args, file)?;
    let source = source::connect(url, SourceOptions::default()).await?;
    let shutdown = Shutdown::on_signals().map_err(CommandError::Signals)?;
    let mut progress = Progress::new("published rows deleted");
    delete_published(source.as_ref(), &retention, &shutdown, |deleted| {
        progress.add(deleted)
    })
    .await?;
    let deleted = progress.finish();
    eprintln!(
        "deleted {deleted} published rows older than {}",
        humantime::format_duration(retention.keep_for)
    );
    Ok(())
}

/// Rows per re-drive statement, so no statement holds locks for long.
const REDRIVE_BATCH: u64 = 1000;

async fn retry(url: &str, args: &RetryArgs) -> Result<(), CommandError> {
    let source = source::connect(url, SourceOptions::default()).await?;
    let mut progress = Progress::new("dead letters re-driven");
    loop {
        let redriven = source
            .redrive(&args.ids, args.aggregate_type.as_deref(), REDRIVE_BATCH)
            .await?;
        progress.add(redriven);
        if redriven < REDRIVE_BATCH {
            break;
        }
    }
    let redriven = progress.finish();
    eprintln!("{redriven} dead-lettered events are pending again");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_errors_stay_usage_errors_and_causes_print_on_one_line() {
        let missing = std::path::Path::new("/nonexistent/outbox-relay.toml");
        let settings = FileConfig::load(Some(missing)).unwrap_err();
        assert!(CommandError::from(settings).is_usage());
        let settings = FileConfig::load(Some(missing)).unwrap_err();
        let resolved = CommandError::from(RunSettingsError::from(settings));
        assert!(resolved.is_usage(), "{resolved}");
        let unsuitable = CommandError::from(RunSettingsError::CdcNeedsPostgres {
            scheme: "mysql".into(),
        });
        assert!(!unsuitable.is_usage());
        assert_eq!(
            unsuitable.to_string(),
            "--mode cdc reads PostgreSQL's write-ahead log, but the database is mysql; \
             use --mode poll"
        );

        let signals = CommandError::Signals(std::io::Error::other("no signal driver"));
        assert!(matches!(signals, CommandError::Signals(_)));
        assert_eq!(
            format!("{:#}", anyhow::Error::from(signals)),
            "cannot install signal handlers: no signal driver"
        );
    }

    #[test]
    fn slot_table_reads_well() {
        let table = slot_table(&SlotStatus {
            slot: "outbox_relay".into(),
            active: true,
            active_pid: Some(4242),
            confirmed_flush_lsn: Some("0/16B6C50".into()),
            behind_bytes: Some(0),
            retained_wal_bytes: Some(2048),
        });
        assert_eq!(
            table,
            "\ncdc slot outbox_relay: read by server process 4242\n  confirmed up to  0/16B6C50\n  \
             behind           0 bytes\n  WAL retained     2048 bytes\n"
        );
    }

    #[test]
    fn status_table_reads_well() {
        let table = status_table(&Status {
            backlog: crate::source::Backlog {
                pending: 3,
                oldest_pending_age_seconds: Some(62.5),
                dead_letters: 1,
            },
            published: 10,
            pending_by_type: vec![crate::source::TypeBacklog {
                aggregate_type: "Order".into(),
                pending: 3,
                oldest_pending_age_seconds: Some(62.5),
            }],
            dead_letter_rows: vec![crate::source::DeadLetter {
                id: "e-1".into(),
                aggregate_type: "Order".into(),
                aggregate_id: "7".into(),
                event_type: "OrderPlaced".into(),
                attempts: 10,
                last_error: Some("message too large".into()),
            }],
            shard_owners: vec![crate::source::ShardOwner {
                owner: "relay-a".into(),
                shards: 16,
                lease_expires_in_seconds: Some(8.0),
            }],
        });
        assert_eq!(
            table,
            "pending          3\noldest pending   1m 2s 500ms\ndead letters     1\npublished        10\n\
             \npending by aggregate type:\n  Order                           3  oldest 1m 2s 500ms\n\
             \ndead letters (oldest first; re-drive with `outbox-relay retry`):\n  \
             e-1  Order/7  OrderPlaced  attempts 10  message too large\n\
             \nshard owners:\n  relay-a                           16 shards  lease 8s left\n"
        );
    }
}
