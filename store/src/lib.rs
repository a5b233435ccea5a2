//! byom's store: everything the server must remember, and nothing else.
//!
//! [`Backend`] is the small key-value contract a storage engine meets (get,
//! put, compare-and-swap, ordered ranges, atomic batches across keyspaces,
//! batches guarded by a key's value, a durable flush, notices to the other
//! processes sharing the store); sled is the embedded default, PostgreSQL
//! ([`PgBackend`]) the one replicas share. [`Store`] builds byom's typed
//! records on it (tokens, machines, commands with their output, threads,
//! triggers, policies, connectors and the outbox) without knowing which
//! backend it has. Records are the protobuf messages of the API.
//!
//! It must never know about agents, gRPC, QUIC, byom's own certificates
//! (the only TLS here is the PostgreSQL connection's, as its URL asks) or
//! wasmtime: the agents' state is opaque bytes under keys their own crate
//! lays out ([`Store::scan_prefix`], [`Store::batch`]).
//!
//! Invariant: every command state change goes through
//! [`Store::update_command`], which checks the transition against
//! `CommandState::can_become`; a command and its queue entry appear
//! together.
//!
//! Key types: [`Store`], [`Backend`] ([`SledBackend`], [`PgBackend`]),
//! [`Space`], [`Op`], [`Guard`], [`StoreError`], and [`Observer`], which
//! the owner may set to count command changes and commit times.

mod backend;
mod blobs;
mod channels;
mod commands;
mod idempotency;
mod machines;
mod observe;
mod outbox;
mod pg_backend;
mod pg_tls;
mod sled_backend;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod tokens;

pub use outbox::OUTBOX_QUEUE_LIMIT;

#[cfg(test)]
mod tests;

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use prost::Message;

pub use backend::{Backend, Guard, Kv, Op, Space};
pub use observe::{Commit, Observer};
pub use pg_backend::PgBackend;
pub use sled_backend::SledBackend;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O failed: {0} (is the disk full or the data dir read-only?)")]
    Io(String),
    /// The shared database refused or failed.
    #[error("{0}")]
    Database(String),
    /// The shared database cannot be reached now (down, restarting,
    /// failing over): the same call may succeed in a moment.
    #[error("{0} (the database cannot be reached now)")]
    Unreachable(String),
    #[error("stored record {0} is corrupt: {1}")]
    Corrupt(String, String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("illegal command state change {from} -> {to} for {id}")]
    IllegalTransition {
        id: String,
        from: &'static str,
        to: &'static str,
    },
}

pub type Result<T> = std::result::Result<T, StoreError>;

fn decode<M: Message + Default>(what: &str, bytes: &[u8]) -> Result<M> {
    M::decode(bytes).map_err(|e| StoreError::Corrupt(what.to_string(), e.to_string()))
}

/// Why a token could not be redeemed; each maps to a clear message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RedeemError {
    #[error("unknown pairing token: create a new one with `byom token create`")]
    Unknown,
    #[error("this pairing token was already used; tokens are single-use, create a new one with `byom token create`")]
    Used,
    #[error("this pairing token expired; create a new one with `byom token create`")]
    Expired,
    #[error("this pairing token was revoked; create a new one with `byom token create`")]
    Revoked,
    #[error("this pairing token paired all the {0} machines it may; create another with `byom token create --reusable --max-uses N`")]
    UsedUp(u32),
    #[error("too many machines are pairing with this token at once; try again")]
    Busy,
}

/// Most records one list call returns.
pub const MAX_LIST: usize = 10_000;

#[derive(Clone)]
pub struct Store {
    kv: Arc<dyn Backend>,
    group: Arc<GroupFlush>,
    /// Machine → commands in its queue, for machines counted so far.
    pending_counts: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    /// What this process last wrote of unfinished commands: the expected
    /// old value of their next update, which then needs no read when no
    /// one else wrote since. Never read as the record itself.
    recent: Arc<Memo<Vec<u8>>>,
    /// Machine name → the ID it last resolved to: a lookup then reads only
    /// the machine's record, which says whether the name still is its own.
    names: Arc<Memo<String>>,
    /// Told of command changes and commit times (the server's metrics).
    observer: Arc<std::sync::OnceLock<Arc<dyn Observer>>>,
}

/// A small memory keyed by ID, bounded in count (past it, it starts over):
/// a miss only costs a read, and nothing in it is trusted without a check.
pub(crate) struct Memo<V>(std::sync::Mutex<std::collections::HashMap<String, V>>);

impl<V> Default for Memo<V> {
    fn default() -> Self {
        Memo(Default::default())
    }
}

impl<V: Clone> Memo<V> {
    /// Entries kept at most.
    const MAX_ENTRIES: usize = 4096;

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, V>> {
        // A map of plain values: a panic elsewhere leaves it usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, key: &str) -> Option<V> {
        self.lock().get(key).cloned()
    }

