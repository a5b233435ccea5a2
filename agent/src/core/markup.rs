//! The markup the agents read: every event reaches a model as one
//! `<event …>text</event>` element (approvals and subscriptions have their
//! own tags). People's text is escaped ([`escape`]) so it can never forge an
//! element, and cut to its budget with a pointer to the rest ([`spill`]).

use serde_json::Value;

use crate::budgets::Budgets;
use crate::event::{CommandResult, RouterItem, TriggerInfo};
use crate::prompt::{escape, spill};
use crate::state::{Approval, CmdRef};

fn mention(t: &TriggerInfo) -> &'static str {
    if t.mention {
        " mention"
    } else {
        ""
    }
}

/// A trigger as a worker or the Router sees it.
pub(super) fn trigger(t: &TriggerInfo, chars: usize) -> String {
    let context = if t.context.is_empty() {
        String::new()
    } else {
        format!(
            "<context thread={}>\n{}\n</context>\n",
            t.thread,
            t.context
                .iter()
                .map(|l| escape(l))
                .collect::<Vec<_>>()
                .join("\n")
        )
    };
    let name = if t.user_name.is_empty() || t.user_name == t.user {
        String::new()
    } else {
        format!(" name={:?}", escape(&t.user_name))
    };
    format!(
        "{context}<event trigger={} thread={} source={} user={}{name}{}>{}</event>",
        t.id,
        t.thread,
        t.source,
        escape(&t.user),
        mention(t),
        escape(&spill(&t.text, chars, &t.id))
    )
}

/// One item of the Router's turn.
pub(super) fn router_item(it: &RouterItem, b: &Budgets) -> String {
    match it {
        RouterItem::Trigger(t) => trigger(t, b.trigger_chars),
        RouterItem::Report {
            worker,
            threads,
            status,
            text,
            ..
        } => format!(
            "<event report worker={worker} thread={} threads={} status={status}>{}</event>",
            threads.first().map(String::as_str).unwrap_or("-"),
            if threads.is_empty() {
                "-".to_string()
            } else {
                threads.join(",")
            },
            escape(&spill(text, b.report_chars, worker))
        ),
        RouterItem::Question {
            approval,
            worker,
            thread,
            question,
            ..
        } => format!(
            "<event question approval={approval} worker={worker} thread={thread}>{}</event>",
            escape(&spill(question, b.report_chars, approval))
        ),
        RouterItem::Bounced {
            worker, trigger: t, ..
        } => format!(
            "<event bounced worker={worker} trigger={} thread={} source={} user={}{}>{}</event>",
            t.id,
            t.thread,
            t.source,
            escape(&t.user),
            mention(t),
            escape(&spill(&t.text, b.trigger_chars, &t.id))
        ),
    }
}

/// The thread an item of the Router's queue is about.
pub(super) fn item_thread(it: &RouterItem) -> Option<String> {
    match it {
        RouterItem::Trigger(t) => Some(t.thread.clone()),
        RouterItem::Bounced { trigger, .. } => Some(trigger.thread.clone()),
        RouterItem::Report { threads, .. } => threads.first().cloned(),
        RouterItem::Question { thread, .. } => Some(thread.clone()),
    }
}

/// What the Router is told about a trigger a worker took directly.
/// The owner's policies, as the Router and pass-through workers see them.
pub(super) fn policies(policies: &[String]) -> String {
    let mut text = String::from("Policies now in force:\n");
    if policies.is_empty() {
        text.push_str("(none)");
    }
    let lines: Vec<String> = policies
        .iter()
        .map(|p| format!("- {}", escape(p)))
        .collect();
    text.push_str(&lines.join("\n"));
    text
}

pub(super) fn observed(t: &TriggerInfo, workers: &[String]) -> String {
    format!(
        "{} on {} from {} went to {}: {}",
        t.id,
        t.thread,
        escape(&t.user),
        workers.join(", "),
        escape(&spill(&t.text, 200, &t.id))
    )
}

/// An open request as the Router sees it every turn: which, where, whose;
/// neither its code (the Router could quote it in a forged request) nor
/// the action's text (a tainted worker's words, which would reach every
/// later turn untainted).
pub(super) fn approval(a: &Approval) -> String {
    format!(
        "<approval id={} thread={} worker={}>waiting for an approver's answer (byom posted the request on the thread)</approval>\n",
        a.id, a.thread, a.worker,
    )
}

pub(super) fn subs(thread: &str, workers: &[String]) -> String {
    format!("<subs thread={thread}>{}</subs>\n", workers.join(" "))
}

/// A command's end, for the worker that started it.
pub(super) fn command_done(cmd: &str, c: &CmdRef, r: &CommandResult, chars: usize) -> String {
    format!(
        "<event command={cmd} machine={} state={} exit={} ms={}>`{}`\nstdout: {}\nstderr: {}{}</event>",
        c.machine,
        r.state,
        r.exit_code
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into()),
        r.duration_ms,
        escape(&c.command),
        escape(&spill(&r.stdout, chars, cmd)),
        escape(&spill(&r.stderr, chars, cmd)),
        if r.reason.is_empty() {
            String::new()
        } else {
            format!("\nreason: {}", escape(&r.reason))
        }
    )
}

/// A command still pending on a machine that went offline.
pub(super) fn command_pending(cmd: &str, c: &CmdRef, note: &str) -> String {
    format!(
        "<event command={cmd} machine={} state=pending>`{}`\n{}</event>",
        c.machine,
        escape(&c.command),
        escape(note)
    )
}

pub(super) fn program_done(
    worker: &str,
    run: u64,
    result: &Value,
    logs: &[String],
    chars: usize,
) -> String {
    let logs = if logs.is_empty() {
        String::new()
    } else {
        format!(
            "\nconsole: {}",
            escape(&spill(&logs.join("\n"), 1000, worker))
        )
    };
    format!(
        "<event program={worker}/js{run} state=done>result: {}{logs}</event>",
        escape(&spill(&result.to_string(), chars, worker))
    )
}

pub(super) fn program_error(worker: &str, run: u64, kind: &str, message: &str) -> String {
    format!(
        "<event program={worker}/js{run} state=error kind={kind}>{}</event>",
        escape(message)
    )
}
