//! The Router and the Workers as one deterministic state machine: an event
//! and a [`World`] (time, fresh IDs, policies, machines, object lookup) in,
//! [`Effect`]s out. No I/O, no clock, no randomness of its own: the same
//! events with the same world give the same effects, which is what lets the
//! driver persist every step and the simulator replay a day in milliseconds.
//!
//! State is a set of records (the router, each worker, each approval),
//! each serializable on its own; [`Core::take_dirty`] says which changed so
//! the driver writes only those.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use byom_protocol::id::Kind;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::prompt::{self, escape, spill};
use crate::model::{Message, Request, Response, Role, ToolCall, Usage};

pub type Ms = u64;

/// Named, configurable context budgets and loop bounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budgets {
    /// Characters of a trigger's text inlined in a prompt.
    pub trigger_chars: usize,
    /// Characters of a command's stdout (and of stderr) inlined.
    pub output_chars: usize,
    /// Characters of a worker's report inlined for the Router.
    pub report_chars: usize,
    /// Characters `recall`/`read` return at once.
    pub recall_chars: usize,
    /// Router conversation size (estimated tokens) before old turns drop.
    pub router_context_tokens: usize,
    /// Worker conversation size before old turns drop.
    pub worker_context_tokens: usize,
    /// Words in a reply on a chat channel.
    pub chat_reply_words: usize,
    /// Model calls one worker may make on one piece of work, from waking up
    /// until it is idle again (a looping worker stops; follow-ups over a
    /// long-lived thread each get the full allowance).
    pub max_worker_steps: u32,
    /// Model calls in one Router turn (tool results → model → …).
    pub max_router_steps: u32,
    /// Subagents one `run_js` program may spawn.
    pub max_subagents: usize,
    /// Subagents of one program running at once (more wait their turn).
    pub max_concurrent_subagents: usize,
    /// Subagents may spawn subagents down to this depth.
    pub max_depth: u32,
    /// Output tokens asked of the model per call.
    pub max_output_tokens: u32,
    /// Events one Router turn takes at most (the rest wait for the next).
    pub max_batch: usize,
    /// An idle worker (task done, listening on its threads) retires after
    /// this long without activity; its threads go back to the Router.
    pub idle_retire_ms: u64,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            trigger_chars: 1500,
            output_chars: 1500,
            report_chars: 3000,
            recall_chars: 6000,
            router_context_tokens: 24_000,
            worker_context_tokens: 48_000,
            chat_reply_words: 100,
            max_worker_steps: 64,
            max_router_steps: 6,
            max_subagents: 8,
            max_concurrent_subagents: 4,
            max_depth: 2,
            max_output_tokens: 2048,
            max_batch: 100,
            idle_retire_ms: 24 * 3600 * 1000,
        }
    }
}

/// Sources whose threads are chat: short replies.
pub const CHAT_SOURCES: &[&str] = &["chat", "slack", "discord", "teams", "matrix", "irc"];
/// Events a worker may hold before its next turn; past it the oldest go
/// (the triggers themselves stay in the store).
pub const MAX_QUEUED_EVENTS: usize = 1000;
/// Items waiting for the Router. Reaching it means the model is far behind;
/// the oldest are dropped, counted in `Stats::dropped` and logged.
pub const MAX_ROUTER_QUEUE: usize = 100_000;
/// Triggers handled by workers the Router keeps for its global picture.
pub const MAX_OBSERVED: usize = 50;
/// Tool calls acted on from one model reply; more are answered with an error.
pub const MAX_TOOL_CALLS_PER_REPLY: usize = 32;
/// Workers (subagents included) running or waiting, across all tasks.
pub const MAX_ACTIVE_WORKERS: usize = 512;
/// Commands one worker may have running at once.
pub const MAX_RUNNING_COMMANDS: usize = 16;
/// Characters of one reply; a longer one is cut with a pointer.
pub const MAX_REPLY_CHARS: usize = 16 * 1024;
/// Router model failures in a row before people waiting are told.
pub const ROUTER_FAILURES_BEFORE_NOTICE: u32 = 3;
/// Model failures in a row before a worker gives up.
pub const MAX_MODEL_FAILURES: u32 = 5;
/// Longest backoff between model retries after `complete` gave up.
pub const MAX_RETRY_BACKOFF_MS: Ms = 5 * 60 * 1000;
/// Finished (closed) workers kept in memory; older ones live only in the store.
pub const JS_CAPABILITIES: [&str; 3] = ["tools.exec", "agents.spawn", "human.ask"];

