//! CDC mode: publishing the outbox table's inserts from PostgreSQL's
//! write-ahead log, through a logical replication slot (plugin `pgoutput`)
//! and a publication limited to the table's inserts ([`slot`]).
//!
//! Committed transactions arrive in commit order; their inserts into the
//! outbox table are decoded ([`pgoutput`]) into the records the polling
//! relay reads, so the messages are the same. One batch of whole
//! transactions is in flight at a time, and the slot's confirmed position
//! advances past a transaction only once the sink acknowledged every one of
//! its messages: a crash or restart republishes from there (at-least-once),
//! never skips. A message the broker refuses is sent again, with backoff,
//! before anything after it is confirmed.
//!
//! Rows still present after publishing are marked published (or deleted
//! with `--delete-on-publish`), so `status`, the backlog metrics and
//! retention work as in polling mode; rows the application deleted in the
//! transaction that inserted them (the insert+delete idiom) are published
//! all the same.
//!
//! One relay reads a slot at a time; another one started on the same slot
//! stands by and takes over when the first stops, dies or stops making
//! progress. The reader sends the server a status update every half second
//! from a task of its own, whatever the sink does; a standby checks once a
//! second whether the reader's server process took one in lately and,
//! after [`READER_SILENCE`] without any while that process waits on its
//! client, ends the reader's replication session (`pg_terminate_backend`)
//! and reads the slot: within [`TAKEOVER_BOUND`] of the reader stopping.
//! Before it hands a batch to the sink, a reader checks that its own server
//! process still holds the slot, so one that lost it (paused, then resumed)
//! sends nothing more; what was handed over before the pause may still go
//! out.

mod error;
pub mod pgoutput;
pub mod slot;

pub use error::{CdcError, OBJECT_IN_USE, sqlstate};

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};

use crate::message::{Message, TopicTemplate};
use crate::metrics;
use crate::record::OutboxRecord;
use crate::relay::{Backoff, INITIAL_BACKOFF, RelayError, Retention, run_retention};
use crate::shutdown::Shutdown;
use crate::sink::{FailureKind, Sink};
use crate::source::Settlement;
use crate::source::postgres::PostgresSource;

/// A reader whose server process took in no status update from it for
/// this long, while waiting on it, has stopped making progress (paused,
/// frozen, cut off, killed without its connection closing): a standby ends
/// its replication session and takes the slot over. A live reader sends one
/// every status interval (half a second), whether or not the sink answers.
pub const READER_SILENCE: Duration = Duration::from_secs(5);

/// Within this long of a reader stopping to make progress, a standby reads
/// the slot: the silence, a second of checks either side, and the takeover.
pub const TAKEOVER_BOUND: Duration = Duration::from_secs(10);

/// An answer that the slot is still this session's is only trusted if it
/// came this soon after the question (a pause in between makes it stale).
const OWNERSHIP_FRESH: Duration = Duration::from_secs(1);

/// How CDC mode runs.
#[derive(Debug, Clone)]
pub struct CdcOptions {
    /// The replication slot, created if missing.
    pub slot: String,
    /// The publication of the outbox table's inserts, created if missing.
    pub publication: String,
    /// Messages sent at once (whole transactions: a larger transaction
    /// makes a larger batch).
    pub batch_size: usize,
    /// How often a standby relay checks whether the slot became free or its
    /// reader went silent.
    pub standby_retry: Duration,
    /// How often acknowledged positions are reported to the server.
    pub status_interval: Duration,
    /// After this long without any message from the server, a heartbeat
    /// is written to the WAL so that the slot's position keeps advancing.
    pub heartbeat_interval: Duration,
    /// Longest pause between resends and reconnects.
    pub max_backoff: Duration,
    /// How long to wait for the batch in flight at shutdown.
    pub shutdown_timeout: Duration,
    /// Periodic deletion of published rows; `None` keeps them.
    pub retention: Option<Retention>,
    /// How often the slot gauges are sampled; `None` records none.
    pub metrics_interval: Option<Duration>,
}

impl Default for CdcOptions {
    fn default() -> Self {
        Self {
            slot: slot::DEFAULT_NAME.to_owned(),
            publication: slot::DEFAULT_NAME.to_owned(),
            batch_size: 500,
            standby_retry: Duration::from_secs(1),
            status_interval: Duration::from_millis(500),
            heartbeat_interval: Duration::from_secs(10),
            max_backoff: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(30),
            retention: Some(Retention::default()),
            metrics_interval: None,
        }
    }
}

