//! The agents' records: the Router's, each worker's and each approval's.
//! Each serializes on its own, so a step writes only the records it
//! changed; what grows (conversations, the Router's queue) lives in
//! [`crate::storage`] one key per entry.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{RouterItem, Stats};
use crate::llm::Usage;
use crate::storage::{Conversation, RouterQueue};
use crate::Ms;

pub use crate::flags::{Cause, Flags};

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
    /// What the Router recalled this turn (A and B, for the workers it
    /// makes in it).
    #[serde(default)]
    pub turn_read: Flags,
    /// A and B of the untrusted text shown to the Router as "seen on
    /// subscribed threads" since its last turn: the next turn starts
    /// with them.
    #[serde(default)]
    pub observed_flags: Flags,
    /// Where the current turn's messages start in the conversation.
    #[serde(default)]
    pub turn_start: usize,
    /// Said at the start of the next turn: that a turn which read
    /// untrusted input was taken out of the conversation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub carry_note: String,
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
    /// Waiting for this approval before it may start (the Rule of Two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// The approval it started under, if it needed one, and who gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub approved_by: String,
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
    /// The owner's policies as last shown to it (with a pass-through
    /// trigger).
    #[serde(default)]
    pub policies_shown: Vec<String>,
    /// The Rule of Two's flags, with their causes.
    #[serde(default)]
    pub flags: Flags,
    /// The threads it was created for: its task's own, where it may speak
    /// without that counting as communicating elsewhere.
    #[serde(default)]
    pub own_threads: Vec<String>,
}

/// Where an approval stands. Stored as its lower-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    Open,
    Approved,
    Denied,
    /// Its program or worker ended before anyone answered.
    Cancelled,
    /// Nobody answered in time: as good as a "no".
    Expired,
}

impl ApprovalState {
    pub fn name(self) -> &'static str {
        match self {
            ApprovalState::Open => "open",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Cancelled => "cancelled",
            ApprovalState::Expired => "expired",
        }
    }
}

/// What an approval is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalKind {
    /// A program's `human.ask`.
    #[default]
    Question,
    /// A command that would give its worker all three flags.
    Command,
    /// A message to another thread that would give its worker all three.
    Message,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub worker: String,
    pub thread: String,
    pub question: String,
    pub run: u64,
    pub call: u32,
    pub state: ApprovalState,
    pub answer: Value,
    pub by: String,
    pub created_ms: Ms,
    pub answered_ms: Ms,
    #[serde(default)]
    pub kind: ApprovalKind,
    /// The machine the approval is about (approvers may be per label).
    #[serde(default)]
    pub machine: String,
    /// The command (`cmd_…`) or the held reply it releases.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cmd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<crate::event::Reply>,
    /// The worker's flags with the action's, when it was asked.
    #[serde(default)]
    pub flags: Flags,
    /// Who may answer, as configured when it was asked.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// Answers refused because the person may not approve (bounded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
    /// The short code an answer must name (`approve CODE`). Requests
    /// made before codes existed have none and answer only from the CLI.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub code: String,
    /// The exact action approved: the command line, or the post's text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub action: String,
    /// What the approval covers ([`crate::approval::digest`] of kind,
    /// machine and action): released only for an action with this digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// When it expires unanswered (0: never, for old records).
    #[serde(default)]
    pub expires_ms: Ms,
}
