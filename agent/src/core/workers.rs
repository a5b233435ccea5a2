//! Workers: one context per task (or subagent), a model loop bounded per
//! piece of work, commands started asynchronously (their ends come back as
//! events), and an orderly end that stops everything the worker started
//! and tells whoever waits on it.

use std::collections::BTreeMap;

use serde_json::json;

use super::containment::{inherit, taint_of};
use super::{backoff, markup, push_bounded, Core};
use super::{
    MAX_MODEL_FAILURES, MAX_QUEUED_EVENTS, MAX_RUNNING_COMMANDS, MAX_TOOL_CALLS_PER_REPLY,
};
use crate::event::{CommandResult, Effect, RouterItem, SessionKind};
use crate::llm::{Message, Request, Response, Usage};
use crate::prompt::{self, compact, spill};
use crate::state::{ApprovalState, CmdRef, JsCallState, WorkerState, WorkerStatus};
use crate::storage::Conversation;
use crate::world::World;
use byom_protocol::id::Kind;

impl Core {
    pub(super) fn new_worker(
        &mut self,
        world: &mut dyn World,
        parent: Option<String>,
        task: String,
        threads: Vec<String>,
        machine: String,
        labels: BTreeMap<String, String>,
    ) -> String {
        let id = world.new_id(Kind::Worker);
        let now = self.now;
        let depth = parent
            .as_ref()
            .and_then(|p| self.records.worker(p))
            .map(|p| p.depth + 1)
            .unwrap_or(0);
        // The task is not markup-escaped: it may be a program, and only
        // `<event>` elements are parsed.
        let mut head = format!("Task: {}\n", task);
        if !machine.is_empty() {
            head.push_str(&format!("Default machine: {machine}\n"));
        }
        if !labels.is_empty() {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            head.push_str(&format!("Machine labels: {}\n", l.join(",")));
        }
        if !threads.is_empty() {
            head.push_str(&format!("Threads: {}\n", threads.join(" ")));
        }
        if let Some(p) = &parent {
            head.push_str(&format!(
                "You are a subagent of {p}; report(done, text) returns your answer to it.\n"
            ));
        }
        head.push_str(&format!("You are {id}."));
        // A subagent starts with what its parent read and reached; a
        // task starts with what the Router's turn held.
        let flags = match parent.as_ref().and_then(|p| self.records.worker(p)) {
            Some(p) => {
                let mut f = crate::state::Flags::default();
                inherit(&mut f, &p.flags, &p.id, "spawned by");
                f
            }
            None => self.turn_flags(),
        };
        let own_threads = threads.clone();
        self.records.insert_worker(WorkerState {
            id: id.clone(),
            parent,
            depth,
            task,
            threads,
            machine,
            labels,
            status: WorkerStatus::Running,
            conversation: Conversation::default(),
            inbox: vec![head],
            policies_shown: Vec::new(),
            in_flight: None,
            turn: 0,
            steps: 0,
            failures: 0,
            retry_at: None,
            commands: BTreeMap::new(),
            js: None,
            js_runs: 0,
            last_report: String::new(),
            created_ms: now,
            updated_ms: now,
            usage: Usage::default(),
            dropped_turns: 0,
            flags,
            own_threads,
        });
        id
    }

    pub(super) fn worker_call(&self, id: &str, turn: u64) -> Option<Effect> {
        let w = self.records.worker(id)?;
        Some(Effect::CallModel {
            session: id.to_string(),
            kind: SessionKind::Worker,
            turn,
            request: Request {
                system: prompt::WORKER_SYSTEM.into(),
                messages: w.conversation.messages().to_vec(),
                tools: prompt::worker_tools(),
                max_tokens: self.budgets.max_output_tokens,
            },
        })
    }

    /// New input for a worker's next turn; wakes it if idle.
    pub(super) fn worker_input(&mut self, id: &str, line: String) {
        let now = self.now;
        let Some(w) = self.records.live_worker_mut(id) else {
            return;
        };
        if w.inbox.len() >= MAX_QUEUED_EVENTS {
            w.inbox.remove(0);
            w.inbox
                .insert(0, "(older events dropped: too many queued)".into());
        }
        w.inbox.push(line);
        if w.status == WorkerStatus::Idle {
            // New work: the loop guard counts from here.
            w.status = WorkerStatus::Running;
            w.steps = 0;
        }
        w.updated_ms = now;
    }

