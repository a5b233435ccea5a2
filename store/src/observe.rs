//! What the store tells its owner as it happens, for the owner's metrics:
//! command state changes and how long commits take. The store only
//! reports; nothing it decides depends on an [`Observer`], and with none
//! set a write costs two clock reads more than it did.

use std::time::{Duration, Instant};

use byom_protocol::pb::{self, CommandState};

/// Which kind of commit took the time reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// An atomic write: a batch (guarded or not), or a command record's
    /// compare-and-swap. On PostgreSQL this is the transaction's commit.
    Write,
    /// A durable flush (sled's fsync, shared by group commit).
    Flush,
}

impl Commit {
    pub fn name(self) -> &'static str {
        match self {
            Commit::Write => "write",
            Commit::Flush => "flush",
        }
    }
}

/// Told after a write succeeded, on the writer's thread: keep it cheap
/// (count, never block) and never call back into the store.
pub trait Observer: Send + Sync {
    /// Command `c` was written; `from` is the state it had before (None:
    /// it was created).
    fn command(&self, from: Option<CommandState>, c: &pb::Command);
    /// A commit of `kind` took `took`.
    fn commit(&self, kind: Commit, took: Duration);
}

impl crate::Store {
    /// Sets the observer (once: a second call is ignored and says so).
    pub fn observe(&self, o: std::sync::Arc<dyn Observer>) -> bool {
        self.observer.set(o).is_ok()
    }

    pub(crate) fn observed_command(&self, from: Option<CommandState>, c: &pb::Command) {
        if let Some(o) = self.observer.get() {
            o.command(from, c);
        }
    }

    /// Runs `f` (a commit of `kind`) and reports how long it took, if it
    /// succeeded.
    pub(crate) fn timed<T>(
        &self,
        kind: Commit,
        f: impl FnOnce() -> crate::Result<T>,
    ) -> crate::Result<T> {
        let Some(o) = self.observer.get() else {
            return f();
        };
        let started = Instant::now();
        let r = f();
        if r.is_ok() {
            o.commit(kind, started.elapsed());
        }
        r
    }
}
