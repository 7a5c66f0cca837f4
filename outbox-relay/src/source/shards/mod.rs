//! Sharing the work between relay instances on one database.
//!
//! Every row belongs to one of `count` shards, a stable hash of its
//! aggregate, so all events of an aggregate share a shard. Each shard has at
//! most one owner at a time: the instance holding an unexpired lease in
//! `outbox_relay_shard`, whose `epoch` grows at every change of owner. Each
//! instance heartbeats its row in `outbox_relay_instance` and takes a fair
//! share of the shards (`ceil(count / live instances)`), releasing extras
//! when instances join and picking up shards whose owner stopped (released
//! at once) or died (lease expired).
//!
//! A claim reads its shards without holding up renewals or takeovers (a
//! lease is renewed on a connection of its own, and never waits for the
//! relay's own claims); the mark re-checks the epochs (fencing); and the
//! relay does not publish a batch unless its local view still holds the
//! batch's shards under the epochs it claimed them with, with a lease
//! covering now (not after a pause, nor after the shards changed owner).
//! An instance that takes over shards whose lease expired ends the previous
//! owner's database sessions where the database allows it (PostgreSQL), so
//! that the rows a paused or frozen claim holds are freed at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use tokio::task::JoinHandle;

use super::SourceError;

pub(crate) mod tables;

/// How an instance takes part in shard ownership.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Number of shards; every instance on a database must use the same.
    pub count: u32,
    /// How long an owner keeps its shards without renewing them; an
    /// instance that dies loses them after this long.
    pub lease: Duration,
    /// This instance's id, unique among the live instances.
    pub instance: String,
    /// The longest a batch may hold its claim (send timeout plus lease);
    /// past it the database ends the claim's transaction, releasing the
    /// rows of a paused instance to the shards' next owner.
    pub batch_timeout: Duration,
}

impl Default for ShardConfig {
    fn default() -> Self {
        Self {
            count: 16,
            lease: Duration::from_secs(10),
            instance: default_instance_id(),
            batch_timeout: Duration::from_secs(40),
        }
    }
}

/// `host-pid-random`, readable in `status` and unique across restarts.
pub fn default_instance_id() -> String {
    let host = host_name().unwrap_or_else(|| "relay".to_owned());
    let random = uuid::Uuid::now_v7().simple().to_string();
    format!(
        "{host}-{}-{}",
        std::process::id(),
        &random[random.len() - 6..]
    )
}

/// This machine's host name, if `/etc/hostname` gives one.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/etc/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
}

/// The ownership statements of one database.
#[async_trait]
pub trait ShardStore: Send + Sync {
    /// Creates the shard rows `0..count`; fails when rows beyond `count`
    /// exist (instances disagree on the shard count).
    async fn prepare(&self, count: u32) -> Result<(), SourceError>;

    /// Extends this instance's registration, forgets expired instances and
    /// returns the number of live ones (this one included).
    async fn heartbeat(&self, instance: &str, lease: Duration) -> Result<usize, SourceError>;

    /// Extends the leases of the shards this instance owns; returns them
    /// with their epochs.
    async fn renew(&self, instance: &str, lease: Duration) -> Result<Vec<(i32, i64)>, SourceError>;

    /// Takes up to `want` free or expired shards for `config.instance`,
    /// under a lease of `config.lease`; returns those taken.
    async fn acquire(&self, config: &ShardConfig, want: usize) -> Result<Vec<Taken>, SourceError>;

    /// Ends the database sessions of `owner`, an instance whose lease
    /// expired while it held shards; returns how many it ended.
    async fn end_sessions_of(&self, owner: &str) -> Result<u64, SourceError>;

    /// Gives up `shards`.
    async fn release(&self, instance: &str, shards: &[i32]) -> Result<(), SourceError>;

    /// Gives up every shard and unregisters.
    async fn leave(&self, instance: &str) -> Result<(), SourceError>;
}

/// A shard taken by [`ShardStore::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The shard.
    pub shard: i32,
    /// Its epoch from now on.
    pub epoch: i64,
    /// The owner whose lease had expired, if any (else it was free).
    pub previous_owner: Option<String>,
}