/// What the core needs from outside, all of it deterministic in simulation.
pub trait World {
    fn now(&self) -> Ms;
    fn new_id(&mut self, kind: Kind) -> String;
    /// The Router's natural-language policies.
    fn policies(&self) -> Vec<String>;
    /// One line per machine (name, state, labels), for the Router.
    fn machines(&self) -> Vec<String>;
    /// The full text of a stored object (trigger, thread, command with its
    /// output, snapshot), for recall/read.
    fn lookup(&self, id: &str) -> Option<String>;
    /// The channel a thread is on (`chat`, `github`, …), if it exists.
    fn thread_source(&self, thread: &str) -> Option<String>;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerInfo {
    pub id: String,
    pub thread: String,
    pub source: String,
    pub user: String,
    pub text: String,
    pub mention: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandResult {
    /// Final state name (exited, failed, cancelled, timed_out, lost).
    pub state: String,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsCallReq {
    pub id: u32,
    pub capability: String,
    pub args: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JsOutcome {
    Done {
        result: Value,
        logs: Vec<String>,
    },
    Paused {
        snapshot: String,
        pending: Vec<JsCallReq>,
    },
    Error {
        kind: String,
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SessionKind {
    Router,
    Worker,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// A trigger that passed the fast path.
    Trigger(TriggerInfo),
    /// A model call finished (`session` is "router" or a worker ID).
    ModelDone {
        session: String,
        turn: u64,
        result: Result<Response, String>,
    },
    CommandDone {
        worker: String,
        cmd: String,
        result: CommandResult,
    },
    JsDone {
        worker: String,
        run: u64,
        outcome: JsOutcome,
    },
    /// An approval answered from the CLI.
    Answer {
        approval: String,
        approved: bool,
        answer: Value,
        by: String,
    },
    /// `byom tasks cancel`.
    Cancel { worker: String, by: String },
    /// Time passes: retries and the watchdog.
    Tick,
}

impl Event {
    /// One short line for logs: what happened to whom, no payloads.
    pub fn summary(&self) -> String {
        match self {
            Event::Trigger(t) => format!("trigger {} on {}", t.id, t.thread),
            Event::ModelDone {
                session,
                turn,
                result,
            } => format!(
                "model done {session} turn {turn}: {}",
                if result.is_ok() { "ok" } else { "error" }
            ),
            Event::CommandDone {
                worker,
                cmd,
                result,
            } => format!("command done {cmd} of {worker}: {}", result.state),
            Event::JsDone {
                worker,
                run,
                outcome,
            } => format!(
                "program step done {worker} run {run}: {}",
                match outcome {
                    JsOutcome::Done { .. } => "done".to_string(),
                    JsOutcome::Paused { pending, .. } =>
                        format!("paused on {} calls", pending.len()),
                    JsOutcome::Error { kind, .. } => format!("error {kind}"),
                }
            ),
            Event::Answer { approval, .. } => format!("answer {approval}"),
            Event::Cancel { worker, .. } => format!("cancel {worker}"),
            Event::Tick => "tick".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The reply's trigger ID (`trg_…`, from the agent).
    pub id: String,
    pub thread: String,
    pub source: String,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Effect {
    CallModel {
        session: String,
        kind: SessionKind,
        turn: u64,
        request: Request,
    },
    /// Create (if it does not exist yet) and watch command `cmd`.
    StartCommand {
        worker: String,
        cmd: String,
        machine: String,
        labels: BTreeMap<String, String>,
        command: String,
        timeout_ms: u64,
    },
    StopCommand {
        cmd: String,
        reason: String,
    },
    RunJs {
        worker: String,
        run: u64,
        code: String,
        clock_ms: Ms,
    },
    ResumeJs {
        worker: String,
        run: u64,
        snapshot: String,
        call: u32,
        result: Result<Value, String>,
    },
    DropSnapshot {
        snapshot: String,
    },
    /// Posted atomically with the state that produced it.
    Reply(Reply),
}

impl Effect {
    /// One short line for logs, no payloads.
    pub fn summary(&self) -> String {
        match self {
            Effect::CallModel { session, turn, .. } => format!("call model {session} turn {turn}"),
            Effect::StartCommand {
                worker,
                cmd,
                machine,
                ..
            } => format!("start command {cmd} of {worker} on {machine:?}"),
            Effect::StopCommand { cmd, .. } => format!("stop command {cmd}"),
            Effect::RunJs { worker, run, .. } => format!("run program {worker} run {run}"),
            Effect::ResumeJs {
                worker, run, call, ..
            } => format!("resume program {worker} run {run} call {call}"),
            Effect::DropSnapshot { snapshot } => format!("drop {snapshot}"),
            Effect::Reply(r) => format!("reply {} on {}", r.id, r.thread),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RouterItem {
    Trigger(TriggerInfo),
    Report {
        worker: String,
        threads: Vec<String>,
        status: String,
        text: String,
    },
    Question {
        approval: String,
        worker: String,
        thread: String,
        question: String,
    },
    Bounced {
        worker: String,
        trigger: TriggerInfo,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub turns: u64,
    pub model_calls: u64,
    pub events: u64,
    pub decisions: u64,
    pub passed_through: u64,
    pub replies: u64,
    /// Router items dropped because its queue was full.
    #[serde(default)]
    pub dropped: u64,
    pub usage: Usage,
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
    fn insert(&mut self, i: usize, m: Message) {
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
    fn drain(&mut self, range: std::ops::Range<usize>) {
        self.removed.extend(self.seqs.drain(range.clone()));
        self.messages.drain(range);
    }
    /// Writes since the last call: new messages, deleted ones.
    fn take_writes(&mut self, session: &str, out: &mut Vec<(String, Option<Vec<u8>>)>) {
        for n in std::mem::take(&mut self.added) {
            if let Some(i) = self.seqs.iter().rposition(|x| *x == n) {
                if let Ok(b) = serde_json::to_vec(&self.messages[i]) {
                    out.push((message_key(session, n), Some(b)));
                }
            }
        }
        for n in std::mem::take(&mut self.removed) {
            out.push((message_key(session, n), None));
        }
    }
    /// Rebuilds the messages from their stored numbers (after a load).
    fn restore(&mut self, stored: &BTreeMap<u64, Message>) {
        self.seqs.retain(|n| stored.contains_key(n));
        self.messages = self
            .seqs
            .iter()
            .filter_map(|n| stored.get(n).cloned())
            .collect();
    }
}

/// Key (in the agents keyspace) of message `n` of `session`.
pub fn message_key(session: &str, n: u64) -> String {
    format!("m/{session}/{n:012}")
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
    fn push_back(&mut self, it: RouterItem) {
        let n = self.back;
        self.back += 1;
        self.items.push_back((n, it));
        self.added.push(n);
        self.len = self.items.len();
    }
    fn push_front(&mut self, it: RouterItem) {
        let n = self.front;
        self.front -= 1;
        self.items.push_front((n, it));
        self.added.push(n);
        self.len = self.items.len();
    }
    fn pop_front(&mut self) -> Option<RouterItem> {
        let (n, it) = self.items.pop_front()?;
        self.removed.push(n);
        self.len = self.items.len();
        Some(it)
    }
    fn take_front(&mut self, n: usize) -> Vec<RouterItem> {
        let n = n.min(self.items.len());
        let out = (0..n).filter_map(|_| self.pop_front()).collect();
        self.len = self.items.len();
        out
    }
    fn take_writes(&mut self, out: &mut Vec<(String, Option<Vec<u8>>)>) {
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
                    out.push((queue_key(n), Some(b)));
                }
            }
        }
        for n in removed {
            out.push((queue_key(n), None));
        }
    }
    fn restore(&mut self, stored: Vec<(u64, RouterItem)>) {
        self.items = stored.into_iter().collect();
        self.len = self.items.len();
    }
}

/// Key (in the agents keyspace) of item `n` of the Router's queue.
pub fn queue_key(n: u64) -> String {
    format!("q/router/{n:020}")
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RouterState {
    pub conversation: Conversation,
    pub queue: RouterQueue,
    /// Turn number of the model call in flight.
    pub in_flight: Option<u64>,
    pub turn: u64,
    /// Model calls made in the current turn.
    pub steps: u32,
    pub failures: u32,
    pub retry_at: Option<Ms>,
    /// Items of the turn in flight, put back if the model fails.
    pub turn_items: Vec<RouterItem>,
    /// thread → subscribed workers.
    pub subs: BTreeMap<String, BTreeSet<String>>,
    /// Triggers workers handled, for the Router's global picture.
    pub observed: VecDeque<String>,
    pub policies_shown: Vec<String>,
    pub machines_shown: Vec<String>,
    pub dropped_turns: u64,
    pub stats: Stats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    /// A model call, command or program is in flight.
    Running,
    /// Waiting for a person (an approval).
    Waiting,
    /// Reported done; still listening on its threads.
    Idle,
    Done,
    Failed,
    Cancelled,
}

impl WorkerStatus {
    pub fn name(self) -> &'static str {
        match self {
            WorkerStatus::Running => "running",
            WorkerStatus::Waiting => "waiting",
            WorkerStatus::Idle => "idle",
            WorkerStatus::Done => "done",
            WorkerStatus::Failed => "failed",
            WorkerStatus::Cancelled => "cancelled",
        }
    }
    pub fn is_closed(self) -> bool {
        matches!(
            self,
            WorkerStatus::Done | WorkerStatus::Failed | WorkerStatus::Cancelled
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CmdRef {
    pub command: String,
    pub machine: String,
    #[serde(default)]
    pub timeout_ms: u64,
    /// Set when a `tools.exec` call in a program started it.
    pub js_call: Option<(u64, u32)>,
    pub done: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JsCallState {
    Command(String),
    Subagent(String),
    /// Waiting for a subagent slot.
    SpawnQueued {
        task: String,
        machine: String,
    },
    Approval(String),
    Settled,
}

/// What the interpreter is doing for a program. An explicit enum, not
/// `Option<Option<…>>`: JSON cannot tell `Some(None)` from `None`, and a
/// reloaded program must know it was mid-eval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JsStep {
    /// Waiting for results (or for nothing: about to end).
    Idle,
    /// The first eval of the code.
    Eval,
    /// Resuming from the snapshot with this call's result.
    Resume {
        call: u32,
        result: Result<Value, String>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsRun {
    pub run: u64,
    pub code: String,
    pub started_ms: Ms,
    /// The latest snapshot (None before the first pause).
    pub snapshot: Option<String>,
    /// The interpreter step in flight, if any.
    pub step: JsStep,
    /// Results waiting for the interpreter to be free.
    pub ready: VecDeque<(u32, Result<Value, String>)>,
    pub calls: BTreeMap<u32, JsCallState>,
    pub spawned: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerState {
    pub id: String,
    pub parent: Option<String>,
    pub depth: u32,
    pub task: String,
    pub threads: Vec<String>,
    pub machine: String,
    pub labels: BTreeMap<String, String>,
    pub status: WorkerStatus,
    pub conversation: Conversation,
    /// Event lines that arrived since the last model call.
    pub inbox: Vec<String>,
    pub in_flight: Option<u64>,
    pub turn: u64,
    /// Model calls since it last woke from idle (see `max_worker_steps`).
    pub steps: u32,
    pub failures: u32,
    pub retry_at: Option<Ms>,
    /// handle (command ID) → command.
    pub commands: BTreeMap<String, CmdRef>,
    pub js: Option<JsRun>,
    pub js_runs: u64,
    pub last_report: String,
    pub created_ms: Ms,
    pub updated_ms: Ms,
    pub usage: Usage,
    pub dropped_turns: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub worker: String,
    pub thread: String,
    pub question: String,
    pub run: u64,
    pub call: u32,
    /// open, approved, denied, cancelled
    pub state: String,
    pub answer: Value,
    pub by: String,
    pub created_ms: Ms,
    pub answered_ms: Ms,
}

/// The whole agent state.
#[derive(Debug, Default)]
pub struct Core {
    pub budgets: Budgets,
    pub router: RouterState,
    pub workers: BTreeMap<String, WorkerState>,
    pub approvals: BTreeMap<String, Approval>,
    /// Triggers on subscribed threads go straight to their workers (off:
    /// the Router decides every trigger; for comparisons).
    pub pass_through: bool,
    dirty: BTreeSet<String>,
}

/// Key of the Router's record.
pub const ROUTER: &str = "router";

impl Core {
    pub fn new(budgets: Budgets) -> Core {
        Core {
            budgets,
            pass_through: true,
            ..Default::default()
        }
    }

    /// Records that changed since the last call (`router`, `wrk_…`, `apr_…`).
    pub fn take_dirty(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.dirty)
    }

    /// One record as JSON, for the store.
    pub fn record(&self, key: &str) -> Option<Value> {
        if key == ROUTER {
            return serde_json::to_value(&self.router).ok();
        }
        if let Some(w) = self.workers.get(key) {
            return serde_json::to_value(w).ok();
        }
        self.approvals
            .get(key)
            .and_then(|a| serde_json::to_value(a).ok())
    }

    /// One record as JSON bytes, straight from the state (no intermediate
    /// tree): what the driver writes after every step.
    pub fn record_bytes(&self, key: &str) -> Option<Vec<u8>> {
        if key == ROUTER {
            return serde_json::to_vec(&self.router).ok();
        }
        if let Some(w) = self.workers.get(key) {
            return serde_json::to_vec(w).ok();
        }
        self.approvals
            .get(key)
            .and_then(|a| serde_json::to_vec(a).ok())
    }

    /// Everything to write after a step: changed records (`r/KEY`) and
    /// conversation messages (`m/SESSION/N`); `None` deletes.
    pub fn take_writes(&mut self) -> Vec<(String, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        self.router.conversation.take_writes(ROUTER, &mut out);
        self.router.queue.take_writes(&mut out);
        for (k, w) in self.workers.iter_mut() {
            w.conversation.take_writes(k, &mut out);
        }
        for key in self.take_dirty() {
            if let Some(b) = self.record_bytes(&key) {
                out.push((format!("r/{key}"), Some(b)));
            }
        }
        out
    }

    /// Rebuilds the state from what [`Core::take_writes`] wrote: the `r/`
    /// records (keys without the prefix) and, per session, its stored
    /// messages. With `evict`, ended workers are not kept in memory (and
    /// their messages not read). Returns the core and what was unreadable.
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
            let r = serde_json::from_slice::<Value>(&v).and_then(|v| core.load(&k, v));
            if let Err(e) = r {
                errors.push(format!("record {k}: {e}"));
            }
        }
        if evict {
            core.evict_closed();
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
        core.router.queue.restore(items);
        let mut router_conv = std::mem::take(&mut core.router.conversation);
        restore(ROUTER, &mut router_conv, &mut errors);
        core.router.conversation = router_conv;
        for (k, w) in core.workers.iter_mut() {
            restore(k, &mut w.conversation, &mut errors);
        }
        core.take_dirty();
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
                .filter_map(|(k, v)| Some((k[prefix.len()..].parse().ok()?, v.clone())))
                .collect()
        };
        let records = image
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("r/")?.to_string(), v.clone())))
            .collect();
        Core::rebuild(
            budgets,
            records,
            |session| numbered(&format!("m/{session}/")),
            numbered("q/router/"),
            evict,
        )
    }

    /// Loads a record written by [`Core::record`].
    pub fn load(&mut self, key: &str, v: Value) -> Result<(), serde_json::Error> {
        if key == ROUTER {
            self.router = serde_json::from_value(v)?;
        } else if key.starts_with(Kind::Worker.prefix()) {
            let w: WorkerState = serde_json::from_value(v)?;
            self.workers.insert(key.to_string(), w);
        } else if key.starts_with(Kind::Approval.prefix()) {
            let a: Approval = serde_json::from_value(v)?;
            self.approvals.insert(key.to_string(), a);
        }
        Ok(())
    }

    /// After a restart: everything that was in flight, to start again.
    /// Commands are created only if missing, so none runs twice.
    pub fn resume_effects(&mut self) -> Vec<Effect> {
        let mut fx = Vec::new();
        if let Some(turn) = self.router.in_flight {
            fx.push(self.router_call(turn));
        }
        let ids: Vec<String> = self.workers.keys().cloned().collect();
        for id in ids {
            let w = &self.workers[&id];
            if w.status.is_closed() {
                continue;
            }
            if let Some(turn) = w.in_flight {
                fx.push(self.worker_call(&id, turn));
            }
            for (cmd, c) in &w.commands {
                if !c.done {
                    fx.push(Effect::StartCommand {
                        worker: id.clone(),
                        cmd: cmd.clone(),
                        machine: c.machine.clone(),
                        labels: w.labels.clone(),
                        command: c.command.clone(),
                        timeout_ms: c.timeout_ms,
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

    /// Applies one event.
    pub fn handle(&mut self, world: &mut dyn World, ev: Event) -> Vec<Effect> {
        let mut fx = Vec::new();
        match ev {
            Event::Trigger(t) => self.on_trigger(world, t),
            Event::ModelDone {
                session,
                turn,
                result,
            } => {
                if session == ROUTER {
                    self.router_model_done(world, turn, result, &mut fx);
                } else {
                    self.worker_model_done(world, &session, turn, result, &mut fx);
                }
            }
            Event::CommandDone {
                worker,
                cmd,
                result,
            } => self.command_done(world, &worker, &cmd, result, &mut fx),
            Event::JsDone {
                worker,
                run,
                outcome,
            } => self.js_done(world, &worker, run, outcome, &mut fx),
            Event::Answer {
                approval,
                approved,
                answer,
                by,
            } => {
                if let Err(e) = self.answer(world, &approval, approved, answer, &by, &mut fx) {
                    tracing::info!("answer for {approval} not applied: {e}");
                }
            }
            Event::Cancel { worker, by } => {
                self.cancel_worker(world, &worker, &format!("cancelled by {by}"), true, &mut fx)
            }
            Event::Tick => self.tick(world, &mut fx),
        }
        self.pump(world, &mut fx);
        fx
    }

    // ── triggers and pass-through ──

    fn on_trigger(&mut self, world: &mut dyn World, t: TriggerInfo) {
        self.router.stats.events += 1;
        self.dirty.insert(ROUTER.into());
        let open_approval = self
            .approvals
            .values()
            .any(|a| a.thread == t.thread && a.state == "open");
        let subs: Vec<String> = self
            .router
            .subs
            .get(&t.thread)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        // An open approval's answer is the Router's to take; otherwise a
        // subscribed thread goes straight to its workers.
        if subs.is_empty() || open_approval || !self.pass_through {
            push_bounded(&mut self.router, RouterItem::Trigger(t));
            return;
        }
        self.router.stats.passed_through += 1;
        let line = format!(
            "<event trigger={} thread={} source={} user={}{}>{}</event>",
            t.id,
            t.thread,
            t.source,
            escape(&t.user),
            if t.mention { " mention" } else { "" },
            escape(&spill(&t.text, self.budgets.trigger_chars, &t.id))
        );
        for w in &subs {
            self.worker_input(world, w, line.clone());
        }
        self.router.observed.push_back(format!(
            "{} on {} from {} went to {}: {}",
            t.id,
            t.thread,
            escape(&t.user),
            subs.join(", "),
            escape(&spill(&t.text, 200, &t.id))
        ));
        while self.router.observed.len() > MAX_OBSERVED {
            self.router.observed.pop_front();
        }
    }

    fn worker_input(&mut self, world: &mut dyn World, worker: &str, line: String) {
        let now = world.now();
        if let Some(w) = self.workers.get_mut(worker) {
            if w.status.is_closed() {
                return;
            }
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
            self.dirty.insert(worker.to_string());
        }
    }

    /// Starts every turn that can start: the Router's if it has queued
    /// items and no call in flight; each worker's likewise.
    fn pump(&mut self, world: &mut dyn World, fx: &mut Vec<Effect>) {
        let now = world.now();
        let ready: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| {
                !w.status.is_closed()
                    && w.in_flight.is_none()
                    && !w.inbox.is_empty()
                    && w.retry_at.is_none_or(|t| now >= t)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for id in ready {
            self.start_worker_turn(world, &id, fx);
        }
        // Workers first: one that stops here reports to the Router, whose
        // turn must then start now, not at the next event.
        if self.router.in_flight.is_none()
            && !self.router.queue.is_empty()
            && self.router.retry_at.is_none_or(|t| now >= t)
        {
            self.router.retry_at = None;
            self.start_router_turn(world, fx);
        }
    }

    // ── the Router ──

    fn start_router_turn(&mut self, world: &mut dyn World, fx: &mut Vec<Effect>) {
        let n = self.router.queue.len().min(self.budgets.max_batch.max(1));
        let items: Vec<RouterItem> = self.router.queue.take_front(n);
        let mut text = String::new();
        let policies = world.policies();
        if policies != self.router.policies_shown {
            text.push_str("Policies now in force:\n");
            if policies.is_empty() {
                text.push_str("(none)\n");
            }
            for p in &policies {
                text.push_str(&format!("- {}\n", escape(p)));
            }
            self.router.policies_shown = policies;
        }
        let machines = world.machines();
        if machines != self.router.machines_shown {
            text.push_str("Machines:\n");
            for m in &machines {
                text.push_str(&format!("- {m}\n"));
            }
            self.router.machines_shown = machines;
        }
        if !self.router.observed.is_empty() {
            text.push_str("Seen on subscribed threads (handled by workers):\n");
            for o in self.router.observed.drain(..) {
                text.push_str(&format!("- {o}\n"));
            }
        }
        let open: Vec<&Approval> = self
            .approvals
            .values()
            .filter(|a| a.state == "open")
            .collect();
        if !open.is_empty() {
            text.push_str("Open approvals:\n");
            for a in open {
                text.push_str(&format!(
                    "<approval id={} thread={} worker={}>{}</approval>\n",
                    a.id,
                    a.thread,
                    a.worker,
                    escape(&a.question)
                ));
            }
        }
        let mut subs_line = String::new();
        for t in items.iter().filter_map(item_thread) {
            if let Some(s) = self.router.subs.get(&t) {
                if !s.is_empty() && !subs_line.contains(&t) {
                    subs_line.push_str(&format!(
                        "<subs thread={t}>{}</subs>\n",
                        s.iter().cloned().collect::<Vec<_>>().join(" ")
                    ));
                }
            }
        }
        text.push_str(&subs_line);
        text.push_str(&format!("New events ({}):\n", items.len()));
        for it in &items {
            text.push_str(&self.router_line(it));
            text.push('\n');
        }
        self.router.conversation.push(Message::user(text));
        self.router.turn_items = items;
        self.router.turn += 1;
        self.router.steps = 0;
        self.router.stats.turns += 1;
        self.compact_router();
        self.issue_router_call(fx);
    }

    fn router_line(&self, it: &RouterItem) -> String {
        let b = &self.budgets;
        match it {
            RouterItem::Trigger(t) => format!(
                "<event trigger={} thread={} source={} user={}{}>{}</event>",
                t.id,
                t.thread,
                t.source,
                escape(&t.user),
                if t.mention { " mention" } else { "" },
                escape(&spill(&t.text, b.trigger_chars, &t.id))
            ),
            RouterItem::Report {
                worker,
                threads,
                status,
                text,
            } => format!(
                "<event report worker={worker} thread={} status={status}>{}</event>",
                threads.first().map(String::as_str).unwrap_or("-"),
                escape(&spill(text, b.report_chars, worker))
            ),
            RouterItem::Question {
                approval,
                worker,
                thread,
                question,
            } => format!(
                "<event question approval={approval} worker={worker} thread={thread}>{}</event>",
                escape(&spill(question, b.report_chars, approval))
            ),
            RouterItem::Bounced { worker, trigger: t } => format!(
                "<event bounced worker={worker} trigger={} thread={} source={} user={}{}>{}</event>",
                t.id,
                t.thread,
                t.source,
                escape(&t.user),
                if t.mention { " mention" } else { "" },
                escape(&spill(&t.text, b.trigger_chars, &t.id))
            ),
        }
    }

    fn compact_router(&mut self) {
        let budget = self.budgets.router_context_tokens;
        if let Some(n) = compact(&mut self.router.conversation, budget) {
            self.router.dropped_turns += n;
        }
    }

    fn router_call(&self, turn: u64) -> Effect {
        Effect::CallModel {
            session: ROUTER.into(),
            kind: SessionKind::Router,
            turn,
            request: Request {
                system: prompt::ROUTER_SYSTEM.into(),
                messages: self.router.conversation.messages().to_vec(),
                tools: prompt::router_tools(),
                max_tokens: self.budgets.max_output_tokens,
            },
        }
    }

    fn issue_router_call(&mut self, fx: &mut Vec<Effect>) {
        let turn = self.router.turn * 1000 + u64::from(self.router.steps);
        self.router.steps += 1;
        self.router.stats.model_calls += 1;
        self.router.in_flight = Some(turn);
        self.dirty.insert(ROUTER.into());
        fx.push(self.router_call(turn));
    }

    fn router_model_done(
        &mut self,
        world: &mut dyn World,
        turn: u64,
        result: Result<Response, String>,
        fx: &mut Vec<Effect>,
    ) {
        if self.router.in_flight != Some(turn) {
            return;
        }
        self.router.in_flight = None;
        self.dirty.insert(ROUTER.into());
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                // Never drop triggers: put the turn back and try later.
                tracing::warn!("router model call failed: {e}");
                self.router.failures += 1;
                if self.router.steps <= 1 {
                    if let Some(m) = self.router.conversation.last() {
                        if m.role == Role::User {
                            self.router.conversation.pop();
                        }
                    }
                    for it in self.router.turn_items.drain(..).rev() {
                        self.router.queue.push_front(it);
                    }
                }
                self.router.retry_at = Some(world.now() + backoff(self.router.failures));
                if self.router.failures == ROUTER_FAILURES_BEFORE_NOTICE {
                    self.model_down_notice(world, &e, fx);
                }
                return;
            }
        };
        self.router.failures = 0;
        self.router.stats.usage += resp.usage;
        self.router.conversation.push(Message::assistant(
            resp.text.clone(),
            resp.tool_calls.clone(),
        ));
        if resp.tool_calls.is_empty() {
            self.router.turn_items.clear();
            return;
        }
        for (i, call) in resp.tool_calls.iter().enumerate() {
            self.router.stats.decisions += 1;
            let r = if i < MAX_TOOL_CALLS_PER_REPLY {
                self.router_tool(world, call, fx)
            } else {
                Err(format!(
                    "at most {MAX_TOOL_CALLS_PER_REPLY} tool calls per reply are acted on"
                ))
            };
            let out = match r {
                Ok(s) => s,
                Err(e) => format!("error: {e}"),
            };
            self.router
                .conversation
                .push(Message::tool_result(call.id.clone(), out));
        }
        if self.router.steps < self.budgets.max_router_steps {
            self.issue_router_call(fx);
        } else {
            self.router.turn_items.clear();
        }
    }

    /// The watchdog's voice when the Router's model is down: everyone who
    /// addressed the agent hears that their message is queued, once per
    /// outage.
    fn model_down_notice(&mut self, world: &mut dyn World, err: &str, fx: &mut Vec<Effect>) {
        let mut threads: Vec<String> = self
            .router
            .queue
            .iter()
            .filter_map(|it| match it {
                RouterItem::Trigger(t) if t.mention => Some(t.thread.clone()),
                _ => None,
            })
            .collect();
        threads.sort();
        threads.dedup();
        let why: String = err.chars().take(120).collect();
        for t in threads {
            let text = format!(
                "I can't reach my model right now ({why}). Your message is queued; I'll answer when it's back."
            );
            if let Ok(r) = self.reply(world, &t, &text, "delayed") {
                fx.push(Effect::Reply(r));
            }
        }
    }

    fn router_tool(
        &mut self,
        world: &mut dyn World,
        call: &ToolCall,
        fx: &mut Vec<Effect>,
    ) -> Result<String, String> {
        let a = &call.arguments;
        match call.name.as_str() {
            "create_worker" => {
                let task = str_arg(a, "task")?;
                let threads: Vec<String> = a
                    .get("threads")
                    .and_then(Value::as_array)
                    .map(|v| {
                        v.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                let machine = opt_str(a, "machine").unwrap_or_default();
                let labels: BTreeMap<String, String> = a
                    .get("labels")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                            .collect()
                    })
                    .unwrap_or_default();
                let subscribe = a.get("subscribe").and_then(Value::as_bool).unwrap_or(true);
                self.room_for_worker()?;
                let id = self.new_worker(world, None, task, threads.clone(), machine, labels);
                if subscribe {
                    for t in &threads {
                        self.subscribe(t, &id);
                    }
                }
                Ok(format!("created {id}"))
            }
            "reply" => {
                let thread = str_arg(a, "thread")?;
                let text = str_arg(a, "text")?;
                let status = a.get("status").and_then(Value::as_str).unwrap_or("");
                let r = self.reply(world, &thread, &text, status)?;
                fx.push(Effect::Reply(r.clone()));
                Ok(format!("posted {}", r.id))
            }
            "subscribe" => {
                let w = str_arg(a, "worker")?;
                let t = str_arg(a, "thread")?;
                self.live_worker(&w)?;
                self.subscribe(&t, &w);
                Ok(format!("{w} now receives {t}"))
            }
            "unsubscribe" => {
                let w = str_arg(a, "worker")?;
                let t = str_arg(a, "thread")?;
                self.unsubscribe(&t, &w);
                Ok(format!("{w} no longer receives {t}"))
            }
            "cancel_worker" => {
                let w = str_arg(a, "worker")?;
                self.live_worker(&w)?;
                let reason =
                    opt_str(a, "reason").unwrap_or_else(|| "cancelled by the router".into());
                // The Router decided this itself: no report back to it.
                // The Router decided this itself: no report back to it.
                self.cancel_worker(world, &w, &reason, false, fx);
                Ok(format!("cancelled {w}"))
            }
            "answer" => {
                let apr = str_arg(a, "approval")?;
                let approved = a
                    .get("approved")
                    .and_then(Value::as_bool)
                    .ok_or("approved must be true or false")?;
                let answer = a.get("answer").cloned().unwrap_or(Value::Null);
                self.answer(world, &apr, approved, answer, "router", fx)?;
                Ok(format!(
                    "{apr} {}",
                    if approved { "approved" } else { "denied" }
                ))
            }
            "ignore" => Ok("ignored".into()),
            "recall" => self.recall(world, &str_arg(a, "id")?, 0),
            "read" => {
                let off = a.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
                self.recall(world, &str_arg(a, "id")?, off)
            }
            other => Err(format!(
                "the router has no tool {other:?}; it cannot run commands or code, only hand out work"
            )),
        }
    }

    /// Idle workers (done, listening) do not count: they cost no model
    /// calls and retire on their own.
    fn room_for_worker(&self) -> Result<(), String> {
        let active = self
            .workers
            .values()
            .filter(|w| matches!(w.status, WorkerStatus::Running | WorkerStatus::Waiting))
            .count();
        if active >= MAX_ACTIVE_WORKERS {
            return Err(format!(
                "{active} workers are busy (limit {MAX_ACTIVE_WORKERS}); wait or cancel some"
            ));
        }
        Ok(())
    }

    fn live_worker(&self, w: &str) -> Result<(), String> {
        match self.workers.get(w) {
            Some(x) if !x.status.is_closed() => Ok(()),
            Some(x) => Err(format!("{w} is {}", x.status.name())),
            None => Err(format!("no worker {w}")),
        }
    }

    fn subscribe(&mut self, thread: &str, worker: &str) {
        self.router
            .subs
            .entry(thread.to_string())
            .or_default()
            .insert(worker.to_string());
        if let Some(w) = self.workers.get_mut(worker) {
            if !w.threads.iter().any(|t| t == thread) {
                w.threads.push(thread.to_string());
                self.dirty.insert(worker.to_string());
            }
        }
        self.dirty.insert(ROUTER.into());
    }

    fn unsubscribe(&mut self, thread: &str, worker: &str) {
        if let Some(s) = self.router.subs.get_mut(thread) {
            s.remove(worker);
            if s.is_empty() {
                self.router.subs.remove(thread);
            }
        }
        self.dirty.insert(ROUTER.into());
    }

    /// A reply, shaped by its channel's norms: chat gets at most
    /// `chat_reply_words` words (enforced here, not asked for); other
    /// channels get a structured message.
    fn reply(
        &mut self,
        world: &mut dyn World,
        thread: &str,
        text: &str,
        status: &str,
    ) -> Result<Reply, String> {
        let source = world
            .thread_source(thread)
            .ok_or_else(|| format!("no thread {thread}; reply on a thread from an event"))?;
        let text = spill(text, MAX_REPLY_CHARS, thread);
        let text = text.as_str();
        let text = if CHAT_SOURCES.contains(&source.as_str()) {
            prompt::limit_words(
                text,
                self.budgets.chat_reply_words,
                &format!("byom threads show {thread}"),
            )
        } else {
            let status = if status.is_empty() { "update" } else { status };
            let workers: Vec<String> = self
                .router
                .subs
                .get(thread)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            format!(
                "**byom — {status}**\n\n{}\n\n— thread {thread}{}",
                text.trim(),
                if workers.is_empty() {
                    String::new()
                } else {
                    format!(", workers {}", workers.join(", "))
                }
            )
        };
        self.router.stats.replies += 1;
        Ok(Reply {
            id: world.new_id(Kind::Trigger),
            thread: thread.to_string(),
            source,
            text,
        })
    }

    // ── workers ──

    fn new_worker(
        &mut self,
        world: &mut dyn World,
        parent: Option<String>,
        task: String,
        threads: Vec<String>,
        machine: String,
        labels: BTreeMap<String, String>,
    ) -> String {
        let id = world.new_id(Kind::Worker);
        let now = world.now();
        let depth = parent
            .as_ref()
            .and_then(|p| self.workers.get(p))
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
        let w = WorkerState {
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
        };
        self.workers.insert(id.clone(), w);
        self.dirty.insert(id.clone());
        id
    }

    fn worker_call(&self, id: &str, turn: u64) -> Effect {
        let w = &self.workers[id];
        Effect::CallModel {
            session: id.to_string(),
            kind: SessionKind::Worker,
            turn,
            request: Request {
                system: prompt::WORKER_SYSTEM.into(),
                messages: w.conversation.messages().to_vec(),
                tools: prompt::worker_tools(),
                max_tokens: self.budgets.max_output_tokens,
            },
        }
    }

    fn start_worker_turn(&mut self, world: &mut dyn World, id: &str, fx: &mut Vec<Effect>) {
        let budget = self.budgets.worker_context_tokens;
        let max_steps = self.budgets.max_worker_steps;
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        if w.steps >= max_steps {
            let msg = format!(
                "stopped after {} model calls (max_worker_steps): it looks stuck or looping",
                w.steps
            );
            self.finish_worker(world, id, WorkerStatus::Failed, &msg, true, fx);
            return;
        }
        let text = w.inbox.drain(..).collect::<Vec<_>>().join("\n");
        w.conversation.push(Message::user(text));
        if let Some(n) = compact(&mut w.conversation, budget) {
            w.dropped_turns += n;
        }
        self.issue_worker_call(id, fx);
    }

    fn issue_worker_call(&mut self, id: &str, fx: &mut Vec<Effect>) {
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        w.turn += 1;
        w.steps += 1;
        w.in_flight = Some(w.turn);
        if w.status == WorkerStatus::Idle {
            w.status = WorkerStatus::Running;
        }
        let turn = w.turn;
        self.dirty.insert(id.to_string());
        fx.push(self.worker_call(id, turn));
    }

    fn worker_model_done(
        &mut self,
        world: &mut dyn World,
        id: &str,
        turn: u64,
        result: Result<Response, String>,
        fx: &mut Vec<Effect>,
    ) {
        let now = world.now();
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        if w.in_flight != Some(turn) || w.status.is_closed() {
            return;
        }
        w.in_flight = None;
        w.updated_ms = now;
        self.dirty.insert(id.to_string());
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                w.failures += 1;
                if w.failures >= MAX_MODEL_FAILURES {
                    let msg = format!("the model kept failing: {e}");
                    self.finish_worker(world, id, WorkerStatus::Failed, &msg, true, fx);
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
        let calls = resp.tool_calls.clone();
        if calls.is_empty() {
            self.settle_status(id);
            return;
        }
        for (i, call) in calls.iter().enumerate() {
            let r = if i < MAX_TOOL_CALLS_PER_REPLY {
                self.worker_tool(world, id, call, fx)
            } else {
                Err(format!(
                    "at most {MAX_TOOL_CALLS_PER_REPLY} tool calls per reply are acted on"
                ))
            };
            let out = match r {
                Ok(s) => s,
                Err(e) => format!("error: {e}"),
            };
            if let Some(w) = self.workers.get_mut(id) {
                w.conversation
                    .push(Message::tool_result(call.id.clone(), out));
            }
        }
        let closed = self
            .workers
            .get(id)
            .map(|w| w.status.is_closed())
            .unwrap_or(true);
        if !closed {
            // Tool results go back to the model at once, with anything that
            // arrived meanwhile.
            let budget = self.budgets.worker_context_tokens;
            let max_steps = self.budgets.max_worker_steps;
            if let Some(w) = self.workers.get_mut(id) {
                if !w.inbox.is_empty() {
                    let text = w.inbox.drain(..).collect::<Vec<_>>().join("\n");
                    w.conversation.push(Message::user(text));
                }
                if let Some(n) = compact(&mut w.conversation, budget) {
                    w.dropped_turns += n;
                }
                if w.steps >= max_steps {
                    let msg = format!(
                        "stopped after {} model calls (max_worker_steps): it looks stuck or looping",
                        w.steps
                    );
                    self.finish_worker(world, id, WorkerStatus::Failed, &msg, true, fx);
                    return;
                }
            }
            self.issue_worker_call(id, fx);
        }
    }

    /// Running while anything is in flight; waiting on a person; else idle.
    fn settle_status(&mut self, id: &str) {
        let waiting_human = self
            .approvals
            .values()
            .any(|a| a.worker == id && a.state == "open");
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        if w.status.is_closed() {
            return;
        }
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
        self.dirty.insert(id.to_string());
    }

    fn worker_tool(
        &mut self,
        world: &mut dyn World,
        id: &str,
        call: &ToolCall,
        fx: &mut Vec<Effect>,
    ) -> Result<String, String> {
        let a = &call.arguments;
        match call.name.as_str() {
            "shell_start" => {
                let command = str_arg(a, "command")?;
                let cmd = self.start_command(
                    world,
                    id,
                    opt_str(a, "machine"),
                    command,
                    timeout_ms(a),
                    None,
                    fx,
                )?;
                Ok(format!(
                    "started {cmd}; its result arrives as an event (shell_stop(\"{cmd}\") stops it)"
                ))
            }
            "shell_stop" => {
                let h = str_arg(a, "handle")?;
                let w = self.workers.get(id).ok_or("no such worker")?;
                match w.commands.get(&h) {
                    Some(c) if !c.done => {
                        fx.push(Effect::StopCommand {
                            cmd: h.clone(),
                            reason: format!("stopped by {id}"),
                        });
                        Ok(format!("stopping {h}; its end arrives as an event"))
                    }
                    Some(_) => Err(format!("{h} already finished")),
                    None => Err(format!("{h} is not one of your commands")),
                }
            }
            "run_js" => {
                let code = str_arg(a, "code")?;
                let now = world.now();
                let w = self.workers.get_mut(id).ok_or("no such worker")?;
                if w.js.is_some() {
                    return Err("a program is already running; wait for its result".into());
                }
                w.js_runs += 1;
                let run = w.js_runs;
                w.js = Some(JsRun {
                    run,
                    code: code.clone(),
                    started_ms: now,
                    snapshot: None,
                    step: JsStep::Eval,
                    ready: VecDeque::new(),
                    calls: BTreeMap::new(),
                    spawned: 0,
                });
                fx.push(Effect::RunJs {
                    worker: id.to_string(),
                    run,
                    code,
                    clock_ms: now,
                });
                Ok(format!(
                    "program {id}/js{run} started; its result arrives as an event"
                ))
            }
            "report" => {
                let status = str_arg(a, "status")?;
                let text = str_arg(a, "text")?;
                self.report(world, id, &status, &text, fx);
                Ok("reported".into())
            }
            "unsubscribe" => {
                let threads: Vec<String> = match a.get("thread").and_then(Value::as_str) {
                    Some(t) => vec![t.to_string()],
                    None => self
                        .workers
                        .get(id)
                        .map(|w| w.threads.clone())
                        .unwrap_or_default(),
                };
                for t in &threads {
                    self.unsubscribe(t, id);
                }
                Ok(format!("unsubscribed from {}", threads.join(", ")))
            }
            "bounce" => {
                let trg = str_arg(a, "trigger")?;
                let info = world
                    .lookup(&trg)
                    .ok_or_else(|| format!("no trigger {trg}"))?;
                let t = parse_trigger_lookup(&trg, &info)
                    .ok_or_else(|| format!("{trg} is not a trigger"))?;
                push_bounded(
                    &mut self.router,
                    RouterItem::Bounced {
                        worker: id.to_string(),
                        trigger: t,
                    },
                );
                self.dirty.insert(ROUTER.into());
                Ok(format!("{trg} handed back to the router"))
            }
            "recall" => self.recall(world, &str_arg(a, "id")?, 0),
            "read" => {
                let off = a.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
                self.recall(world, &str_arg(a, "id")?, off)
            }
            other => Err(format!("no tool {other:?}")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_command(
        &mut self,
        world: &mut dyn World,
        id: &str,
        machine: Option<String>,
        command: String,
        timeout_ms: u64,
        js_call: Option<(u64, u32)>,
        fx: &mut Vec<Effect>,
    ) -> Result<String, String> {
        let cmd = world.new_id(Kind::Command);
        let w = self.workers.get_mut(id).ok_or("no such worker")?;
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
        w.commands.insert(
            cmd.clone(),
            CmdRef {
                command: command.clone(),
                machine: machine.clone(),
                timeout_ms,
                js_call,
                done: false,
            },
        );
        w.status = WorkerStatus::Running;
        self.dirty.insert(id.to_string());
        fx.push(Effect::StartCommand {
            worker: id.to_string(),
            cmd: cmd.clone(),
            machine,
            labels: w.labels.clone(),
            command,
            timeout_ms,
        });
        Ok(cmd)
    }

    fn command_done(
        &mut self,
        world: &mut dyn World,
        id: &str,
        cmd: &str,
        r: CommandResult,
        fx: &mut Vec<Effect>,
    ) {
        let budget = self.budgets.output_chars;
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        let Some(c) = w.commands.get_mut(cmd) else {
            return;
        };
        if c.done {
            return;
        }
        c.done = true;
        let js_call = c.js_call;
        let line = format!(
            "<event command={cmd} machine={} state={} exit={} ms={}>`{}`\nstdout: {}\nstderr: {}{}</event>",
            c.machine,
            r.state,
            r.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            r.duration_ms,
            escape(&c.command),
            escape(&spill(&r.stdout, budget, cmd)),
            escape(&spill(&r.stderr, budget, cmd)),
            if r.reason.is_empty() {
                String::new()
            } else {
                format!("\nreason: {}", escape(&r.reason))
            }
        );
        self.dirty.insert(id.to_string());
        if w.status.is_closed() {
            return;
        }
        match js_call {
            Some((run, call)) => {
                let v = json!({
                    "command": cmd, "state": r.state, "exit_code": r.exit_code,
                    "stdout": spill(&r.stdout, budget * 4, cmd),
                    "stderr": spill(&r.stderr, budget * 4, cmd),
                    "reason": r.reason,
                });
                self.js_settle(id, run, call, Ok(v), fx);
            }
            None => {
                self.worker_input(world, id, line);
            }
        }
    }

    fn report(
        &mut self,
        world: &mut dyn World,
        id: &str,
        status: &str,
        text: &str,
        fx: &mut Vec<Effect>,
    ) {
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        w.last_report = text.to_string();
        self.dirty.insert(id.to_string());
        match w.parent.is_some() {
            // A subagent's report is its answer to the program that spawned it.
            true if status != "progress" => {
                let st = if status == "failed" {
                    WorkerStatus::Failed
                } else {
                    WorkerStatus::Done
                };
                self.finish_worker(world, id, st, text, true, fx);
            }
            true => {}
            // finish_worker tells the Router about a failure.
            false if status == "failed" => {
                self.finish_worker(world, id, WorkerStatus::Failed, text, true, fx);
            }
            false => {
                let threads = w.threads.clone();
                push_bounded(
                    &mut self.router,
                    RouterItem::Report {
                        worker: id.to_string(),
                        threads,
                        status: status.to_string(),
                        text: text.to_string(),
                    },
                );
                self.dirty.insert(ROUTER.into());
            }
        }
    }

    /// Closes a worker: stops its commands, children and approvals, and
    /// tells whoever waits on it.
    /// `tell_router`: a top-level worker that fails or is cancelled is
    /// reported to the Router, unless the Router itself ended it.
    fn finish_worker(
        &mut self,
        world: &mut dyn World,
        id: &str,
        status: WorkerStatus,
        text: &str,
        tell_router: bool,
        fx: &mut Vec<Effect>,
    ) {
        let now = world.now();
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        if w.status.is_closed() {
            return;
        }
        w.status = status;
        w.in_flight = None;
        w.inbox.clear();
        w.updated_ms = now;
        if !text.is_empty() {
            w.last_report = text.to_string();
        }
        let parent = w.parent.clone();
        let threads = w.threads.clone();
        let mut children = Vec::new();
        for (cmd, c) in &w.commands {
            if !c.done {
                fx.push(Effect::StopCommand {
                    cmd: cmd.clone(),
                    reason: format!("worker {id} {}", status.name()),
                });
            }
        }
        if let Some(js) = w.js.take() {
            for st in js.calls.values() {
                if let JsCallState::Subagent(c) = st {
                    children.push(c.clone());
                }
            }
            if let Some(s) = js.snapshot {
                fx.push(Effect::DropSnapshot { snapshot: s });
            }
        }
        self.dirty.insert(id.to_string());
        for t in &threads {
            self.unsubscribe(t, id);
        }
        for a in self.approvals.values_mut() {
            if a.worker == id && a.state == "open" {
                a.state = "cancelled".into();
                a.answered_ms = now;
                self.dirty.insert(a.id.clone());
            }
        }
        for c in children {
            self.cancel_worker(world, &c, &format!("its parent {id} ended"), true, fx);
        }
        if let Some(p) = parent {
            let (call, run) = self.js_call_of(&p, id);
            if let (Some(call), Some(run)) = (call, run) {
                let v = json!({"worker": id, "status": status.name(), "text": text});
                let r = if status == WorkerStatus::Done {
                    Ok(v)
                } else {
                    Err(format!("subagent {id} {}: {text}", status.name()))
                };
                self.js_settle(&p, run, call, r, fx);
                self.spawn_queued(world, &p, fx);
            }
        } else if status != WorkerStatus::Done && tell_router {
            push_bounded(
                &mut self.router,
                RouterItem::Report {
                    worker: id.to_string(),
                    threads,
                    status: status.name().to_string(),
                    text: text.to_string(),
                },
            );
            self.dirty.insert(ROUTER.into());
        }
    }

    fn js_call_of(&self, parent: &str, child: &str) -> (Option<u32>, Option<u64>) {
        let Some(js) = self.workers.get(parent).and_then(|p| p.js.as_ref()) else {
            return (None, None);
        };
        let call = js
            .calls
            .iter()
            .find(|(_, s)| matches!(s, JsCallState::Subagent(c) if c == child))
            .map(|(k, _)| *k);
        (call, Some(js.run))
    }

    fn cancel_worker(
        &mut self,
        world: &mut dyn World,
        id: &str,
        reason: &str,
        tell_router: bool,
        fx: &mut Vec<Effect>,
    ) {
        self.finish_worker(world, id, WorkerStatus::Cancelled, reason, tell_router, fx);
    }

    // ── the code interpreter ──

    fn js_done(
        &mut self,
        world: &mut dyn World,
        id: &str,
        run: u64,
        outcome: JsOutcome,
        fx: &mut Vec<Effect>,
    ) {
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        let Some(js) = w.js.as_mut() else {
            return;
        };
        if js.run != run || js.step == JsStep::Idle || w.status.is_closed() {
            return;
        }
        js.step = JsStep::Idle;
        self.dirty.insert(id.to_string());
        match outcome {
            JsOutcome::Paused { snapshot, pending } => {
                if let Some(old) = js.snapshot.replace(snapshot) {
                    fx.push(Effect::DropSnapshot { snapshot: old });
                }
                let new: Vec<JsCallReq> = pending
                    .into_iter()
                    .filter(|p| !js.calls.contains_key(&p.id))
                    .collect();
                for p in new {
                    self.js_call(world, id, run, p, fx);
                }
                self.spawn_queued(world, id, fx);
                self.js_next(id, fx);
                self.settle_status(id);
            }
            JsOutcome::Done { result, logs } => {
                self.end_program(world, id, "the program finished", fx);
                let logs = if logs.is_empty() {
                    String::new()
                } else {
                    format!("\nconsole: {}", escape(&spill(&logs.join("\n"), 1000, id)))
                };
                let line = format!(
                    "<event program={id}/js{run} state=done>result: {}{logs}</event>",
                    escape(&spill(&result.to_string(), self.budgets.report_chars, id))
                );
                self.worker_input(world, id, line);
            }
            JsOutcome::Error { kind, message } => {
                self.end_program(world, id, "its program failed", fx);
                let line = format!(
                    "<event program={id}/js{run} state=error kind={kind}>{}</event>",
                    escape(&message)
                );
                self.worker_input(world, id, line);
            }
        }
    }

    /// A program ended (done or failed) while calls it made may still be
    /// out (a rejected `Promise.all`, a call never awaited): stop them.
    fn end_program(&mut self, world: &mut dyn World, id: &str, why: &str, fx: &mut Vec<Effect>) {
        let now = world.now();
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        let Some(js) = w.js.take() else {
            return;
        };
        if let Some(s) = js.snapshot {
            fx.push(Effect::DropSnapshot { snapshot: s });
        }
        let mut children = Vec::new();
        for st in js.calls.values() {
            match st {
                JsCallState::Command(cmd) => {
                    if w.commands.get(cmd).is_some_and(|c| !c.done) {
                        fx.push(Effect::StopCommand {
                            cmd: cmd.clone(),
                            reason: why.to_string(),
                        });
                    }
                }
                JsCallState::Subagent(c) => children.push(c.clone()),
                JsCallState::Approval(a) => {
                    if let Some(a) = self.approvals.get_mut(a) {
                        if a.state == "open" {
                            a.state = "cancelled".into();
                            a.answered_ms = now;
                            self.dirty.insert(a.id.clone());
                        }
                    }
                }
                JsCallState::SpawnQueued { .. } | JsCallState::Settled => {}
            }
        }
        self.dirty.insert(id.to_string());
        for c in children {
            self.cancel_worker(world, &c, why, true, fx);
        }
    }

    /// A new durable call from the program: start what it asks for.
    fn js_call(
        &mut self,
        world: &mut dyn World,
        id: &str,
        run: u64,
        p: JsCallReq,
        fx: &mut Vec<Effect>,
    ) {
        let max_subagents = self.budgets.max_subagents;
        let max_depth = self.budgets.max_depth;
        let state = match p.capability.as_str() {
            "tools.exec" => {
                let command = opt_str(&p.args, "command").unwrap_or_default();
                let machine = opt_str(&p.args, "machine");
                let timeout = timeout_ms(&p.args);
                match self.start_command(
                    world,
                    id,
                    machine,
                    command,
                    timeout,
                    Some((run, p.id)),
                    fx,
                ) {
                    Ok(cmd) => JsCallState::Command(cmd),
                    Err(e) => {
                        self.js_settle_now(id, p.id, Err(e));
                        return;
                    }
                }
            }
            "agents.spawn" => {
                let task = opt_str(&p.args, "task").unwrap_or_default();
                let machine = opt_str(&p.args, "machine")
                    .or_else(|| self.workers.get(id).map(|w| w.machine.clone()))
                    .unwrap_or_default();
                let w = &self.workers[id];
                let spawned = w.js.as_ref().map(|j| j.spawned).unwrap_or(0);
                if w.depth + 1 > max_depth {
                    self.js_settle_now(
                        id,
                        p.id,
                        Err(format!("subagents may nest at most {max_depth} deep")),
                    );
                    return;
                }
                if spawned >= max_subagents {
                    self.js_settle_now(
                        id,
                        p.id,
                        Err(format!(
                            "a program may spawn at most {max_subagents} subagents"
                        )),
                    );
                    return;
                }
                if let Some(js) = self.workers.get_mut(id).and_then(|w| w.js.as_mut()) {
                    js.spawned += 1;
                }
                JsCallState::SpawnQueued { task, machine }
            }
            "human.ask" => {
                let question = match &p.args {
                    Value::String(s) => s.clone(),
                    v => opt_str(v, "question").unwrap_or_else(|| v.to_string()),
                };
                let apr = world.new_id(Kind::Approval);
                let thread = self.root_thread(id).unwrap_or_default();
                let now = world.now();
                self.approvals.insert(
                    apr.clone(),
                    Approval {
                        id: apr.clone(),
                        worker: id.to_string(),
                        thread: thread.clone(),
                        question: question.clone(),
                        run,
                        call: p.id,
                        state: "open".into(),
                        answer: Value::Null,
                        by: String::new(),
                        created_ms: now,
                        answered_ms: 0,
                    },
                );
                self.dirty.insert(apr.clone());
                push_bounded(
                    &mut self.router,
                    RouterItem::Question {
                        approval: apr.clone(),
                        worker: id.to_string(),
                        thread,
                        question,
                    },
                );
                self.dirty.insert(ROUTER.into());
                JsCallState::Approval(apr)
            }
            other => {
                self.js_settle_now(id, p.id, Err(format!("unknown capability {other}")));
                return;
            }
        };
        if let Some(js) = self.workers.get_mut(id).and_then(|w| w.js.as_mut()) {
            js.calls.insert(p.id, state);
        }
    }

    /// The first thread up the parent chain: where a person can be asked.
    fn root_thread(&self, id: &str) -> Option<String> {
        let mut cur = self.workers.get(id)?;
        for _ in 0..16 {
            if let Some(t) = cur.threads.first() {
                return Some(t.clone());
            }
            cur = self.workers.get(cur.parent.as_ref()?)?;
        }
        None
    }

    /// Starts queued subagents while there is room.
    fn spawn_queued(&mut self, world: &mut dyn World, id: &str, fx: &mut Vec<Effect>) {
        let max = self.budgets.max_concurrent_subagents;
        loop {
            let Some(js) = self.workers.get(id).and_then(|w| w.js.as_ref()) else {
                return;
            };
            let running = js
                .calls
                .values()
                .filter(|s| match s {
                    JsCallState::Subagent(c) => self
                        .workers
                        .get(c)
                        .map(|w| !w.status.is_closed())
                        .unwrap_or(false),
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
            if let Err(e) = self.room_for_worker() {
                let run = js.run;
                self.js_settle(id, run, call, Err(e), fx);
                continue;
            }
            let labels = self.workers[id].labels.clone();
            let child = self.new_worker(
                world,
                Some(id.to_string()),
                task,
                Vec::new(),
                machine,
                labels,
            );
            if let Some(js) = self.workers.get_mut(id).and_then(|w| w.js.as_mut()) {
                js.calls.insert(call, JsCallState::Subagent(child));
            }
            self.dirty.insert(id.to_string());
        }
    }

    /// A result for a call, settled now (the call never started).
    fn js_settle_now(&mut self, id: &str, call: u32, r: Result<Value, String>) {
        if let Some(js) = self.workers.get_mut(id).and_then(|w| w.js.as_mut()) {
            js.calls.insert(call, JsCallState::Settled);
            js.ready.push_back((call, r));
        }
    }

    fn js_settle(
        &mut self,
        id: &str,
        run: u64,
        call: u32,
        r: Result<Value, String>,
        fx: &mut Vec<Effect>,
    ) {
        let Some(js) = self.workers.get_mut(id).and_then(|w| w.js.as_mut()) else {
            return;
        };
        if js.run != run || matches!(js.calls.get(&call), Some(JsCallState::Settled) | None) {
            return;
        }
        js.calls.insert(call, JsCallState::Settled);
        js.ready.push_back((call, r));
        self.dirty.insert(id.to_string());
        self.js_next(id, fx);
    }

    /// Feeds the next ready result to the interpreter if it is free.
    fn js_next(&mut self, id: &str, fx: &mut Vec<Effect>) {
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        let Some(js) = w.js.as_mut() else {
            return;
        };
        if js.step != JsStep::Idle {
            return;
        }
        let Some(snapshot) = js.snapshot.clone() else {
            return;
        };
        let Some((call, result)) = js.ready.pop_front() else {
            return;
        };
        js.step = JsStep::Resume {
            call,
            result: result.clone(),
        };
        w.status = WorkerStatus::Running;
        self.dirty.insert(id.to_string());
        fx.push(Effect::ResumeJs {
            worker: id.to_string(),
            run: js.run,
            snapshot,
            call,
            result,
        });
    }

    // ── approvals ──

    fn answer(
        &mut self,
        world: &mut dyn World,
        apr: &str,
        approved: bool,
        answer: Value,
        by: &str,
        fx: &mut Vec<Effect>,
    ) -> Result<(), String> {
        let now = world.now();
        let a = self
            .approvals
            .get_mut(apr)
            .ok_or_else(|| format!("no approval {apr}"))?;
        if a.state != "open" {
            return Err(format!("{apr} is already {}", a.state));
        }
        a.state = if approved { "approved" } else { "denied" }.into();
        a.answer = answer.clone();
        a.by = by.to_string();
        a.answered_ms = now;
        let (worker, run, call) = (a.worker.clone(), a.run, a.call);
        self.dirty.insert(apr.to_string());
        let v = json!({"approved": approved, "answer": answer, "by": by});
        self.js_settle(&worker, run, call, Ok(v), fx);
        self.settle_status(&worker);
        Ok(())
    }

    // ── recall ──

    fn recall(&self, world: &dyn World, id: &str, offset: usize) -> Result<String, String> {
        let full = if let Some(w) = self.workers.get(id) {
            worker_text(w)
        } else if let Some(a) = self.approvals.get(id) {
            serde_json::to_string_pretty(a).unwrap_or_default()
        } else {
            world.lookup(id).ok_or_else(|| format!("no object {id}"))?
        };
        let rest: String = full.chars().skip(offset).collect();
        Ok(spill(&rest, self.budgets.recall_chars, id).replace(
            &format!("read(\"{id}\", {})", self.budgets.recall_chars),
            &format!("read(\"{id}\", {})", offset + self.budgets.recall_chars),
        ))
    }

    // ── time ──

    fn tick(&mut self, world: &mut dyn World, fx: &mut Vec<Effect>) {
        let now = world.now();
        let due: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| !w.status.is_closed() && w.retry_at.is_some_and(|t| now >= t))
            .map(|(k, _)| k.clone())
            .collect();
        for id in due {
            if let Some(w) = self.workers.get_mut(&id) {
                w.retry_at = None;
                let turn = w.in_flight.unwrap_or(w.turn);
                w.in_flight = Some(turn);
                self.dirty.insert(id.clone());
                fx.push(self.worker_call(&id, turn));
            }
        }
        // The Router's retry is started by `pump` once `retry_at` passes.
        let retire = self.budgets.idle_retire_ms;
        let idle: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| {
                w.status == WorkerStatus::Idle && now.saturating_sub(w.updated_ms) >= retire
            })
            .map(|(k, _)| k.clone())
            .collect();
        for id in idle {
            self.finish_worker(world, &id, WorkerStatus::Done, "", false, fx);
        }
    }

    /// Drops ended workers and answered approvals from memory; their
    /// records stay in the store (call after they were written).
    pub fn evict_closed(&mut self) {
        let dirty = &self.dirty;
        self.workers
            .retain(|k, w| !w.status.is_closed() || dirty.contains(k));
        self.approvals
            .retain(|k, a| a.state == "open" || dirty.contains(k));
    }

    /// Whether nothing is in flight or waiting anywhere (simulation end).
    pub fn quiescent(&self) -> bool {
        self.router.in_flight.is_none()
            && self.router.queue.is_empty()
            && self.workers.values().all(|w| {
                w.status.is_closed()
                    || (w.in_flight.is_none()
                        && w.inbox.is_empty()
                        && w.js.is_none()
                        && w.commands.values().all(|c| c.done))
            })
    }
}

fn item_thread(it: &RouterItem) -> Option<String> {
    match it {
        RouterItem::Trigger(t) => Some(t.thread.clone()),
        RouterItem::Bounced { trigger, .. } => Some(trigger.thread.clone()),
        RouterItem::Report { threads, .. } => threads.first().cloned(),
        RouterItem::Question { thread, .. } => Some(thread.clone()),
    }
}

fn push_bounded(r: &mut RouterState, it: RouterItem) {
    if r.queue.len() >= MAX_ROUTER_QUEUE {
        // The trigger itself stays in the store, readable by ID.
        tracing::error!("router queue full ({MAX_ROUTER_QUEUE}); dropping its oldest item");
        r.queue.pop_front();
        r.stats.dropped += 1;
    }
    r.queue.push_back(it);
}

fn str_arg(a: &Value, k: &str) -> Result<String, String> {
    opt_str(a, k).ok_or_else(|| format!("missing string argument {k:?}"))
}

fn opt_str(a: &Value, k: &str) -> Option<String> {
    a.get(k).and_then(Value::as_str).map(str::to_string)
}

/// Timeout of a command an agent starts without one.
const DEFAULT_COMMAND_TIMEOUT_MS: u64 = 600_000;

/// `timeout_s` of a `shell_start` or `tools.exec` call, in ms (saturating:
/// the value comes from a model).
fn timeout_ms(a: &Value) -> u64 {
    a.get("timeout_s")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_COMMAND_TIMEOUT_MS, |s| s.saturating_mul(1000))
}

fn backoff(failures: u32) -> Ms {
    (1000u64 << failures.min(16)).min(MAX_RETRY_BACKOFF_MS)
}

/// Drops the oldest whole turns (from a user message to the next) until the
/// conversation fits `budget` tokens, leaving a note; returns how many.
/// Dropping breaks the provider's prefix cache once; appending keeps it.
fn compact(conv: &mut Conversation, budget: usize) -> Option<u64> {
    let size = |c: &[Message]| -> usize {
        c.iter()
            .map(|m| {
                prompt::tokens(&m.text)
                    + m.tool_calls
                        .iter()
                        .map(|t| prompt::tokens(&t.arguments.to_string()) + 4)
                        .sum::<usize>()
                    + 4
            })
            .sum()
    };
    if size(conv.messages()) <= budget {
        return None;
    }
    // Keep the first message (the task) and drop from the second on.
    let mut dropped = 0u64;
    while size(conv.messages()) > budget / 2 && conv.len() > 2 {
        // Next user message after index 1 that starts a turn.
        let Some(next) = conv
            .messages()
            .iter()
            .enumerate()
            .skip(2)
            .find(|(_, m)| m.role == Role::User)
            .map(|(i, _)| i)
        else {
            break;
        };
        conv.drain(1..next);
        dropped += 1;
    }
    if dropped > 0 {
        conv.insert(
            1,
            Message::user(format!(
                "({dropped} earlier turns were dropped to fit the context budget; recall(id) any object you need)"
            )),
        );
        // The note itself must not start a run of two user messages at the
        // front without an answer; providers accept consecutive user turns.
    }
    Some(dropped)
}

fn worker_text(w: &WorkerState) -> String {
    let mut s = format!(
        "worker {} ({}){}\ntask: {}\nthreads: {}\nmachine: {}\nlast report: {}\n",
        w.id,
        w.status.name(),
        w.parent
            .as_ref()
            .map(|p| format!(", subagent of {p}"))
            .unwrap_or_default(),
        w.task,
        w.threads.join(" "),
        w.machine,
        w.last_report
    );
    for (cmd, c) in &w.commands {
        s.push_str(&format!(
            "command {cmd} on {}: `{}`{}\n",
            c.machine,
            c.command,
            if c.done { " (finished)" } else { " (running)" }
        ));
    }
    s
}

/// A trigger from `World::lookup` text (JSON of the stored trigger).
fn parse_trigger_lookup(id: &str, text: &str) -> Option<TriggerInfo> {
    let v: Value = serde_json::from_str(text).ok()?;
    Some(TriggerInfo {
        id: id.to_string(),
        thread: v.get("thread_id")?.as_str()?.to_string(),
        source: v.get("source")?.as_str()?.to_string(),
        user: v.get("user")?.as_str()?.to_string(),
        text: v.get("text")?.as_str()?.to_string(),
        mention: v.get("mention").and_then(Value::as_bool).unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scripted::Scripted;

    struct W {
        now: Ms,
        seq: u64,
    }
    impl World for W {
        fn now(&self) -> Ms {
            self.now
        }
        fn new_id(&mut self, kind: Kind) -> String {
            self.seq += 1;
            let mut r = [0u8; 10];
            r[2..].copy_from_slice(&self.seq.to_be_bytes());
            format!("{}{}", kind.prefix(), byom_protocol::id::encode_body(1, r))
        }
        fn policies(&self) -> Vec<String> {
            Vec::new()
        }
        fn machines(&self) -> Vec<String> {
            vec!["lap (online)".into()]
        }
        fn lookup(&self, _: &str) -> Option<String> {
            None
        }
        fn thread_source(&self, _: &str) -> Option<String> {
            Some("chat".into())
        }
    }

    /// What a restart does: write what the driver writes, rebuild from it.
    fn reload(core: &mut Core) -> Core {
        let mut stored: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (k, v) in core.take_writes() {
            match v {
                Some(v) => stored.insert(k, v),
                None => stored.remove(&k),
            };
        }
        let (fresh, errors) = Core::rebuild_from_image(Budgets::default(), &stored, true);
        assert!(errors.is_empty(), "{errors:?}");
        fresh
    }

    fn trig(id: &str, thread: &str, text: &str) -> Event {
        Event::Trigger(TriggerInfo {
            id: id.into(),
            thread: thread.into(),
            source: "chat".into(),
            user: "ada".into(),
            text: text.into(),
            mention: true,
        })
    }

    fn model_call(fx: &[Effect]) -> Option<(String, u64, Request)> {
        fx.iter().find_map(|e| match e {
            Effect::CallModel {
                session,
                turn,
                request,
                ..
            } => Some((session.clone(), *turn, request.clone())),
            _ => None,
        })
    }

    #[test]
    fn the_router_cannot_execute_even_if_the_model_asks() {
        let mut core = Core::new(Budgets::default());
        let mut w = W { now: 0, seq: 0 };
        core.handle(&mut w, trig("trg_1", "thr_1", "hello"));
        let fx = router_step(
            &mut core,
            &mut w,
            vec![
                (
                    "shell_start",
                    json!({"command": "rm -rf /", "machine": "lap"}),
                ),
                ("run_js", json!({"code": "1"})),
            ],
        );
        assert!(!fx
            .iter()
            .any(|e| matches!(e, Effect::StartCommand { .. } | Effect::RunJs { .. })));
        let results: Vec<&Message> = core
            .router
            .conversation
            .messages()
            .iter()
            .filter(|m| m.role == Role::Tool)
            .collect();
        assert_eq!(results.len(), 2);
        assert!(results[0].text.contains("cannot run commands or code"));
    }

    #[test]
    fn a_failed_router_call_puts_its_triggers_back() {
        let mut core = Core::new(Budgets::default());
        let mut w = W { now: 0, seq: 0 };
        let fx = core.handle(&mut w, trig("trg_1", "thr_1", "please run `ls` on lap"));
        let (session, turn, _) = model_call(&fx).unwrap();
        // Another trigger arrives while the call is out: it waits.
        let fx = core.handle(&mut w, trig("trg_2", "thr_2", "hi"));
        assert!(model_call(&fx).is_none());
        let fx = core.handle(
            &mut w,
            Event::ModelDone {
                session,
                turn,
                result: Err("503 from the provider".into()),
            },
        );
        assert!(model_call(&fx).is_none(), "backs off before retrying");
        assert_eq!(core.router.queue.len(), 2, "nothing dropped");
        w.now = 60_000;
        let fx = core.handle(&mut w, Event::Tick);
        let (session, turn, req) = model_call(&fx).expect("retried after the backoff");
        let last = &req.messages.last().unwrap().text;
        assert!(last.contains("trg_1") && last.contains("trg_2"), "{last}");
        // A third failure in a row: people waiting hear about it, once.
        let fx = core.handle(
            &mut w,
            Event::ModelDone {
                session,
                turn,
                result: Err("503".into()),
            },
        );
        assert!(fx.is_empty());
        w.now = 600_000;
        let fx = core.handle(&mut w, Event::Tick);
        let (session, turn, _) = model_call(&fx).unwrap();
        let fx = core.handle(
            &mut w,
            Event::ModelDone {
                session,
                turn,
                result: Err("503".into()),
            },
        );
        let notices: Vec<&Reply> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::Reply(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(notices.len(), 2, "one per waiting thread");
        assert!(notices[0].text.contains("queued"));
        assert_eq!(core.router.queue.len(), 2, "still nothing dropped");
        // The queue survives a restart, in order.
        let fresh = reload(&mut core);
        let ids: Vec<String> = fresh
            .router
            .queue
            .iter()
            .filter_map(|i| match i {
                RouterItem::Trigger(t) => Some(t.id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(ids, ["trg_1", "trg_2"]);
    }

    #[test]
    fn state_survives_a_reload_and_resumes_what_was_in_flight() {
        let model = Scripted::default();
        let mut core = Core::new(Budgets::default());
        let mut w = W { now: 0, seq: 0 };
        let mut queue: VecDeque<Effect> = core
            .handle(
                &mut w,
                trig("trg_1", "thr_1", "please run `sleep 5` on lap"),
            )
            .into();
        // Answer model calls until a command starts.
        let mut started = None;
        for _ in 0..20 {
            match queue.pop_front() {
                Some(Effect::StartCommand { cmd, .. }) => {
                    started = Some(cmd);
                    break;
                }
                Some(Effect::CallModel {
                    session,
                    turn,
                    request,
                    ..
                }) => {
                    let (resp, _) = model.respond(&request);
                    queue.extend(core.handle(
                        &mut w,
                        Event::ModelDone {
                            session,
                            turn,
                            result: Ok(resp),
                        },
                    ));
                }
                Some(_) => {}
                None => break,
            }
        }
        let cmd = started.expect("a command started");
        // Write what the driver writes, rebuild a fresh core from it.
        let mut fresh = reload(&mut core);
        for (id, w) in &core.workers {
            assert_eq!(
                fresh.workers[id].conversation.messages(),
                w.conversation.messages(),
                "the transcript comes back whole"
            );
        }
        assert_eq!(
            fresh.router.conversation.messages(),
            core.router.conversation.messages()
        );
        let again = fresh.resume_effects();
        let restarts: Vec<&String> = again
            .iter()
            .filter_map(|e| match e {
                Effect::StartCommand { cmd, command, .. } => {
                    assert_eq!(command, "sleep 5");
                    Some(cmd)
                }
                _ => None,
            })
            .collect();
        assert_eq!(restarts, [&cmd], "the same command ID: created once");
    }

    #[test]
    fn a_hostile_reply_is_bounded() {
        let mut core = Core::new(Budgets::default());
        let mut w = W { now: 0, seq: 0 };
        core.handle(&mut w, trig("trg_1", "thr_1", "hi"));
        let spin = json!({"task": "spin", "threads": ["thr_1"], "machine": "lap"});
        router_step(&mut core, &mut w, vec![("create_worker", spin); 100]);
        assert_eq!(core.workers.len(), MAX_TOOL_CALLS_PER_REPLY);
    }

    fn reply_with(calls: Vec<(&str, Value)>) -> Response {
        Response {
            text: String::new(),
            tool_calls: calls
                .into_iter()
                .enumerate()
                .map(|(i, (n, a))| ToolCall {
                    id: format!("t{i}"),
                    name: n.into(),
                    arguments: a,
                })
                .collect(),
            usage: Usage::default(),
            stop_reason: "tool_calls".into(),
            attempts: 1,
        }
    }

    /// A worker on thr_1, created by the Router; returns its ID.
    fn with_worker(core: &mut Core, w: &mut dyn World) -> String {
        let fx = core.handle(w, trig("trg_1", "thr_1", "hi"));
        let (session, turn, _) = model_call(&fx).unwrap();
        core.handle(
            w,
            Event::ModelDone {
                session,
                turn,
                result: Ok(reply_with(vec![(
                    "create_worker",
                    json!({"task": "watch", "threads": ["thr_1"], "machine": "lap"}),
                )])),
            },
        );
        core.workers.keys().next().unwrap().clone()
    }

    /// Answers the Router's call in flight with `calls`.
    fn router_step(core: &mut Core, w: &mut dyn World, calls: Vec<(&str, Value)>) -> Vec<Effect> {
        let turn = core.router.in_flight.expect("a Router call in flight");
        core.handle(
            w,
            Event::ModelDone {
                session: ROUTER.into(),
                turn,
                result: Ok(reply_with(calls)),
            },
        )
    }

    fn worker_step(
        core: &mut Core,
        w: &mut dyn World,
        id: &str,
        calls: Vec<(&str, Value)>,
    ) -> Vec<Effect> {
        let turn = core.workers[id].in_flight.expect("a call in flight");
        core.handle(
            w,
            Event::ModelDone {
                session: id.into(),
                turn,
                result: Ok(reply_with(calls)),
            },
        )
    }

    #[test]
    fn unsubscribing_sends_the_thread_back_to_the_router() {
        let mut core = Core::new(Budgets::default());
        let mut w = W { now: 0, seq: 0 };
        let id = with_worker(&mut core, &mut w);
        assert!(core.router.subs["thr_1"].contains(&id));
        worker_step(&mut core, &mut w, &id, vec![("unsubscribe", json!({}))]);
        assert!(!core.router.subs.contains_key("thr_1"));
        let before = core.router.stats.passed_through;
        core.handle(&mut w, trig("trg_2", "thr_1", "more"));
        assert_eq!(core.router.stats.passed_through, before);
        assert!(core
            .router
            .queue
            .iter()
            .any(|i| matches!(i, RouterItem::Trigger(t) if t.id == "trg_2")));
    }

    #[test]
    fn recall_and_read_page_through_long_objects() {
        struct Big(W);
        impl World for Big {
            fn now(&self) -> Ms {
                0
            }
            fn new_id(&mut self, k: Kind) -> String {
                self.0.new_id(k)
            }
            fn policies(&self) -> Vec<String> {
                Vec::new()
            }
            fn machines(&self) -> Vec<String> {
                Vec::new()
            }
            fn lookup(&self, id: &str) -> Option<String> {
                (id == "cmd_big").then(|| "x".repeat(10_000) + "END")
            }
            fn thread_source(&self, _: &str) -> Option<String> {
                Some("chat".into())
            }
        }
        let mut core = Core::new(Budgets {
            recall_chars: 4000,
            ..Budgets::default()
        });
        let mut w = Big(W { now: 0, seq: 0 });
        let id = with_worker(&mut core, &mut w);
        worker_step(
            &mut core,
            &mut w,
            &id,
            vec![
                ("recall", json!({"id": "cmd_big"})),
                ("read", json!({"id": "cmd_big", "offset": 8000})),
                ("recall", json!({"id": "cmd_nope"})),
            ],
        );
        let results: Vec<String> = core.workers[&id]
            .conversation
            .messages()
            .iter()
            .filter(|m| m.role == Role::Tool)
            .map(|m| m.text.clone())
            .collect();
        assert!(
            results[0].contains("read(\"cmd_big\", 4000)"),
            "{}",
            &results[0][4000..]
        );
        assert!(results[1].ends_with("END"), "the last page has the end");
        assert!(results[2].contains("no object cmd_nope"));
    }

    #[test]
    fn idle_workers_retire_and_ended_ones_leave_memory() {
        let mut core = Core::new(Budgets {
            idle_retire_ms: 1000,
            ..Budgets::default()
        });
        let mut w = W { now: 0, seq: 0 };
        let id = with_worker(&mut core, &mut w);
        worker_step(&mut core, &mut w, &id, vec![]);
        assert_eq!(core.workers[&id].status, WorkerStatus::Idle);
        w.now = 500;
        core.handle(&mut w, Event::Tick);
        assert_eq!(core.workers[&id].status, WorkerStatus::Idle);
        w.now = 5000;
        core.handle(&mut w, Event::Tick);
        assert_eq!(core.workers[&id].status, WorkerStatus::Done);
        assert!(
            !core.router.subs.contains_key("thr_1"),
            "its thread goes back"
        );
        // Written first (dirty), then evicted.
        core.evict_closed();
        assert!(core.workers.contains_key(&id));
        core.take_dirty();
        core.evict_closed();
        assert!(!core.workers.contains_key(&id));
    }

    #[test]
    fn the_step_allowance_is_per_piece_of_work_and_a_stuck_worker_is_reported_at_once() {
        let mut core = Core::new(Budgets {
            max_worker_steps: 3,
            ..Budgets::default()
        });
        let mut w = W { now: 0, seq: 0 };
        let id = with_worker(&mut core, &mut w);
        router_step(&mut core, &mut w, vec![]);
        worker_step(&mut core, &mut w, &id, vec![]);
        // Many follow-ups over the thread's life: each one wakes the
        // worker from idle with the whole allowance again.
        for i in 0..10 {
            core.handle(&mut w, trig(&format!("trg_f{i}"), "thr_1", "and?"));
            assert_eq!(core.workers[&id].status, WorkerStatus::Running, "{i}");
            worker_step(&mut core, &mut w, &id, vec![]);
            assert_eq!(core.workers[&id].status, WorkerStatus::Idle, "{i}");
        }
        // A worker busy with a long command that keeps being woken spends
        // its allowance; the turn it cannot take fails it, and the Router
        // hears so in that same step, not at some later event.
        core.handle(&mut w, trig("trg_long", "thr_1", "long one"));
        worker_step(
            &mut core,
            &mut w,
            &id,
            vec![(
                "shell_start",
                json!({"machine": "lap", "command": "sleep 100"}),
            )],
        );
        worker_step(&mut core, &mut w, &id, vec![]);
        assert_eq!(core.workers[&id].status, WorkerStatus::Running);
        let mut fx = Vec::new();
        for i in 0..5 {
            fx = core.handle(&mut w, trig(&format!("trg_m{i}"), "thr_1", "more"));
            if core.workers[&id].status.is_closed() {
                break;
            }
            worker_step(&mut core, &mut w, &id, vec![]);
        }
        assert_eq!(core.workers[&id].status, WorkerStatus::Failed);
        let (session, _, req) = model_call(&fx).expect("the Router is called");
        assert_eq!(session, ROUTER);
        let last = req.messages.last().unwrap();
        assert!(last.text.contains("max_worker_steps"), "{}", last.text);
    }

    #[test]
    fn a_model_given_timeout_cannot_overflow() {
        assert_eq!(timeout_ms(&json!({})), DEFAULT_COMMAND_TIMEOUT_MS);
        assert_eq!(timeout_ms(&json!({"timeout_s": 5})), 5000);
        assert_eq!(timeout_ms(&json!({"timeout_s": u64::MAX})), u64::MAX);
    }

    #[test]
    fn a_turn_takes_a_bounded_batch() {
        let mut core = Core::new(Budgets {
            max_batch: 3,
            ..Budgets::default()
        });
        let mut w = W { now: 0, seq: 0 };
        let fx = core.handle(&mut w, trig("trg_0", "thr_0", "hi"));
        let (session, turn, _) = model_call(&fx).unwrap();
        for i in 1..=7 {
            core.handle(&mut w, trig(&format!("trg_{i}"), "thr_x", "hi"));
        }
        let empty = Response {
            text: "ok".into(),
            tool_calls: vec![],
            usage: Usage::default(),
            stop_reason: "stop".into(),
            attempts: 1,
        };
        let fx = core.handle(
            &mut w,
            Event::ModelDone {
                session,
                turn,
                result: Ok(empty),
            },
        );
        let (_, _, req) = model_call(&fx).unwrap();
        assert!(req.messages.last().unwrap().text.contains("New events (3)"));
        assert_eq!(core.router.queue.len(), 4);
    }
}
