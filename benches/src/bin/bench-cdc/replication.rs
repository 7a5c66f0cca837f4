//! The run's own replication slot and publication: created once at the
//! start, moved past everything the CDC relay must not publish before each
//! CDC measurement, and dropped at the end, also when the run fails (a
//! leaked slot makes the server keep WAL forever and takes one of its few
//! slots).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use outbox_relay::cdc::slot;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

/// Slot and publication names start with this, then a UUIDv7 (whose first
/// 48 bits are the creation time in milliseconds).
const PREFIX: &str = "outbox_bench_cdc_";

/// A slot of an earlier run, inactive and older than this, was leaked by a
/// run that was killed; it is dropped.
const STALE_AFTER: Duration = Duration::from_secs(30 * 60);

/// The names of the run's slot and publication (the same name for both).
#[derive(Debug, Clone)]
pub struct Replication {
    pub name: String,
}

impl Replication {
    /// Fresh names, nothing created yet.
    pub fn new() -> Self {
        Self {
            name: format!("{PREFIX}{}", Uuid::now_v7().simple()),
        }
    }

    /// Creates the publication of the outbox table the pool's search path
    /// finds, and the slot, as the relay would on its first start.
    pub async fn create(&self, pool: &PgPool) -> anyhow::Result<()> {
        slot::check_wal_level(pool).await?;
        slot::ensure_publication(pool, &self.name).await?;
        slot::ensure_slot(pool, &self.name).await?;
        Ok(())
    }

    /// The server process streaming the slot to a relay, if any.
    pub async fn reader_pid(&self, pool: &PgPool) -> anyhow::Result<Option<i32>> {
        Ok(sqlx::query_scalar(
            "SELECT s.active_pid FROM pg_replication_slots AS s \
             JOIN pg_stat_activity AS a ON a.pid = s.active_pid \
             WHERE s.slot_name = $1 AND s.active AND a.backend_type = 'walsender'",
        )
        .bind(&self.name)
        .fetch_optional(pool)
        .await?
        .flatten())
    }

    /// Waits until a relay streams the slot; rows committed from then on
    /// reach it without the backlog of a catch-up.
    pub async fn wait_reading(&self, pool: &PgPool) -> anyhow::Result<i32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(pid) = self.reader_pid(pool).await? {
                return Ok(pid);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the CDC relay did not start reading slot {} within 30 s",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until no process uses the slot (a stopped relay's server
    /// process exits a moment after it).
    async fn wait_inactive(&self, pool: &PgPool, timeout: Duration) -> anyhow::Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let active: Option<bool> =
                sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                    .bind(&self.name)
                    .fetch_optional(pool)
                    .await?;
            if active != Some(true) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Moves the slot's confirmed position to the end of the WAL, so the
    /// next CDC relay publishes only what is committed from now on (not
    /// the rows of the polling measurements). The slot must be free.
    ///
    /// A checkpoint first: it logs the running transactions, a point from
    /// which decoding can restart, so the slot's restart position follows
    /// the confirmed one. Without it, the next relay would start by reading
    /// again (and discarding) all the WAL written since the restart
    /// position last moved, which a relay that ran a while keeps within
    /// about 15 s (the server logs running transactions that often).
    pub async fn skip_to_now(&self, pool: &PgPool) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.wait_inactive(pool, Duration::from_secs(30)).await?,
            "slot {} is still in use",
            self.name
        );
        // The restart position moves once decoding passed such a point and
        // the confirmed position passed it too: it may take two rounds.
        for _ in 0..3 {
            sqlx::raw_sql("CHECKPOINT").execute(pool).await?;
            sqlx::query("SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())")
                .bind(&self.name)
                .execute(pool)
                .await
                .with_context(|| format!("advancing slot {}", self.name))?;
            let retained = slot::slot_status(pool, &self.name)
                .await?
                .and_then(|status| status.retained_wal_bytes)
                .unwrap_or(0);
            if retained < 1024 * 1024 {
                break;
            }
        }
        Ok(())
    }

    /// Drops the slot and the publication, over a fresh connection to
    /// `admin_url` (retried for a minute, in case the server restarts). A
    /// reader still streaming the slot after 15 s is this run's own relay,
    /// and its server process is terminated.
    pub async fn drop(&self, admin_url: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let pool = loop {
            match PgPoolOptions::new()
                .max_connections(1)
                .connect(admin_url)
                .await
            {
                Ok(pool) => break pool,
                Err(error) if Instant::now() < deadline => {
                    eprintln!("cannot connect to drop slot {} yet: {error}", self.name);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(error) => {
                    return Err(error).context(format!(
                        "cannot connect to drop slot {0}: drop it with \
                         SELECT pg_drop_replication_slot('{0}'); DROP PUBLICATION {0};",
                        self.name
                    ));
                }
            }
        };
        let outcome = async {
            if !self.wait_inactive(&pool, Duration::from_secs(15)).await? {
                sqlx::query(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                     WHERE slot_name = $1 AND active",
                )
                .bind(&self.name)
                .execute(&pool)
                .await?;
                self.wait_inactive(&pool, Duration::from_secs(15)).await?;
            }
            drop_slot_and_publication(&pool, &self.name).await
        }
        .await;
        pool.close().await;
        outcome
    }
}

async fn drop_slot_and_publication(pool: &PgPool, name: &str) -> anyhow::Result<()> {
    sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = $1",
    )
    .bind(name)
    .execute(pool)
    .await
    .with_context(|| format!("dropping slot {name}"))?;
    // `name` is PREFIX and hex digits: it needs no quoting.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP PUBLICATION IF EXISTS {name}"
    )))
    .execute(pool)
    .await
    .with_context(|| format!("dropping publication {name}"))?;
    Ok(())
}

/// Drops the inactive slots (and their publications) that runs killed
/// before their cleanup left behind, once they are [`STALE_AFTER`] old.
pub async fn drop_stale(pool: &PgPool) -> anyhow::Result<()> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT slot_name::text FROM pg_replication_slots \
         WHERE slot_name LIKE 'outbox\\_bench\\_cdc\\_%' AND NOT active",
    )
    .fetch_all(pool)
    .await?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    for name in names {
        let created_ms = name
            .strip_prefix(PREFIX)
            .and_then(|uuid| uuid.get(..12))
            .and_then(|hex| u128::from_str_radix(hex, 16).ok());
        if let Some(created_ms) = created_ms
            && now_ms.saturating_sub(created_ms) > STALE_AFTER.as_millis()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            eprintln!("dropping slot {name}, left behind by an earlier run");
            drop_slot_and_publication(pool, &name).await?;
        }
    }
    Ok(())
}
