//! The store: everything the server must remember, and nothing else.
//!
//! [`Backend`] is the small key-value contract a storage engine must meet
//! (get, put, compare-and-swap, ordered range scans, durable flush); sled is
//! the default. [`Store`] builds byom's typed records on top of it, so a
//! second backend (a distributed KV for scale-out) plugs in without touching
//! the code above. Records are the protobuf messages of the admin API.
//!
//! Invariant: every command state change goes through [`Store::update_command`],
//! which checks the transition against `CommandState::can_become`.

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use byom_protocol::pb::{self, CommandState};
use prost::Message;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O failed: {0} (is the disk full or the data dir read-only?)")]
    Io(String),
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
}

impl Space {
    const ALL: [Space; 13] = [
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
    ];
    fn name(self) -> &'static str {
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
        }
    }
}

pub type Kv = (Vec<u8>, Vec<u8>);

/// What a storage engine must provide. All operations are atomic per key;
/// `flush` makes everything written before it durable.
pub trait Backend: Send + Sync + 'static {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>>;
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
}

pub struct SledBackend {
    db: sled::Db,
    trees: Vec<(Space, sled::Tree)>,
}

fn io(e: sled::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

impl SledBackend {
    pub fn open(dir: &Path) -> Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(ref err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                    StoreError::Io(format!(
                        "{e}: another `byom server` is using {}",
                        dir.display()
                    ))
                }
                other => io(other),
            })?;
        let mut trees = Vec::new();
        for s in Space::ALL {
            trees.push((s, db.open_tree(s.name()).map_err(io)?));
        }
        Ok(Self { db, trees })
    }

    fn tree(&self, space: Space) -> &sled::Tree {
        // Every Space was opened in `open`.
        &self
            .trees
            .iter()
            .find(|(s, _)| *s == space)
            .expect("all spaces are opened at start")
            .1
    }
}

impl Backend for SledBackend {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.tree(space).get(key).map_err(io)?.map(|v| v.to_vec()))
    }
    fn put(&self, space: Space, key: &[u8], value: &[u8]) -> Result<()> {
        self.tree(space).insert(key, value).map_err(io)?;
        Ok(())
    }
    fn delete(&self, space: Space, key: &[u8]) -> Result<()> {
        self.tree(space).remove(key).map_err(io)?;
        Ok(())
    }
    fn compare_and_swap(
        &self,
        space: Space,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        Ok(self
            .tree(space)
            .compare_and_swap(key, old, new)
            .map_err(io)?
            .is_ok())
    }
    fn range(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<Kv>> {
        let iter = self.tree(space).range::<&[u8], _>((start, end));
        let mut out = Vec::new();
        let mut push = |r: sled::Result<(sled::IVec, sled::IVec)>| -> Result<bool> {
            let (k, v) = r.map_err(io)?;
            out.push((k.to_vec(), v.to_vec()));
            Ok(out.len() < limit)
        };
        if reverse {
            for r in iter.rev() {
                if !push(r)? {
                    break;
                }
            }
        } else {
            for r in iter {
                if !push(r)? {
                    break;
                }
            }
        }
        Ok(out)
    }
    fn keys(&self, space: Space) -> Result<Vec<Vec<u8>>> {
        self.tree(space)
            .iter()
            .keys()
            .map(|k| k.map(|k| k.to_vec()).map_err(io))
            .collect()
    }
    fn flush(&self) -> Result<()> {
        self.db.flush().map_err(io)?;
        Ok(())
    }
    fn batch(&self, ops: &[Op]) -> Result<()> {
        use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
        let spaces: Vec<Space> = {
            let mut v: Vec<Space> = ops.iter().map(|o| o.space).collect();
            v.sort_by_key(|s| s.name());
            v.dedup();
            v
        };
        let trees: Vec<sled::Tree> = spaces.iter().map(|s| self.tree(*s).clone()).collect();
        let r: std::result::Result<(), TransactionError<()>> = trees.as_slice().transaction(|tx| {
            for op in ops {
                let Some(i) = spaces.iter().position(|s| *s == op.space) else {
                    return Err(ConflictableTransactionError::Abort(()));
                };
                match &op.value {
                    Some(v) => {
                        tx[i].insert(op.key.as_slice(), v.as_slice())?;
                    }
                    None => {
                        tx[i].remove(op.key.as_slice())?;
                    }
                }
            }
            Ok(())
        });
        match r {
            Ok(()) => Ok(()),
            Err(TransactionError::Storage(e)) => Err(io(e)),
            Err(TransactionError::Abort(())) => Err(StoreError::Io("batch aborted".into())),
        }
    }
}

