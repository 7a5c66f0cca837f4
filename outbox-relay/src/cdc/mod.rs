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
//!
//! The decisions are two state machines without I/O: `sessions.rs` (read
//! the slot, stand by, reconnect, stop) and `stream.rs` (between
//! transactions or in one; committed transactions ready, sending,
//! acknowledged, marking, confirmed). The session code here performs what
//! they say.

mod error;
pub mod pgoutput;
mod sessions;
pub mod slot;
mod stream;

pub use error::{CdcError, OBJECT_IN_USE, sqlstate};

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig};

use crate::message::{Message, TopicTemplate};
use crate::metrics;
use crate::relay::{Backoff, INITIAL_BACKOFF, Retention, run_retention};
use crate::shutdown::Shutdown;
use crate::sink::{FailureKind, Sink};
use crate::source::Settlement;
use crate::source::postgres::PostgresSource;
use pgoutput::OutboxTable;
use sessions::{AfterSession, ReaderWatch, SessionEnd, Sessions};
use stream::{Committed, Delivered, Stream};

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
    /// The extra columns the messages need (see [`crate::source::extra`]).
    pub extra_columns: Vec<String>,
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
            extra_columns: Vec::new(),
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
    ///
    /// A slot no process holds is no takeover: this session's server
    /// process ended (the server or an administrator terminated it, or the
    /// connection broke) and nothing is sent; the session ends as broken
    /// and reconnects.
    ///
    /// Returns the moment until which sending counts as at once (the
    /// answer's question plus [`OWNERSHIP_FRESH`]): a process paused past
    /// it hands nothing more to the sink before it confirms again.
    async fn confirm(&self) -> Result<Instant, Undelivered> {
        for _ in 0..5 {
            let asked = Instant::now();
            let holder = slot::slot_holder(self.source.pool(), &self.slot)
                .await
                .map_err(Undelivered::Unconfirmed)?;
            match Holder::of(holder, self.pid) {
                Holder::This => {}
                Holder::Another => return Err(Undelivered::SlotLost),
                Holder::Nobody => {
                    return Err(Undelivered::Unconfirmed(CdcError::SessionProcessEnded));
                }
            }
            if asked.elapsed() < OWNERSHIP_FRESH {
                return Ok(asked + OWNERSHIP_FRESH);
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
            Ok(holder) if Holder::of(holder, self.pid) == Holder::Another
        )
    }
}

/// Who holds the slot, as a session sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// The session's own server process.
    This,
    /// Another server process: another relay took the slot over.
    Another,
    /// No process: the session's own ended, and no other took its place.
    Nobody,
}

impl Holder {
    /// The holder `active_pid` names, for the session of server process `own`.
    fn of(active_pid: Option<i32>, own: i32) -> Self {
        match active_pid {
            Some(pid) if pid == own => Self::This,
            Some(_) => Self::Another,
            None => Self::Nobody,
        }
    }
}

/// A batch at the sink: acknowledged in full, or why not.
type Sending = BoxFuture<'static, Result<Delivered, Undelivered>>;

