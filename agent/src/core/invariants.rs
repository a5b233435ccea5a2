//! What must hold between any two steps, checked by the simulator after
//! every step (and by the server's driver in debug builds). A violation is
//! a bug in the core, named precisely enough to find it.

use super::{Core, MAX_ACTIVE_WORKERS, MAX_QUEUED_EVENTS, MAX_ROUTER_QUEUE, MAX_RUNNING_COMMANDS};
use crate::state::{ApprovalKind, ApprovalState, JsCallState, JsStep, WorkerStatus};

impl Core {
    /// Every invariant of the state; `Err` lists each one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut bad: Vec<String> = Vec::new();
        let r = self.records.router();
        let workers = self.records.workers();
        let b = &self.budgets;
        if r.queue.len() > MAX_ROUTER_QUEUE {
            bad.push(format!("router queue {} over its bound", r.queue.len()));
        }
        if r.queue.len() != r.queue.iter().count() {
            bad.push("router queue length disagrees with its items".into());
        }
        if r.steps > b.max_router_steps {
            bad.push(format!("router made {} calls in one turn", r.steps));
        }
        if r.in_flight.is_some() && r.retry_at.is_some() {
            bad.push("router has a call in flight and a retry scheduled".into());
        }
        for (thread, subs) in &r.subs {
            if subs.is_empty() {
                bad.push(format!("{thread} has an empty subscriber set"));
            }
            for w in subs {
                match workers.get(w) {
                    None => bad.push(format!("{thread} is subscribed by unknown {w}")),
                    Some(x) if x.status.is_closed() => {
                        bad.push(format!("{thread} is subscribed by ended {w}"))
                    }
                    Some(x) if !x.threads.contains(thread) => {
                        bad.push(format!("{w} receives {thread} but does not list it"))
                    }
                    _ => {}
                }
            }
        }
        let active = workers
            .values()
            .filter(|w| matches!(w.status, WorkerStatus::Running | WorkerStatus::Waiting))
            .count();
        // Hostile replies are cut per reply, so the bound can be passed by
        // at most one reply's worth of creations.
        if active > MAX_ACTIVE_WORKERS + super::MAX_TOOL_CALLS_PER_REPLY {
            bad.push(format!("{active} active workers"));
        }
        for (id, w) in workers {
            if id != &w.id {
                bad.push(format!("record {id} holds worker {}", w.id));
            }
            if w.inbox.len() > MAX_QUEUED_EVENTS + 1 {
                bad.push(format!("{id} holds {} queued events", w.inbox.len()));
            }
            if w.depth > b.max_depth {
                bad.push(format!("{id} is nested {} deep", w.depth));
            }
            let running = w.commands.values().filter(|c| !c.done).count();
            if w.status.is_closed() {
                if w.in_flight.is_some() || !w.inbox.is_empty() || w.js.is_some() {
                    bad.push(format!("ended {id} still has work in flight"));
                }
                continue;
            }
            if running > MAX_RUNNING_COMMANDS {
                bad.push(format!("{id} runs {running} commands"));
            }
            if w.steps > b.max_worker_steps {
                bad.push(format!("{id} made {} model calls", w.steps));
            }
            if w.status == WorkerStatus::Idle
                && (w.in_flight.is_some() || running > 0 || w.js.is_some())
            {
                bad.push(format!("idle {id} has work in flight"));
            }
            if let Some(p) = &w.parent {
                let parent_waits = workers.get(p).is_some_and(|pw| {
                    !pw.status.is_closed()
                        && pw.js.as_ref().is_some_and(|js| {
                            js.calls
                                .values()
                                .any(|s| matches!(s, JsCallState::Subagent(c) if c == id))
                        })
                });
                if !parent_waits {
                    bad.push(format!("subagent {id} runs with no program of {p} waiting"));
                }
            }
            if let Some(js) = &w.js {
                if matches!(js.step, JsStep::Resume { .. }) && js.snapshot.is_none() {
                    bad.push(format!("{id} resumes a program that never paused"));
                }
                if js.spawned > b.max_subagents {
                    bad.push(format!("{id} spawned {} subagents", js.spawned));
                }
                for (call, st) in &js.calls {
                    if let JsCallState::Command(cmd) = st {
                        if !w.commands.contains_key(cmd) {
                            bad.push(format!("{id} call {call} waits on unknown {cmd}"));
                        }
                    }
                }
            }
        }
        for (aid, a) in self.records.approvals() {
            if a.state != ApprovalState::Open {
                continue;
            }
            let live = workers.get(&a.worker).filter(|w| !w.status.is_closed());
            // A held post waits on nobody: the reply itself is what an
            // answer releases, whether its worker has ended or not.
            let waiting = a.kind == ApprovalKind::Message && a.reply.is_some();
            let waiting = waiting || live.is_some_and(|w| match a.kind {
                ApprovalKind::Question => w.js.as_ref().is_some_and(|js| {
                    js.run == a.run
                        && matches!(js.calls.get(&a.call), Some(JsCallState::Approval(x)) if x == aid)
                }),
                ApprovalKind::Command => w
                    .commands
                    .get(&a.cmd)
                    .is_some_and(|c| !c.done && c.held.as_deref() == Some(aid.as_str())),
                ApprovalKind::Message => a.reply.is_some(),
            });
            if !waiting {
                bad.push(format!("open {aid} has nothing waiting on it"));
            }
        }
        // A held command waits on an open approval of its own; one that
        // started under an approval cites an approved one (when still in
        // memory).
        for (id, w) in workers.iter().filter(|(_, w)| !w.status.is_closed()) {
            for (cmd, c) in &w.commands {
                if let Some(apr) = c.held.as_ref().filter(|_| !c.done) {
                    let ok = self.records.approvals().get(apr).is_some_and(|a| {
                        a.state == ApprovalState::Open && a.cmd == *cmd && a.worker == *id
                    });
                    if !ok {
                        bad.push(format!("{id}'s held {cmd} has no open approval {apr}"));
                    }
                }
                if let Some(a) = c
                    .approval
                    .as_ref()
                    .and_then(|a| self.records.approvals().get(a))
                {
                    if a.state != ApprovalState::Approved || a.by != c.approved_by {
                        bad.push(format!(
                            "{id}'s {cmd} started under {} which is {}",
                            a.id,
                            a.state.name()
                        ));
                    }
                }
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("; "))
        }
    }
}