/// Publishes the outbox table's inserts read from a replication slot.
pub struct CdcRelay {
    database_url: String,
    source: Arc<PostgresSource>,
    sink: Arc<dyn Sink>,
    topics: TopicTemplate,
    options: CdcOptions,
}

/// Why a replication session ended.
enum SessionEnd {
    /// Shutdown was requested.
    Stopped,
    /// Another relay reads the slot.
    SlotInUse,
    /// Another relay took the slot over while this one was reading it.
    SlotLost,
    /// The sink can take no more messages.
    SinkClosed(String),
    /// The session could not start.
    NotStarted(CdcError),
    /// The session broke after it started.
    Broken(CdcError),
}

/// A committed transaction with inserts into the outbox table.
struct Committed {
    records: Vec<OutboxRecord>,
    /// The transaction's commit time, in microseconds since the Unix epoch.
    commit_time_micros: i64,
    /// Confirmable once the records are acknowledged.
    end_lsn: Lsn,
}

/// Why a batch was not delivered.
enum Undelivered {
    /// The sink closed, for this reason.
    SinkClosed(String),
    /// Another relay reads the slot now: nothing more is sent.
    SlotLost,
    /// Whether the slot is still this session's could not be found out.
    Unconfirmed(CdcError),
}

/// A replication session's hold on the slot, checked before each send.
#[derive(Clone)]
struct Ownership {
    source: Arc<PostgresSource>,
    slot: String,
    /// The server process streaming to this session.
    pid: i32,
}

impl Ownership {
    /// Succeeds if this session's server process held the slot less than
    /// [`OWNERSHIP_FRESH`] ago: a standby ends a reader only after
    /// [`READER_SILENCE`] without news from it, so a relay that got this
    /// answer and sends at once was not replaced before it sent.
    async fn confirm(&self) -> Result<(), Undelivered> {
        for _ in 0..5 {
            let asked = Instant::now();
            match slot::slot_holder(self.source.pool(), &self.slot).await {
                Ok(Some(pid)) if pid == self.pid => {}
                Ok(_) => return Err(Undelivered::SlotLost),
                Err(error) => return Err(Undelivered::Unconfirmed(error)),
            }
            if asked.elapsed() < OWNERSHIP_FRESH {
                return Ok(());
            }
        }
        Err(Undelivered::Unconfirmed(CdcError::OwnershipUnconfirmed(
            OWNERSHIP_FRESH,
        )))
    }

    /// Whether another server process holds the slot now.
    async fn lost(&self) -> bool {
        matches!(
            slot::slot_holder(self.source.pool(), &self.slot).await,
            Ok(Some(pid)) if pid != self.pid
        )
    }
}

/// What a standby saw of the relay reading the slot.
#[derive(Debug, Default)]
struct ReaderWatch {
    /// The reader's server process, the last status update it took in, and
    /// since when both are unchanged.
    seen: Option<(i32, Option<String>, Instant)>,
    /// Consecutive checks that found that process waiting on its client.
    waiting: u32,
    /// The server process whose state was logged already.
    noted: Option<i32>,
}

impl ReaderWatch {
    /// How long the reader has been silent, once that is [`READER_SILENCE`]
    /// or more: no new status update taken in, while its server process
    /// waits on it (at the last two checks), so it would take one in. A
    /// process busy decoding a large transaction takes none in for a while,
    /// but does not wait on its client meanwhile.
    fn silent_for(&mut self, reader: &slot::SlotReader, now: Instant) -> Option<Duration> {
        let since = match &self.seen {
            Some((pid, reply, since)) if *pid == reader.pid && *reply == reader.reply_time => {
                *since
            }
            _ => {
                self.seen = Some((reader.pid, reader.reply_time.clone(), now));
                self.waiting = 0;
                now
            }
        };
        self.waiting = if reader.waiting_on_client {
            self.waiting + 1
        } else {
            0
        };
        let silent = now.duration_since(since);
        (silent >= READER_SILENCE && self.waiting >= 2).then_some(silent)
    }

    /// Whether `pid`'s state is news to log: once per server process.
    fn first_note(&mut self, pid: i32) -> bool {
        self.noted.replace(pid) != Some(pid)
    }
}

/// A batch whose every message the sink acknowledged.
struct Delivered {
    /// The event ids, to mark.
    ids: Vec<String>,
    end_lsn: Lsn,
}