/// A batch being marked: the position to confirm once it is.
type Marking = BoxFuture<'static, Result<Lsn, CdcError>>;

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
        let (config, outbox) = self.prepare().await?;
        let background = self.spawn_background(&shutdown);
        tracing::info!(
            slot = %self.options.slot,
            publication = %self.options.publication,
            "CDC mode: reading the outbox table's inserts from the write-ahead log"
        );
        let mut sessions = Sessions::new(
            self.options.slot.clone(),
            self.options.standby_retry,
            self.options.max_backoff,
        );
        let outcome = loop {
            if shutdown.is_requested() {
                break Ok(());
            }
            let end = if sessions.checks_reader() && self.slot_in_use(&mut sessions.watch).await {
                SessionEnd::SlotInUse
            } else {
                self.session(&config, &outbox, &shutdown).await
            };
            let pause = match sessions.ended(end) {
                AfterSession::Stop(outcome) => break outcome,
                AfterSession::Retry(pause) => pause,
            };
            tokio::select! {
                () = shutdown.requested() => {}
                () = tokio::time::sleep(pause) => {}
            }
            if let Err(error) = slot::ensure_slot(self.source.pool(), &self.options.slot).await {
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

    /// Checks the server, creates the publication and slot if missing, and
    /// returns the replication settings and the outbox table.
    async fn prepare(&self) -> Result<(ReplicationConfig, OutboxTable), CdcError> {
        let pool = self.source.pool();
        slot::check_wal_level(pool).await?;
        slot::ensure_publication(pool, &self.options.publication).await?;
        slot::ensure_slot(pool, &self.options.slot).await?;
        let mut outbox = slot::outbox_table(pool).await?;
        outbox.extra = self.options.extra_columns.clone();
        let config = slot::replication_config(
            &self.database_url,
            &self.options.slot,
            &self.options.publication,
        )?
        // Status updates every interval, idle or not, busy sink or not: a
        // standby takes silence for a reader that stopped.
        .with_status_interval(self.options.status_interval)
        .with_wakeup_interval(self.options.status_interval);
        Ok((config, outbox))
    }

    /// Starts retention and the slot gauges, as configured.
    fn spawn_background(&self, shutdown: &Shutdown) -> Vec<tokio::task::JoinHandle<()>> {
        [
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
        .collect()
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
        outbox: &OutboxTable,
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
        let end = match self.stream(&mut client, outbox, &ownership, shutdown).await {
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

    /// Reads, sends, marks and confirms as [`Stream`] says until the
    /// session ends.
    async fn stream(
        &self,
        client: &mut ReplicationClient,
        outbox: &OutboxTable,
        ownership: &Ownership,
        shutdown: &Shutdown,
    ) -> Result<SessionEnd, CdcError> {
        let mut stream = Stream::new(outbox.clone(), self.options.batch_size);
        let mut sending: Option<Sending> = None;
        let mut marking: Option<Marking> = None;
        let mut last_message = Instant::now();
        let mut heartbeat = tokio::time::interval(self.options.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Some(batch) = stream.next_batch() {
                sending = Some(self.deliver(batch, ownership.clone()));
            }
            if let Some(delivered) = stream.next_mark() {
                marking = Some(self.settle(delivered));
            }
            metrics::record_cdc_bytes_in_flight(stream.bytes_in_flight());
            tokio::select! {
                biased;
                () = shutdown.requested() => {
                    return self.stop(client, &mut stream, sending.take(), marking.take()).await;
                }
                outcome = async { sending.as_mut().expect("guarded").await }, if sending.is_some() => {
                    sending = None;
                    match outcome {
                        Ok(delivered) => stream.acknowledged(delivered),
                        Err(Undelivered::SinkClosed(reason)) => {
                            return Ok(SessionEnd::SinkClosed(reason));
                        }
                        Err(Undelivered::SlotLost) => return Ok(SessionEnd::SlotLost),
                        Err(Undelivered::Unconfirmed(error)) => return Err(error),
                    }
                }
                confirmed = async { marking.as_mut().expect("guarded").await }, if marking.is_some() => {
                    marking = None;
                    for position in stream.marked(confirmed?) {
                        client.update_applied_lsn(position);
                    }
                }
                event = client.recv(), if stream.reads() => {
                    last_message = Instant::now();
                    let event = match event {
                        Ok(Some(event)) => event,
                        Ok(None) => return Err(CdcError::StreamEnded),
                        Err(error) => return Err(replication_error(error)),
                    };
                    if let Some(position) = stream.received(event)? {
                        client.update_applied_lsn(position);
                    }
                    if let Some(rows) = stream.take_committed_rows() {
                        metrics::record_cdc_transaction(rows);
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

    /// At shutdown: waits (a while) for the batch at the sink, marks and
    /// confirms every acknowledged batch in order, and leaves the status
    /// worker time to report the last confirmed position.
    async fn stop(
        &self,
        client: &mut ReplicationClient,
        stream: &mut Stream,
        sending: Option<Sending>,
        marking: Option<Marking>,
    ) -> Result<SessionEnd, CdcError> {
        if let Some(batch) = sending
            && let Ok(Ok(delivered)) =
                tokio::time::timeout(self.options.shutdown_timeout, batch).await
        {
            stream.acknowledged(delivered);
        }
        // A batch of pieces of an open transaction confirms nothing (zero).
        let confirm = |position: Lsn| {
            if !position.is_zero() {
                client.update_applied_lsn(position);
            }
        };
        if let Some(marking) = marking {
            confirm(marking.await?);
        }
        for delivered in stream.unmarked() {
            confirm(self.settle(delivered).await?);
        }
        // The worker reports the last confirmed position within the status
        // interval.
        tokio::time::sleep(self.options.status_interval + Duration::from_millis(200)).await;
        Ok(SessionEnd::Stopped)
    }

    /// Sends a batch until every message is acknowledged, resending the
    /// failed ones (and those held back behind them) in order with backoff;
    /// each time only once `ownership` is confirmed.
    fn deliver(&self, batch: Vec<Committed>, ownership: Ownership) -> Sending {
        let sink = self.sink.clone();
        let topics = self.topics.clone();
        let max_backoff = self.options.max_backoff;
        Box::pin(async move {
            let sent_at = Instant::now();
            let now_micros = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_micros() as i64);
            let end_lsn = stream::batch_end(&batch);
            let mut records = Vec::new();
            for committed in batch {
                let age = (now_micros - committed.commit_time_micros) as f64 / 1e6;
                records.extend(committed.records.into_iter().map(|mut record| {
                    record.age_at_claim = age;
                    record
                }));
            }
            let mut remaining: Vec<Message> = topics.messages(&records);
            let mut backoff = Backoff::new(INITIAL_BACKOFF, max_backoff);
            loop {
                let fresh_until = ownership.confirm().await?;
                let outcomes = sink.publish_until(&remaining, fresh_until).await;
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
                        created_at: records.into_iter().map(|r| r.created_at).collect(),
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
    fn settle(&self, delivered: Delivered) -> Marking {
        let source = self.source.clone();
        Box::pin(async move {
            let created_at = delivered
                .ids
                .iter()
                .zip(&delivered.created_at)
                .filter_map(|(id, at)| Some((id.as_str(), at.as_deref()?)))
                .collect();
            source
                .mark_published(&delivered.ids, &created_at)
                .await
                .map_err(CdcError::Mark)?;
            tracing::debug!(published = delivered.ids.len(), confirmed = %delivered.end_lsn, "batch confirmed");
            Ok(delivered.end_lsn)
        })
    }
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
    use super::Holder;

    #[test]
    fn only_another_process_on_the_slot_is_a_takeover() {
        assert_eq!(Holder::of(Some(41), 41), Holder::This);
        assert_eq!(Holder::of(Some(42), 41), Holder::Another);
        // The server ended this session's process: a broken session, which
        // reconnects, not a takeover, which stands by.
        assert_eq!(Holder::of(None, 41), Holder::Nobody);
    }
}
