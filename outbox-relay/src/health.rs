//! What `/readyz` answers: the database and the broker were reachable at the
//! last check. A relay owning no shards is standing by, and ready.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::metrics;
use crate::shutdown::Shutdown;
use crate::sink::Sink;
use crate::source::Source;

/// The outcome of the last connection checks.
#[derive(Debug, Default)]
pub struct Health {
    database: AtomicBool,
    broker: AtomicBool,
}

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
