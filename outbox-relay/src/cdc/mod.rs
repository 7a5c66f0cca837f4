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
//! stands by, retrying every few seconds, and takes over when the first
//! stops or dies.

pub mod pgoutput;
pub mod slot;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::future::BoxFuture;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};

use crate::message::{Message, TopicTemplate};
use crate::metrics::{self, BatchObservation};
use crate::record::OutboxRecord;
use crate::relay::{Backoff, INITIAL_BACKOFF, RelayError, Retention, run_retention};
use crate::shutdown::Shutdown;
use crate::sink::{FailureKind, Sink};
use crate::source::Settlement;
use crate::source::postgres::PostgresSource;

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
    /// How often a standby relay checks whether the slot became free.
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
            standby_retry: Duration::from_secs(3),
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
    /// The sink can take no more messages.
    SinkClosed(String),
    /// The session could not start.
    NotStarted(anyhow::Error),
    /// The session broke after it started.
    Broken(anyhow::Error),
}

/// A committed transaction with inserts into the outbox table.
struct Committed {
    records: Vec<OutboxRecord>,
    /// The transaction's commit time, in microseconds since the Unix epoch.
    commit_time_micros: i64,
    /// Confirmable once the records are acknowledged.
    end_lsn: Lsn,
}

/// Why a batch was not delivered: the sink closed, for this reason.
struct Undelivered(String);

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
    pub async fn run(&self, shutdown: Shutdown) -> anyhow::Result<()> {
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
        .with_status_interval(self.options.status_interval)
        .with_wakeup_interval(self.options.status_interval.max(Duration::from_secs(1)));
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
        let outcome = loop {
            if shutdown.is_requested() {
                break Ok(());
            }
            let end = self.session(&config, outbox_oid, &shutdown).await;
            let broken = matches!(end, SessionEnd::Broken(_));
            let pause = match end {
                SessionEnd::Stopped => break Ok(()),
                SessionEnd::SinkClosed(reason) => break Err(RelayError::SinkClosed(reason).into()),
                SessionEnd::SlotInUse => {
                    if !standing_by {
                        tracing::info!(
                            slot = %self.options.slot,
                            "another relay reads the replication slot; standing by"
                        );
                        standing_by = true;
                    }
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

    /// One replication session: reads, publishes and confirms until it ends.
    async fn session(
        &self,
        config: &ReplicationConfig,
        outbox_oid: u32,
        shutdown: &Shutdown,
    ) -> SessionEnd {
        let mut client = match ReplicationClient::connect(config.clone()).await {
            Ok(client) => client,
            Err(error) => return SessionEnd::NotStarted(replication_error(error)),
        };
        if let Err(error) = client.wait_started().await {
            // 55006: the slot is active for another process.
            if error.to_string().contains("SQLSTATE 55006") {
                return SessionEnd::SlotInUse;
            }
            return SessionEnd::NotStarted(replication_error(error));
        }
        metrics::record_cdc_reading(true);
        tracing::info!(slot = %config.slot, "reading the replication slot");
        let end = self
            .stream(&mut client, outbox_oid, shutdown)
            .await
            .unwrap_or_else(SessionEnd::Broken);
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
        shutdown: &Shutdown,
    ) -> anyhow::Result<SessionEnd> {
        let mut decoder = pgoutput::Decoder::new(outbox_oid);
        let mut open: Option<Committed> = None;
        let mut ready: VecDeque<Committed> = VecDeque::new();
        let mut in_flight: Option<BoxFuture<'static, Result<Delivered, Undelivered>>> = None;
        // Acknowledged batches wait here to be marked and confirmed, one at
        // a time and in order, while the next batch is already being sent.
        let mut acknowledged: VecDeque<Delivered> = VecDeque::new();
        let mut settling: Option<BoxFuture<'static, anyhow::Result<Lsn>>> = None;
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
                in_flight = Some(self.deliver(batch));
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
                        Err(Undelivered(reason)) => return Ok(SessionEnd::SinkClosed(reason)),
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
                        Ok(None) => anyhow::bail!("the server ended the replication stream"),
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
                                    .context("an insert arrived outside a transaction")?
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
    /// failed ones (and those held back behind them) in order with backoff.
    fn deliver(&self, batch: Vec<Committed>) -> BoxFuture<'static, Result<Delivered, Undelivered>> {
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
                let outcomes = sink.publish(&remaining).await;
                let mut failed = Vec::new();
                let mut first_error = None;
                for (message, outcome) in remaining.into_iter().zip(outcomes) {
                    if let Err(error) = outcome {
                        if error.kind == FailureKind::Closed {
                            return Err(Undelivered(error.reason));
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
                    BatchObservation::new(&records, &settlement, sent_at).record();
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
    fn settle(&self, delivered: Delivered) -> BoxFuture<'static, anyhow::Result<Lsn>> {
        let source = self.source.clone();
        Box::pin(async move {
            source
                .mark_published(&delivered.ids)
                .await
                .context("cannot mark published rows")?;
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

fn replication_error(error: pgwire_replication::PgWireError) -> anyhow::Error {
    anyhow::anyhow!("replication connection: {error}")
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
            Ok(Some(status)) => metrics::record_slot(&status),
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
