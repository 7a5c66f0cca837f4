//! `outbox-relay replay`: sends already published events again, to the
//! relay's own topics or to another (`--to`), for a consumer that lost its
//! state.
//!
//! A replay first writes its plan, in one transaction: the selected
//! published events, each aggregate's in the order the relay sends them
//! (rows written by plain SQL first, then by `aggregate_seq`, ties by
//! `seq`), numbered 1, 2, 3, ... in `outbox_replay_row`, and its audit
//! record in `outbox_replay`. It then sends the plan in chunks, in that
//! order, waiting for every acknowledgement of a chunk before it records
//! the chunk as sent, so an interrupted replay resumes after the last
//! chunk acknowledged (`--resume ID`; a chunk in flight is sent again).
//! Each copy keeps the event's id, key, headers and payload and carries
//! the `replayId` header.
//!
//! The live relay is never disturbed: a replay reads published rows only
//! and marks nothing, so the relay claims, orders and marks pending rows
//! exactly as without it, and the live stream of each aggregate keeps its
//! order. Replayed copies are extra messages beside it: within an
//! aggregate they are in order among themselves, but on the relay's own
//! topics they may fall between live events of the same aggregate. An
//! inbox that applied an event drops its copy as a duplicate (same id); a
//! consumer that rebuilds its state reads a replay sent `--to` a topic of
//! its own, then the live topics, deduplicating by id.

pub mod command;
pub mod store;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::contract::headers;
use crate::message::{Message, TopicTemplate};
use crate::progress::Progress;
use crate::record::OutboxRecord;
use crate::shutdown::Shutdown;
use crate::sink::{FailureKind, Sink};
use crate::source::SourceError;
pub use store::{ReplayRecord, Store};

/// How many of the largest aggregates a dry run lists.
pub const AGGREGATES_SHOWN: i64 = 20;

/// A replay whose audit record shows progress more recently than this is
/// taken to be still running, and is not resumed.
pub const RUNNING_WITHIN: Duration = Duration::from_secs(60);

/// Sends of a chunk's messages before the replay stops with the error.
const SEND_ATTEMPTS: u32 = 8;

/// The longest pause between two sends of a chunk's failed messages.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Which published events a replay sends again. Every condition given
/// must hold; lists hold when any of their values does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// `aggregatetype` is one of these.
    pub aggregate_types: Vec<String>,
    /// `aggregateid` is one of these.
    pub aggregate_ids: Vec<String>,
    /// `type` is one of these.
    pub event_types: Vec<String>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// The event id is at least this one.
    pub from_id: Option<String>,
    /// The event id is at most this one.
    pub to_id: Option<String>,
}

impl Selection {
    /// The selection as command-line options, for the audit record.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        for (flag, values) in [
            ("--aggregate-type", &self.aggregate_types),
            ("--aggregate-id", &self.aggregate_ids),
            ("--event-type", &self.event_types),
        ] {
            parts.extend(values.iter().map(|value| format!("{flag} {value}")));
        }
        for (flag, time) in [("--since", &self.since), ("--until", &self.until)] {
            if let Some(time) = time {
                parts.push(format!("{flag} {}", rfc3339(time)));
            }
        }
        for (flag, id) in [("--from-id", &self.from_id), ("--to-id", &self.to_id)] {
            if let Some(id) = id {
                parts.push(format!("{flag} {id}"));
            }
        }
        if parts.is_empty() {
            "every published event".to_owned()
        } else {
            parts.join(" ")
        }
    }

    /// Narrows the creation time to `[from, to)` as well.
    pub fn within(mut self, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Self {
        self.since = self.since.max(from);
        self.until = match (self.until, to) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self
    }
}

/// A time as RFC 3339 text in UTC, with microseconds.
pub fn rfc3339(time: &DateTime<Utc>) -> String {
    time.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// What a selection holds, for a dry run and the confirmation.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Published events selected.
    pub events: i64,
    /// Aggregates they belong to.
    pub aggregates: i64,
    /// The earliest creation time among them (RFC 3339).
    pub first_created: Option<String>,
    /// The latest creation time among them.
    pub last_created: Option<String>,
    /// Events per aggregate type, most first.
    pub by_type: Vec<TypeCount>,
    /// The aggregates with the most events (at most [`AGGREGATES_SHOWN`]).
    pub largest: Vec<AggregateCount>,
}