/// Batches of committed transactions read ahead of the one in flight.
const BUFFERED_BATCHES: usize = 4;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl CdcRelay {
    /// A CDC relay reading the database of `database_url`, whose outbox
    /// table `source` marks.
    pub fn new(
        database_url: String,
        source: Arc<PostgresSource>,
        sink: Arc<dyn Sink>,
        topics: TopicTemplate,
        options: CdcOptions,
    ) -> Self {
        Self {
            database_url,
            source,
            sink,
            topics,
            options,
        }
    }

    /// Publishes until `shutdown` is requested, standing by while another
    /// relay reads the slot and reconnecting after errors. Fails at once
    /// when the server cannot do logical decoding, the slot or publication
    /// cannot be created, the first connection fails, or the sink closed.
    pub async fn run(&self, shutdown: Shutdown) -> Result<(), CdcError> {
        let pool = self.source.pool();
        slot::check_wal_level(pool).await?;
        slot::ensure_publication(pool, &self.options.publication).await?;
        slot::ensure_slot(pool, &self.options.slot).await?;
        let outbox_oid = slot::outbox_oid(pool).await?;
        let config = slot::replication_config(
            &self.database_url,
            &self.options.slot,
            &self.options.publication,
        )?
        // Status updates every interval, idle or not, busy sink or not: a
        // standby takes silence for a reader that stopped.
        .with_status_interval(self.options.status_interval)
        .with_wakeup_interval(self.options.status_interval);
        let background: Vec<_> = [
            self.options.retention.clone().map(|retention| {
                tokio::spawn(run_retention(
                    self.source.clone(),
                    retention,
                    shutdown.clone(),
                ))
            }),
            self.options.metrics_interval.map(|interval| {
                tokio::spawn(sample_slot(
                    self.source.clone(),
                    self.options.slot.clone(),
                    interval,
                    shutdown.clone(),
                ))
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        tracing::info!(
            slot = %self.options.slot,
            publication = %self.options.publication,
            "CDC mode: reading the outbox table's inserts from the write-ahead log"
        );
        let mut backoff = Backoff::new(INITIAL_BACKOFF, self.options.max_backoff);
        let mut standing_by = false;
        // Only a first connection that fails is fatal (bad URL, password,
        // privileges); later failures are outages, retried.
        let mut first_attempt = true;
        let mut watch = ReaderWatch::default();
        let outcome = loop {
            if shutdown.is_requested() {
                break Ok(());
            }
            // A standby asks about the reader over an ordinary connection
            // rather than asking for the slot, which the server refuses.
            let end = if !first_attempt && self.slot_in_use(&mut watch).await {
                SessionEnd::SlotInUse
            } else {
                self.session(&config, outbox_oid, &shutdown).await
            };
            if !matches!(end, SessionEnd::SlotInUse) {
                watch = ReaderWatch::default();
            }
            let broken = matches!(end, SessionEnd::Broken(_));
            let pause = match end {
                SessionEnd::Stopped => break Ok(()),
                SessionEnd::SinkClosed(reason) => break Err(RelayError::SinkClosed(reason).into()),
                SessionEnd::SlotInUse => {
                    if !standing_by {
                        tracing::info!(
                            slot = %self.options.slot,
                            retry_every = ?self.options.standby_retry,
                            "another server process holds the replication slot (another relay, \
                             or this relay's previous session until the server ends it); \
                             standing by until it is released"
                        );
                        standing_by = true;
                    }
                    metrics::record_cdc_reading(false);
                    self.options.standby_retry
                }
                SessionEnd::SlotLost => {
                    tracing::warn!(
                        slot = %self.options.slot,
                        "another relay took the replication slot over while this one made no \
                         progress; what this one had read and not sent is left to it; standing by"
                    );
                    standing_by = true;
                    metrics::record_cdc_reading(false);
                    self.options.standby_retry
                }
                SessionEnd::NotStarted(error) if first_attempt => break Err(error),
                SessionEnd::NotStarted(error) | SessionEnd::Broken(error) => {
                    standing_by = false;
                    metrics::record_cdc_reading(false);
                    if broken {
                        // It had been reading: this failure is a fresh one.
                        backoff.reset();
                    }
                    let pause = backoff.next();
                    tracing::error!(error = %format!("{error:#}"), retry_in = ?pause, "replication stream failed; reconnecting");
                    pause
                }
            };
            first_attempt = false;
            tokio::select! {
                () = shutdown.requested() => {}
                () = tokio::time::sleep(pause) => {}
            }
            if let Err(error) = slot::ensure_slot(pool, &self.options.slot).await {
                tracing::warn!(error = %format!("{error:#}"), "cannot check the replication slot");
            }
        };
        self.sink.flush(self.options.shutdown_timeout).await;
        for task in background {
            task.abort();
        }
        metrics::record_cdc_reading(false);
        tracing::info!("relay stopped");
        outcome
    }

    /// Whether another process reads the slot, as a standby sees it. A
    /// relay reading it that went silent (see [`ReaderWatch::silent_for`])
    /// has its replication session ended, and then the slot is free.
    async fn slot_in_use(&self, watch: &mut ReaderWatch) -> bool {
        let pool = self.source.pool();
        let slot = &self.options.slot;
        let reader = match slot::slot_reader(pool, slot).await {
            Ok(Some(reader)) => reader,
            Ok(None) => return false,
            // The server tells the replication connection instead.
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "cannot check the replication slot");
                return false;
            }
        };
        if !reader.is_relay || !reader.visible {
            if reader.is_relay && watch.first_note(reader.pid) {
                tracing::info!(
                    slot = %slot,
                    server_process = reader.pid,
                    "cannot see the replication statistics of the relay reading the slot \
                     (grant pg_read_all_stats, or use its role): should it stop making \
                     progress, this one takes over only once the server ends its session \
                     (wal_sender_timeout)"
                );
            }
            return true;
        }
        let Some(silent_for) = watch.silent_for(&reader, Instant::now()) else {
            return true;
        };
        if let Err(error) = slot::end_server_process(pool, reader.pid).await {
            if watch.first_note(reader.pid) {
                tracing::warn!(
                    slot = %slot,
                    server_process = reader.pid,
                    error = %format!("{error:#}"),
                    "the relay reading the slot stopped making progress, but its session cannot \
                     be ended (this user needs pg_signal_backend or the reader's role): it is \
                     taken over once the server ends it (wal_sender_timeout)"
                );
            }
            return true;
        }
        tracing::warn!(
            slot = %slot,
            server_process = reader.pid,
            silent_for = ?silent_for,
            "the relay reading the slot stopped making progress: ended its replication \
             session to take over"
        );
        // The server process exits at once, even when its client is frozen.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && matches!(slot::slot_holder(pool, slot).await, Ok(Some(pid)) if pid == reader.pid)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        *watch = ReaderWatch::default();
        false
    }

    /// One replication session: reads, publishes and confirms until it ends.
    async fn session(
        &self,
        config: &ReplicationConfig,
        outbox_oid: u32,
        shutdown: &Shutdown,
    ) -> SessionEnd {
        let mut client = match ReplicationClient::connect_gated(config.clone()).await {
            Ok(client) => client,
            Err(error) => return SessionEnd::NotStarted(replication_error(error)),
        };
        let (own_pid, holder) = match session_pids(&mut client, &config.slot).await {
            Ok(pids) => pids,
            Err(error) => return SessionEnd::NotStarted(error),
        };
        if holder.is_some_and(|pid| pid != own_pid) {
            // Asking for the slot would be refused; the connection closes
            // quietly when `client` is dropped.
            return SessionEnd::SlotInUse;
        }
        let ownership = Ownership {
            source: self.source.clone(),
            slot: config.slot.clone(),
            pid: own_pid,
        };
        if let Err(error) = client.start().await {
            return SessionEnd::NotStarted(replication_error(error));
        }
        if let Err(error) = client.wait_started().await {
            // 55006: the slot is active for another process.
            if sqlstate(&error) == Some(OBJECT_IN_USE) {
                return SessionEnd::SlotInUse;
            }
            return SessionEnd::NotStarted(replication_error(error));
        }
        metrics::record_cdc_reading(true);
        tracing::info!(slot = %config.slot, "reading the replication slot");
        let end = match self
            .stream(&mut client, outbox_oid, &ownership, shutdown)
            .await
        {
            Ok(end) => end,
            // A standby ended this session's server process and took over.
            Err(_) if ownership.lost().await => SessionEnd::SlotLost,
            Err(error) => SessionEnd::Broken(error),
        };
        if matches!(end, SessionEnd::Stopped) {
            let _ = tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await;
        }
        client.abort();
        end
    }

    async fn stream(
        &self,
        client: &mut ReplicationClient,
        outbox_oid: u32,
        ownership: &Ownership,
        shutdown: &Shutdown,
    ) -> Result<SessionEnd, CdcError> {
        let mut decoder = pgoutput::Decoder::new(outbox_oid);
        let mut open: Option<Committed> = None;
        let mut ready: VecDeque<Committed> = VecDeque::new();
        let mut in_flight: Option<BoxFuture<'static, Result<Delivered, Undelivered>>> = None;
        // Acknowledged batches wait here to be marked and confirmed, one at
        // a time and in order, while the next batch is already being sent.
        let mut acknowledged: VecDeque<Delivered> = VecDeque::new();
        let mut settling: Option<BoxFuture<'static, Result<Lsn, CdcError>>> = None;
        // A position past everything read, to confirm once nothing before
        // it is left unconfirmed.
        let mut idle_position: Option<Lsn> = None;
        // Records in `ready`.
        let mut buffered = 0usize;
        let mut last_message = Instant::now();
        let mut heartbeat = tokio::time::interval(self.options.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if in_flight.is_none() && !ready.is_empty() {
                let batch = take_batch(&mut ready, self.options.batch_size);
                buffered -= batch.iter().map(|c| c.records.len()).sum::<usize>();
                in_flight = Some(self.deliver(batch, ownership.clone()));
            }
            if settling.is_none()
                && let Some(delivered) = acknowledged.pop_front()
            {
                settling = Some(self.settle(delivered));
            }
            tokio::select! {
                biased;
                () = shutdown.requested() => {
                    if let Some(batch) = in_flight.take()
                        && let Ok(Ok(delivered)) =
                            tokio::time::timeout(self.options.shutdown_timeout, batch).await
                    {
                        acknowledged.push_back(delivered);
                    }
                    if let Some(settle) = settling.take() {
                        client.update_applied_lsn(settle.await?);
                    }
                    for delivered in acknowledged.drain(..) {
                        client.update_applied_lsn(self.settle(delivered).await?);
                    }
                    // The worker reports the last confirmed position within
                    // the status interval.
                    tokio::time::sleep(self.options.status_interval + Duration::from_millis(200)).await;
                    return Ok(SessionEnd::Stopped);
                }
                outcome = async { in_flight.as_mut().expect("guarded").await }, if in_flight.is_some() => {
                    in_flight = None;
                    match outcome {
                        Ok(delivered) => acknowledged.push_back(delivered),
                        Err(Undelivered::SinkClosed(reason)) => {
                            return Ok(SessionEnd::SinkClosed(reason));
                        }
                        Err(Undelivered::SlotLost) => return Ok(SessionEnd::SlotLost),
                        Err(Undelivered::Unconfirmed(error)) => return Err(error),
                    }
                }
                confirmed = async { settling.as_mut().expect("guarded").await }, if settling.is_some() => {
                    settling = None;
                    client.update_applied_lsn(confirmed?);
                    if in_flight.is_none()
                        && ready.is_empty()
                        && acknowledged.is_empty()
                        && let Some(position) = idle_position.take()
                    {
                        client.update_applied_lsn(position);
                    }
                }
                // While the sink is slow or down, stop reading once a few
                // batches wait: the server holds the rest in its WAL.
                event = client.recv(), if buffered < self.options.batch_size.saturating_mul(BUFFERED_BATCHES) => {
                    last_message = Instant::now();
                    let event = match event {
                        Ok(Some(event)) => event,
                        Ok(None) => return Err(CdcError::StreamEnded),
                        Err(error) => return Err(replication_error(error)),
                    };
                    let position = match event {
                        ReplicationEvent::Begin { commit_time_micros, .. } => {
                            open = Some(Committed {
                                records: Vec::new(),
                                commit_time_micros: commit_time_micros + POSTGRES_EPOCH_MICROS,
                                end_lsn: Lsn::ZERO,
                            });
                            None
                        }
                        ReplicationEvent::XLogData { data, .. } => {
                            if let Some(record) = decoder.decode(&data)? {
                                open.as_mut()
                                    .ok_or(CdcError::InsertOutsideTransaction)?
                                    .records
                                    .push(record);
                            }
                            None
                        }
                        ReplicationEvent::Commit { end_lsn, .. } => match open.take() {
                            Some(mut committed) if !committed.records.is_empty() => {
                                committed.end_lsn = end_lsn;
                                buffered += committed.records.len();
                                ready.push_back(committed);
                                None
                            }
                            _ => Some(end_lsn),
                        },
                        ReplicationEvent::KeepAlive { wal_end, .. } => Some(wal_end),
                        ReplicationEvent::Message { lsn, transactional: false, .. } => Some(lsn),
                        ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => None,
                    };
                    // A position with nothing before it left to deliver:
                    // confirming it lets the server release WAL on a quiet table.
                    if let Some(position) = position.filter(|lsn| !lsn.is_zero())
                        && open.is_none()
                    {
                        if let Some(last) = ready.back_mut() {
                            last.end_lsn = last.end_lsn.max(position);
                        } else if in_flight.is_some() || settling.is_some() || !acknowledged.is_empty() {
                            idle_position = Some(idle_position.map_or(position, |p| p.max(position)));
                        } else {
                            client.update_applied_lsn(position);
                        }
                    }
                }
                _ = heartbeat.tick() => {
                    if last_message.elapsed() >= self.options.heartbeat_interval
                        && let Err(error) = slot::emit_heartbeat(self.source.pool()).await
                    {
                        tracing::warn!(error = %format!("{error:#}"), "cannot write the heartbeat");
                    }
                }
            }
        }
    }

    /// Sends a batch until every message is acknowledged, resending the
    /// failed ones (and those held back behind them) in order with backoff;
    /// each time only once `ownership` is confirmed.
    fn deliver(
        &self,
        batch: Vec<Committed>,
        ownership: Ownership,
    ) -> BoxFuture<'static, Result<Delivered, Undelivered>> {
        let sink = self.sink.clone();
        let topics = self.topics.clone();
        let max_backoff = self.options.max_backoff;
        Box::pin(async move {
            let sent_at = Instant::now();
            let now_micros = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_micros() as i64);
            let end_lsn = batch.last().map_or(Lsn::ZERO, |last| last.end_lsn);
            let mut records = Vec::new();
            for committed in batch {
                let age = (now_micros - committed.commit_time_micros) as f64 / 1e6;
                records.extend(committed.records.into_iter().map(|mut record| {
                    record.age_at_claim = age;
                    record
                }));
            }
            let mut remaining: Vec<Message> = records.iter().map(|r| topics.message(r)).collect();
            let mut backoff = Backoff::new(INITIAL_BACKOFF, max_backoff);
            loop {
                ownership.confirm().await?;
                let outcomes = sink.publish(&remaining).await;
                let mut failed = Vec::new();
                let mut first_error = None;
                for (message, outcome) in remaining.into_iter().zip(outcomes) {
                    if let Err(error) = outcome {
                        if error.kind == FailureKind::Closed {
                            return Err(Undelivered::SinkClosed(error.reason));
                        }
                        first_error.get_or_insert(error.reason);
                        failed.push(message);
                    }
                }
                let Some(first_error) = first_error else {
                    // Recorded at the acknowledgement: marking is bookkeeping.
                    let settlement = Settlement {
                        published: records.iter().map(|r| r.id.clone()).collect(),
                        failed: Vec::new(),
                    };
                    settlement.observe(&records, sent_at).record();
                    return Ok(Delivered {
                        ids: settlement.published,
                        end_lsn,
                    });
                };
                let pause = backoff.next();
                tracing::warn!(
                    unacknowledged = failed.len(),
                    %first_error,
                    retry_in = ?pause,
                    "events not acknowledged; sending them again in order"
                );
                tokio::time::sleep(pause).await;
                remaining = failed;
            }
        })
    }

    /// Marks the delivered rows; returns the position to confirm.
    fn settle(&self, delivered: Delivered) -> BoxFuture<'static, Result<Lsn, CdcError>> {
        let source = self.source.clone();
        Box::pin(async move {
            source
                .mark_published(&delivered.ids)
                .await
                .map_err(CdcError::Mark)?;
            tracing::debug!(published = delivered.ids.len(), confirmed = %delivered.end_lsn, "batch confirmed");
            Ok(delivered.end_lsn)
        })
    }
}