    pub(crate) fn set(&self, key: &str, v: V) {
        let mut m = self.lock();
        if m.len() >= Self::MAX_ENTRIES && !m.contains_key(key) {
            m.clear();
        }
        m.insert(key.to_string(), v);
    }

    pub(crate) fn take(&self, key: &str) -> Option<V> {
        self.lock().remove(key)
    }
}

/// Group commit's bookkeeping: flushes are numbered as they start; `done`
/// announces the last one finished and its error.
#[derive(Default)]
struct GroupFlush {
    state: std::sync::Mutex<FlushState>,
    done: tokio::sync::watch::Sender<(u64, Option<String>)>,
}

#[derive(Default)]
struct FlushState {
    started: u64,
    running: bool,
}

impl GroupFlush {
    fn lock(&self) -> std::sync::MutexGuard<'_, FlushState> {
        // The state is two plain fields: a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a flush may take before the log says so (and again each time).
const SLOW_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

impl Store {
    pub fn new(kv: Arc<dyn Backend>) -> Self {
        Self {
            kv,
            group: Arc::default(),
            pending_counts: Arc::default(),
            recent: Arc::default(),
            names: Arc::default(),
            observer: Arc::default(),
        }
    }

    pub fn open_sled(dir: &Path) -> Result<Self> {
        Ok(Self::new(Arc::new(SledBackend::open(dir)?)))
    }

    /// Makes all prior writes durable. Blocking: call from a blocking context
    /// or via [`Store::flush_async`].
    pub fn flush(&self) -> Result<()> {
        self.timed(Commit::Flush, || self.kv.flush())
    }