    /// Moves the inbox into the conversation and calls the model, unless
    /// the worker has spent its allowance of model calls.
    pub(super) fn start_worker_turn(&mut self, world: &mut dyn World, id: &str) {
        let budget = self.budgets.worker_context_tokens;
        let max_steps = self.budgets.max_worker_steps;
        let Some(w) = self.records.worker_mut(id) else {
            return;
        };
        if w.steps >= max_steps {
            let msg = stuck(w.steps);
            self.finish_worker(world, id, WorkerStatus::Failed, &msg, true);
            return;
        }
        let text = w.inbox.drain(..).collect::<Vec<_>>().join("\n");
        w.conversation.push(Message::user(text));
        if let Some(n) = compact(&mut w.conversation, budget) {
            w.dropped_turns += n;
        }
        self.issue_worker_call(id);
    }

    fn issue_worker_call(&mut self, id: &str) {
        let Some(w) = self.records.worker_mut(id) else {
            return;
        };
        w.turn += 1;
        w.steps += 1;
        w.in_flight = Some(w.turn);
        if w.status == WorkerStatus::Idle {
            w.status = WorkerStatus::Running;
        }
        let turn = w.turn;
        let e = self.worker_call(id, turn);
        self.out.extend(e);
    }

    pub(super) fn worker_model_done(
        &mut self,
        world: &mut dyn World,
        id: &str,
        turn: u64,
        result: Result<Response, String>,
    ) {
        let now = self.now;
        let Some(w) = self.records.live_worker_mut(id) else {
            return;
        };
        if w.in_flight != Some(turn) {
            return;
        }
        w.in_flight = None;
        w.updated_ms = now;
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                w.failures += 1;
                if w.failures >= MAX_MODEL_FAILURES {
                    let msg = format!("the model kept failing: {e}");
                    self.finish_worker(world, id, WorkerStatus::Failed, &msg, true);
                } else {
                    w.retry_at = Some(now + backoff(w.failures));
                    // The same request is made again at the retry.
                    w.in_flight = Some(turn);
                }
                return;
            }
        };
        w.failures = 0;
        w.usage += resp.usage;
        w.conversation.push(Message::assistant(
            resp.text.clone(),
            resp.tool_calls.clone(),
        ));
        if resp.tool_calls.is_empty() {
            self.settle_status(id);
            return;
        }
        for (i, call) in resp.tool_calls.iter().enumerate() {
            let r = if i < MAX_TOOL_CALLS_PER_REPLY {
                self.worker_tool(world, id, call)
            } else {
                Err(format!(
                    "at most {MAX_TOOL_CALLS_PER_REPLY} tool calls per reply are acted on"
                ))
            };
            let out = r.unwrap_or_else(|e| format!("error: {e}"));
            if let Some(w) = self.records.worker_mut(id) {
                w.conversation
                    .push(Message::tool_result(call.id.clone(), out));
            }
        }
        // Tool results go back to the model at once, with anything that
        // arrived meanwhile.
        let budget = self.budgets.worker_context_tokens;
        let max_steps = self.budgets.max_worker_steps;
        let Some(w) = self.records.live_worker_mut(id) else {
            return;
        };
        if !w.inbox.is_empty() {
            let text = w.inbox.drain(..).collect::<Vec<_>>().join("\n");
            w.conversation.push(Message::user(text));
        }
        if let Some(n) = compact(&mut w.conversation, budget) {
            w.dropped_turns += n;
        }
        if w.steps >= max_steps {
            let msg = stuck(w.steps);
            self.finish_worker(world, id, WorkerStatus::Failed, &msg, true);
            return;
        }
        self.issue_worker_call(id);
    }

    /// Running while anything is in flight; waiting on a person; else idle.
    pub(super) fn settle_status(&mut self, id: &str) {
        let waiting_human = !self.records.open_approvals_of(id).is_empty();
        let Some(w) = self.records.live_worker_mut(id) else {
            return;
        };
        let busy = w.in_flight.is_some()
            || !w.inbox.is_empty()
            || w.commands.values().any(|c| !c.done)
            || w.js.is_some();
        w.status = if waiting_human {
            WorkerStatus::Waiting
        } else if busy {
            WorkerStatus::Running
        } else {
            WorkerStatus::Idle
        };
    }

    /// Records a command the worker starts (its ID chosen here, so a
    /// replayed step creates it once) and asks the shell to run it.
    pub(super) fn start_command(
        &mut self,
        world: &mut dyn World,
        id: &str,
        machine: Option<String>,
        command: String,
        timeout_ms: u64,
        js_call: Option<(u64, u32)>,
    ) -> Result<String, String> {
        let w = self.records.worker(id).ok_or("no such worker")?;
        let machine = machine
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| w.machine.clone());
        if machine.is_empty() && w.labels.is_empty() {
            return Err("name a machine: this task has no default machine".into());
        }
        if command.trim().is_empty() {
            return Err("empty command".into());
        }
        let running = w.commands.values().filter(|c| !c.done).count();
        if running >= MAX_RUNNING_COMMANDS {
            return Err(format!(
                "{running} commands are already running (limit {MAX_RUNNING_COMMANDS}); wait for their results"
            ));
        }
        let cmd = world.new_id(Kind::Command);
        let held = self.gate_command(world, id, &cmd, &machine, &command);
        let w = self.records.worker_mut(id).ok_or("no such worker")?;
        w.commands.insert(
            cmd.clone(),
            CmdRef {
                command: command.clone(),
                machine: machine.clone(),
                timeout_ms,
                js_call,
                done: false,
                held: held.clone(),
                approval: None,
                approved_by: String::new(),
            },
        );
        if held.is_some() {
            // Waiting on a person, recorded by `ask`.
            return Ok(cmd);
        }
        w.status = WorkerStatus::Running;
        self.out.push(Effect::StartCommand {
            worker: id.to_string(),
            cmd: cmd.clone(),
            machine,
            labels: w.labels.clone(),
            command,
            timeout_ms,
            taint: taint_of(&w.flags),
            approved_by: String::new(),
        });
        Ok(cmd)
    }

    pub(super) fn command_done(&mut self, id: &str, cmd: &str, r: CommandResult) {
        let chars = self.budgets.output_chars;
        let Some(w) = self.records.worker_mut(id) else {
            return;
        };
        let Some(c) = w.commands.get_mut(cmd).filter(|c| !c.done) else {
            return;
        };
        c.done = true;
        let js_call = c.js_call;
        let line = markup::command_done(cmd, c, &r, chars);
        if w.status.is_closed() {
            return;
        }
        // Reading it is reading whoever wrote what it fetched: the machine
        // says whether it used the network (its kernel saw an IP socket,
        // or nothing watched and the network was open); a program that
        // fetches by nature counts whatever the machine says.
        if r.network {
            w.flags.add_untrusted(
                cmd,
                "its output may hold anyone's words: it could reach the network and used it (or its machine could not watch)",
            );
        } else if let Some(program) = super::containment::fetches(&c.command) {
            w.flags.add_untrusted(
                cmd,
                &format!("its output came from the network ({program}): anyone's words"),
            );
        }
        match js_call {
            Some((run, call)) => {
                let v = json!({
                    "command": cmd, "state": r.state, "exit_code": r.exit_code,
                    "stdout": spill(&r.stdout, chars * 4, cmd),
                    "stderr": spill(&r.stderr, chars * 4, cmd),
                    "reason": r.reason,
                });
                self.js_settle(id, run, call, Ok(v));
            }
            None => self.worker_input(id, line),
        }
    }

    /// The machine of a running command went away: the worker hears so
    /// (the command itself goes on, or ends as lost at its deadline).
    pub(super) fn command_pending(&mut self, id: &str, cmd: &str, note: &str) {
        let Some(w) = self.records.worker(id).filter(|w| !w.status.is_closed()) else {
            return;
        };
        let Some(c) = w.commands.get(cmd).filter(|c| !c.done) else {
            return;
        };
        let line = markup::command_pending(cmd, c, note);
        self.worker_input(id, line);
    }

    pub(super) fn report(&mut self, world: &mut dyn World, id: &str, status: &str, text: &str) {
        let Some(w) = self.records.worker_mut(id) else {
            return;
        };
        w.last_report = text.to_string();
        let threads = w.threads.clone();
        let flags = w.flags.clone();
        let own_threads = w.own_threads.clone();
        match w.parent.is_some() {
            // A subagent's report is its answer to the program that spawned it.
            true if status != "progress" => {
                let st = if status == "failed" {
                    WorkerStatus::Failed
                } else {
                    WorkerStatus::Done
                };
                self.finish_worker(world, id, st, text, true);
            }
            true => {}
            // finish_worker tells the Router about a failure.
            false if status == "failed" => {
                self.finish_worker(world, id, WorkerStatus::Failed, text, true);
            }
            false => push_bounded(
                self.records.router_mut(),
                RouterItem::Report {
                    worker: id.to_string(),
                    threads,
                    status: status.to_string(),
                    text: text.to_string(),
                    flags: flags.clone(),
                    own_threads: own_threads.clone(),
                },
            ),
        }
    }

    /// Closes a worker: stops its commands, children and approvals, and
    /// tells whoever waits on it.
    /// `tell_router`: a top-level worker that fails or is cancelled is
    /// reported to the Router, unless the Router itself ended it.
    pub(super) fn finish_worker(
        &mut self,
        world: &mut dyn World,
        id: &str,
        status: WorkerStatus,
        text: &str,
        tell_router: bool,
    ) {
        let now = self.now;
        let Some(w) = self.records.live_worker_mut(id) else {
            return;
        };
        w.status = status;
        w.in_flight = None;
        w.inbox.clear();
        w.updated_ms = now;
        if !text.is_empty() {
            w.last_report = text.to_string();
        }
        let parent = w.parent.clone();
        let threads = w.threads.clone();
        for (cmd, c) in &w.commands {
            // A held command never reached a machine; its approval is
            // cancelled below.
            if !c.done && c.held.is_none() {
                self.out.push(Effect::StopCommand {
                    cmd: cmd.clone(),
                    reason: format!("worker {id} {}", status.name()),
                });
            }
        }
        let mut children = Vec::new();
        if let Some(js) = w.js.take() {
            for st in js.calls.values() {
                if let JsCallState::Subagent(c) = st {
                    children.push(c.clone());
                }
            }
            if let Some(s) = js.snapshot {
                self.out.push(Effect::DropSnapshot { snapshot: s });
            }
        }
        for t in &threads {
            self.unsubscribe(t, id);
        }
        for a in self.records.open_approvals_of(id) {
            if let Some(a) = self.records.approval_mut(&a) {
                a.state = ApprovalState::Cancelled;
                a.answered_ms = now;
            }
        }
        for c in children {
            let why = format!("its parent {id} ended");
            self.finish_worker(world, &c, WorkerStatus::Cancelled, &why, true);
        }
        if let Some(p) = parent {
            // What the subagent read and reached comes back with its answer.
            let child = self.records.worker(id).map(|c| c.flags.clone());
            if let (Some(f), Some(pw)) = (child, self.records.live_worker_mut(&p)) {
                inherit(&mut pw.flags, &f, id, "the answer of subagent");
            }
            if let Some((run, call)) = self.js_call_of(&p, id) {
                let v = json!({"worker": id, "status": status.name(), "text": text});
                let r = if status == WorkerStatus::Done {
                    Ok(v)
                } else {
                    Err(format!("subagent {id} {}: {text}", status.name()))
                };
                self.js_settle(&p, run, call, r);
                self.spawn_queued(world, &p);
            }
        } else if status != WorkerStatus::Done && tell_router {
            let (flags, own_threads) = self
                .records
                .worker(id)
                .map(|w| (w.flags.clone(), w.own_threads.clone()))
                .unwrap_or_default();
            push_bounded(
                self.records.router_mut(),
                RouterItem::Report {
                    worker: id.to_string(),
                    threads,
                    status: status.name().to_string(),
                    text: text.to_string(),
                    flags: flags.clone(),
                    own_threads: own_threads.clone(),
                },
            );
        }
    }
}

fn stuck(steps: u32) -> String {
    format!("stopped after {steps} model calls (max_worker_steps): it looks stuck or looping")
}
