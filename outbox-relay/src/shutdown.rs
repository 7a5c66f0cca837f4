//! Graceful shutdown on SIGINT or SIGTERM: the relay stops claiming, settles
//! the batch in flight and flushes the producer. A second signal exits at
//! once; rows in flight then stay pending and are published again later.

use tokio::sync::watch;

/// Tells the relay when to stop.
#[derive(Clone, Debug)]
pub struct Shutdown {
    requested: watch::Receiver<bool>,
}

/// Requests a shutdown by hand (tests, embedding).
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

impl ShutdownTrigger {
    /// Asks the relay to stop after its current batch.
    pub fn trigger(&self) {
        let _ = self.0.send(true);
    }
}

impl Shutdown {
    /// A shutdown requested through the returned trigger only.
    pub fn manual() -> (ShutdownTrigger, Self) {
        let (sender, requested) = watch::channel(false);
        (ShutdownTrigger(sender), Self { requested })
    }

    /// A shutdown requested by SIGINT or SIGTERM.
    pub fn on_signals() -> std::io::Result<Self> {
        let (trigger, shutdown) = Self::manual();
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut interrupt = signal(SignalKind::interrupt())?;
            let mut terminate = signal(SignalKind::terminate())?;
            tokio::spawn(async move {
                for signals_seen in 1.. {
                    tokio::select! {
                        _ = interrupt.recv() => {}
                        _ = terminate.recv() => {}
                    }
                    if signals_seen == 1 {
                        tracing::info!("shutting down: finishing the batch in flight");
                        trigger.trigger();
                    } else {
                        tracing::warn!("second signal: exiting now; rows in flight stay pending");
                        std::process::exit(130);
                    }
                }
            });
        }
        #[cfg(not(unix))]
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                trigger.trigger();
            }
        });
        Ok(shutdown)
    }

    /// Whether a shutdown was requested.
    pub fn is_requested(&self) -> bool {
        *self.requested.borrow()
    }

    /// Completes when a shutdown is requested.
    pub async fn requested(&self) {
        let mut requested = self.requested.clone();
        // An error means every trigger is gone: nobody can ask any more.
        if requested.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
