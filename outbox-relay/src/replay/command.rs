//! The `replay` command on resolved settings: select (or resume), show,
//! confirm, plan, send.

use std::io::{BufRead, IsTerminal, Write};

use super::store::{self, NewReplay, ReplayRecord, Store};
use super::{ReplayError, Selection, Summary};
use crate::cli::ReplayArgs;
use crate::commands::{CommandError, connect_sink, topics};
use crate::config::{FileConfig, ReplaySettings};
use crate::partitions;
use crate::shutdown::Shutdown;

/// Runs `outbox-relay replay` on the database of `url`.
pub async fn execute(url: &str, args: &ReplayArgs, file: &FileConfig) -> Result<(), CommandError> {
    // The columns the router reads besides the outbox's own are read with
    // each planned event (with or without `--to`).
    let extra = crate::config::SinkSettings::for_replay(&args.output, file)?
        .router
        .map(|router| router.extra_columns().clone())
        .unwrap_or_default();
    let store = store::connect(url, &extra).await?;
    let done = execute_with(store.as_ref(), url, args, file).await;
    store.close().await;
    done
}

async fn execute_with(
    store: &dyn Store,
    url: &str,
    args: &ReplayArgs,
    file: &FileConfig,
) -> Result<(), CommandError> {
    // The sink is connected before the replay is marked running, so that
    // a broker that cannot be reached leaves nothing to wait for.
    let (replay, settings, sink) = match &args.resume {
        Some(id) => {
            let replay = resumable(store, id).await?;
            let settings = ReplaySettings::resolve(args, replay.topic.as_deref(), file)?;
            let sink = connect_sink(&settings.output).await?;
            if !store
                .restart(id)
                .await
                .map_err(ReplayError::query("resuming the replay"))?
            {
                return Err(ReplayError::AlreadyDone(id.to_owned()).into());
            }
            (replay, settings, sink)
        }
        None => {
            let settings = ReplaySettings::resolve(args, args.to.as_deref(), file)?;
            let selection = selection(url, args).await?;
            if !preview(store, args, &settings, &selection).await? {
                return Ok(());
            }
            let sink = connect_sink(&settings.output).await?;
            let replay = plan(store, args, &settings, &selection).await?;
            (replay, settings, sink)
        }
    };
    let shutdown = Shutdown::on_signals().map_err(CommandError::Signals)?;
    eprintln!(
        "replay {}: sending {} of {} events to {}",
        replay.id,
        replay.planned - replay.sent,
        replay.planned,
        replay.destination
    );
    let id = replay.id.clone();
    let replay = super::send(
        store,
        sink.as_ref(),
        &topics(&settings.output),
        replay,
        &settings.pace,
        &shutdown,
    )
    .await?;
    let record = store
        .load(&id)
        .await
        .map_err(ReplayError::query("reading the replay's record"))?
        .unwrap_or(replay);
    eprintln!(
        "replay {} done: {} events sent to {}{}",
        record.id,
        record.sent,
        record.destination,
        match record.planned - record.sent {
            0 => String::new(),
            gone => format!(" ({gone} planned events were no longer in the outbox)"),
        }
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    }
    Ok(())
}

/// The replay `id`, if it can be resumed.
async fn resumable(store: &dyn Store, id: &str) -> Result<ReplayRecord, ReplayError> {
    let replay = store
        .load(id)
        .await
        .map_err(ReplayError::query("reading the replay's record"))?
        .ok_or_else(|| ReplayError::NotFound(id.to_owned()))?;
    if replay.state == super::State::Done.as_str() {
        return Err(ReplayError::AlreadyDone(id.to_owned()));
    }
    if replay.state == super::State::Running.as_str()
        && replay.idle_seconds < super::RUNNING_WITHIN.as_secs_f64()
    {
        return Err(ReplayError::StillRunning {
            id: id.to_owned(),
            idle_seconds: replay.idle_seconds,
        });
    }
    Ok(replay)
}

/// The selection of the command line; `--partition` becomes the
/// partition's day.
async fn selection(url: &str, args: &ReplayArgs) -> Result<Selection, CommandError> {
    let selection = Selection {
        aggregate_types: args.aggregate_types.clone(),
        aggregate_ids: args.aggregate_ids.clone(),
        event_types: args.event_types.clone(),
        since: args.since,
        until: args.until,
        from_id: args.from_id.clone(),
        to_id: args.to_id.clone(),
    };
    let Some(name) = &args.partition else {
        return Ok(selection);
    };
    let Some(partition_store) = partitions::connect(url).await? else {
        return Err(CommandError::PartitionsNeedServer);
    };
    let listed = partitions::list(partition_store.as_ref()).await;
    partition_store.close().await;
    let partition = listed?
        .into_iter()
        .find(|partition| &partition.name == name)
        .ok_or_else(|| ReplayError::UnknownPartition(name.clone()))?;
    if partition.default || (partition.from.is_none() && partition.to.is_none()) {
        return Err(ReplayError::UnboundedPartition(name.clone()).into());
    }
    Ok(selection.within(partition.from, partition.to))
}

