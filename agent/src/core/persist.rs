//! Persistence: what a step writes ([`Core::take_writes`]), how a core is
//! rebuilt from what was written ([`Core::rebuild`]), and what was in
//! flight and must start again after a restart ([`Core::resume_effects`]).
//! Keys are those of [`crate::storage::keys`].

use std::collections::BTreeMap;

use byom_protocol::id::Kind;
use serde_json::Value;

use super::Core;
use crate::budgets::Budgets;
use crate::event::{Effect, RouterItem};
use crate::llm::Message;
use crate::state::{Approval, JsStep, RouterState, WorkerState};
use crate::storage::keys::{self, ROUTER};
use crate::storage::Conversation;

/// A write to the agents keyspace: `None` deletes the key.
pub type Write = (String, Option<Vec<u8>>);

impl Core {
    /// Records changed since the last call (`router`, `wrk_…`, `apr_…`).
    pub fn take_dirty(&mut self) -> std::collections::BTreeSet<String> {
        self.records.take_dirty()
    }

    /// One record as JSON bytes, straight from the state.
    fn record_bytes(&self, key: &str) -> Option<Vec<u8>> {
        if key == ROUTER {
            return serde_json::to_vec(self.records.router()).ok();
        }
        if let Some(w) = self.records.worker(key) {
            return serde_json::to_vec(w).ok();
        }
        self.records
            .approvals()
            .get(key)
            .and_then(|a| serde_json::to_vec(a).ok())
    }

    /// Everything to write after a step: changed records and the messages
    /// and queue items added or dropped.
    pub fn take_writes(&mut self) -> Vec<Write> {
        let mut out = Vec::new();
        {
            let (router, workers) = self.records.sessions_mut();
            router.conversation.take_writes(ROUTER, &mut out);
            router.queue.take_writes(&mut out);
            for (k, w) in workers.iter_mut() {
                w.conversation.take_writes(k, &mut out);
            }
        }
        for key in self.records.take_dirty() {
            if let Some(b) = self.record_bytes(&key) {
                out.push((keys::record(&key), Some(b)));
            }
        }
        for (trigger, fate) in self.fates.drain(..) {
            out.push((keys::fate(&trigger), Some(fate.into_bytes())));
        }
        out
    }

    /// Rebuilds the state from what [`Core::take_writes`] wrote: the records
    /// (keys without their prefix), each session's stored messages and the
    /// Router's queue items. With `evict`, ended workers are not kept in
    /// memory (and their messages not read). Returns the core and what was
    /// unreadable.
    pub fn rebuild(
        budgets: Budgets,
        records: Vec<(String, Vec<u8>)>,
        mut messages: impl FnMut(&str) -> Vec<(u64, Vec<u8>)>,
        queue: Vec<(u64, Vec<u8>)>,
        evict: bool,
    ) -> (Core, Vec<String>) {
        let mut core = Core::new(budgets);
        let mut errors = Vec::new();
        for (k, v) in records {
            if let Err(e) = core.load(&k, &v) {
                errors.push(format!("record {k}: {e}"));
            }
        }
        if evict {
            core.records.evict_closed();
        }
        let mut restore = |session: &str, conv: &mut Conversation, errors: &mut Vec<String>| {
            let mut stored = BTreeMap::new();
            for (n, b) in messages(session) {
                match serde_json::from_slice::<Message>(&b) {
                    Ok(m) => {
                        stored.insert(n, m);
                    }
                    Err(e) => errors.push(format!("message {n} of {session}: {e}")),
                }
            }
            let want = conv.len();
            conv.restore(&stored);
            if conv.len() != want {
                errors.push(format!(
                    "{session}: {} of {want} messages missing",
                    want - conv.len()
                ));
            }
        };
        let mut items = Vec::new();
        for (n, b) in queue {
            match serde_json::from_slice::<RouterItem>(&b) {
                Ok(it) => items.push((n, it)),
                Err(e) => errors.push(format!("queue item {n}: {e}")),
            }
        }
        items.sort_by_key(|(n, _)| *n);
        let (router, workers) = core.records.sessions_mut();
        router.queue.restore(items);
        restore(ROUTER, &mut router.conversation, &mut errors);
        for (k, w) in workers.iter_mut() {
            restore(k, &mut w.conversation, &mut errors);
        }
        core.records.take_dirty();
        (core, errors)
    }

    /// [`Core::rebuild`] from an in-memory image of the agents' keyspace
    /// (every key [`Core::take_writes`] wrote, as last written): what the
    /// simulator's crashes and the unit tests' reloads rebuild from.
    pub fn rebuild_from_image(
        budgets: Budgets,
        image: &BTreeMap<String, Vec<u8>>,
        evict: bool,
    ) -> (Core, Vec<String>) {
        let numbered = |prefix: &str| -> Vec<(u64, Vec<u8>)> {
            image
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .filter_map(|(k, v)| Some((keys::number(prefix, k)?, v.clone())))
                .collect()
        };
        let records = image
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(keys::RECORD)?.to_string(), v.clone())))
            .collect();
        Core::rebuild(
            budgets,
            records,
            |session| numbered(&keys::messages_of(session)),
            numbered(keys::ROUTER_QUEUE),
            evict,
        )
    }

    /// Loads one stored record (key without its prefix).
    fn load(&mut self, key: &str, bytes: &[u8]) -> Result<(), serde_json::Error> {
        if key == ROUTER {
            self.records
                .load_router(serde_json::from_slice::<RouterState>(bytes)?);
        } else if key.starts_with(Kind::Worker.prefix()) {
            self.records
                .load_worker(key, serde_json::from_slice::<WorkerState>(bytes)?);
        } else if key.starts_with(Kind::Approval.prefix()) {
            self.records
                .load_approval(key, serde_json::from_slice::<Approval>(bytes)?);
        } else {
            // A kind this version does not know: say so, keep it stored.
            serde_json::from_slice::<Value>(bytes)?;
            tracing::warn!("unknown agent record {key} left alone");
        }
        Ok(())
    }

    /// After a restart: everything that was in flight, to start again.
    /// Commands are created only if missing, so none runs twice.
    pub fn resume_effects(&mut self) -> Vec<Effect> {
        let mut fx = Vec::new();
        if let Some(turn) = self.records.router().in_flight {
            fx.push(self.router_call(turn));
        }
        for (id, w) in self.records.workers() {
            if w.status.is_closed() {
                continue;
            }
            if let Some(turn) = w.in_flight {
                fx.extend(self.worker_call(id, turn));
            }
            for (cmd, c) in &w.commands {
                // A held command waits for its approval, not a machine.
                if !c.done && c.held.is_none() {
                    fx.push(Effect::StartCommand {
                        worker: id.clone(),
                        cmd: cmd.clone(),
                        machine: c.machine.clone(),
                        labels: w.labels.clone(),
                        command: c.command.clone(),
                        timeout_ms: c.timeout_ms,
                        taint: super::containment::taint_of(&w.flags),
                        approved_by: c.approved_by.clone(),
                    });
                }
            }
            if let Some(js) = &w.js {
                match (&js.step, &js.snapshot) {
                    (JsStep::Eval, _) => fx.push(Effect::RunJs {
                        worker: id.clone(),
                        run: js.run,
                        code: js.code.clone(),
                        clock_ms: js.started_ms,
                    }),
                    (JsStep::Resume { call, result }, Some(snap)) => fx.push(Effect::ResumeJs {
                        worker: id.clone(),
                        run: js.run,
                        snapshot: snap.clone(),
                        call: *call,
                        result: result.clone(),
                    }),
                    _ => {}
                }
            }
        }
        fx
    }
}
