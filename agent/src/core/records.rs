//! The core's records behind accessors that do the bookkeeping: every
//! `…_mut` marks what it hands out as changed, so a step writes exactly the
//! records it may have touched and no call site has to remember to.

use std::collections::{BTreeMap, BTreeSet};

use crate::state::{Approval, ApprovalState, RouterState, WorkerState};
use crate::storage::keys::ROUTER;

#[derive(Debug, Default)]
pub(crate) struct Records {
    router: RouterState,
    workers: BTreeMap<String, WorkerState>,
    approvals: BTreeMap<String, Approval>,
    /// Keys of the records changed since the last [`Records::take_dirty`].
    dirty: BTreeSet<String>,
}

impl Records {
    pub fn router(&self) -> &RouterState {
        &self.router
    }

    pub fn router_mut(&mut self) -> &mut RouterState {
        self.dirty.insert(ROUTER.to_string());
        &mut self.router
    }

    pub fn workers(&self) -> &BTreeMap<String, WorkerState> {
        &self.workers
    }

    pub fn worker(&self, id: &str) -> Option<&WorkerState> {
        self.workers.get(id)
    }

    pub fn worker_mut(&mut self, id: &str) -> Option<&mut WorkerState> {
        let w = self.workers.get_mut(id)?;
        self.dirty.insert(id.to_string());
        Some(w)
    }

    /// A worker that has not ended (ended ones take no more changes).
    pub fn live_worker_mut(&mut self, id: &str) -> Option<&mut WorkerState> {
        if self.workers.get(id)?.status.is_closed() {
            return None;
        }
        self.worker_mut(id)
    }

    pub fn insert_worker(&mut self, w: WorkerState) {
        self.dirty.insert(w.id.clone());
        self.workers.insert(w.id.clone(), w);
    }

    pub fn approvals(&self) -> &BTreeMap<String, Approval> {
        &self.approvals
    }

    pub fn approval_mut(&mut self, id: &str) -> Option<&mut Approval> {
        let a = self.approvals.get_mut(id)?;
        self.dirty.insert(id.to_string());
        Some(a)
    }

    pub fn insert_approval(&mut self, a: Approval) {
        self.dirty.insert(a.id.clone());
        self.approvals.insert(a.id.clone(), a);
    }

    /// Open approvals of `worker` (IDs).
    pub fn open_approvals_of(&self, worker: &str) -> Vec<String> {
        self.approvals
            .values()
            .filter(|a| a.worker == worker && a.state == ApprovalState::Open)
            .map(|a| a.id.clone())
            .collect()
    }

    pub fn take_dirty(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.dirty)
    }

    /// Every session's record, for writing its new messages. Messages are
    /// keys of their own, so this marks nothing dirty; a push through it
    /// still changes the record's message list, which is why pushes go
    /// through `router_mut`/`worker_mut` in the core.
    pub fn sessions_mut(&mut self) -> (&mut RouterState, &mut BTreeMap<String, WorkerState>) {
        (&mut self.router, &mut self.workers)
    }

    /// Loads a stored record (no change to write back).
    pub fn load_router(&mut self, r: RouterState) {
        self.router = r;
    }
    pub fn load_worker(&mut self, key: &str, w: WorkerState) {
        self.workers.insert(key.to_string(), w);
    }
    pub fn load_approval(&mut self, key: &str, a: Approval) {
        self.approvals.insert(key.to_string(), a);
    }

    /// Drops ended workers and answered approvals from memory, except those
    /// changed and not yet written (call after writing).
    pub fn evict_closed(&mut self) {
        let dirty = &self.dirty;
        self.workers
            .retain(|k, w| !w.status.is_closed() || dirty.contains(k));
        self.approvals
            .retain(|k, a| a.state == ApprovalState::Open || dirty.contains(k));
    }
}
