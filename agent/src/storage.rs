//! How the agents' state is laid out in the store's `agents` keyspace, and
//! the two structures that grow and are therefore stored one key per entry:
//! conversations and the Router's queue. A step writes what it added and
//! deletes what it dropped; it never rewrites a transcript or a queue.
//!
//! This module is the one place that spells the keys ([`keys`]); the
//! server's driver and its read side both use it.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::event::RouterItem;
use crate::llm::Message;

/// Keys of the `agents` keyspace.
pub mod keys {
    /// A record: `r/router`, `r/wrk_…`, `r/apr_…`.
    pub const RECORD: &str = "r/";
    /// A conversation message: `m/SESSION/NUMBER`.
    pub const MESSAGE: &str = "m/";
    /// An item of the Router's queue: `q/router/NUMBER`.
    pub const ROUTER_QUEUE: &str = "q/router/";
    /// The durable inbox: `i/TIME SEQ` → an event, in arrival order.
    pub const INBOX: &str = "i/";
    /// Inbox entries this version could not read, kept as they were
    /// (`x/TIME SEQ`) rather than dropped: bad input loses nothing, and
    /// stops nothing behind it.
    pub const UNREADABLE: &str = "x/";
    /// The Router's record (under [`RECORD`]).
    pub const ROUTER: &str = "router";
    /// What became of a trigger: `f/trg_…` → a line for `byom show`.
    pub const FATE: &str = "f/";

    pub fn fate(trigger: &str) -> String {
        format!("{FATE}{trigger}")
    }

    pub fn record(key: &str) -> String {
        format!("{RECORD}{key}")
    }

    /// Prefix of every message of `session`.
    pub fn messages_of(session: &str) -> String {
        format!("{MESSAGE}{session}/")
    }

    pub fn message(session: &str, n: u64) -> String {
        format!("{MESSAGE}{session}/{n:012}")
    }

    pub fn queue_item(n: u64) -> String {
        format!("{ROUTER_QUEUE}{n:020}")
    }

    /// Inbox key: time, then a process-local sequence, so entries sort in
    /// arrival order across restarts.
    pub fn inbox(time_ms: u64, seq: u64) -> String {
        format!("{INBOX}{time_ms:016}{:010}", seq % 10_000_000_000)
    }

    /// The number after `prefix` in a numbered key.
    pub fn number(prefix: &str, key: &str) -> Option<u64> {
        key.strip_prefix(prefix)?.parse().ok()
    }
}

/// A session's messages, stored append-only: each message is written once
/// under its own number (`m/SESSION/NUMBER`); the session's record keeps
/// only the numbers in order. A step writes its new messages, not the whole
/// transcript.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Conversation {
    #[serde(skip)]
    messages: Vec<Message>,
    /// Message numbers, in conversation order.
    seqs: Vec<u64>,
    next: u64,
    #[serde(skip)]
    added: Vec<u64>,
    #[serde(skip)]
    removed: Vec<u64>,
}