/// Events of one aggregate type.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TypeCount {
    /// `aggregatetype`.
    pub aggregate_type: String,
    /// Events.
    pub events: i64,
}

/// Events of one aggregate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AggregateCount {
    /// `aggregatetype`.
    pub aggregate_type: String,
    /// `aggregateid`.
    pub aggregate_id: String,
    /// Events.
    pub events: i64,
}

/// Where a replay stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Sending.
    Running,
    /// Stopped by a signal; can be resumed.
    Interrupted,
    /// Stopped by an error; can be resumed.
    Failed,
    /// Every planned event sent.
    Done,
}

impl State {
    /// The name the audit record holds.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
            Self::Done => "done",
        }
    }
}

/// Why a replay failed. Each message is one line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// A statement failed.
    #[error("replay: {what} failed: {source}")]
    Query {
        /// What was being done.
        what: &'static str,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// Reading the plan failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The replay tables are missing.
    #[error("the replay tables do not exist; create them with `outbox-relay migrate`")]
    MissingTables,
    /// `--resume` names no replay.
    #[error("there is no replay {0}; `outbox-relay status` lists the latest")]
    NotFound(String),
    /// `--resume` names a finished replay.
    #[error("replay {0} is done; start a new one to send its events again")]
    AlreadyDone(String),
    /// `--resume` names a replay that recorded progress moments ago.
    #[error(
        "replay {id} is running (it recorded progress {idle_seconds:.0}s ago); stop it first, or \
         wait a minute if it was killed"
    )]
    StillRunning {
        /// The replay.
        id: String,
        /// Seconds since its last progress.
        idle_seconds: f64,
    },
    /// Over the confirmation threshold without `--yes`.
    #[error(
        "the replay would send {events} events, over --confirm-over {threshold}; check them with \
         --dry-run, then run again with --yes"
    )]
    NeedsConfirmation {
        /// Events selected.
        events: i64,
        /// The threshold.
        threshold: u64,
    },
    /// `--partition` names no partition.
    #[error("there is no partition {0}; `outbox-relay partitions` lists them")]
    UnknownPartition(String),
    /// `--partition` names the catch-all partition.
    #[error("partition {0} has no day range; select its events by time with --since and --until")]
    UnboundedPartition(String),
    /// Declined at the prompt.
    #[error("replay cancelled; nothing was sent")]
    Declined,
    /// A message could not be sent.
    #[error(
        "replay {id} stopped after {sent} of {planned} events: {reason}; resume it with \
         `outbox-relay replay --resume {id}`"
    )]
    Send {
        /// The replay.
        id: String,
        /// Events sent and acknowledged.
        sent: i64,
        /// Events planned.
        planned: i64,
        /// The broker's reason.
        reason: String,
    },
    /// Stopped by a signal.
    #[error(
        "replay {id} interrupted after {sent} of {planned} events; resume it with \
         `outbox-relay replay --resume {id}`"
    )]
    Interrupted {
        /// The replay.
        id: String,
        /// Events sent and acknowledged.
        sent: i64,
        /// Events planned.
        planned: i64,
    },
}

impl ReplayError {
    pub(crate) fn query(what: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| {
            if crate::source::is_missing_table(&source) {
                Self::MissingTables
            } else {
                Self::Query { what, source }
            }
        }
    }
}

/// How a replay sends.
#[derive(Debug, Clone)]
pub struct Pace {
    /// Events read and sent at once.
    pub chunk: i64,
    /// Events per second at most.
    pub rate: Option<u64>,
}

impl Pace {
    /// The chunk size: at most a second's worth of events at the rate, so
    /// that the audit record shows progress at least every second or so.
    fn chunk(&self) -> i64 {
        match self.rate {
            Some(rate) => self.chunk.min(rate.max(1) as i64),
            None => self.chunk,
        }
    }
}

/// The message of a replayed event: as the relay sent it, plus the
/// `replayId` header.
pub fn message<'a>(topics: &TopicTemplate, record: &'a OutboxRecord, replay: &str) -> Message<'a> {
    let mut message = topics.message(record);
    message
        .headers
        .push((headers::REPLAY_ID, replay.to_owned().into()));
    message
}

/// Why a replay stopped before its end.
enum Stop {
    /// A signal asked it to.
    Interrupted,
    /// A chunk was not acknowledged, for this reason.
    Failed(String),
}

