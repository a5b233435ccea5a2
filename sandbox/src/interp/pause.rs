//! Durable pauses: when a script awaits only durable capability calls, the
//! interpreter's memory and pending calls become a signed [`Snapshot`];
//! [`Interpreter::restore`] rebuilds it (in any process) and
//! [`Interpreter::resume`] settles a call and runs the script on. The
//! evaluation loop itself (eval, poll, settle, limits) is in [`super`].

use std::sync::Arc;

use serde_json::Value;

use super::{Interpreter, Outcome};
use crate::capability::{Capability, PendingCall};
use crate::engine::Engine;
use crate::host::CallRec;
use crate::limits::{ErrorKind, Limits};
use crate::snapshot::{SavedCall, Snapshot, SnapshotBody};

impl Interpreter {
    pub(super) fn snapshot(&mut self, pending: Vec<PendingCall>) -> anyhow::Result<Snapshot> {
        let initial = self.engine.initial_image()?;
        let sp = match self.ex.stack_pointer.get(&mut self.store) {
            wasmtime::Val::I32(v) => v as u32,
            _ => anyhow::bail!("stack pointer is not i32"),
        };
        let mem = self.ex.memory.data(&self.store);
        let h = self.store.data();
        let body = SnapshotBody {
            memory_len: mem.len() as u64,
            stack_pointer: sp,
            pending: pending
                .iter()
                .map(|p| SavedCall {
                    id: p.id,
                    capability: p.capability.clone(),
                    args: p.args.clone(),
                })
                .collect(),
            next_id: h.next_id,
            clock_us: h.clock_us,
            capabilities: self.caps.iter().map(|c| c.full_name()).collect(),
            calls_made: h
                .calls_made
                .iter()
                .map(|(k, v)| (self.caps[*k].full_name(), *v))
                .collect(),
        };
        Snapshot::capture(body, mem, initial, &self.snapshot_key)
    }

    /// Restores a paused interpreter from a snapshot (in any process). The
    /// capabilities must be the same names in the same order as when it
    /// paused; the key must be the one that signed it.
    pub fn restore(
        engine: &Engine,
        limits: Limits,
        caps: Vec<Capability>,
        snapshot: &Snapshot,
        snapshot_key: &[u8],
    ) -> Result<Interpreter, (ErrorKind, String)> {
        let bad = |m: String| (ErrorKind::BadSnapshot, m);
        let body = snapshot
            .verify(snapshot_key)
            .map_err(|e| bad(e.to_string()))?;
        let names: Vec<String> = caps.iter().map(|c| c.full_name()).collect();
        if names != body.capabilities {
            return Err(bad(format!(
                "the snapshot was made with capabilities {:?}, not {:?}",
                body.capabilities, names
            )));
        }
        let mut it = Self::instantiate(engine, limits, Arc::new(caps), snapshot_key)
            .map_err(|e| (ErrorKind::Internal, e.to_string()))?;
        let cur = it.ex.memory.data_size(&it.store);
        let (len, chunks) = snapshot
            .delta(cur, snapshot_key)
            .map_err(|e| bad(e.to_string()))?;
        if len > cur {
            let pages = (len - cur).div_ceil(65536) as u64;
            it.ex.memory.grow(&mut it.store, pages).map_err(|e| {
                (
                    ErrorKind::OutOfMemory,
                    format!("cannot restore memory: {e}"),
                )
            })?;
        }
        // A fresh instance's memory is the initial image (copy-on-write), so
        // writing the changed chunks reproduces the paused memory.
        let data = it.ex.memory.data_mut(&mut it.store);
        for (start, bytes) in &chunks {
            data[*start..*start + bytes.len()].copy_from_slice(bytes);
        }
        it.ex
            .stack_pointer
            .set(&mut it.store, wasmtime::Val::I32(body.stack_pointer as i32))
            .map_err(|e| (ErrorKind::Internal, e.to_string()))?;
        let h = it.store.data_mut();
        h.next_id = body.next_id;
        h.clock_us = body.clock_us;
        for p in &body.pending {
            let Some(cap) = names.iter().position(|n| *n == p.capability) else {
                return Err(bad(format!("unknown capability {}", p.capability)));
            };
            h.calls.push(CallRec {
                id: p.id,
                cap,
                args: p.args.clone(),
                started: false,
                immediate: None,
            });
        }
        for (name, n) in &body.calls_made {
            if let Some(cap) = names.iter().position(|x| x == name) {
                h.calls_made.insert(cap, *n);
            }
        }
        Ok(it)
    }

    /// Durable calls this interpreter waits on.
    pub fn pending(&self) -> Vec<PendingCall> {
        self.store
            .data()
            .calls
            .iter()
            .filter(|c| self.caps[c.cap].durable)
            .map(|c| PendingCall {
                id: c.id,
                capability: self.caps[c.cap].full_name(),
                args: c.args.clone(),
            })
            .collect()
    }

    /// Settles durable call `call_id` (Ok: the value; Err: a rejection with
    /// that message) and runs the script on, to its end or its next pause.
    pub async fn resume(&mut self, call_id: u32, result: Result<Value, String>) -> Outcome {
        if self.poisoned {
            return Outcome::Error(
                ErrorKind::Internal,
                "the interpreter was discarded after a trap".into(),
            );
        }
        let known = self
            .store
            .data()
            .calls
            .iter()
            .any(|c| c.id == call_id && self.caps[c.cap].durable);
        if !known {
            let ids: Vec<u32> = self.pending().iter().map(|p| p.id).collect();
            return Outcome::Error(
                ErrorKind::BadSnapshot,
                format!("no pending call {call_id} (pending: {ids:?})"),
            );
        }
        self.begin();
        self.store.data_mut().calls.retain(|c| c.id != call_id);
        if let Err((k, m)) = self.settle(call_id, result) {
            return Outcome::Error(k, m);
        }
        self.drive().await
    }
}
