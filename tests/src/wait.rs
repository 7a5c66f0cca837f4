//! Waiting for a condition the test polls, failing with what it waited for.

use std::time::{Duration, Instant};

/// Polls `done` every 50 ms until it holds; fails the test naming `what`
/// after `timeout`.
pub async fn until(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
