//! Programs a worker runs in the code interpreter, and the approvals they
//! wait on. Every capability is durable: the program pauses on each call
//! (its state a snapshot the shell keeps), the core starts what the call
//! asks for (a command, a subagent, a question to a person), and each
//! result resumes the program from its latest snapshot, one at a time.

use serde_json::Value;

use super::router::opt_str;
use super::tools::timeout_ms;
use super::{markup, Core};
use crate::event::{Effect, JsCallReq, JsOutcome};
use crate::state::{ApprovalKind, ApprovalState, JsCallState, JsStep, WorkerStatus};
use crate::world::World;

/// Longest parent chain walked to find where a person can be asked.
const MAX_PARENT_WALK: usize = crate::budgets::MAX_DEPTH_LIMIT as usize;

impl Core {
    pub(super) fn js_done(
        &mut self,
        world: &mut dyn World,
        id: &str,
        run: u64,
        outcome: JsOutcome,
    ) {
        let Some(w) = self.records.live_worker_mut(id) else {
            return;
        };
        let Some(js) =
            w.js.as_mut()
                .filter(|j| j.run == run && j.step != JsStep::Idle)
        else {
            return;
        };
        js.step = JsStep::Idle;
        match outcome {
            JsOutcome::Paused { snapshot, pending } => {
                if let Some(old) = js.snapshot.replace(snapshot) {
                    self.out.push(Effect::DropSnapshot { snapshot: old });
                }
                let new: Vec<JsCallReq> = pending
                    .into_iter()
                    .filter(|p| !js.calls.contains_key(&p.id))
                    .collect();
                for p in new {
                    self.js_call(world, id, run, p);
                }
                self.spawn_queued(world, id);
                self.js_next(id);
                self.settle_status(id);
            }
            JsOutcome::Done { result, logs } => {
                self.end_program(world, id, "the program finished");
                let line = markup::program_done(id, run, &result, &logs, self.budgets.report_chars);
                self.worker_input(id, line);
            }
            JsOutcome::Error { kind, message } => {
                self.end_program(world, id, "its program failed");
                self.worker_input(id, markup::program_error(id, run, &kind, &message));
            }
        }
    }

    /// A program ended (done or failed) while calls it made may still be
    /// out (a rejected `Promise.all`, a call never awaited): stop them.
    fn end_program(&mut self, world: &mut dyn World, id: &str, why: &str) {
        let now = self.now;
        let Some(w) = self.records.worker_mut(id) else {
            return;
        };
        let Some(js) = w.js.take() else {
            return;
        };
        if let Some(s) = js.snapshot {
            self.out.push(Effect::DropSnapshot { snapshot: s });
        }
        let mut children = Vec::new();
        let mut approvals = Vec::new();
        for st in js.calls.values() {
            match st {
                JsCallState::Command(cmd) => {
                    if let Some(apr) = w.commands.get(cmd).and_then(|c| c.held.clone()) {
                        approvals.push(apr);
                        if let Some(c) = w.commands.get_mut(cmd) {
                            c.done = true;
                            c.held = None;
                        }
                    } else if w.commands.get(cmd).is_some_and(|c| !c.done) {
                        self.out.push(Effect::StopCommand {
                            cmd: cmd.clone(),
                            reason: why.to_string(),
                        });
                    }
                }
                JsCallState::Subagent(c) => children.push(c.clone()),
                JsCallState::Approval(a) => approvals.push(a.clone()),
                JsCallState::SpawnQueued { .. } | JsCallState::Settled => {}
            }
        }
        for a in approvals {
            if let Some(a) = self
                .records
                .approval_mut(&a)
                .filter(|a| a.state == ApprovalState::Open)
            {
                a.state = ApprovalState::Cancelled;
                a.answered_ms = now;
            }
        }
        for c in children {
            self.finish_worker(world, &c, WorkerStatus::Cancelled, why, true);
        }
    }

    /// A new durable call from the program: start what it asks for.
    fn js_call(&mut self, world: &mut dyn World, id: &str, run: u64, p: JsCallReq) {
        let state = match p.capability.as_str() {
            "tools.exec" => {
                let command = opt_str(&p.args, "command").unwrap_or_default();
                let machine = opt_str(&p.args, "machine");
                let timeout = timeout_ms(&p.args);
                match self.start_command(world, id, machine, command, timeout, Some((run, p.id))) {
                    Ok(cmd) => JsCallState::Command(cmd),
                    Err(e) => return self.js_settle_now(id, p.id, Err(e)),
                }
            }
            "agents.spawn" => match self.queue_spawn(id, &p.args) {
                Ok(state) => state,
                Err(e) => return self.js_settle_now(id, p.id, Err(e)),
            },
            "human.ask" => {
                let question = match &p.args {
                    Value::String(s) => s.clone(),
                    v => opt_str(v, "question").unwrap_or_else(|| v.to_string()),
                };
                // Answered by an approver for the worker's machine.
                let (machine, labels, flags) = match self.records.worker(id) {
                    Some(w) => (w.machine.clone(), w.labels.clone(), w.flags.clone()),
                    None => return,
                };
                let labels = self
                    .read(world.machines_for(&machine, &labels), Vec::new())
                    .first()
                    .map(|m| m.labels.clone());
                let apr = self.ask(
                    world,
                    id,
                    ApprovalKind::Question,
                    &machine,
                    labels.as_ref(),
                    "ask you (a program waits for your answer)",
                    &question,
                    flags,
                    "",
                    None,
                );
                if let Some(a) = self.records.approval_mut(&apr) {
                    a.run = run;
                    a.call = p.id;
                }
                JsCallState::Approval(apr)
            }
            other => {
                return self.js_settle_now(id, p.id, Err(format!("unknown capability {other}")))
            }
        };
        if let Some(js) = self.records.worker_mut(id).and_then(|w| w.js.as_mut()) {
            js.calls.insert(p.id, state);
        }
    }

