//! Channels' connectors and the way out: connector records, the outbox
//! (items and their per-thread send queue), the index of provider message
//! IDs, and the small state connectors keep between restarts.
//!
//! An item and its queue entry are written in one batch ([`Op::outbox`]):
//! an item is pending exactly while its queue entry exists.

use std::ops::Bound;

use byom_protocol::pb::{self, OutboxState};
use prost::Message;

use crate::backend::{prefix_end, Op, Space};
use crate::{Result, Store, StoreError, MAX_LIST};

/// Items waiting to go out on one connector; past it the agents' replies
/// still land in byom (threads show them) but the outbox says it is full.
pub const OUTBOX_QUEUE_LIMIT: usize = 10_000;

fn join(a: &str, b: &[u8]) -> Vec<u8> {
    let mut k = a.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(b);
    k
}

fn queue_key(it: &pb::OutboxItem) -> Vec<u8> {
    let mut k = join(&it.connector, it.thread_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&it.created_at_ms.to_be_bytes());
    k.extend_from_slice(&it.seq.to_be_bytes());
    k.extend_from_slice(it.id.as_bytes());
    k
}

impl Op {
    /// A new outbox item with its queue entry.
    pub fn outbox(it: &pb::OutboxItem) -> Vec<Op> {
        vec![
            Op::put(Space::Outbox, it.id.as_bytes(), it.encode_to_vec()),
            Op::put(Space::OutboxQueue, queue_key(it), it.id.as_bytes().to_vec()),
        ]
    }

    /// Remembers that `external_id` on `connector` is trigger `trigger`.
    pub fn channel_index(connector: &str, external_id: &str, trigger: &str) -> Op {
        Op::put(
            Space::ChannelIndex,
            join(connector, external_id.as_bytes()),
            trigger.as_bytes().to_vec(),
        )
    }

    /// A connector's state value.
    pub fn channel_state(connector: &str, name: &str, value: &[u8]) -> Op {
        Op::put(
            Space::ChannelState,
            join(connector, name.as_bytes()),
            value.to_vec(),
        )
    }
}

impl Store {
    // ── connectors ──

    pub fn put_connector(&self, c: &pb::Connector) -> Result<()> {
        self.kv
            .put(Space::Connectors, c.name.as_bytes(), &c.encode_to_vec())
    }

    /// Adds a connector unless one has that name.
    pub fn create_connector(&self, c: &pb::Connector) -> Result<()> {
        let ok = self.kv.compare_and_swap(
            Space::Connectors,
            c.name.as_bytes(),
            None,
            Some(&c.encode_to_vec()),
        )?;
        if ok {
            Ok(())
        } else {
            Err(StoreError::Conflict(format!(
                "a connector named {} exists; remove it first or pick another name",
                c.name
            )))
        }
    }

    pub fn get_connector(&self, name: &str) -> Result<Option<pb::Connector>> {
        self.get_msg(Space::Connectors, name)
    }

    /// By name.
    pub fn list_connectors(&self) -> Result<Vec<pb::Connector>> {
        let mut v: Vec<pb::Connector> = self.list_msgs(Space::Connectors, MAX_LIST)?;
        v.reverse();
        Ok(v)
    }

    pub fn remove_connector(&self, name: &str) -> Result<Option<pb::Connector>> {
        let c = self.get_connector(name)?;
        if c.is_some() {
            self.kv.delete(Space::Connectors, name.as_bytes())?;
        }
        Ok(c)
    }

    // ── connector state and message index ──

    pub fn channel_state(&self, connector: &str, name: &str) -> Result<Option<Vec<u8>>> {
        self.kv
            .get(Space::ChannelState, &join(connector, name.as_bytes()))
    }

    pub fn put_channel_state(&self, connector: &str, name: &str, value: &[u8]) -> Result<()> {
        self.kv.put(
            Space::ChannelState,
            &join(connector, name.as_bytes()),
            value,
        )
    }

    /// The trigger a provider's message ID is, if byom saw or sent it.
    pub fn channel_message(&self, connector: &str, external_id: &str) -> Result<Option<String>> {
        Ok(self
            .kv
            .get(
                Space::ChannelIndex,
                &join(connector, external_id.as_bytes()),
            )?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Claims `external_id` on `connector` for trigger `id`; if it was
    /// claimed before, the first claimant.
    pub fn claim_channel_message(
        &self,
        connector: &str,
        external_id: &str,
        id: &str,
    ) -> Result<Option<String>> {
        let key = join(connector, external_id.as_bytes());
        if self
            .kv
            .compare_and_swap(Space::ChannelIndex, &key, None, Some(id.as_bytes()))?
        {
            return Ok(None);
        }
        Ok(self
            .kv
            .get(Space::ChannelIndex, &key)?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    // ── the outbox ──

    pub fn get_outbox(&self, id: &str) -> Result<Option<pb::OutboxItem>> {
        self.get_msg(Space::Outbox, id)
    }

    /// Newest first; `failed` keeps only failed items.
    pub fn list_outbox(&self, failed: bool, limit: usize) -> Result<Vec<pb::OutboxItem>> {
        self.scan_newest(Space::Outbox, limit, |it: &pb::OutboxItem| {
            Some(!failed || it.state() == OutboxState::OutboxFailed)
        })
    }

    /// How many items wait on `connector` (up to `limit`).
    pub fn outbox_queue_len(&self, connector: &str, limit: usize) -> Result<usize> {
        Ok(self.outbox_queue(connector, limit)?.len())
    }

    /// The queue of `connector` in send order: (thread, item ID).
    pub fn outbox_queue(&self, connector: &str, limit: usize) -> Result<Vec<(String, String)>> {
        let prefix = join(connector, b"");
        let end = prefix_end(&prefix);
        Ok(self
            .kv
            .range(
                Space::OutboxQueue,
                Bound::Included(prefix.as_slice()),
                end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
                false,
                limit,
            )?
            .into_iter()
            .map(|(k, v)| {
                let rest = &k[prefix.len()..];
                let thread = rest.split(|b| *b == 0).next().unwrap_or_default();
                (
                    String::from_utf8_lossy(thread).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect())
    }

    /// Writes an item's new state; leaving `pending` takes it off the
    /// queue, entering it puts it back, in one batch.
    pub fn update_outbox(&self, it: &pb::OutboxItem) -> Result<()> {
        let mut ops = vec![Op::put(Space::Outbox, it.id.as_bytes(), it.encode_to_vec())];
        if it.state() == OutboxState::OutboxPending {
            ops.push(Op::put(
                Space::OutboxQueue,
                queue_key(it),
                it.id.as_bytes().to_vec(),
            ));
        } else {
            ops.push(Op::delete(Space::OutboxQueue, queue_key(it)));
        }
        if it.state() == OutboxState::OutboxSent && !it.receipt.is_empty() {
            ops.push(Op::channel_index(&it.connector, &it.receipt, &it.reply_id));
        }
        self.kv.batch(&ops)
    }
}