/// This instance's view of its shards, kept current by [`run_membership`].
#[derive(Debug, Default)]
pub(crate) struct Membership {
    lease: Mutex<Lease>,
    /// Whether the wait for shards held by other instances was logged.
    waiting_logged: AtomicBool,
}

/// The shards held at the last successful renewal, and until when.
#[derive(Debug, Default)]
struct Lease {
    valid_until: Option<Instant>,
    /// Shard to epoch.
    owned: HashMap<i64, i64>,
}

impl Membership {
    /// Whether, as of the last renewal and still at `now`, this instance
    /// holds every one of the `(shard, epoch)` pairs: a batch claimed
    /// under them may be sent. False once the lease ran out (after a
    /// pause, say), and false for good once any of them changed owner,
    /// even if this instance renewed its other shards since.
    #[cfg(test)]
    pub fn holds(&self, now: Instant, claimed: &[(i64, i64)]) -> bool {
        self.held_until(claimed).is_some_and(|until| now < until)
    }

    /// Until when, as of the last renewal, this instance holds every one
    /// of the `(shard, epoch)` pairs; `None` when it holds no lease or any
    /// of them changed owner.
    pub fn held_until(&self, claimed: &[(i64, i64)]) -> Option<Instant> {
        let lease = self.lease.lock().expect("membership lock");
        let all_held = claimed
            .iter()
            .all(|(shard, epoch)| lease.owned.get(shard) == Some(epoch));
        lease.valid_until.filter(|_| all_held)
    }

    /// Says once, at INFO, that this instance waits for shards other
    /// instances hold (a restarted relay waits for its previous run's
    /// leases), rather than claiming nothing in silence.
    fn note_waiting(&self, owned: usize, fair: usize, lease: Duration) {
        let waiting = owned < fair;
        if waiting && !self.waiting_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(
                owned,
                fair_share = fair,
                "waiting for shards other instances hold: taken over when their owners hand \
                 them over or their leases expire (within --lease {})",
                humantime::format_duration(lease)
            );
        } else if !waiting && self.waiting_logged.swap(false, Ordering::Relaxed) {
            tracing::info!(owned, "owns its fair share of the shards");
        }
    }

    fn renewed(&self, at: Instant, lease: Duration, owned: &[(i32, i64)]) {
        // A margin for clock drift between the relay and the database.
        let valid = lease.mul_f32(0.8);
        let mut state = self.lease.lock().expect("membership lock");
        state.valid_until = Some(at + valid);
        state.owned = owned
            .iter()
            .map(|(shard, epoch)| (i64::from(*shard), *epoch))
            .collect();
    }
}

/// Joins the shard owners: one round at once (so a lone instance starts
/// with every shard), then a round every heartbeat until the returned task
/// is aborted.
pub(crate) async fn join(
    store: Arc<dyn ShardStore>,
    config: ShardConfig,
) -> Result<(Arc<Membership>, JoinHandle<()>), SourceError> {
    store.prepare(config.count).await?;
    let membership = Arc::new(Membership::default());
    round(store.as_ref(), &config, &membership).await?;
    let task = tokio::spawn(run_membership(store, config, membership.clone()));
    Ok((membership, task))
}

fn heartbeat_interval(lease: Duration) -> Duration {
    (lease / 3).min(Duration::from_secs(1))
}

async fn run_membership(
    store: Arc<dyn ShardStore>,
    config: ShardConfig,
    membership: Arc<Membership>,
) {
    let interval = heartbeat_interval(config.lease);
    loop {
        tokio::time::sleep(interval).await;
        if let Err(error) = round(store.as_ref(), &config, &membership).await {
            tracing::warn!(%error, "cannot renew shard leases; retrying");
        }
    }
}

