//! One owner of the agents among replicas: a lease in the store (holder,
//! epoch, expiry) and the epoch every agent commit is guarded by.
//!
//! A replica takes the lease when it is free or expired, moving the epoch
//! on; it renews it every second while it runs the agents. An owner that
//! was paused (or cut off) past the expiry finds, when it wakes, that its
//! next commit is refused (the epoch moved on) and stands down: it never
//! writes again under the old epoch. The new owner rebuilds the agents from
//! the store and resumes what was in flight.
//!
//! Expiry is by each replica's clock: replicas need clocks that agree to
//! well within [`LEASE_TTL`] (NTP does).

use std::time::Duration;

use byom_store::{Guard, Op, Space, Store, StoreError};
use tokio_util::sync::CancellationToken;

/// How long a lease holds without renewal: the most the agents stand
/// still after their owner dies.
pub const LEASE_TTL: Duration = Duration::from_secs(4);
pub const RENEW_EVERY: Duration = Duration::from_secs(1);

const LEASE: &str = "agents";
const EPOCH: &str = "agents.epoch";

/// A lease held.
#[derive(Clone)]
pub struct Lease {
    store: Store,
    pub replica: String,
    pub epoch: u64,
    /// Holds while the epoch is ours: what every agent commit is guarded by.
    pub fence: Guard,
}

fn parse(v: &[u8]) -> (String, u64, u64) {
    let s = String::from_utf8_lossy(v);
    let mut it = s.split(' ');
    let holder = it.next().unwrap_or("").to_string();
    let epoch = it.next().and_then(|e| e.parse().ok()).unwrap_or(0);
    let expires = it.next().and_then(|e| e.parse().ok()).unwrap_or(0);
    (holder, epoch, expires)
}

fn value(replica: &str, epoch: u64, expires: u64) -> Vec<u8> {
    format!("{replica} {epoch} {expires}").into_bytes()
}

