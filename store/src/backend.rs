//! The small key-value contract a storage engine must meet ([`Backend`]:
//! get, put, compare-and-swap, ordered range scans, atomic batches, a
//! durable flush) and the keyspaces byom's records live in ([`Space`]).
//! Backends map spaces to whatever they have (sled: trees).

use std::ops::Bound;

use byom_protocol::pb;
use prost::Message;

use crate::Result;

/// Keyspaces. Each backend maps them to whatever it has (sled: trees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    Tokens,
    TokenSecrets,
    Machines,
    MachineNames,
    Commands,
    /// `machine_id/command_id` for every non-terminal command.
    Pending,
    /// `command_id, stream, offset(BE u64)` → output bytes.
    Output,
    Triggers,
    Threads,
    /// `source \0 external` → thread ID.
    ThreadKeys,
    /// Natural-language Router policies.
    Policies,
    /// Agent records (`r/router`, `r/wrk_…`, `r/apr_…`) and the agent inbox
    /// (`i/<time><seq>` → event), in one space so a step commits atomically.
    Agents,
    /// Paused interpreters: `snp_…` → snapshot bytes.
    Snapshots,
    /// `scope/caller/key` → what a creating call with that key created.
    Idempotency,
    /// Connector name → its record (secrets included).
    Connectors,
    /// `out_…` → outbox item.
    Outbox,
    /// `connector \0 thread \0 created(BE u64) seq(BE u32)` → `out_…` for
    /// every item still to send, in send order per thread.
    OutboxQueue,
    /// `connector \0 provider message ID` → `trg_…`: the messages a
    /// connector saw or sent, for replies that point at them.
    ChannelIndex,
    /// `connector \0 name` → small state a connector keeps (Matrix's
    /// `since` token); `\0 name` for server-wide settings (routing rules).
    ChannelState,
    /// The server's own secrets (its CA, keys), sealed by the server
    /// before they get here: `group` → ciphertext.
    Secrets,
    /// Machine ID → `replica generation`: which server holds the
    /// machine's connection, when several share the store.
    Presence,
    /// Replica ID → when its liveness expires (BE u64 ms).
    Replicas,
    /// Leases (`agents`: holder, epoch, expiry) and their epochs, which
    /// every fenced write is guarded by; one-time claims (`answer/apr_…`:
    /// who answered an approval first).
    Leases,
}

impl Space {
    pub const ALL: [Space; 23] = [
        Space::Tokens,
        Space::TokenSecrets,
        Space::Machines,
        Space::MachineNames,
        Space::Commands,
        Space::Pending,
        Space::Output,
        Space::Triggers,
        Space::Threads,
        Space::ThreadKeys,
        Space::Policies,
        Space::Agents,
        Space::Snapshots,
        Space::Idempotency,
        Space::Connectors,
        Space::Outbox,
        Space::OutboxQueue,
        Space::ChannelIndex,
        Space::ChannelState,
        Space::Secrets,
        Space::Presence,
        Space::Replicas,
        Space::Leases,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Space::Tokens => "tokens",
            Space::TokenSecrets => "token_secrets",
            Space::Machines => "machines",
            Space::MachineNames => "machine_names",
            Space::Commands => "commands",
            Space::Pending => "pending",
            Space::Output => "output",
            Space::Triggers => "triggers",
            Space::Threads => "threads",
            Space::ThreadKeys => "thread_keys",
            Space::Policies => "policies",
            Space::Agents => "agents",
            Space::Snapshots => "snapshots",
            Space::Idempotency => "idempotency",
            Space::Connectors => "connectors",
            Space::Outbox => "outbox",
            Space::OutboxQueue => "outbox_queue",
            Space::ChannelIndex => "channel_index",
            Space::ChannelState => "channel_state",
            Space::Secrets => "secrets",
            Space::Presence => "presence",
            Space::Replicas => "replicas",
            Space::Leases => "leases",
        }
    }
}

pub type Kv = (Vec<u8>, Vec<u8>);

/// What a storage engine must provide. All operations are atomic per key;
/// `flush` makes everything written before it durable.
pub trait Backend: Send + Sync + 'static {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// The values of `keys`, in their order: one round trip where the
    /// backend has them (a queue's records, read together).
    fn get_many(&self, space: Space, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(space, k)).collect()
    }
    fn put(&self, space: Space, key: &[u8], value: &[u8]) -> Result<()>;
    fn delete(&self, space: Space, key: &[u8]) -> Result<()>;
    /// Sets `key` to `new` only if it currently holds `old` (`None`: absent).
    fn compare_and_swap(
        &self,
        space: Space,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool>;
    /// Up to `limit` entries with `start <= key < end`, in key order
    /// (descending when `reverse`).
    fn range(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<Kv>>;
    /// Every key of `space`, in key order, without copying the values
    /// (which can be megabytes each, e.g. snapshots).
    fn keys(&self, space: Space) -> Result<Vec<Vec<u8>>>;
    fn flush(&self) -> Result<()>;
    /// Applies every write (None: delete) atomically, across spaces.
    fn batch(&self, ops: &[Op]) -> Result<()>;
    /// Applies `ops` atomically only if `guard` holds at that moment;
    /// whether it did. A write fenced by a lease's epoch: a holder that
    /// lost the lease cannot write, however late its write arrives.
    fn batch_if(&self, guard: &Guard, ops: &[Op]) -> Result<bool>;
    /// Whether every write is durable once it returns, so `flush` has
    /// nothing to wait for.
    fn writes_are_durable(&self) -> bool {
        false
    }
    /// Whether other processes share this store (replicas).
    fn is_shared(&self) -> bool {
        false
    }
    /// Tells every process sharing the store (this one included) `note`,
    /// after the writes made before the call; nothing for a store only
    /// one process uses.
    fn notify(&self, _note: &str) -> Result<()> {
        Ok(())
    }
    /// What [`Backend::notify`] tells, from any process; `*` when some may
    /// have been missed (a lost connection), so listeners look again.
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }
}

/// What [`Backend::batch_if`] checks: `key` holds exactly `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    pub space: Space,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// One write in a [`Backend::batch`].
#[derive(Debug, Clone)]
pub struct Op {
    pub space: Space,
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
}

impl Op {
    pub fn put(space: Space, key: impl Into<Vec<u8>>, value: Vec<u8>) -> Op {
        Op {
            space,
            key: key.into(),
            value: Some(value),
        }
    }
    pub fn delete(space: Space, key: impl Into<Vec<u8>>) -> Op {
        Op {
            space,
            key: key.into(),
            value: None,
        }
    }
    /// A trigger record.
    pub fn trigger(t: &pb::Trigger) -> Op {
        Op::put(Space::Triggers, t.id.as_bytes(), t.encode_to_vec())
    }
    /// A Router policy.
    pub fn policy(p: &pb::RouterPolicy) -> Op {
        Op::put(Space::Policies, p.id.as_bytes(), p.encode_to_vec())
    }
    /// What a creating call with an idempotency key created, written in
    /// the same batch as the object itself.
    pub fn idempotency(key: &str, r: &pb::IdempotencyRecord) -> Op {
        Op::put(Space::Idempotency, key.as_bytes(), r.encode_to_vec())
    }
}

/// The end of a prefix range: the prefix with its last byte incremented.
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
