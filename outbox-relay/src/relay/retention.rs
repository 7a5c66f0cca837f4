//! Retention: deleting published rows older than a window, in small
//! batches, periodically during a run or once from `outbox-relay cleanup`.

use std::sync::Arc;
use std::time::Duration;

use crate::shutdown::Shutdown;
use crate::source::{Source, SourceError};

/// Deletion of published rows older than a window.
#[derive(Debug, Clone)]
pub struct Retention {
    /// Keep published rows this long.
    pub keep_for: Duration,
    /// Run the deletion this often.
    pub interval: Duration,
    /// Rows per `DELETE`, so no statement holds locks for long.
    pub batch_size: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            keep_for: Duration::from_secs(7 * 24 * 3600),
            interval: Duration::from_secs(600),
            batch_size: 1000,
        }
    }
}

/// Deletes old published rows every `retention.interval`.
pub(crate) async fn run_retention(
    source: Arc<dyn Source>,
    retention: Retention,
    shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            () = shutdown.requested() => return,
            () = tokio::time::sleep(retention.interval) => {}
        }
        match delete_published(source.as_ref(), &retention, &shutdown, |_| {}).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted published rows past retention"),
            Err(error) => {
                tracing::warn!(%error, "retention cleanup failed; retrying next interval")
            }
        }
    }
}

/// Deletes published rows older than the window in batches, reporting
/// each batch to `progress`; returns how many.
pub async fn delete_published(
    source: &dyn Source,
    retention: &Retention,
    shutdown: &Shutdown,
    mut progress: impl FnMut(u64),
) -> Result<u64, SourceError> {
    let mut total = 0;
    loop {
        let deleted = source
            .delete_published(retention.keep_for, retention.batch_size)
            .await?;
        total += deleted;
        progress(deleted);
        if deleted < retention.batch_size || shutdown.is_requested() {
            return Ok(total);
        }
    }
}