fn guard(key: &str, value: Vec<u8>) -> Guard {
    Guard {
        space: Space::Leases,
        key: key.as_bytes().to_vec(),
        value,
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Takes the lease if it is free or expired.
pub fn try_take(store: &Store, replica: &str) -> Result<Option<Lease>, StoreError> {
    // The row exists from the first replica on, so every change is guarded.
    store.create_raw(Space::Leases, LEASE, &value("", 0, 0))?;
    let Some(cur) = store.get_raw(Space::Leases, LEASE)? else {
        return Ok(None);
    };
    let (holder, epoch, expires) = parse(&cur);
    let now = byom_wire::now_ms();
    if !holder.is_empty() && expires > now {
        return Ok(None);
    }
    let epoch = epoch + 1;
    let mine = format!("{epoch} {replica}").into_bytes();
    let ops = [
        Op::put(
            Space::Leases,
            LEASE,
            value(replica, epoch, now + ms(LEASE_TTL)),
        ),
        Op::put(Space::Leases, EPOCH, mine.clone()),
    ];
    if !store.batch_if(&guard(LEASE, cur), &ops)? {
        return Ok(None); // another replica was quicker
    }
    Ok(Some(Lease {
        store: store.clone(),
        replica: replica.to_string(),
        epoch,
        fence: guard(EPOCH, mine),
    }))
}

/// Who holds the agents' lease and until when (ms since the epoch), as
/// the store says now; None before any replica asked for it.
pub fn holder(store: &Store) -> Result<Option<(String, u64)>, StoreError> {
    Ok(store.get_raw(Space::Leases, LEASE)?.map(|v| {
        let (holder, _, expires) = parse(&v);
        (holder, expires)
    }))
}

impl Lease {
    /// Extends the lease; false if it is no longer ours.
    pub fn renew(&self) -> Result<bool, StoreError> {
        self.set_expiry(byom_wire::now_ms() + ms(LEASE_TTL))
    }

    /// Gives the lease up (at shutdown): another replica takes over now,
    /// not when it expires.
    pub fn release(&self) -> Result<bool, StoreError> {
        self.set_expiry(0)
    }

    fn set_expiry(&self, expires: u64) -> Result<bool, StoreError> {
        let op = Op::put(
            Space::Leases,
            LEASE,
            value(&self.replica, self.epoch, expires),
        );
        self.store.batch_if(&self.fence, &[op])
    }
}

/// Waits until this replica holds the lease; None at shutdown.
pub async fn acquire(store: &Store, replica: &str, shutdown: &CancellationToken) -> Option<Lease> {
    let mut told = false;
    loop {
        let (s, r) = (store.clone(), replica.to_string());
        match tokio::task::spawn_blocking(move || try_take(&s, &r)).await {
            Ok(Ok(Some(l))) => return Some(l),
            Ok(Ok(None)) if !told => {
                tracing::info!("another replica runs the agents: standing by");
                told = true;
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::warn!("cannot read the agents' lease: {e}"),
            Err(e) => tracing::warn!("lease task failed: {e}"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(RENEW_EVERY / 2) => {}
        }
    }
}

/// Renews `lease` until it is lost, then cancels `lost`; at shutdown
/// releases it. A lease that could not be renewed for most of its time is
/// given up as lost before another replica can take it.
pub async fn keep(lease: Lease, lost: CancellationToken, shutdown: CancellationToken) {
    let mut renewed = byom_wire::now_ms();
    loop {
        tokio::select! {
            // Shutdown first: it cancels `lost` too, and must release.
            biased;
            _ = shutdown.cancelled() => {
                let l = lease.clone();
                let _ = tokio::task::spawn_blocking(move || l.release()).await;
                return;
            }
            _ = lost.cancelled() => return,
            _ = tokio::time::sleep(RENEW_EVERY) => {}
        }
        let l = lease.clone();
        let r = tokio::task::spawn_blocking(move || l.renew()).await;
        match r {
            Ok(Ok(true)) => renewed = byom_wire::now_ms(),
            Ok(Ok(false)) => {
                tracing::warn!(epoch = lease.epoch, "the agents' lease was taken over");
                lost.cancel();
                return;
            }
            Ok(Err(e)) => tracing::warn!("cannot renew the agents' lease: {e}"),
            Err(e) => tracing::warn!("lease task failed: {e}"),
        }
        if byom_wire::now_ms().saturating_sub(renewed) > ms(LEASE_TTL) * 3 / 4 {
            tracing::warn!("could not renew the agents' lease in time: standing down");
            lost.cancel();
            return;
        }
    }
}

/// Runs the agents: at once with an embedded store (one server); with
/// replicas, whenever this one holds the lease, standing down when it
/// loses it and standing by to take it again.
pub async fn run(
    h: crate::agents::driver::Handles,
    cfg: crate::agents::driver::AgentConfig,
    cluster: std::sync::Arc<crate::cluster::Cluster>,
) {
    if !cluster.shared() {
        return crate::agents::driver::run(h, cfg).await;
    }
    let shutdown = h.shutdown.clone();
    h.channels.set_active(false);
    loop {
        let Some(lease) = acquire(&h.store, &cluster.replica, &shutdown).await else {
            return;
        };
        tracing::info!(
            epoch = lease.epoch,
            "took the agents' lease: running the agents"
        );
        let lost = shutdown.child_token();
        let keeper = tokio::spawn(keep(lease.clone(), lost.clone(), shutdown.clone()));
        let mut mine = h.clone();
        mine.shutdown = lost.clone();
        mine.fence = Some(lease.fence.clone());
        h.channels.set_active(true);
        crate::agents::driver::run(mine, cfg.clone()).await;
        // Another replica's figures now.
        crate::metrics::agents_seen(None);
        h.channels.set_active(false);
        lost.cancel();
        if shutdown.is_cancelled() {
            let _ = keeper.await;
            return;
        }
        keeper.abort();
        tracing::warn!(epoch = lease.epoch, "stood down from the agents");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_an_old_epoch_is_fenced() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open_sled(d.path()).unwrap();
        let a = try_take(&s, "a").unwrap().expect("free: a takes it");
        assert!(try_take(&s, "b").unwrap().is_none(), "held by a");
        assert!(a.renew().unwrap());
        // a stops renewing (paused); once expired, b takes over.
        let (h, e, _) = parse(&s.get_raw(Space::Leases, LEASE).unwrap().unwrap());
        s.put_raw(Space::Leases, LEASE, &value(&h, e, 1)).unwrap();
        let b = try_take(&s, "b").unwrap().expect("expired: b takes it");
        assert_eq!(b.epoch, a.epoch + 1);
        // a wakes: its renewal and its commits are refused.
        assert!(!a.renew().unwrap());
        let op = [Op::put(Space::Agents, "r/x", b"late".to_vec())];
        assert!(!s.batch_if(&a.fence, &op).unwrap());
        assert!(s.batch_if(&b.fence, &op).unwrap());
        // b releases at shutdown: free at once.
        assert!(b.release().unwrap());
        assert!(try_take(&s, "c").unwrap().is_some());
    }
}