/// One heartbeat: renew, then release or acquire towards a fair share.
async fn round(
    store: &dyn ShardStore,
    config: &ShardConfig,
    membership: &Membership,
) -> Result<(), SourceError> {
    let started = Instant::now();
    let live = store
        .heartbeat(&config.instance, config.lease)
        .await?
        .max(1);
    let mut owned = store.renew(&config.instance, config.lease).await?;
    membership.renewed(started, config.lease, &owned);
    tracing::debug!(live, owned = owned.len(), "renewed the shard leases");
    let fair = (config.count as usize).div_ceil(live);
    if owned.len() > fair {
        owned.sort_unstable();
        let extra: Vec<i32> = owned
            .split_off(fair)
            .into_iter()
            .map(|(shard, _)| shard)
            .collect();
        // Given up in the view first: no batch of them is sent from now on.
        membership.renewed(started, config.lease, &owned);
        store.release(&config.instance, &extra).await?;
        tracing::info!(released = ?extra, live, "handed shards over to other instances");
    } else if owned.len() < fair {
        let taken = store.acquire(config, fair - owned.len()).await?;
        if !taken.is_empty() {
            let shards: Vec<i32> = taken.iter().map(|taken| taken.shard).collect();
            tracing::info!(?shards, live, "took over shards");
        }
        end_stale_owners(store, &config.instance, &taken).await;
        owned.extend(taken.iter().map(|taken| (taken.shard, taken.epoch)));
        membership.renewed(started, config.lease, &owned);
    }
    membership.note_waiting(owned.len(), fair, config.lease);
    crate::metrics::record_owned_shards(owned.len());
    Ok(())
}

/// Ends the database sessions of the instances whose expired shards were
/// just taken: a relay paused or frozen in the middle of a claim keeps that
/// claim's rows locked (a statement blocked on sending rows to a stopped
/// client is not idle, so no idle timeout ends it) until its session ends.
/// A resumed owner finds its connections closed and its lease gone, and
/// sends nothing more of those shards.
async fn end_stale_owners(store: &dyn ShardStore, instance: &str, taken: &[Taken]) {
    let mut stale: Vec<&str> = taken
        .iter()
        .filter_map(|taken| taken.previous_owner.as_deref())
        .filter(|owner| *owner != instance)
        .collect();
    stale.sort_unstable();
    stale.dedup();
    for owner in stale {
        match store.end_sessions_of(owner).await {
            Ok(0) => {}
            Ok(ended) => tracing::warn!(
                owner,
                ended,
                "took over shards whose owner stopped renewing its lease; ended its database sessions"
            ),
            Err(error) => tracing::warn!(
                owner,
                %error,
                "cannot end the sessions of the shards' previous owner; its claims end with their timeouts"
            ),
        }
    }
}

/// Leaves at shutdown so that other instances take the shards over at once.
pub(crate) async fn leave(store: &dyn ShardStore, config: &ShardConfig) {
    match store.leave(&config.instance).await {
        Ok(()) => tracing::info!("released every shard"),
        Err(error) => {
            tracing::warn!(%error, "cannot release the shards; they expire with the lease")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_are_frequent_enough_for_the_lease() {
        assert_eq!(
            heartbeat_interval(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            heartbeat_interval(Duration::from_millis(900)),
            Duration::from_millis(300)
        );
    }

    #[test]
    fn a_lease_is_trusted_for_most_of_its_length() {
        let membership = Membership::default();
        let now = Instant::now();
        assert!(
            !membership.holds(now, &[]),
            "no lease before the first renewal"
        );
        membership.renewed(now, Duration::from_secs(10), &[(1, 4)]);
        assert!(membership.holds(now + Duration::from_secs(7), &[(1, 4)]));
        assert!(!membership.holds(now + Duration::from_secs(9), &[(1, 4)]));
    }

    #[test]
    fn a_batch_is_sent_only_under_the_epochs_it_was_claimed_with() {
        let membership = Membership::default();
        let now = Instant::now();
        membership.renewed(now, Duration::from_secs(10), &[(1, 4), (2, 9)]);
        assert!(membership.holds(now, &[(1, 4), (2, 9)]));
        assert!(!membership.holds(now + Duration::from_secs(9), &[(1, 4)]));
        // Resumed after a pause: the renewal no longer returns shard 2, or
        // returns it under a later epoch (taken over and back).
        membership.renewed(now, Duration::from_secs(10), &[(1, 4)]);
        assert!(!membership.holds(now, &[(1, 4), (2, 9)]));
        membership.renewed(now, Duration::from_secs(10), &[(1, 4), (2, 11)]);
        assert!(!membership.holds(now, &[(2, 9)]));
        assert!(membership.holds(now, &[(1, 4)]));
    }

    #[test]
    fn instance_ids_are_unique() {
        assert_ne!(default_instance_id(), default_instance_id());
    }
}