/// Whole transactions from the front of `ready`, at least one, until they
/// hold `batch_size` records or more.
fn take_batch(ready: &mut VecDeque<Committed>, batch_size: usize) -> Vec<Committed> {
    let mut batch = Vec::new();
    let mut records = 0;
    while let Some(committed) = ready.pop_front() {
        records += committed.records.len();
        batch.push(committed);
        if records >= batch_size {
            break;
        }
    }
    batch
}

/// The server process of a replication session that has not started, and
/// the one holding the slot (if any), asked on that session.
async fn session_pids(
    client: &mut ReplicationClient,
    slot: &str,
) -> Result<(i32, Option<i32>), CdcError> {
    // `slot` passed slot::check_name: it needs no quoting.
    let rows = client
        .simple_query(&format!(
            "SELECT pg_backend_pid(), (SELECT active_pid FROM pg_replication_slots \
             WHERE slot_name = '{slot}' AND database = current_database())"
        ))
        .await
        .map_err(replication_error)?;
    let row = rows.first().ok_or(CdcError::NoSlotAnswer("no row"))?;
    let pid = |column: usize| -> Result<Option<i32>, CdcError> {
        row.get(column)
            .and_then(|value| value.as_deref())
            .map(|text| {
                std::str::from_utf8(text)
                    .ok()
                    .and_then(|text| text.parse::<i32>().ok())
                    .ok_or(CdcError::NoSlotAnswer("a process id that is not a number"))
            })
            .transpose()
    };
    let own = pid(0)?.ok_or(CdcError::NoSlotAnswer("no server process id"))?;
    Ok((own, pid(1)?))
}

