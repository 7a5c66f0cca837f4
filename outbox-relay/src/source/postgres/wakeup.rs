//! Waking on new rows: `LISTEN outbox` on a connection of its own, which
//! holds the wake-up slots while the relay waits (see the module's parent
//! for how writers notify only then).

use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use super::{PgDialect, PostgresSource};

use outbox_contract::wakeup::CHANNEL;

/// The first key of the wake-up advisory locks (`outb` in ASCII), as the
/// migration's trigger uses it.
pub use outbox_contract::wakeup::LOCK_KEY as WAKE_LOCK_KEY;

/// How long a relay about to wait waits for the writers holding wake-up
/// slots. A transaction that holds one longer (it wrote to the outbox and
/// has not committed yet) makes the relay poll at this pace until it ends,
/// rather than leave other writers' rows unpublished meanwhile.
const MAX_WAIT_FOR_WRITERS: Duration = Duration::from_millis(100);

/// The number of wake-up slots; an inserting transaction tries the slot of
/// its backend's process id modulo this.
pub use outbox_contract::wakeup::SLOTS as WAKE_SLOTS;

/// The statement with which a waiting relay takes every wake-up slot
/// (shared session locks; `pg_advisory_unlock_all()` releases them).
pub fn take_wake_slots_sql() -> String {
    format!(
        "SELECT pg_advisory_lock_shared({WAKE_LOCK_KEY}, slot) \
         FROM generate_series(0, {}) AS slot",
        WAKE_SLOTS - 1
    )
}

impl PgDialect {
    async fn listen(pool: &PgPool) -> Result<Listener, sqlx::Error> {
        // A connection of its own, outside the claims' pool: the session
        // locks it may hold go with it when it is dropped, never to a claim.
        let port = pool.connect_options().get_port();
        let own = crate::nodelay::pool_options(PgPoolOptions::new(), port)
            .max_connections(1)
            .connect_with((*pool.connect_options()).clone())
            .await?;
        let mut connection = PgListener::connect_with(&own).await?;
        // A lost connection is reported at once, not replaced behind the
        // relay's back by one holding no slots.
        connection.eager_reconnect(false);
        connection.listen(CHANNEL).await?;
        Ok(Listener {
            connection,
            watching: false,
        })
    }

    /// Releases the wake-up slots once a claim found rows: writers stop
    /// notifying while the relay is busy. Skipped while the listener is in
    /// use (the relay loop never claims during its wait): the slots then
    /// stay held, which costs writers notifications, not correctness.
    pub(super) async fn stop_watching(&self) {
        let Ok(mut slot) = self.listener.try_lock() else {
            return;
        };
        if let Some(listener) = slot.as_mut().filter(|listener| listener.watching)
            && let Err(error) = listener.release().await
        {
            tracing::warn!(%error, "cannot release the wake-up locks; reconnecting");
            *slot = None;
        }
    }

    /// Takes the wake-up slots and returns at once, so that the caller's
    /// next claim is the last before the wait; once they are held, waits
    /// for a notification or `timeout`. The slots stay held until a claim
    /// finds rows.
    pub(super) async fn wait_for_rows(&self, source: &PostgresSource, timeout: Duration) {
        let mut slot = self.listener.lock().await;
        if slot.is_none() {
            match Self::listen(source.pool()).await {
                Ok(listener) => *slot = Some(listener),
                Err(error) => {
                    tracing::warn!(%error, "cannot LISTEN for new outbox rows; polling instead");
                    tokio::time::sleep(timeout).await;
                    return;
                }
            }
        }
        let listener = slot.as_mut().expect("listener was just set");
        if source.owns_no_shard() {
            // A standby: nothing to claim until it owns a shard.
            if listener.watching && listener.release().await.is_err() {
                *slot = None;
            }
            tokio::time::sleep(timeout).await;
            return;
        }
        if !listener.watching {
            match listener.watch(timeout.min(MAX_WAIT_FOR_WRITERS)).await {
                // Either the slots are held and rows of the writers waited
                // for may be pending, or a writer held a slot for the
                // whole interval: claim again in both cases.
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(%error, "cannot take the wake-up locks; reconnecting");
                    *slot = None;
                    tokio::time::sleep(timeout).await;
                    return;
                }
            }
        }
        match tokio::time::timeout(timeout, listener.connection.try_recv()).await {
            Ok(Ok(Some(_))) => while listener.connection.next_buffered().is_some() {},
            Ok(Ok(None)) => {
                // The slots went with the connection: listen and take them
                // again on a new one next time.
                tracing::warn!("lost the LISTEN connection; reconnecting");
                *slot = None;
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "lost the LISTEN connection; reconnecting");
                *slot = None;
                tokio::time::sleep(timeout).await;
            }
            Err(_elapsed) => {}
        }
    }
}

/// The `LISTEN` connection, which also holds the wake-up slots while the
/// relay waits.
pub(super) struct Listener {
    connection: PgListener,
    /// Whether this connection holds every wake-up slot, taken before the
    /// last claim.
    watching: bool,
}

impl Listener {
    /// Takes every wake-up slot, waiting up to `timeout` in all for the
    /// writers that hold one; if they hold them longer, takes none (and the
    /// caller polls).
    async fn watch(&mut self, timeout: Duration) -> Result<(), sqlx::Error> {
        // One round trip, in one implicit transaction, so the timeout
        // applies to this statement only.
        let sql = format!(
            "SET LOCAL statement_timeout = '{}ms'; {}",
            timeout.as_millis().max(1),
            take_wake_slots_sql()
        );
        let taken = sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut self.connection)
            .await;
        match taken {
            Ok(_) => {
                self.watching = true;
                Ok(())
            }
            // Session locks taken before an error stay held: release them.
            Err(sqlx::Error::Database(error))
                if matches!(error.code().as_deref(), Some("57014" | "55P03")) =>
            {
                self.release().await
            }
            Err(error) => {
                self.release().await.ok();
                Err(error)
            }
        }
    }

    /// Releases the wake-up slots.
    async fn release(&mut self) -> Result<(), sqlx::Error> {
        self.watching = false;
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut self.connection)
            .await?;
        Ok(())
    }
}