/// Sends replay `replay`'s plan from where it stands, chunk by chunk,
/// recording each acknowledged chunk; returns the record as it ended.
pub async fn send(
    store: &dyn Store,
    sink: &dyn Sink,
    topics: &TopicTemplate,
    mut replay: ReplayRecord,
    pace: &Pace,
    shutdown: &Shutdown,
) -> Result<ReplayRecord, ReplayError> {
    let started = Instant::now();
    let mut sent_now: u64 = 0;
    let mut missing: u64 = 0;
    let mut progress = Progress::new("events replayed");
    let outcome = loop {
        if shutdown.is_requested() {
            break Err(Stop::Interrupted);
        }
        if replay.last_ordinal >= replay.planned {
            break Ok(());
        }
        let upto = replay.planned.min(replay.last_ordinal + pace.chunk());
        let chunk = store.chunk(&replay.id, replay.last_ordinal, upto).await?;
        let messages: Vec<Message> = chunk
            .records
            .iter()
            .map(|record| message(topics, record, &replay.id))
            .collect();
        if let Err(reason) = publish(sink, messages, shutdown).await {
            break Err(Stop::Failed(reason));
        }
        replay.sent += chunk.records.len() as i64;
        replay.last_ordinal = chunk.last_ordinal;
        missing += chunk.missing;
        store
            .advance(&replay.id, replay.last_ordinal, replay.sent)
            .await
            .map_err(ReplayError::query("recording progress"))?;
        sent_now += chunk.records.len() as u64;
        progress.add(chunk.records.len() as u64);
        if let Some(rate) = pace.rate {
            let due = started + Duration::from_secs_f64(sent_now as f64 / rate.max(1) as f64);
            tokio::select! {
                _ = tokio::time::sleep_until(due.into()) => {}
                _ = shutdown.requested() => {}
            }
        }
    };
    progress.finish();
    if missing > 0 {
        tracing::warn!(
            replay = %replay.id,
            missing,
            "planned events were deleted (retention) or could not be read since the plan was \
             made; they were not replayed"
        );
    }
    ended(store, replay, outcome).await
}

/// Records how `replay` ended and reports it.
async fn ended(
    store: &dyn Store,
    mut replay: ReplayRecord,
    outcome: Result<(), Stop>,
) -> Result<ReplayRecord, ReplayError> {
    let (state, reason) = match &outcome {
        Ok(()) => (State::Done, None),
        Err(Stop::Interrupted) => (State::Interrupted, None),
        Err(Stop::Failed(reason)) => (State::Failed, Some(reason.as_str())),
    };
    store
        .finish(&replay.id, state, reason)
        .await
        .map_err(ReplayError::query("recording the end"))?;
    replay.state = state.as_str().to_owned();
    match outcome {
        Ok(()) => Ok(replay),
        Err(Stop::Interrupted) => Err(ReplayError::Interrupted {
            id: replay.id,
            sent: replay.sent,
            planned: replay.planned,
        }),
        Err(Stop::Failed(reason)) => Err(ReplayError::Send {
            id: replay.id,
            sent: replay.sent,
            planned: replay.planned,
            reason,
        }),
    }
}

/// Sends `messages` until every one is acknowledged, sending the failed
/// ones again (each aggregate's still in order: the sink holds back an
/// aggregate's messages behind its failed one) after a growing pause, at
/// most [`SEND_ATTEMPTS`] times.
async fn publish(
    sink: &dyn Sink,
    mut messages: Vec<Message<'_>>,
    shutdown: &Shutdown,
) -> Result<(), String> {
    let mut pause = Duration::from_millis(500);
    for attempt in 1..=SEND_ATTEMPTS {
        let outcomes = sink.publish(&messages).await;
        let mut reason = None;
        let mut failed = Vec::new();
        for (message, outcome) in messages.into_iter().zip(outcomes) {
            if let Err(error) = outcome {
                if error.kind == FailureKind::Closed {
                    return Err(error.reason);
                }
                if error.kind != FailureKind::HeldBack {
                    reason.get_or_insert(error.reason);
                }
                failed.push(message);
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        let reason = reason.unwrap_or_else(|| "held back".to_owned());
        if attempt == SEND_ATTEMPTS || shutdown.is_requested() {
            return Err(reason);
        }
        tracing::warn!(failed = failed.len(), attempt, %reason, "replayed events not acknowledged; sending them again");
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.requested() => return Err(reason),
        }
        pause = (pause * 2).min(MAX_BACKOFF);
        messages = failed;
    }
    unreachable!("the last attempt returns")
}