fn replication_error(error: pgwire_replication::PgWireError) -> CdcError {
    CdcError::Replication(error)
}

/// Records the slot gauges every `interval`.
async fn sample_slot(
    source: Arc<PostgresSource>,
    slot_name: String,
    interval: Duration,
    shutdown: Shutdown,
) {
    loop {
        match slot::slot_status(source.pool(), &slot_name).await {
            Ok(Some(status)) => {
                metrics::record_slot(status.behind_bytes, status.retained_wal_bytes)
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "cannot sample the replication slot")
            }
        }
        tokio::select! {
            () = shutdown.requested() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(records: usize, end: u64) -> Committed {
        let record = OutboxRecord {
            id: String::new(),
            aggregate_type: String::new(),
            aggregate_id: String::new(),
            event_type: String::new(),
            payload: None,
            event_version: 1,
            aggregate_seq: None,
            traceparent: None,
            seq: 0,
            attempts: 0,
            age_at_claim: 0.0,
        };
        Committed {
            records: vec![record; records],
            commit_time_micros: 0,
            end_lsn: Lsn::from_u64(end),
        }
    }

    #[test]
    fn a_reader_is_silent_once_it_sends_nothing_while_waited_on() {
        let reader = |reply: &str, waiting: bool| slot::SlotReader {
            pid: 7,
            is_relay: true,
            visible: true,
            reply_time: Some(reply.to_owned()),
            waiting_on_client: waiting,
        };
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let mut watch = ReaderWatch::default();
        // Replies keep coming: never silent.
        for second in 0..10 {
            let reply = second.to_string();
            assert_eq!(watch.silent_for(&reader(&reply, true), at(second)), None);
        }
        // No reply since second 9; its process waits on it.
        assert_eq!(watch.silent_for(&reader("9", true), at(13)), None);
        assert_eq!(
            watch.silent_for(&reader("9", true), at(14)),
            Some(READER_SILENCE)
        );
        // A process busy decoding takes no replies in: not silence.
        let mut watch = ReaderWatch::default();
        for second in 0..30 {
            assert_eq!(watch.silent_for(&reader("1", false), at(second)), None);
        }
        // Waiting once after a busy stretch is not enough either.
        assert_eq!(watch.silent_for(&reader("1", true), at(30)), None);
        assert!(watch.silent_for(&reader("1", true), at(31)).is_some());
        // Another reader starts the count again.
        let other = slot::SlotReader {
            pid: 8,
            ..reader("1", true)
        };
        assert_eq!(watch.silent_for(&other, at(32)), None);
    }

    #[test]
    fn batches_hold_whole_transactions() {
        let mut ready: VecDeque<_> = [committed(3, 1), committed(3, 2), committed(600, 3)].into();
        let ends = |batch: Vec<Committed>| -> Vec<u64> {
            batch.iter().map(|c| c.end_lsn.as_u64()).collect()
        };
        assert_eq!(ends(take_batch(&mut ready, 5)), [1, 2]);
        assert_eq!(
            ends(take_batch(&mut ready, 5)),
            [3],
            "a large transaction stays whole"
        );
        assert!(take_batch(&mut ready, 5).is_empty());
    }
}