/// The end of a prefix range: the prefix with its last byte incremented.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

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
}

/// Most records one list call returns.
pub const MAX_LIST: usize = 10_000;

#[derive(Clone)]
pub struct Store {
    kv: Arc<dyn Backend>,
}

fn output_key(cmd: &str, stream: i32, offset: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(cmd.len() + 10);
    k.extend_from_slice(cmd.as_bytes());
    k.push(0);
    k.push(stream as u8);
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

fn pending_key(machine: &str, cmd: &str) -> Vec<u8> {
    format!("{machine}/{cmd}").into_bytes()
}

/// How long a flush may take before the log says so (and again each time).
const SLOW_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

impl Store {
    pub fn new(kv: Arc<dyn Backend>) -> Self {
        Self { kv }
    }

    pub fn open_sled(dir: &Path) -> Result<Self> {
        Ok(Self::new(Arc::new(SledBackend::open(dir)?)))
    }

    /// Makes all prior writes durable. Blocking: call from a blocking context
    /// or via [`Store::flush_async`].
    pub fn flush(&self) -> Result<()> {
        self.kv.flush()
    }

    pub async fn flush_async(&self) -> Result<()> {
        let kv = self.kv.clone();
        let started = std::time::Instant::now();
        let mut task = tokio::task::spawn_blocking(move || kv.flush());
        loop {
            tokio::select! {
                r = &mut task => {
                    return r.map_err(|e| StoreError::Io(format!("flush task failed: {e}")))?;
                }
                _ = tokio::time::sleep(SLOW_FLUSH) => {
                    // A disk that stalls (or a store that hangs) shows in
                    // the log rather than as silence.
                    tracing::warn!(
                        secs = started.elapsed().as_secs(),
                        "the store's flush has not finished yet"
                    );
                }
            }
        }
    }

    fn get_msg<M: Message + Default>(&self, space: Space, key: &str) -> Result<Option<M>> {
        match self.kv.get(space, key.as_bytes())? {
            Some(b) => Ok(Some(decode(key, &b)?)),
            None => Ok(None),
        }
    }

    fn list_msgs<M: Message + Default>(&self, space: Space, limit: usize) -> Result<Vec<M>> {
        self.kv
            .range(space, Bound::Unbounded, Bound::Unbounded, true, limit)?
            .into_iter()
            .map(|(k, v)| decode(&String::from_utf8_lossy(&k), &v))
            .collect()
    }

    /// Read-modify-write with compare-and-swap, retried on contention.
    fn update_msg<M, F>(&self, space: Space, key: &str, mut f: F) -> Result<M>
    where
        M: Message + Default,
        F: FnMut(&mut M) -> Result<()>,
    {
        for _ in 0..1000 {
            let old = self
                .kv
                .get(space, key.as_bytes())?
                .ok_or_else(|| StoreError::NotFound(key.to_string()))?;
            let mut msg: M = decode(key, &old)?;
            f(&mut msg)?;
            let new = msg.encode_to_vec();
            // Nothing changed (e.g. a transition that did not apply): no write.
            if new == old {
                return Ok(msg);
            }
            if self
                .kv
                .compare_and_swap(space, key.as_bytes(), Some(&old), Some(&new))?
            {
                return Ok(msg);
            }
        }
        Err(StoreError::Conflict(format!(
            "{key}: too much contention updating the record"
        )))
    }

    // ── tokens ──

    /// The token and its secret's index appear together (a crash between
    /// two writes would leave an index to nothing).
    pub fn create_token(&self, token: &pb::Token) -> Result<()> {
        self.kv.batch(&[
            Op::put(Space::Tokens, token.id.as_bytes(), token.encode_to_vec()),
            Op::put(
                Space::TokenSecrets,
                token.secret_sha256.as_bytes(),
                token.id.as_bytes().to_vec(),
            ),
        ])
    }

    pub fn get_token_by_secret(&self, secret_sha256: &str) -> Result<Option<pb::Token>> {
        match self.kv.get(Space::TokenSecrets, secret_sha256.as_bytes())? {
            Some(id) => self.get_token(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    pub fn get_token(&self, id: &str) -> Result<Option<pb::Token>> {
        self.get_msg(Space::Tokens, id)
    }

    pub fn list_tokens(&self) -> Result<Vec<pb::Token>> {
        self.list_msgs(Space::Tokens, MAX_LIST)
    }

    pub fn revoke_token(&self, id: &str) -> Result<pb::Token> {
        self.update_msg(Space::Tokens, id, |t: &mut pb::Token| {
            t.revoked = true;
            Ok(())
        })
    }

    /// Marks the token with this secret hash used by `machine_id`, atomically:
    /// of any number of concurrent redemptions exactly one succeeds.
    pub fn redeem_token(
        &self,
        secret_sha256: &str,
        machine_id: &str,
        now_ms: u64,
    ) -> Result<std::result::Result<pb::Token, RedeemError>> {
        let Some(id) = self.kv.get(Space::TokenSecrets, secret_sha256.as_bytes())? else {
            return Ok(Err(RedeemError::Unknown));
        };
        let id = String::from_utf8_lossy(&id).into_owned();
        let Some(old) = self.kv.get(Space::Tokens, id.as_bytes())? else {
            return Ok(Err(RedeemError::Unknown));
        };
        let mut token: pb::Token = decode(&id, &old)?;
        if token.revoked {
            return Ok(Err(RedeemError::Revoked));
        }
        if token.used_at_ms != 0 {
            return Ok(Err(RedeemError::Used));
        }
        if now_ms >= token.expires_at_ms {
            return Ok(Err(RedeemError::Expired));
        }
        token.used_at_ms = now_ms;
        token.used_by = machine_id.to_string();
        let swapped = self.kv.compare_and_swap(
            Space::Tokens,
            id.as_bytes(),
            Some(&old),
            Some(&token.encode_to_vec()),
        )?;
        if !swapped {
            // Someone else changed it first: used or revoked, either way not ours.
            return Ok(Err(RedeemError::Used));
        }
        Ok(Ok(token))
    }

    // ── machines ──

    /// Stores a new machine, making its name unique by adding `-2`, `-3`, ….
    pub fn create_machine(&self, m: &mut pb::Machine) -> Result<()> {
        let base = m.name.clone();
        for n in 1..=1000u32 {
            let candidate = if n == 1 {
                base.clone()
            } else {
                format!("{base}-{n}")
            };
            if self.kv.compare_and_swap(
                Space::MachineNames,
                candidate.as_bytes(),
                None,
                Some(m.id.as_bytes()),
            )? {
                m.name = candidate;
                return self
                    .kv
                    .put(Space::Machines, m.id.as_bytes(), &m.encode_to_vec());
            }
        }
        Err(StoreError::Conflict(format!(
            "too many machines named {base:?}"
        )))
    }

    pub fn get_machine(&self, id: &str) -> Result<Option<pb::Machine>> {
        self.get_msg(Space::Machines, id)
    }

    /// Finds a machine by ID or name.
    pub fn resolve_machine(&self, id_or_name: &str) -> Result<Option<pb::Machine>> {
        if let Some(m) = self.get_machine(id_or_name)? {
            return Ok(Some(m));
        }
        match self.kv.get(Space::MachineNames, id_or_name.as_bytes())? {
            Some(id) => self.get_machine(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    pub fn list_machines(&self) -> Result<Vec<pb::Machine>> {
        let mut v: Vec<pb::Machine> = self.list_msgs(Space::Machines, MAX_LIST)?;
        v.reverse();
        Ok(v)
    }

    pub fn update_machine<F>(&self, id: &str, f: F) -> Result<pb::Machine>
    where
        F: FnMut(&mut pb::Machine) -> Result<()>,
    {
        self.update_msg(Space::Machines, id, f)
    }

    pub fn rename_machine(&self, id: &str, new_name: &str) -> Result<pb::Machine> {
        let Some(m) = self.get_machine(id)? else {
            return Err(StoreError::NotFound(id.to_string()));
        };
        if m.name == new_name {
            return Ok(m);
        }
        if !self.kv.compare_and_swap(
            Space::MachineNames,
            new_name.as_bytes(),
            None,
            Some(id.as_bytes()),
        )? {
            return Err(StoreError::Conflict(format!(
                "a machine named {new_name:?} already exists"
            )));
        }
        let old_name = m.name.clone();
        let m = self.update_machine(id, |m| {
            m.name = new_name.to_string();
            Ok(())
        })?;
        self.release_machine_name(&old_name, id)?;
        Ok(m)
    }

    /// Releases a name held by `id` (after a rename).
    pub fn release_machine_name(&self, name: &str, id: &str) -> Result<()> {
        self.kv.compare_and_swap(
            Space::MachineNames,
            name.as_bytes(),
            Some(id.as_bytes()),
            None,
        )?;
        Ok(())
    }

    // ── commands ──

    /// The record and its queue entry appear together: a dispatcher that
    /// saw the entry first would take it for a crash's leftover.
    pub fn create_command(&self, c: &pb::Command) -> Result<()> {
        debug_assert_eq!(c.state(), CommandState::Queued);
        self.kv.batch(&[
            Op::put(Space::Commands, c.id.as_bytes(), c.encode_to_vec()),
            Op::put(
                Space::Pending,
                pending_key(&c.machine_id, &c.id),
                Vec::new(),
            ),
        ])
    }

    pub fn get_command(&self, id: &str) -> Result<Option<pb::Command>> {
        self.get_msg(Space::Commands, id)
    }

    /// Updates a command. `f` returns the new state (or the same state to
    /// change only fields); illegal transitions are refused.
    pub fn update_command<F>(&self, id: &str, mut f: F) -> Result<pb::Command>
    where
        F: FnMut(&mut pb::Command) -> Result<()>,
    {
        let c = self.update_msg(Space::Commands, id, |c: &mut pb::Command| {
            let from = c.state();
            f(c)?;
            let to = c.state();
            if from != to && !from.can_become(to) {
                return Err(StoreError::IllegalTransition {
                    id: c.id.clone(),
                    from: from.name(),
                    to: to.name(),
                });
            }
            Ok(())
        })?;
        if c.state().is_terminal() {
            self.kv
                .delete(Space::Pending, &pending_key(&c.machine_id, &c.id))?;
        }
        Ok(c)
    }

    /// Moves a command to `to` only if it is in `from` now. Returns the new
    /// record, or `None` if it was not in `from` (another task won).
    pub fn transition(
        &self,
        id: &str,
        from: &[CommandState],
        to: CommandState,
        mut f: impl FnMut(&mut pb::Command),
    ) -> Result<Option<pb::Command>> {
        let mut skipped = false;
        let c = self.update_command(id, |c| {
            skipped = !from.contains(&c.state());
            if !skipped {
                c.set_state(to);
                f(c);
            }
            Ok(())
        })?;
        Ok(if skipped { None } else { Some(c) })
    }

    /// Non-terminal commands of a machine, oldest first.
    pub fn pending_commands(&self, machine: &str) -> Result<Vec<pb::Command>> {
        let prefix = format!("{machine}/").into_bytes();
        let end = prefix_end(&prefix);
        let keys = self.kv.range(
            Space::Pending,
            Bound::Included(&prefix),
            end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
            false,
            MAX_LIST,
        )?;
        let mut out = Vec::new();
        for (k, _) in keys {
            let id = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
            match self.get_command(&id)? {
                Some(c) if !c.state().is_terminal() => out.push(c),
                // A crash between the terminal write and the index delete
                // leaves a stale entry: clean it now.
                Some(_) => self.kv.delete(Space::Pending, &k)?,
                // Never deleted here: only a command's end removes it.
                None => tracing::warn!(cmd = %id, "queue entry without a command record"),
            }
        }
        Ok(out)
    }

    /// Every non-terminal command (for the queue sweeper).
    pub fn all_pending(&self) -> Result<Vec<pb::Command>> {
        let keys = self.kv.range(
            Space::Pending,
            Bound::Unbounded,
            Bound::Unbounded,
            false,
            MAX_LIST,
        )?;
        let mut out = Vec::new();
        for (k, _) in keys {
            let key = String::from_utf8_lossy(&k).into_owned();
            let Some((_, id)) = key.split_once('/') else {
                continue;
            };
            if let Some(c) = self.get_command(id)? {
                if !c.state().is_terminal() {
                    out.push(c);
                }
            }
        }
        Ok(out)
    }

    /// Scans a space newest first (IDs sort by creation time), page by page.
    /// `visit` returns `Some(true)` to keep a record, `Some(false)` to skip
    /// it, `None` to stop; at most `limit` records are kept.
    fn scan_newest<M, F>(&self, space: Space, limit: usize, mut visit: F) -> Result<Vec<M>>
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

    /// Newest first, stopping at commands created before `since_ms`.
    pub fn list_commands(
        &self,
        machine: Option<&str>,
        state: Option<CommandState>,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<pb::Command>> {
        self.scan_newest(Space::Commands, limit, |c: &pb::Command| {
            if c.created_at_ms < since_ms {
                return None;
            }
            Some(machine.is_none_or(|m| c.machine_id == m) && state.is_none_or(|s| c.state() == s))
        })
    }

    // ── triggers and threads ──

    fn thread_key(source: &str, external: &str) -> Vec<u8> {
        let mut k = source.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(external.as_bytes());
        k
    }

    pub fn find_thread(&self, source: &str, external: &str) -> Result<Option<pb::Thread>> {
        match self
            .kv
            .get(Space::ThreadKeys, &Self::thread_key(source, external))?
        {
            Some(id) => self.get_thread(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    /// Creates a thread, or returns the one a concurrent call created. The
    /// record is written before its name points at it, so whoever finds
    /// the name finds the thread.
    pub fn create_thread(&self, t: &pb::Thread) -> Result<pb::Thread> {
        let key = Self::thread_key(&t.source, &t.external);
        self.kv
            .put(Space::Threads, t.id.as_bytes(), &t.encode_to_vec())?;
        if self
            .kv
            .compare_and_swap(Space::ThreadKeys, &key, None, Some(t.id.as_bytes()))?
        {
            return Ok(t.clone());
        }
        // Another call named it first: ours was never referenced.
        self.kv.delete(Space::Threads, t.id.as_bytes())?;
        self.find_thread(&t.source, &t.external)?
            .ok_or_else(|| StoreError::Conflict("thread vanished".into()))
    }

    /// Newest first.
    pub fn list_threads(&self, limit: usize) -> Result<Vec<pb::Thread>> {
        self.list_msgs(Space::Threads, limit)
    }

    pub fn get_thread(&self, id: &str) -> Result<Option<pb::Thread>> {
        self.get_msg(Space::Threads, id)
    }

    pub fn touch_thread(&self, id: &str, now_ms: u64) -> Result<pb::Thread> {
        self.update_msg(Space::Threads, id, |t: &mut pb::Thread| {
            t.last_trigger_ms = t.last_trigger_ms.max(now_ms);
            Ok(())
        })
    }

    pub fn put_trigger(&self, t: &pb::Trigger) -> Result<()> {
        self.kv
            .put(Space::Triggers, t.id.as_bytes(), &t.encode_to_vec())
    }

    pub fn get_trigger(&self, id: &str) -> Result<Option<pb::Trigger>> {
        self.get_msg(Space::Triggers, id)
    }

    /// Newest first, optionally on one thread.
    pub fn list_triggers(&self, thread: Option<&str>, limit: usize) -> Result<Vec<pb::Trigger>> {
        self.scan_newest(Space::Triggers, limit, |t: &pb::Trigger| {
            Some(thread.is_none_or(|th| t.thread_id == th))
        })
    }

    // ── router policies ──

    pub fn put_policy(&self, p: &pb::RouterPolicy) -> Result<()> {
        self.kv
            .put(Space::Policies, p.id.as_bytes(), &p.encode_to_vec())
    }

    /// Oldest first: the order the Router reads them in.
    pub fn list_policies(&self) -> Result<Vec<pb::RouterPolicy>> {
        let mut v: Vec<pb::RouterPolicy> = self.list_msgs(Space::Policies, MAX_LIST)?;
        v.reverse();
        Ok(v)
    }

    pub fn remove_policy(&self, id: &str) -> Result<Option<pb::RouterPolicy>> {
        let p = self.get_msg(Space::Policies, id)?;
        if p.is_some() {
            self.kv.delete(Space::Policies, id.as_bytes())?;
        }
        Ok(p)
    }

    // ── agents ──

    /// Applies writes atomically (see [`Backend::batch`]).
    pub fn batch(&self, ops: &[Op]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.kv.batch(ops)
    }

    /// Every agent record: (key without `r/`, JSON bytes).
    pub fn agent_records(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let end = prefix_end(b"r/").unwrap_or_default();
        Ok(self
            .kv
            .range(
                Space::Agents,
                Bound::Included(b"r/".as_slice()),
                Bound::Excluded(end.as_slice()),
                false,
                usize::MAX,
            )?
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k[2..]).into_owned(), v))
            .collect())
    }

    pub fn agent_record(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.kv.get(Space::Agents, format!("r/{key}").as_bytes())
    }

    /// The oldest `limit` inbox entries: (full key, JSON event).
    pub fn agent_inbox(&self, limit: usize) -> Result<Vec<Kv>> {
        let end = prefix_end(b"i/").unwrap_or_default();
        self.kv.range(
            Space::Agents,
            Bound::Included(b"i/".as_slice()),
            Bound::Excluded(end.as_slice()),
            false,
            limit,
        )
    }

    /// A session's stored conversation messages: (number, JSON bytes).
    pub fn agent_messages(&self, session: &str) -> Result<Vec<(u64, Vec<u8>)>> {
        self.agent_numbered(&format!("m/{session}/"))
    }

    /// The Router's stored queue items: (number, JSON bytes), in order.
    pub fn agent_queue(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        self.agent_numbered("q/router/")
    }

    /// Entries `PREFIX<number>` of the agents keyspace, in key order.
    fn agent_numbered(&self, prefix: &str) -> Result<Vec<(u64, Vec<u8>)>> {
        let end = prefix_end(prefix.as_bytes()).unwrap_or_default();
        Ok(self
            .kv
            .range(
                Space::Agents,
                Bound::Included(prefix.as_bytes()),
                Bound::Excluded(end.as_slice()),
                false,
                usize::MAX,
            )?
            .into_iter()
            .filter_map(|(k, v)| {
                let n = std::str::from_utf8(&k[prefix.len()..]).ok()?.parse().ok()?;
                Some((n, v))
            })
            .collect())
    }

    pub fn put_snapshot(&self, id: &str, bytes: &[u8]) -> Result<()> {
        self.kv.put(Space::Snapshots, id.as_bytes(), bytes)
    }

    pub fn get_snapshot(&self, id: &str) -> Result<Option<Vec<u8>>> {
        self.kv.get(Space::Snapshots, id.as_bytes())
    }

    /// IDs of every stored snapshot (their bytes stay on disk).
    pub fn snapshot_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .kv
            .keys(Space::Snapshots)?
            .into_iter()
            .map(|k| String::from_utf8_lossy(&k).into_owned())
            .collect())
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.kv.delete(Space::Snapshots, id.as_bytes())
    }

    // ── output ──

    /// Stores a chunk at its offset. Idempotent: a resent chunk overwrites
    /// itself.
    pub fn append_output(&self, cmd: &str, stream: i32, offset: u64, data: &[u8]) -> Result<()> {
        self.kv
            .put(Space::Output, &output_key(cmd, stream, offset), data)
    }

    /// Bytes of contiguous output stored for a stream.
    pub fn output_len(&self, cmd: &str, stream: i32) -> Result<u64> {
        let start = output_key(cmd, stream, 0);
        let end = output_key(cmd, stream, u64::MAX);
        let last = self.kv.range(
            Space::Output,
            Bound::Included(&start),
            Bound::Included(&end),
            true,
            1,
        )?;
        Ok(match last.first() {
            Some((k, v)) => offset_of(k) + v.len() as u64,
            None => 0,
        })
    }

    /// Output from `from`, at most `max` bytes, as (offset, bytes) chunks.
    pub fn read_output(
        &self,
        cmd: &str,
        stream: i32,
        from: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let at = output_key(cmd, stream, from);
        let start = output_key(cmd, stream, 0);
        // The chunk that contains `from` starts at or before it.
        let first = self
            .kv
            .range(
                Space::Output,
                Bound::Included(&start),
                Bound::Included(&at),
                true,
                1,
            )?
            .into_iter()
            .next()
            .map(|(k, _)| k)
            .unwrap_or(at);
        let end = output_key(cmd, stream, u64::MAX);
        let mut out = Vec::new();
        let mut total = 0usize;
        for (k, v) in self.kv.range(
            Space::Output,
            Bound::Included(&first),
            Bound::Included(&end),
            false,
            4096,
        )? {
            let off = offset_of(&k);
            let end_off = off + v.len() as u64;
            if end_off <= from {
                continue;
            }
            let skip = from.saturating_sub(off) as usize;
            let data = v[skip..].to_vec();
            total += data.len();
            out.push((off + skip as u64, data));
            if total >= max {
                break;
            }
        }
        Ok(out)
    }
}

fn offset_of(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    if key.len() >= 8 {
        b.copy_from_slice(&key[key.len() - 8..]);
    }
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_sled(dir.path()).unwrap();
        (dir, s)
    }

    fn cmd(id: &str, machine: &str) -> pb::Command {
        pb::Command {
            id: id.into(),
            machine_id: machine.into(),
            state: CommandState::Queued as i32,
            ..Default::default()
        }
    }

    /// A dispatcher reads the queue while commands are being created (the
    /// agents start several at once): none may be dropped from it.
    #[test]
    fn commands_created_while_the_queue_is_read_stay_queued() {
        let (_d, s) = store();
        let s = Arc::new(s);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (s, done) = (s.clone(), done.clone());
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                while !done.load(std::sync::atomic::Ordering::SeqCst)
                    && t.elapsed() < std::time::Duration::from_secs(30)
                {
                    s.pending_commands("mch_a").unwrap();
                }
            })
        };
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        s.create_command(&cmd(&format!("cmd_{w}_{i:03}"), "mch_a"))
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        reader.join().unwrap();
        assert_eq!(s.pending_commands("mch_a").unwrap().len(), 1000);
    }

    /// Messages arriving at once on a new thread all land on one thread.
    #[test]
    fn a_thread_named_by_many_at_once_is_one_thread() {
        let (_d, s) = store();
        let s = Arc::new(s);
        for round in 0..50 {
            let external = format!("t{round}");
            let ids: Vec<String> = (0..6)
                .map(|i| {
                    let (s, external) = (s.clone(), external.clone());
                    std::thread::spawn(move || {
                        if let Some(t) = s.find_thread("chat", &external).unwrap() {
                            return t.id;
                        }
                        let t = pb::Thread {
                            id: format!("thr_{round}_{i}"),
                            source: "chat".into(),
                            external,
                            ..Default::default()
                        };
                        s.create_thread(&t).unwrap().id
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
        }
        // The losers' records are gone: one thread per name.
        assert_eq!(s.list_threads(1000).unwrap().len(), 50);
    }

    #[test]
    fn snapshot_ids_list_every_snapshot() {
        let (_d, s) = store();
        s.put_snapshot("snp_b", &[7u8; 100_000]).unwrap();
        s.put_snapshot("snp_a", b"x").unwrap();
        assert_eq!(s.snapshot_ids().unwrap(), ["snp_a", "snp_b"]);
        s.delete_snapshot("snp_a").unwrap();
        assert_eq!(s.snapshot_ids().unwrap(), ["snp_b"]);
    }

    #[test]
    fn batch_writes_and_deletes_across_spaces_at_once() {
        let (_d, s) = store();
        s.batch(&[
            Op::put(Space::Agents, b"i/1".to_vec(), b"ev".to_vec()),
            Op::put(Space::Agents, b"r/router".to_vec(), b"{}".to_vec()),
        ])
        .unwrap();
        let t = pb::Trigger {
            id: "trg_x".into(),
            ..Default::default()
        };
        s.batch(&[
            Op::trigger(&t),
            Op::put(Space::Agents, b"r/wrk_1".to_vec(), b"{}".to_vec()),
            Op::delete(Space::Agents, b"i/1".to_vec()),
        ])
        .unwrap();
        assert!(s.get_trigger("trg_x").unwrap().is_some());
        assert!(s.agent_inbox(10).unwrap().is_empty());
        let keys: Vec<String> = s
            .agent_records()
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["router", "wrk_1"]);
        s.batch(&[]).unwrap();
    }

    #[test]
    fn command_transitions_are_checked() {
        let (_d, s) = store();
        s.create_command(&cmd("cmd_a", "mch_a")).unwrap();
        assert_eq!(s.pending_commands("mch_a").unwrap().len(), 1);
        let err = s
            .update_command("cmd_a", |c| {
                c.set_state(CommandState::Exited);
                Ok(())
            })
            .unwrap_err();
        assert!(matches!(err, StoreError::IllegalTransition { .. }));
        let c = s
            .transition(
                "cmd_a",
                &[CommandState::Queued],
                CommandState::Dispatched,
                |_| {},
            )
            .unwrap();
        assert!(c.is_some());
        // A second dispatcher loses the race.
        let c = s
            .transition(
                "cmd_a",
                &[CommandState::Queued],
                CommandState::Dispatched,
                |_| {},
            )
            .unwrap();
        assert!(c.is_none());
        s.transition(
            "cmd_a",
            &[CommandState::Dispatched],
            CommandState::Lost,
            |_| {},
        )
        .unwrap();
        assert!(s.pending_commands("mch_a").unwrap().is_empty());
    }

    #[test]
    fn list_commands_filters_newest_first() {
        let (_d, s) = store();
        for (i, m) in ["mch_a", "mch_b", "mch_a"].iter().enumerate() {
            let mut c = cmd(&format!("cmd_{i}"), m);
            c.created_at_ms = 100 * (i as u64 + 1);
            s.create_command(&c).unwrap();
        }
        let ids = |v: Vec<pb::Command>| v.into_iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(
            ids(s.list_commands(None, None, 0, 10).unwrap()),
            ["cmd_2", "cmd_1", "cmd_0"]
        );
        assert_eq!(
            ids(s.list_commands(Some("mch_a"), None, 0, 10).unwrap()),
            ["cmd_2", "cmd_0"]
        );
        assert_eq!(
            ids(s.list_commands(None, None, 200, 10).unwrap()),
            ["cmd_2", "cmd_1"]
        );
        assert_eq!(
            ids(s
                .list_commands(None, Some(CommandState::Queued), 0, 1)
                .unwrap()),
            ["cmd_2"]
        );
        assert!(s
            .list_commands(None, Some(CommandState::Exited), 0, 10)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn output_offsets() {
        let (_d, s) = store();
        s.append_output("cmd_a", 1, 0, b"hello ").unwrap();
        s.append_output("cmd_a", 1, 6, b"world").unwrap();
        s.append_output("cmd_a", 2, 0, b"err").unwrap();
        assert_eq!(s.output_len("cmd_a", 1).unwrap(), 11);
        assert_eq!(s.output_len("cmd_a", 2).unwrap(), 3);
        assert_eq!(s.output_len("cmd_b", 1).unwrap(), 0);
        let got = s.read_output("cmd_a", 1, 3, 100).unwrap();
        assert_eq!(got, vec![(3, b"lo ".to_vec()), (6, b"world".to_vec())]);
        assert!(s.read_output("cmd_a", 1, 11, 100).unwrap().is_empty());
    }

    #[test]
    fn token_redeemed_once() {
        let (_d, s) = store();
        let t = pb::Token {
            id: "tok_a".into(),
            secret_sha256: "h".into(),
            expires_at_ms: 100,
            ..Default::default()
        };
        s.create_token(&t).unwrap();
        assert_eq!(
            s.redeem_token("x", "mch_a", 1).unwrap(),
            Err(RedeemError::Unknown)
        );
        assert!(s.redeem_token("h", "mch_a", 1).unwrap().is_ok());
        assert_eq!(
            s.redeem_token("h", "mch_b", 2).unwrap(),
            Err(RedeemError::Used)
        );
        let t2 = pb::Token {
            id: "tok_b".into(),
            secret_sha256: "h2".into(),
            expires_at_ms: 100,
            ..Default::default()
        };
        s.create_token(&t2).unwrap();
        assert_eq!(
            s.redeem_token("h2", "mch_a", 100).unwrap(),
            Err(RedeemError::Expired)
        );
    }

    #[test]
    fn machine_names_are_unique() {
        let (_d, s) = store();
        let mut a = pb::Machine {
            id: "mch_a".into(),
            name: "lap".into(),
            ..Default::default()
        };
        let mut b = pb::Machine {
            id: "mch_b".into(),
            name: "lap".into(),
            ..Default::default()
        };
        s.create_machine(&mut a).unwrap();
        s.create_machine(&mut b).unwrap();
        assert_eq!(b.name, "lap-2");
        assert_eq!(s.resolve_machine("lap-2").unwrap().unwrap().id, "mch_b");
        assert!(s.rename_machine("mch_b", "lap").is_err());
        s.rename_machine("mch_b", "desk").unwrap();
        assert_eq!(s.resolve_machine("desk").unwrap().unwrap().id, "mch_b");
        assert!(s.resolve_machine("lap-2").unwrap().is_none());
    }
}
