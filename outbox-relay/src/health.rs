//! What `/readyz` answers: the database and the broker were reachable at the
//! last check. A relay owning no shards is standing by, and ready.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::metrics;
use crate::shutdown::Shutdown;
use crate::sink::Sink;
use crate::source::Source;

/// The outcome of the last connection checks.
#[derive(Debug)]
pub struct Health {
    database: AtomicBool,
    broker: AtomicBool,
    /// A partitioned outbox's whole days from today with partitions; -1
    /// when the outbox is not partitioned (or not checked yet).
    partition_days_ahead: AtomicI64,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            database: AtomicBool::new(false),
            broker: AtomicBool::new(false),
            partition_days_ahead: AtomicI64::new(-1),
        }
    }
}

/// Fewer days ahead with partitions than this, and `/readyz` warns (rows
/// of a day without its partition go to the default partition: nothing
/// fails, but maintenance is not running).
pub const MIN_PARTITION_DAYS_AHEAD: i64 = 3;

impl Health {
    /// Whether the last database check succeeded.
    pub fn database_up(&self) -> bool {
        self.database.load(Ordering::Relaxed)
    }

    /// Whether the last broker check succeeded.
    pub fn broker_up(&self) -> bool {
        self.broker.load(Ordering::Relaxed)
    }

    /// Ready to publish: both reachable.
    pub fn ready(&self) -> bool {
        self.database_up() && self.broker_up()
    }

    /// A partitioned outbox's whole days from today with partitions, if the
    /// outbox is partitioned.
    pub fn partition_days_ahead(&self) -> Option<i64> {
        let days = self.partition_days_ahead.load(Ordering::Relaxed);
        (days >= 0).then_some(days)
    }

    /// Notes a partitioned outbox's whole days from today with partitions.
    pub fn set_partition_days_ahead(&self, days: i64) {
        self.partition_days_ahead
            .store(days.max(0), Ordering::Relaxed);
    }
}

/// Checks the database (sampling the backlog gauges) and the broker every
/// `interval` until shutdown.
pub async fn monitor(
    source: Arc<dyn Source>,
    sink: Arc<dyn Sink>,
    health: Arc<Health>,
    interval: Duration,
    shutdown: Shutdown,
) {
    loop {
        let database = match source.backlog().await {
            Ok(backlog) => {
                metrics::record_backlog(
                    backlog.pending,
                    backlog.oldest_pending_age_seconds,
                    backlog.dead_letters,
                );
                true
            }
            Err(error) => {
                tracing::warn!(%error, "database check failed");
                false
            }
        };
        let broker = sink.probe().await;
        health.database.store(database, Ordering::Relaxed);
        health.broker.store(broker, Ordering::Relaxed);
        metrics::record_connections(database, broker);
        tokio::select! {
            () = shutdown.requested() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