    /// An `agents.spawn` call waits for a subagent slot, within the
    /// program's and the depth's bounds.
    fn queue_spawn(&mut self, id: &str, args: &Value) -> Result<JsCallState, String> {
        let max_subagents = self.budgets.max_subagents;
        let max_depth = self.budgets.max_depth;
        let w = self.records.worker_mut(id).ok_or("no such worker")?;
        let task = opt_str(args, "task").unwrap_or_default();
        let machine = opt_str(args, "machine").unwrap_or_else(|| w.machine.clone());
        if w.depth + 1 > max_depth {
            return Err(format!("subagents may nest at most {max_depth} deep"));
        }
        let js = w.js.as_mut().ok_or("no program is running")?;
        if js.spawned >= max_subagents {
            return Err(format!(
                "a program may spawn at most {max_subagents} subagents"
            ));
        }
        js.spawned += 1;
        Ok(JsCallState::SpawnQueued { task, machine })
    }

    /// Where a person is asked: the thread the task came from (its top
    /// worker's own first thread, as given when it was made). Never a
    /// thread a worker chose to watch later: a request posts the action's
    /// text, so its place is not the worker's to pick.
    pub(super) fn root_thread(&self, id: &str) -> Option<String> {
        let mut cur = self.records.worker(id)?;
        for _ in 0..MAX_PARENT_WALK {
            match &cur.parent {
                Some(p) => cur = self.records.worker(p)?,
                None => return cur.own_threads.first().cloned(),
            }
        }
        None
    }

    /// The program call a subagent answers: (run, call).
    pub(super) fn js_call_of(&self, parent: &str, child: &str) -> Option<(u64, u32)> {
        let js = self.records.worker(parent)?.js.as_ref()?;
        let call = js
            .calls
            .iter()
            .find(|(_, s)| matches!(s, JsCallState::Subagent(c) if c == child))
            .map(|(k, _)| *k)?;
        Some((js.run, call))
    }

    /// Starts queued subagents while there is room.
    pub(super) fn spawn_queued(&mut self, world: &mut dyn World, id: &str) {
        let max = self.budgets.max_concurrent_subagents;
        // Each pass settles or starts one queued call, so this ends.
        loop {
            let Some(js) = self.records.worker(id).and_then(|w| w.js.as_ref()) else {
                return;
            };
            let running = js
                .calls
                .values()
                .filter(|s| match s {
                    JsCallState::Subagent(c) => self
                        .records
                        .worker(c)
                        .is_some_and(|w| !w.status.is_closed()),
                    _ => false,
                })
                .count();
            if running >= max {
                return;
            }
            let Some((call, task, machine)) = js.calls.iter().find_map(|(k, s)| match s {
                JsCallState::SpawnQueued { task, machine } => {
                    Some((*k, task.clone(), machine.clone()))
                }
                _ => None,
            }) else {
                return;
            };
            let run = js.run;
            if let Err(e) = self.room_for_worker() {
                self.js_settle(id, run, call, Err(e));
                continue;
            }
            let labels = self
                .records
                .worker(id)
                .map(|w| w.labels.clone())
                .unwrap_or_default();
            let child = self.new_worker(
                world,
                Some(id.to_string()),
                task,
                Vec::new(),
                machine,
                labels,
            );
            if let Some(js) = self.records.worker_mut(id).and_then(|w| w.js.as_mut()) {
                js.calls.insert(call, JsCallState::Subagent(child));
            }
        }
    }

    /// A result for a call, settled now (the call never started).
    fn js_settle_now(&mut self, id: &str, call: u32, r: Result<Value, String>) {
        if let Some(js) = self.records.worker_mut(id).and_then(|w| w.js.as_mut()) {
            js.calls.insert(call, JsCallState::Settled);
            js.ready.push_back((call, r));
        }
    }

    pub(super) fn js_settle(&mut self, id: &str, run: u64, call: u32, r: Result<Value, String>) {
        let Some(js) = self.records.worker(id).and_then(|w| w.js.as_ref()) else {
            return;
        };
        if js.run != run || matches!(js.calls.get(&call), Some(JsCallState::Settled) | None) {
            return;
        }
        if let Some(js) = self.records.worker_mut(id).and_then(|w| w.js.as_mut()) {
            js.calls.insert(call, JsCallState::Settled);
            js.ready.push_back((call, r));
        }
        self.js_next(id);
    }

    /// Feeds the next ready result to the interpreter if it is free.
    fn js_next(&mut self, id: &str) {
        let ready = self
            .records
            .worker(id)
            .and_then(|w| w.js.as_ref())
            .is_some_and(|js| {
                js.step == JsStep::Idle && js.snapshot.is_some() && !js.ready.is_empty()
            });
        if !ready {
            return;
        }
        let Some(w) = self.records.worker_mut(id) else {
            return;
        };
        let Some(js) = w.js.as_mut() else {
            return;
        };
        let (Some(snapshot), Some((call, result))) = (js.snapshot.clone(), js.ready.pop_front())
        else {
            return;
        };
        js.step = JsStep::Resume {
            call,
            result: result.clone(),
        };
        let run = js.run;
        w.status = WorkerStatus::Running;
        self.out.push(Effect::ResumeJs {
            worker: id.to_string(),
            run,
            snapshot,
            call,
            result,
        });
    }
}
