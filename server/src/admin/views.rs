//! The one place the agents' and channels' records become the admin API's
//! messages (and a trust configuration comes back from one). Records are
//! the agents' own state, free to change with the server; these messages
//! are the contract the CLI, the console and the watchdog read.

use std::collections::BTreeMap;

use byom_agent::event::Stats;
use byom_agent::flags::{Cause, Flags};
use byom_agent::llm::{Message, Role, Usage};
use byom_agent::state::{
    Approval, ApprovalKind, CmdRef, JsCallState, JsRun, JsStep, RouterState, WorkerState,
};
use byom_agent::trust::{Approver, Trust};
use byom_protocol::pb;

use crate::admins::AdminRecord;

pub fn usage(u: &Usage) -> pb::Usage {
    pb::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
    }
}

fn causes(c: &[Cause]) -> Vec<pb::FlagCause> {
    c.iter()
        .map(|c| pb::FlagCause {
            object: c.object.clone(),
            why: c.why.clone(),
        })
        .collect()
}

pub fn flags(f: &Flags) -> pb::RuleOfTwo {
    pb::RuleOfTwo {
        untrusted: causes(&f.untrusted),
        sensitive: causes(&f.sensitive),
        acts: causes(&f.acts),
    }
}

/// A worker in one row.
pub fn summary(w: &WorkerState) -> pb::WorkerSummary {
    let running = w.commands.values().filter(|c| !c.done).count();
    pb::WorkerSummary {
        id: w.id.clone(),
        parent: w.parent.clone(),
        status: w.status.name().into(),
        task: w.task.clone(),
        threads: w.threads.clone(),
        machine: w.machine.clone(),
        created_at_ms: w.created_ms,
        updated_at_ms: w.updated_ms,
        commands: count(w.commands.len()),
        running_commands: count(running),
        program: w.js.as_ref().map(|j| format!("{}/js{}", w.id, j.run)),
        model_calls: w.steps,
        usage: Some(usage(&w.usage)),
        last_report: w.last_report.clone(),
        rule_of_two: w.flags.letters(),
        containment: w.flags.explain(),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

pub fn role(r: &Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

pub fn message(m: &Message) -> pb::TranscriptMessage {
    pb::TranscriptMessage {
        role: role(&m.role).into(),
        text: m.text.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| pb::ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments_json: c.arguments.to_string(),
            })
            .collect(),
        call_id: m.call_id.clone(),
    }
}

fn command(handle: &str, c: &CmdRef) -> pb::WorkerCommand {
    pb::WorkerCommand {
        handle: handle.to_string(),
        command: c.command.clone(),
        machine: c.machine.clone(),
        timeout_ms: c.timeout_ms,
        js_run: c.js_call.map(|(run, _)| run),
        js_call: c.js_call.map(|(_, call)| call),
        done: c.done,
        held: c.held.clone(),
        approval: c.approval.clone(),
        approved_by: c.approved_by.clone(),
    }
}

fn call(c: &JsCallState) -> String {
    match c {
        JsCallState::Command(id) => format!("command {id}"),
        JsCallState::Subagent(id) => format!("subagent {id}"),
        JsCallState::SpawnQueued { machine, .. } => {
            format!("a subagent waiting for a slot (on {machine})")
        }
        JsCallState::Approval(id) => format!("approval {id}"),
        JsCallState::Settled => "settled".into(),
    }
}

fn program(j: &JsRun) -> pb::ProgramRun {
    pb::ProgramRun {
        run: j.run,
        code: j.code.clone(),
        started_at_ms: j.started_ms,
        snapshot: j.snapshot.clone(),
        step: match &j.step {
            JsStep::Idle => "idle".into(),
            JsStep::Eval => "eval".into(),
            JsStep::Resume { call, .. } => format!("resume {call}"),
        },
        results_waiting: count(j.ready.len()),
        calls: j.calls.iter().map(|(n, c)| (*n, call(c))).collect(),
        spawned: j.spawned as u64,
    }
}

/// A worker whole: its record, `transcript` (the stored messages, in the
/// record's order), the model workers use and its subagents.
pub fn worker(
    w: &WorkerState,
    transcript: Vec<pb::TranscriptMessage>,
    model: String,
    children: Vec<pb::WorkerSummary>,
) -> pb::Worker {
    pb::Worker {
        summary: Some(summary(w)),
        depth: w.depth,
        labels: w.labels.clone().into_iter().collect(),
        transcript,
        inbox: w.inbox.clone(),
        in_flight: w.in_flight,
        turn: w.turn,
        steps: w.steps,
        failures: w.failures,
        retry_at_ms: w.retry_at,
        commands: w.commands.iter().map(|(h, c)| command(h, c)).collect(),
        program: w.js.as_ref().map(program),
        program_runs: w.js_runs,
        dropped_turns: w.dropped_turns,
        policies_shown: w.policies_shown.clone(),
        flags: Some(flags(&w.flags)),
        own_threads: w.own_threads.clone(),
        model,
        children,
        transcript_seqs: w.conversation.seqs().to_vec(),
        transcript_next: w.conversation.next_seq(),
    }
}

pub fn approval(a: &Approval) -> pb::Approval {
    pb::Approval {
        id: a.id.clone(),
        worker: a.worker.clone(),
        thread: a.thread.clone(),
        question: a.question.clone(),
        run: a.run,
        call: a.call,
        state: a.state.name().into(),
        answer_json: a.answer.to_string(),
        by: a.by.clone(),
        created_at_ms: a.created_ms,
        answered_at_ms: a.answered_ms,
        kind: match a.kind {
            ApprovalKind::Question => "question",
            ApprovalKind::Command => "command",
            ApprovalKind::Message => "message",
        }
        .into(),
        machine: a.machine.clone(),
        cmd: a.cmd.clone(),
        reply: a.reply.as_ref().map(|r| pb::HeldReply {
            id: r.id.clone(),
            thread: r.thread.clone(),
            source: r.source.clone(),
            text: r.text.clone(),
            untrusted: r.untrusted.clone(),
        }),
        flags: Some(flags(&a.flags)),
        approvers: a.approvers.clone(),
        refused: a.refused.clone(),
        code: a.code.clone(),
        action: a.action.clone(),
        digest: a.digest.clone(),
        expires_at_ms: a.expires_ms,
    }
}

fn stats(s: &Stats) -> pb::RouterStats {
    pb::RouterStats {
        turns: s.turns,
        model_calls: s.model_calls,
        events: s.events,
        decisions: s.decisions,
        passed_through: s.passed_through,
        replies: s.replies,
        dropped: s.dropped,
        usage: Some(usage(&s.usage)),
    }
}

pub fn router(r: &RouterState, model: String) -> pb::RouterView {
    pb::RouterView {
        model,
        stats: Some(stats(&r.stats)),
        queued: r.queue.len() as u64,
        in_flight: r.in_flight.is_some(),
        conversation_messages: r.conversation.len() as u64,
        dropped_turns: r.dropped_turns,
        subscriptions: r
            .subs
            .iter()
            .map(|(t, ws)| {
                (
                    t.clone(),
                    pb::StringList {
                        items: ws.iter().cloned().collect(),
                    },
                )
            })
            .collect(),
    }
}

pub fn trust(t: &Trust) -> pb::TrustConfig {
    pb::TrustConfig {
        trusted: t.trusted.clone(),
        github_associations: t.github_associations.clone(),
        slack_members: t.slack_members,
        matrix_homeservers: t.matrix_homeservers.clone(),
        approvers: t
            .approvers
            .iter()
            .map(|a| pb::Approver {
                principal: a.principal.clone(),
                label: a.label.clone(),
            })
            .collect(),
    }
}

/// A trust configuration from the API (validated by the caller).
pub fn trust_from(t: pb::TrustConfig) -> Trust {
    Trust {
        trusted: t.trusted,
        github_associations: t.github_associations,
        slack_members: t.slack_members,
        matrix_homeservers: t.matrix_homeservers,
        approvers: t
            .approvers
            .into_iter()
            .map(|a| Approver {
                principal: a.principal,
                label: a.label,
            })
            .collect(),
    }
}

pub fn admin(r: &AdminRecord, by: &str) -> pb::AdminView {
    pb::AdminView {
        name: r.name.clone(),
        spki_sha256: r.spki_sha256.clone(),
        created_at_ms: r.created_ms,
        created_by: r.created_by.clone(),
        revoked_at_ms: r.revoked_ms,
        revoked_by: r.revoked_by.clone(),
        you: by == format!("admin:{}", r.name),
    }
}

pub fn thread_row(
    t: &pb::Thread,
    subs: &BTreeMap<String, std::collections::BTreeSet<String>>,
) -> pb::ThreadRow {
    pb::ThreadRow {
        id: t.id.clone(),
        source: t.source.clone(),
        external: t.external.clone(),
        kind: t.kind.clone(),
        created_at_ms: t.created_at_ms,
        last_trigger_at_ms: t.last_trigger_ms,
        workers: subs
            .get(&t.id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default(),
    }
}

pub fn thread_message(x: &pb::Trigger) -> pb::ThreadMessage {
    pb::ThreadMessage {
        id: x.id.clone(),
        user: x.user.clone(),
        text: x.text.clone(),
        from_bot: x.from_bot,
        created_at_ms: x.created_at_ms,
        decision: x.decision().name().into(),
    }
}