impl Conversation {
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }
    /// The stored numbers of its messages, in order (also right for a
    /// record loaded without its messages).
    pub fn seqs(&self) -> &[u64] {
        &self.seqs
    }
    /// The number the next message gets.
    pub fn next_seq(&self) -> u64 {
        self.next
    }
    /// Messages in the conversation (also right for a record loaded
    /// without its messages).
    pub fn len(&self) -> usize {
        self.seqs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
    pub fn last(&self) -> Option<&Message> {
        self.messages.last()
    }
    pub fn push(&mut self, m: Message) {
        let n = self.next;
        self.next += 1;
        self.seqs.push(n);
        self.messages.push(m);
        self.added.push(n);
    }
    pub(crate) fn insert(&mut self, i: usize, m: Message) {
        let n = self.next;
        self.next += 1;
        self.seqs.insert(i, n);
        self.messages.insert(i, m);
        self.added.push(n);
    }
    pub fn pop(&mut self) -> Option<Message> {
        let n = self.seqs.pop()?;
        self.removed.push(n);
        self.messages.pop()
    }
    pub(crate) fn drain(&mut self, range: std::ops::Range<usize>) {
        self.removed.extend(self.seqs.drain(range.clone()));
        self.messages.drain(range);
    }
    /// Writes since the last call: new messages, deleted ones.
    pub(crate) fn take_writes(&mut self, session: &str, out: &mut Vec<(String, Option<Vec<u8>>)>) {
        for n in std::mem::take(&mut self.added) {
            if let Some(i) = self.seqs.iter().rposition(|x| *x == n) {
                if let Ok(b) = serde_json::to_vec(&self.messages[i]) {
                    out.push((keys::message(session, n), Some(b)));
                }
            }
        }
        for n in std::mem::take(&mut self.removed) {
            out.push((keys::message(session, n), None));
        }
    }
    /// Rebuilds the messages from their stored numbers (after a load).
    pub(crate) fn restore(&mut self, stored: &BTreeMap<u64, Message>) {
        self.seqs.retain(|n| stored.contains_key(n));
        self.messages = self
            .seqs
            .iter()
            .filter_map(|n| stored.get(n).cloned())
            .collect();
    }
}

/// The Router's queue, stored one item per key (`q/router/N`) so a new
/// item writes itself, not the queue: during a model outage thousands may
/// wait. Numbers grow at the back and shrink at the front, so key order is
/// queue order and the record keeps only the two ends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouterQueue {
    #[serde(skip)]
    items: VecDeque<(u64, RouterItem)>,
    front: u64,
    back: u64,
    len: usize,
    #[serde(skip)]
    added: Vec<u64>,
    #[serde(skip)]
    removed: Vec<u64>,
}

impl Default for RouterQueue {
    fn default() -> Self {
        // Room to grow both ways.
        RouterQueue {
            items: VecDeque::new(),
            front: (1 << 62) - 1,
            back: 1 << 62,
            len: 0,
            added: Vec::new(),
            removed: Vec::new(),
        }
    }
}

impl RouterQueue {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn iter(&self) -> impl Iterator<Item = &RouterItem> {
        self.items.iter().map(|(_, it)| it)
    }
    pub(crate) fn push_back(&mut self, it: RouterItem) {
        let n = self.back;
        self.back += 1;
        self.items.push_back((n, it));
        self.added.push(n);
        self.len = self.items.len();
    }
    pub(crate) fn push_front(&mut self, it: RouterItem) {
        let n = self.front;
        self.front -= 1;
        self.items.push_front((n, it));
        self.added.push(n);
        self.len = self.items.len();
    }
    pub(crate) fn pop_front(&mut self) -> Option<RouterItem> {
        let (n, it) = self.items.pop_front()?;
        self.removed.push(n);
        self.len = self.items.len();
        Some(it)
    }
    pub(crate) fn take_front(&mut self, n: usize) -> Vec<RouterItem> {
        let n = n.min(self.items.len());
        let out = (0..n).filter_map(|_| self.pop_front()).collect();
        self.len = self.items.len();
        out
    }
    pub(crate) fn take_writes(&mut self, out: &mut Vec<(String, Option<Vec<u8>>)>) {
        let added = std::mem::take(&mut self.added);
        let removed = std::mem::take(&mut self.removed);
        for n in added {
            if removed.contains(&n) {
                continue;
            }
            // Back pushes are numbered from 1 << 62 up, front pushes below:
            // search from the end each came in at, so a long queue costs O(1)
            // per new item.
            let found = if n >= 1 << 62 {
                self.items.iter().rev().find(|(x, _)| *x == n)
            } else {
                self.items.iter().find(|(x, _)| *x == n)
            };
            if let Some((_, it)) = found {
                if let Ok(b) = serde_json::to_vec(it) {
                    out.push((keys::queue_item(n), Some(b)));
                }
            }
        }
        for n in removed {
            out.push((keys::queue_item(n), None));
        }
    }
    pub(crate) fn restore(&mut self, stored: Vec<(u64, RouterItem)>) {
        self.items = stored.into_iter().collect();
        self.len = self.items.len();
    }
}