    /// Makes all writes made before the call durable. Concurrent callers
    /// share flushes (group commit): a caller waits for the first flush
    /// that starts after its call, and starts one only when none is
    /// running, so N writers under load pay for a few flushes, not N.
    ///
    /// The leader flushes on its own thread (in `block_in_place` on a
    /// multi-threaded runtime) and announces with no `.await` in between:
    /// a caller dropped mid-flush (a client that went away, a timeout, a
    /// `select!`) cannot leave the others waiting for an announcement that
    /// never comes, and no other thread has to be woken to flush.
    pub async fn flush_async(&self) -> Result<()> {
        if self.kv.writes_are_durable() {
            return Ok(());
        }
        let g = &self.group;
        let mut done = g.done.subscribe();
        // A flush already running may have started before our writes: ours
        // is the next one.
        let target = g.lock().started + 1;
        loop {
            {
                let (gen, err) = &*done.borrow_and_update();
                if *gen >= target {
                    return match err {
                        None => Ok(()),
                        Some(e) => Err(StoreError::Io(e.clone())),
                    };
                }
            }
            let lead = {
                let mut s = g.lock();
                (!s.running).then(|| {
                    s.running = true;
                    s.started += 1;
                    s.started
                })
            };
            if let Some(gen) = lead {
                let r = blocking(|| self.timed(Commit::Flush, || flush_logged(self.kv.as_ref())));
                // Not running before announcing: a waiter woken by the
                // announcement must find it can lead the next flush.
                g.lock().running = false;
                g.done.send_replace((gen, r.err().map(|e| e.to_string())));
                continue;
            }
            // `g` holds the sender, so the channel outlives this wait.
            if done.changed().await.is_err() {
                return Err(StoreError::Io("the store was closed mid-flush".into()));
            }
        }
    }
}

/// Runs `f` where blocking is allowed: on a multi-threaded runtime the
/// thread's other tasks move elsewhere meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// One flush, logged if it was slow: a disk that stalls shows in the log.
fn flush_logged(kv: &dyn Backend) -> Result<()> {
    let started = std::time::Instant::now();
    let r = kv.flush();
    let took = started.elapsed();
    if took >= SLOW_FLUSH {
        tracing::warn!(secs = took.as_secs(), "the store's flush was slow");
    }
    r
}

impl Store {
    pub(crate) fn get_msg<M: Message + Default>(
        &self,
        space: Space,
        key: &str,
    ) -> Result<Option<M>> {
        match self.kv.get(space, key.as_bytes())? {
            Some(b) => Ok(Some(decode(key, &b)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn list_msgs<M: Message + Default>(
        &self,
        space: Space,
        limit: usize,
    ) -> Result<Vec<M>> {
        self.kv
            .range(space, Bound::Unbounded, Bound::Unbounded, true, limit)?
            .into_iter()
            .map(|(k, v)| decode(&String::from_utf8_lossy(&k), &v))
            .collect()
    }

    /// Read-modify-write with compare-and-swap, retried on contention.
    pub(crate) fn update_msg<M, F>(&self, space: Space, key: &str, f: F) -> Result<M>
    where
        M: Message + Default,
        F: FnMut(&mut M) -> Result<()>,
    {
        self.update_msg_by(space, key, None, f, |_, old, new| {
            self.kv
                .compare_and_swap(space, key.as_bytes(), Some(old), Some(&new))
        })
    }

    /// Read-modify-write retried on contention: `write(msg, old, new)`
    /// stores `new` if the record is still `old`, and says whether it did.
    /// `guess` is what the record probably is (this process wrote it last):
    /// tried first without a read, and trusted only through a guarded
    /// write that succeeds.
    pub(crate) fn update_msg_by<M, F, W>(
        &self,
        space: Space,
        key: &str,
        mut guess: Option<Vec<u8>>,
        mut f: F,
        mut write: W,
    ) -> Result<M>
    where
        M: Message + Default,
        F: FnMut(&mut M) -> Result<()>,
        W: FnMut(&M, &[u8], Vec<u8>) -> Result<bool>,
    {
        for _ in 0..1000 {
            let guessed = guess.is_some();
            let old = match guess.take() {
                Some(g) => g,
                None => self
                    .kv
                    .get(space, key.as_bytes())?
                    .ok_or_else(|| StoreError::NotFound(key.to_string()))?,
            };
            let mut msg: M = decode(key, &old)?;
            // A refusal or a no-op says something about the record only
            // if it was read: a guess may be stale.
            match f(&mut msg) {
                Err(_) if guessed => continue,
                r => r?,
            }
            let new = msg.encode_to_vec();
            // Nothing changed (e.g. a transition that did not apply): no write.
            if new == old {
                if guessed {
                    continue;
                }
                return Ok(msg);
            }
            if write(&msg, &old, new)? {
                return Ok(msg);
            }
        }
        Err(StoreError::Conflict(format!(
            "{key}: too much contention updating the record"
        )))
    }

    /// Scans a space newest first (IDs sort by creation time), page by page.
    /// `visit` returns `Some(true)` to keep a record, `Some(false)` to skip
    /// it, `None` to stop; at most `limit` records are kept.
    pub(crate) fn scan_newest<M, F>(
        &self,
        space: Space,
        limit: usize,
        mut visit: F,
    ) -> Result<Vec<M>>
    where
        M: Message + Default,
        F: FnMut(&M) -> Option<bool>,
    {
        const PAGE: usize = 512;
        let mut out = Vec::new();
        let mut cursor: Option<Vec<u8>> = None;
        loop {
            let page = self.kv.range(
                space,
                Bound::Unbounded,
                cursor.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
                true,
                PAGE,
            )?;
            let n = page.len();
            for (k, v) in page {
                let m: M = decode(&String::from_utf8_lossy(&k), &v)?;
                cursor = Some(k);
                match visit(&m) {
                    None => return Ok(out),
                    Some(false) => continue,
                    Some(true) => out.push(m),
                }
                if out.len() >= limit {
                    return Ok(out);
                }
            }
            if n < PAGE {
                return Ok(out);
            }
        }
    }

    /// Applies writes atomically, across spaces (see [`Backend::batch`]).
    pub fn batch(&self, ops: &[Op]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.timed(Commit::Write, || self.kv.batch(ops))
    }

    /// Applies writes atomically if `guard` holds (see [`Backend::batch_if`]).
    pub fn batch_if(&self, guard: &Guard, ops: &[Op]) -> Result<bool> {
        self.timed(Commit::Write, || self.kv.batch_if(guard, ops))
    }

    /// One value, as stored.
    pub fn get_raw(&self, space: Space, key: &str) -> Result<Option<Vec<u8>>> {
        self.kv.get(space, key.as_bytes())
    }

    /// Whether several servers share this store.
    pub fn is_shared(&self) -> bool {
        self.kv.is_shared()
    }

    /// Tells every server sharing the store `note` (see [`Backend::notify`]).
    pub fn notify(&self, note: &str) -> Result<()> {
        self.kv.notify(note)
    }

    pub fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        self.kv.notices()
    }

    pub fn delete_raw(&self, space: Space, key: &str) -> Result<()> {
        self.kv.delete(space, key.as_bytes())
    }

    /// Replaces `key`'s value `old` with `new` (None: absent), if it is
    /// still `old`.
    pub fn cas_raw(
        &self,
        space: Space,
        key: &str,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        self.kv.compare_and_swap(space, key.as_bytes(), old, new)
    }

    /// Writes `value` under `key` unless something is there already;
    /// whether it did. The first of several servers racing wins.
    pub fn create_raw(&self, space: Space, key: &str, value: &[u8]) -> Result<bool> {
        self.kv
            .compare_and_swap(space, key.as_bytes(), None, Some(value))
    }

    pub fn put_raw(&self, space: Space, key: &str, value: &[u8]) -> Result<()> {
        self.kv.put(space, key.as_bytes(), value)
    }

    /// Up to `limit` entries whose key starts with `prefix`, in key order,
    /// keys without the prefix.
    pub fn scan_prefix(
        &self,
        space: Space,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        let end = backend::prefix_end(prefix.as_bytes());
        Ok(self
            .kv
            .range(
                space,
                Bound::Included(prefix.as_bytes()),
                end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
                false,
                limit,
            )?
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), v))
            .collect())
    }
}
