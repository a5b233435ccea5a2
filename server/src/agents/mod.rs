//! The agents' shell: the driver that owns the [`byom_agent::Core`] and
//! writes every step to the store before acting on it ([`driver`]), the
//! world it sees ([`world`]), programs in the real interpreter
//! ([`programs`]), model calls, and the durable inbox everyone else uses to
//! reach it ([`AgentInbox`]).

pub mod driver;
pub mod lease;
pub mod programs;
pub mod world;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use byom_agent::storage::keys;
use byom_agent::Event;
use byom_store::{Op, Space, Store, StoreError};
use tokio::sync::Notify;

pub use world::paused_program_of;

/// The agents' durable inbox: triggers, answers and cancels are written
/// (flushed) here before they are acknowledged; the driver takes them in
/// order and deletes each in the same commit as the step it caused.
#[derive(Clone)]
pub struct AgentInbox {
    store: Store,
    bell: Arc<Notify>,
    /// The agents may run on another replica.
    cluster: Arc<crate::cluster::Cluster>,
}

impl AgentInbox {
    pub fn new(store: Store) -> AgentInbox {
        AgentInbox {
            store,
            bell: Arc::new(Notify::new()),
            cluster: crate::cluster::Cluster::alone(),
        }
    }

    /// The inbox of agents that may run on any replica of `cluster`.
    pub fn in_cluster(mut self, cluster: Arc<crate::cluster::Cluster>) -> AgentInbox {
        self.cluster = cluster;
        self
    }

    /// The write that puts `ev` in the inbox (to batch with others).
    pub fn op(ev: &Event) -> Op {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let key = keys::inbox(byom_wire::now_ms(), seq);
        Op::put(
            Space::Agents,
            key.into_bytes(),
            serde_json::to_vec(ev).unwrap_or_default(),
        )
    }

    /// Puts an event in the inbox (durably, with `extra` writes in the same
    /// batch) and wakes the driver.
    pub async fn enqueue(&self, ev: &Event, extra: &[Op]) -> Result<(), StoreError> {
        let mut ops = vec![Self::op(ev)];
        ops.extend_from_slice(extra);
        self.store.batch(&ops)?;
        self.store.flush_async().await?;
        self.wake();
        Ok(())
    }

    /// Something was written to the inbox: the agents look, on whichever
    /// replica runs them.
    pub fn wake(&self) {
        self.bell.notify_one();
        self.cluster.tell(crate::cluster::Note::Agents);
    }

    /// Another replica wrote to the inbox (or may have): look here.
    pub fn wake_here(&self) {
        self.bell.notify_one();
    }

    pub(crate) async fn woken(&self) {
        self.bell.notified().await;
    }
}