/// Shows the selection (a dry run) or confirms it; whether to go on:
/// not after a dry run, nor for an empty selection.
async fn preview(
    store: &dyn Store,
    args: &ReplayArgs,
    settings: &ReplaySettings,
    selection: &Selection,
) -> Result<bool, CommandError> {
    let summary = store
        .summarize(selection)
        .await
        .map_err(ReplayError::query("reading the selection"))?;
    if args.dry_run {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        } else {
            print!("{}", summary_table(&summary, selection));
        }
        return Ok(false);
    }
    if summary.events == 0 {
        eprintln!(
            "no published event matches ({}); nothing to replay",
            selection.describe()
        );
        return Ok(false);
    }
    if summary.events as u64 > settings.confirm_over && !args.yes {
        confirm(&summary, settings.confirm_over)?;
    }
    Ok(true)
}

/// Plans a new replay of `selection`; returns its record.
async fn plan(
    store: &dyn Store,
    args: &ReplayArgs,
    settings: &ReplaySettings,
    selection: &Selection,
) -> Result<ReplayRecord, ReplayError> {
    let id = new_id();
    let new = NewReplay {
        id: id.clone(),
        requested_by: requested_by(),
        selection: match &args.partition {
            Some(partition) => format!("--partition {partition} ({})", selection.describe()),
            None => selection.describe(),
        },
        destination: format!(
            "{} {}",
            settings.output.sink.name(),
            crate::commands::topics_shown(&settings.output)
        ),
        topic: args.to.clone(),
    };
    store
        .plan(&new, selection)
        .await
        .map_err(ReplayError::query("planning the replay"))?;
    store
        .load(&id)
        .await
        .map_err(ReplayError::query("reading the replay's record"))?
        .ok_or(ReplayError::NotFound(id))
}

/// Asks on a terminal; elsewhere, fails asking for `--yes`.
fn confirm(summary: &Summary, threshold: u64) -> Result<(), ReplayError> {
    let refused = ReplayError::NeedsConfirmation {
        events: summary.events,
        threshold,
    };
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return Err(refused);
    }
    eprint!(
        "replay {} events of {} aggregates? [y/N] ",
        summary.events, summary.aggregates
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return Err(refused);
    }
    match answer.trim() {
        "y" | "Y" | "yes" => Ok(()),
        _ => Err(ReplayError::Declined),
    }
}

/// A new replay's id: its start time and a random suffix.
fn new_id() -> String {
    let random = uuid::Uuid::now_v7().simple().to_string();
    format!(
        "{}-{}",
        chrono::Utc::now().format("%Y%m%d-%H%M%S"),
        &random[random.len() - 6..]
    )
}

/// `user@host` of this process, for the audit record.
fn requested_by() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host = crate::source::shards::host_name().unwrap_or_else(|| "localhost".to_owned());
    format!("{user}@{host}")
}

/// A dry run's report.
fn summary_table(summary: &Summary, selection: &Selection) -> String {
    let mut table = format!(
        "would replay {} events of {} aggregates ({})\n",
        summary.events,
        summary.aggregates,
        selection.describe()
    );
    if let (Some(first), Some(last)) = (&summary.first_created, &summary.last_created) {
        table.push_str(&format!("created from {first} to {last}\n"));
    }
    if !summary.by_type.is_empty() {
        table.push_str("\nby aggregate type:\n");
        for row in &summary.by_type {
            table.push_str(&format!(
                "  {:<32} {:>10}\n",
                row.aggregate_type, row.events
            ));
        }
    }
    if !summary.largest.is_empty() {
        table.push_str("\nlargest aggregates:\n");
        for row in &summary.largest {
            table.push_str(&format!(
                "  {:<48} {:>10}\n",
                format!("{}/{}", row.aggregate_type, row.aggregate_id),
                row.events
            ));
        }
        if summary.aggregates > summary.largest.len() as i64 {
            table.push_str(&format!(
                "  ... and {} more\n",
                summary.aggregates - summary.largest.len() as i64
            ));
        }
    }
    table
}

/// `status`'s lines for the latest replays.
pub fn replays_table(replays: &[ReplayRecord]) -> String {
    if replays.is_empty() {
        return String::new();
    }
    let mut table = "\nreplays (latest first):\n".to_owned();
    for replay in replays {
        table.push_str(&format!(
            "  {}  {}  {} of {} sent  by {} at {}  {}  -> {}{}\n",
            replay.id,
            replay.state,
            replay.sent,
            replay.planned,
            replay.requested_by,
            replay.started_at,
            replay.selection,
            replay.destination,
            replay
                .last_error
                .as_deref()
                .map(|error| format!("  ({error})"))
                .unwrap_or_default()
        ));
    }
    table
}
