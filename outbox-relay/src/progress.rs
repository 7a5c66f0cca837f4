//! Progress of long operations (`cleanup`, `retry`): a spinner with a count
//! and rate on a terminal, a log line every few seconds otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How often progress is logged when standard error is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Counts rows processed by a long operation.
pub struct Progress {
    what: &'static str,
    done: u64,
    bar: Option<ProgressBar>,
    last_log: Instant,
}

impl Progress {
    /// Starts counting `what` ("rows deleted", ...).
    pub fn new(what: &'static str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {pos} {msg} ({per_sec}, {elapsed})")
                    .expect("valid progress template"),
            );
            bar.set_message(what);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Self {
            what,
            done: 0,
            bar,
            last_log: Instant::now(),
        }
    }

    /// Adds `count` processed rows.
    pub fn add(&mut self, count: u64) {
        self.done += count;
        match &self.bar {
            Some(bar) => bar.inc(count),
            None if self.last_log.elapsed() >= LOG_EVERY => {
                tracing::info!(done = self.done, "{} so far", self.what);
                self.last_log = Instant::now();
            }
            None => {}
        }
    }

    /// Stops the spinner; returns the total.
    pub fn finish(self) -> u64 {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
        self.done
    }
}
