//! Channels' records: threads (one per source and external name, created
//! once however many messages name it at the same moment), triggers, and
//! the Router's natural-language policies.

use byom_protocol::pb;
use prost::Message;

use crate::backend::Space;
use crate::{Result, Store, StoreError, MAX_LIST};

impl Store {
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

    /// Up to `limit` triggers of `thread`, newest first, among the newest
    /// `scan` triggers of all threads: bounded work however long the store
    /// has run (a quiet thread's old messages are not looked for).
    pub fn recent_on_thread(
        &self,
        thread: &str,
        limit: usize,
        scan: usize,
    ) -> Result<Vec<pb::Trigger>> {
        let mut seen = 0usize;
        self.scan_newest(Space::Triggers, limit, |t: &pb::Trigger| {
            seen += 1;
            if seen > scan {
                return None;
            }
            Some(t.thread_id == thread)
        })
    }

    /// Newest first, optionally on one thread.
    pub fn list_triggers(&self, thread: Option<&str>, limit: usize) -> Result<Vec<pb::Trigger>> {
        self.scan_newest(Space::Triggers, limit, |t: &pb::Trigger| {
            Some(thread.is_none_or(|th| t.thread_id == th))
        })
    }

    // ── router policies ──

    pub fn get_policy(&self, id: &str) -> Result<Option<pb::RouterPolicy>> {
        self.get_msg(Space::Policies, id)
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
}
