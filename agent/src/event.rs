//! What goes in and out of the core: the events it handles, the effects it
//! asks the shell to carry out, and the small records both carry
//! (triggers, command results, program outcomes, replies).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::llm::{Request, Response, Usage};
use crate::Ms;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TriggerInfo {
    pub id: String,
    pub thread: String,
    pub source: String,
    pub user: String,
    pub text: String,
    pub mention: bool,
    /// The person's display name, when the channel gives one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user_name: String,
    /// The thread's nearby messages, oldest first, as `who: text` lines:
    /// the message this one replies to and the ones before it (bounded by
    /// the server), so "do the same for the other one" makes sense.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<String>,
    /// Its author (and every message in `context`) is trusted, as judged
    /// when it arrived. Absent means untrusted: the safe side.
    #[serde(default)]
    pub trusted: bool,
    /// Why it is trusted or not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub trust: String,
    /// When the server received it (0: unknown). An answer to an
    /// approval counts only when it came after the request.
    #[serde(default)]
    pub at_ms: crate::Ms,
    /// Its author is a name an admin gave through the API (`byom events
    /// send --user github:…`), not one a channel verified: it never
    /// answers an approval.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub claimed: bool,
    /// The channel says it was written in a direct conversation with byom
    /// (a Slack IM, a Matrix direct room): an approver's `approve CODE`
    /// there answers a request asked on any thread.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CommandResult {
    /// Final state name (exited, failed, cancelled, timed_out, lost).
    pub state: String,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    pub reason: String,
    /// It may have used the network (its machine's sandbox saw an IP
    /// socket, or could not watch and the network was open to it): what it
    /// printed may be anyone's words.
    #[serde(default)]
    pub network: bool,
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
    /// A worker's command waits on a machine that went offline: it is still
    /// pending (the worker may wait, stop it, or use another machine).
    CommandPending {
        worker: String,
        cmd: String,
        note: String,
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
            Event::CommandPending { worker, cmd, .. } => {
                format!("command pending {cmd} of {worker}")
            }
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
    /// Why it may carry someone untrusted's words (written in a turn that
    /// read them, answering them, or a request a tainted worker wrote):
    /// whoever later reads the thread reads them too, so it is stored as
    /// untrusted. `None`: byom's own words from trusted input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untrusted: Option<String>,
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
        /// Its worker read untrusted input, and why: the machine's owner
        /// decides locally what such a command may do.
        taint: String,
        /// The approver who let it run, when the Rule of Two asked.
        approved_by: String,
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
        /// The worker's flags when it reported: they travel with its
        /// words, so a worker that has ended (and left memory) still
        /// taints what reads them and still needs approval to post
        /// elsewhere.
        #[serde(default)]
        flags: crate::flags::Flags,
        /// The threads of its task as given (a report there answers the
        /// people who asked; anywhere else is "elsewhere").
        #[serde(default)]
        own_threads: Vec<String>,
    },
    Question {
        approval: String,
        worker: String,
        thread: String,
        question: String,
        /// The asking worker's A and B: the request's text is its words.
        #[serde(default)]
        flags: crate::flags::Flags,
    },
    Bounced {
        worker: String,
        trigger: TriggerInfo,
        /// The bouncing worker's flags when it bounced.
        #[serde(default)]
        flags: crate::flags::Flags,
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
