//! Tasks and threads in the console: the list of tasks, the list of
//! threads, a thread's timeline and a worker's page with its transcript,
//! and **Cancel** (the API's own `cancel_task`, as the signed-in person).
//!
//! A thread's timeline is assembled from what `byom threads show`,
//! `byom events ls --thread`, `byom show trg_…|wrk_…|apr_…|cmd_…` and
//! `byom outbox ls` read, on the server: the thread's triggers with the
//! fast path's decision and what the agents made of each (their fate:
//! the Router's decision), the workers on the thread (created, where they
//! stand, their last report), their commands with exit codes, the
//! approvals asked on it and their answers, and each reply's delivery
//! (state, attempts, the provider's receipt). Every part is bounded; a
//! page says when it shows only the newest.

use std::collections::HashMap;

use byom_protocol::pb;
use tonic::Status;

use super::pages::{ago, command_line, esc, layout, Viewer};
use super::Console;

/// Triggers of one thread on its timeline (the newest).
pub const TIMELINE_TRIGGERS: usize = 200;
/// Commands of one thread's workers on its timeline.
pub const TIMELINE_COMMANDS: usize = 500;
/// Newest outbox items looked through for a thread's delivery receipts.
pub const RECEIPT_SCAN: u32 = 1000;
/// Transcript messages rendered on a worker's page (its last ones).
pub const TRANSCRIPT_MESSAGES: usize = 500;
/// Characters of one transcript message, tool arguments or report shown.
pub const TEXT_CHARS: usize = 20_000;

/// An open worker with no progress for this long is shown on Needs you.
pub const STALLED_AFTER_MS: u64 = 15 * 60 * 1000;
/// A worker stopped at its model-call budget is shown this long after.
pub const OVER_BUDGET_SHOWN_MS: u64 = 24 * 3600 * 1000;
/// How the core says a worker stopped at `max_worker_steps` (its report).
const STEP_BUDGET_MARK: &str = "(max_worker_steps)";

/// Why a worker needs a person, if it does: it stopped at its model-call
/// budget, its model calls keep failing, or it made no progress for
/// [`STALLED_AFTER_MS`] (with what it waits on). Waiting for an approval
/// is not listed here: the approval is.
pub fn attention(w: &pb::Worker, now: u64) -> Option<String> {
    let s = w.summary.as_ref()?;
    let quiet = now.saturating_sub(s.updated_at_ms);
    match s.status.as_str() {
        "failed" if s.last_report.contains(STEP_BUDGET_MARK) && quiet < OVER_BUDGET_SHOWN_MS => {
            Some(format!(
                "over budget: stopped after {} model calls (max_worker_steps)",
                w.steps
            ))
        }
        "running" if w.failures > 0 => Some(format!(
            "its model calls fail: {} in a row{}",
            w.failures,
            w.retry_at_ms
                .map(|r| format!(", next try {}", byom_protocol::time::rfc3339(r)))
                .unwrap_or_default()
        )),
        "running" if quiet >= STALLED_AFTER_MS => {
            let on = if s.running_commands > 0 {
                format!("{} command(s) still running", s.running_commands)
            } else if w.in_flight.is_some() {
                "a model call that has not answered".into()
            } else if let Some(p) = &w.program {
                format!("its program js{} ({})", p.run, p.step)
            } else {
                "nothing the core knows of".into()
            };
            Some(format!(
                "stalled: no progress for {} min; it waits on {on}",
                quiet / 60_000
            ))
        }
        _ => None,
    }
}

/// `text` cut to `n` characters, saying so.
fn cut(text: &str, n: usize) -> String {
    match text.char_indices().nth(n) {
        Some((i, _)) => format!(
            "{}… ({} more characters)",
            &text[..i],
            text[i..].chars().count()
        ),
        None => text.to_string(),
    }
}

/// A time as people read it on a timeline: how long ago, with the exact
/// time as the tooltip.
fn when(ms: u64, now: u64) -> String {
    format!(
        "<time title=\"{}\">{}</time>",
        esc(&byom_protocol::time::rfc3339(ms)),
        ago(ms, now)
    )
}

fn id_link(id: &str) -> String {
    let path = match id.split_once('_').map(|(p, _)| p) {
        Some("cmd") => "commands",
        Some("wrk") => "workers",
        Some("thr") => "threads",
        _ => return format!("<code>{}</code>", esc(id)),
    };
    format!("<a href=\"/{path}/{id}\">{id}</a>", id = esc(id))
}

/// Everything a thread's timeline shows, read by [`Console::thread_data`].
pub struct ThreadData {
    pub thread: pb::Thread,
    /// Newest first, each with its fate (what the agents made of it).
    pub triggers: Vec<(pb::Trigger, Option<String>)>,
    /// Whether older triggers exist beyond [`TIMELINE_TRIGGERS`].
    pub more_triggers: bool,
    pub workers: Vec<pb::Worker>,
    pub commands: HashMap<String, pb::Command>,
    pub approvals: Vec<pb::Approval>,
    /// The thread's outbox items (among the newest [`RECEIPT_SCAN`]).
    pub outbox: Vec<pb::OutboxItem>,
}

/// One line of a timeline: when, its order among lines at the same
/// millisecond, its HTML.
struct Entry {
    at: u64,
    order: u8,
    html: String,
}

fn entry(at: u64, order: u8, kind: &str, now: u64, body: String) -> Entry {
    Entry {
        at,
        order,
        html: format!(
            "<li class=\"ev {kind}\"><span class=\"when\">{}</span> {body}</li>",
            when(at, now)
        ),
    }
}

fn delivery(o: &pb::OutboxItem, now: u64) -> String {
    let state = o.state().as_str_name();
    let state = state
        .strip_prefix("OUTBOX_")
        .unwrap_or(state)
        .to_lowercase();
    let mut s = format!(
        "<span class=\"delivery\">via {} <code>{}</code>: <span class=\"state {st}\">{st}</span>",
        esc(&o.connector),
        esc(&o.id),
        st = esc(&state)
    );
    if !o.receipt.is_empty() {
        s.push_str(&format!(
            ", receipt <code>{}</code> {}",
            esc(&o.receipt),
            when(o.sent_at_ms, now)
        ));
    }
    if o.attempts > 0 {
        s.push_str(&format!(", {} attempts", o.attempts));
    }
    if !o.last_error.is_empty() {
        s.push_str(&format!(", last error: {}", esc(&o.last_error)));
    }
    if o.maybe_duplicate {
        s.push_str(", may have been posted twice");
    }
    s.push_str("</span>");
    s
}

/// The timeline's lines, oldest first.
fn entries(d: &ThreadData, now: u64) -> Vec<Entry> {
    let mut out = Vec::new();
    let receipts: HashMap<&str, Vec<&pb::OutboxItem>> =
        d.outbox.iter().fold(HashMap::new(), |mut m, o| {
            m.entry(o.reply_id.as_str()).or_default().push(o);
            m
        });
    for (t, fate) in &d.triggers {
        // byom's own, as the core judges it (no principal: a webhook body
        // saying `"user": "byom"` is someone else's message).
        let reply = crate::triggers::is_own_reply(t);
        let body = if reply {
            let sent: Vec<String> = receipts
                .get(t.id.as_str())
                .map(|v| v.iter().map(|o| delivery(o, now)).collect())
                .unwrap_or_default();
            format!(
                "<strong>byom replied</strong> <code>{}</code><pre class=\"said\">{}</pre>{}",
                esc(&t.id),
                esc(&cut(&t.text, TEXT_CHARS)),
                if sent.is_empty() {
                    "<span class=\"muted\">kept in byom (no connector to deliver it)</span>"
                        .to_string()
                } else {
                    sent.join("<br>")
                }
            )
        } else {
            let who = if t.user_name.is_empty() {
                esc(&t.user)
            } else {
                format!("{} ({})", esc(&t.user_name), esc(&t.user))
            };
            format!(
                "<strong>{who}</strong> said <code>{}</code>{}<pre class=\"said\">{}</pre><span class=\"muted\">fast path: {} ({}){}</span>{}",
                esc(&t.id),
                if t.trusted { "" } else { " · untrusted" },
                esc(&cut(&t.text, TEXT_CHARS)),
                esc(t.decision().as_str_name()).to_lowercase(),
                esc(&t.reason),
                if t.mention { " · addressed" } else { "" },
                match fate {
                    Some(f) => format!("<br><span class=\"fate\">→ {}</span>", esc(f)),
                    None => String::new(),
                }
            )
        };
        out.push(entry(
            t.created_at_ms,
            0,
            if reply { "reply" } else { "trigger" },
            now,
            body,
        ));
    }
    for w in &d.workers {
        let Some(s) = &w.summary else { continue };
        out.push(entry(
            s.created_at_ms,
            1,
            "worker",
            now,
            format!(
                "{} {} started{}: {}",
                if s.parent.is_some() {
                    "subagent"
                } else {
                    "task"
                },
                id_link(&s.id),
                s.parent
                    .as_ref()
                    .map(|p| format!(" by {}", id_link(p)))
                    .unwrap_or_default(),
                esc(&cut(&s.task, 300))
            ),
        ));
        if s.updated_at_ms > s.created_at_ms {
            out.push(entry(
                s.updated_at_ms,
                3,
                "worker",
                now,
                format!(
                    "{} is <span class=\"state {st}\">{st}</span> after {} model calls ({} commands){}",
                    id_link(&s.id),
                    s.model_calls,
                    s.commands,
                    if s.last_report.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; reported:<pre class=\"said\">{}</pre>",
                            esc(&cut(&s.last_report, TEXT_CHARS))
                        )
                    },
                    st = esc(&s.status),
                ),
            ));
        }
        for c in &w.commands {
            let Some(cmd) = d.commands.get(&c.handle) else {
                if let Some(apr) = &c.held {
                    out.push(entry(
                        s.updated_at_ms,
                        2,
                        "command",
                        now,
                        format!(
                            "{} holds <code>{}</code> on {} for approval <code>{}</code>",
                            id_link(&s.id),
                            esc(&c.command),
                            esc(&c.machine),
                            esc(apr)
                        ),
                    ));
                }
                continue;
            };
            let exit = match (cmd.exit_code, cmd.signal) {
                (Some(e), _) => format!(", exit {e}"),
                (None, Some(sig)) => format!(", signal {sig}"),
                _ => String::new(),
            };
            out.push(entry(
                cmd.created_at_ms,
                2,
                "command",
                now,
                format!(
                    "{} ran {} <code>{}</code> on {}: <span class=\"state {st}\">{st}</span>{exit}{}",
                    id_link(&s.id),
                    id_link(&cmd.id),
                    esc(&cut(&command_line(cmd), 500)),
                    esc(&c.machine),
                    if c.approved_by.is_empty() {
                        String::new()
                    } else {
                        format!(" (approved by {})", esc(&c.approved_by))
                    },
                    st = esc(cmd.state().name()),
                ),
            ));
        }
    }
    for a in &d.approvals {
        out.push(entry(
            a.created_at_ms,
            2,
            "approval",
            now,
            format!(
                "{} asked approval <code>{}</code> (code <code>{}</code>, {}): <pre class=\"said\">{}</pre>",
                id_link(&a.worker),
                esc(&a.id),
                esc(&a.code),
                esc(&a.kind),
                esc(&cut(&a.question, TEXT_CHARS))
            ),
        ));
        if a.answered_at_ms > 0 {
            out.push(entry(
                a.answered_at_ms,
                2,
                "approval",
                now,
                format!(
                    "approval <code>{}</code> <span class=\"state {st}\">{st}</span>{}",
                    esc(&a.id),
                    if a.by.is_empty() {
                        String::new()
                    } else {
                        format!(" by {}", esc(&a.by))
                    },
                    st = esc(&a.state),
                ),
            ));
        }
    }
    out.sort_by_key(|e| (e.at, e.order));
    out
}

pub fn thread_page(v: &Viewer, d: &ThreadData, now: u64) -> String {
    let t = &d.thread;
    let mut b = format!(
        "<table class=\"facts\"><tr><th>Source</th><td>{}</td></tr><tr><th>Name</th><td>{}</td></tr><tr><th>Kind</th><td>{}</td></tr><tr><th>Started</th><td>{}</td></tr></table>",
        esc(&t.source),
        esc(&t.external),
        esc(&t.kind),
        when(t.created_at_ms, now)
    );
    b.push_str("<h2>Timeline</h2>");
    if d.more_triggers {
        b.push_str(&format!(
            "<p class=\"muted\">The newest {TIMELINE_TRIGGERS} messages; older ones: <code>byom events ls --thread {}</code>.</p>",
            esc(&t.id)
        ));
    }
    let lines = entries(d, now);
    if lines.is_empty() {
        b.push_str("<p class=\"empty\">Nothing on this thread yet.</p>");
    } else {
        b.push_str("<ol class=\"timeline\">");
        for e in lines {
            b.push_str(&e.html);
        }
        b.push_str("</ol>");
    }
    layout(&format!("Thread {}", t.id), Some(v), &b)
}

fn worker_rows(ws: &[pb::WorkerSummary], now: u64) -> String {
    let mut b = String::from(
        "<table><tr><th>ID</th><th>Status</th><th>Task</th><th>Threads</th><th>Machine</th><th>Model calls</th><th>Commands</th><th>Flags</th><th>Updated</th></tr>",
    );
    for w in ws {
        b.push_str(&format!(
            "<tr><td>{}</td><td class=\"state {st}\">{st}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ({} running)</td><td>{}</td><td>{}</td></tr>",
            id_link(&w.id),
            esc(&cut(&w.task, 200)),
            w.threads.iter().map(|t| id_link(t)).collect::<Vec<_>>().join(" "),
            esc(&w.machine),
            w.model_calls,
            w.commands,
            w.running_commands,
            esc(&w.rule_of_two),
            ago(w.updated_at_ms, now),
            st = esc(&w.status),
        ));
    }
    b.push_str("</table>");
    b
}

pub fn tasks_page(v: &Viewer, ws: &[pb::WorkerSummary], now: u64) -> String {
    let mut b = worker_rows(ws, now);
    if ws.is_empty() {
        b.push_str("<p class=\"empty\">No tasks yet: the Router starts one when a message asks for work.</p>");
    }
    layout("Tasks", Some(v), &b)
}

pub fn threads_page(v: &Viewer, ts: &[pb::ThreadRow], now: u64) -> String {
    let mut b = String::from(
        "<table><tr><th>ID</th><th>Source</th><th>Name</th><th>Last message</th><th>Workers</th></tr>",
    );
    for t in ts {
        b.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            id_link(&t.id),
            esc(&t.source),
            esc(&t.external),
            ago(t.last_trigger_at_ms, now),
            t.workers
                .iter()
                .map(|w| id_link(w))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    b.push_str("</table>");
    if ts.is_empty() {
        b.push_str("<p class=\"empty\">No threads yet.</p>");
    }
    layout("Threads", Some(v), &b)
}

fn cancel_form(v: &Viewer, id: &str) -> String {
    if v.read_only {
        return "<p class=\"muted\">Read-only session: cancel with <code>byom tasks cancel</code> or a full session.</p>".into();
    }
    format!(
        r#"<form method="post" action="/workers/{id}/cancel" class="inline"><input type="hidden" name="csrf" value="{csrf}"><button class="deny" id="cancel-{id}">Cancel</button></form> <span class="muted">stops it, its subagents and its running commands</span>"#,
        id = esc(id),
        csrf = esc(v.csrf)
    )
}

/// A worker whole: what it is doing, its commands, subagents and
/// transcript (the last [`TRANSCRIPT_MESSAGES`]), with Cancel while it
/// is open.
pub fn worker_page(v: &Viewer, w: &pb::Worker, note: Option<&str>, now: u64) -> String {
    let s = w.summary.clone().unwrap_or_default();
    let open = !matches!(s.status.as_str(), "done" | "failed" | "cancelled");
    let mut b = String::new();
    if let Some(n) = note {
        b.push_str(&format!("<p class=\"note\" id=\"note\">{}</p>", esc(n)));
    }
    let usage = s.usage.unwrap_or_default();
    b.push_str(&format!(
        r#"<table class="facts">
<tr><th>Status</th><td id="status" class="state {st}">{st}</td></tr>
<tr><th>Task</th><td><pre class="said">{task}</pre></td></tr>
<tr><th>Started by</th><td>{parent}</td></tr>
<tr><th>Threads</th><td>{threads}</td></tr>
<tr><th>Machine</th><td>{machine}</td></tr>
<tr><th>Model</th><td>{model}</td></tr>
<tr><th>Created</th><td>{created}</td></tr>
<tr><th>Updated</th><td>{updated}</td></tr>
<tr><th>Model calls</th><td>{calls} since it woke ({failures} failed{retry})</td></tr>
<tr><th>Tokens</th><td>{tin} in ({tcache} cached), {tout} out</td></tr>
<tr><th>Rule of Two</th><td>{flags} {why}</td></tr>
<tr><th>Last report</th><td><pre class="said">{report}</pre></td></tr>
</table>"#,
        st = esc(&s.status),
        task = esc(&cut(&s.task, TEXT_CHARS)),
        parent = s
            .parent
            .as_deref()
            .map(id_link)
            .unwrap_or_else(|| "the Router (a task)".into()),
        threads = s
            .threads
            .iter()
            .map(|t| id_link(t))
            .collect::<Vec<_>>()
            .join(" "),
        machine = esc(&s.machine),
        model = esc(&w.model),
        created = when(s.created_at_ms, now),
        updated = when(s.updated_at_ms, now),
        calls = w.steps,
        failures = w.failures,
        retry = w
            .retry_at_ms
            .map(|r| format!(", next try {}", esc(&byom_protocol::time::rfc3339(r))))
            .unwrap_or_default(),
        tin = usage.input_tokens,
        tcache = usage.cache_read_tokens,
        tout = usage.output_tokens,
        flags = esc(&s.rule_of_two),
        why = esc(&s.containment),
        report = esc(&cut(&s.last_report, TEXT_CHARS)),
    ));
    if open {
        b.push_str(&cancel_form(v, &s.id));
    }
    b.push_str(&format!("<h2>Commands ({})</h2>", w.commands.len()));
    if !w.commands.is_empty() {
        b.push_str("<table><tr><th>ID</th><th>Machine</th><th>Command</th><th>Done</th><th>Approval</th></tr>");
        for c in w.commands.iter().take(TIMELINE_COMMANDS) {
            b.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                id_link(&c.handle),
                esc(&c.machine),
                esc(&cut(&c.command, 500)),
                if c.done { "yes" } else { "no" },
                match (&c.held, &c.approval) {
                    (Some(h), _) => format!("waiting for <code>{}</code>", esc(h)),
                    (None, Some(a)) =>
                        format!("<code>{}</code> by {}", esc(a), esc(&c.approved_by)),
                    _ => String::new(),
                }
            ));
        }
        b.push_str("</table>");
    }
    if !w.children.is_empty() {
        b.push_str(&format!("<h2>Subagents ({})</h2>", w.children.len()));
        b.push_str(&worker_rows(&w.children, now));
    }
    if let Some(p) = &w.program {
        b.push_str(&format!(
            "<h2>Program js{} ({})</h2><pre>{}</pre>",
            p.run,
            esc(&p.step),
            esc(&cut(&p.code, TEXT_CHARS))
        ));
    }
    b.push_str(&format!(
        "<h2>Transcript ({} messages)</h2>",
        w.transcript.len()
    ));
    let skip = w.transcript.len().saturating_sub(TRANSCRIPT_MESSAGES);
    if skip > 0 {
        b.push_str(&format!(
            "<p class=\"muted\">The last {TRANSCRIPT_MESSAGES}; all of it: <code>byom workers show {} --json</code>.</p>",
            esc(&s.id)
        ));
    }
    b.push_str("<ol class=\"transcript\">");
    for m in w.transcript.iter().skip(skip) {
        b.push_str(&format!(
            "<li class=\"msg {role}\"><span class=\"role\">{role}</span>{call}<pre>{}</pre>",
            esc(&cut(&m.text, TEXT_CHARS)),
            role = esc(&m.role),
            call = if m.call_id.is_empty() {
                String::new()
            } else {
                format!(" <span class=\"muted\">answers {}</span>", esc(&m.call_id))
            },
        ));
        for c in &m.tool_calls {
            b.push_str(&format!(
                "<p class=\"tool\">calls <code>{}</code> ({}):</p><pre>{}</pre>",
                esc(&c.name),
                esc(&c.id),
                esc(&cut(&c.arguments_json, TEXT_CHARS))
            ));
        }
        b.push_str("</li>");
    }
    b.push_str("</ol>");
    let title = if s.parent.is_some() {
        "Subagent"
    } else {
        "Task"
    };
    layout(&format!("{title} {}", s.id), Some(v), &b)
}

impl Console {
    /// What a thread's timeline shows, from the store and the API.
    pub(super) fn thread_data(&self, id: &str) -> Result<ThreadData, Status> {
        let unavailable = |e: byom_store::StoreError| Status::unavailable(e.to_string());
        let store = &self.api.store;
        let thread = store
            .get_thread(id)
            .map_err(unavailable)?
            .ok_or_else(|| Status::not_found(format!("no thread {id}")))?;
        let mut triggers = store
            .list_triggers(Some(&thread.id), TIMELINE_TRIGGERS + 1)
            .map_err(unavailable)?;
        let more_triggers = triggers.len() > TIMELINE_TRIGGERS;
        triggers.truncate(TIMELINE_TRIGGERS);
        let triggers = triggers
            .into_iter()
            .map(|t| {
                let fate = self.api.fate(&t.id)?.fate;
                Ok((t, fate))
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let workers = self.api.workers_where(|w| w.threads.contains(&thread.id))?;
        let mut commands = HashMap::new();
        for c in workers
            .iter()
            .flat_map(|w| &w.commands)
            .take(TIMELINE_COMMANDS)
        {
            if let Some(cmd) = store.get_command(&c.handle).map_err(unavailable)? {
                commands.insert(c.handle.clone(), cmd);
            }
        }
        let mine: std::collections::HashSet<&str> = workers
            .iter()
            .filter_map(|w| w.summary.as_ref().map(|s| s.id.as_str()))
            .collect();
        let approvals = self
            .api
            .list_approvals(true)?
            .approvals
            .into_iter()
            .filter(|a| a.thread == thread.id || mine.contains(a.worker.as_str()))
            .collect();
        let outbox = self
            .api
            .channels
            .list_outbox(false, RECEIPT_SCAN)
            .map_err(|e| Status::unavailable(e.to_string()))?
            .into_iter()
            .filter(|o| o.thread_id == thread.id)
            .collect();
        Ok(ThreadData {
            thread,
            triggers,
            more_triggers,
            workers,
            commands,
            approvals,
            outbox,
        })
    }

    pub(super) fn tasks(&self, v: &Viewer, now: u64) -> Result<String, Status> {
        let ws = self.api.list_workers(false)?.workers;
        Ok(tasks_page(v, &ws, now))
    }

    pub(super) fn threads(&self, v: &Viewer, now: u64) -> Result<String, Status> {
        let ts = self.api.threads()?.threads;
        Ok(threads_page(v, &ts, now))
    }

    pub(super) fn thread(&self, v: &Viewer, id: &str, now: u64) -> Result<String, Status> {
        Ok(thread_page(v, &self.thread_data(id)?, now))
    }

    pub(super) fn worker(
        &self,
        v: &Viewer,
        id: &str,
        query: &str,
        now: u64,
    ) -> Result<String, Status> {
        let w = self.api.worker(id)?;
        let note = (super::form_field(query, "cancelled") == Some("1"))
            .then_some("Cancelling: its subagents and running commands stop.");
        Ok(worker_page(v, &w, note, now))
    }

    /// `POST /workers/ID/cancel`: the API's cancel, as `who`.
    pub(super) async fn cancel(&self, id: &str, who: &str) -> Result<String, Status> {
        let req = pb::CancelTaskRequest {
            id: id.to_string(),
            ..Default::default()
        };
        self.api.cancel_task(req, who).await?;
        tracing::info!(worker = id, by = %who, "cancelled in the console");
        Ok(format!("/workers/{id}?cancelled=1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_escapes_and_orders() {
        let mut trg = pb::Trigger {
            id: "trg_1".into(),
            user: "eve".into(),
            text: "<script>alert(1)</script>".into(),
            created_at_ms: 1000,
            ..Default::default()
        };
        trg.set_decision(pb::TriggerDecision::Candidate);
        let reply = pb::Trigger {
            id: "trg_2".into(),
            user: "byom".into(),
            from_bot: true,
            text: "done <b>".into(),
            created_at_ms: 3000,
            ..Default::default()
        };
        let w = pb::Worker {
            summary: Some(pb::WorkerSummary {
                id: "wrk_1".into(),
                status: "done".into(),
                task: "<img src=x>".into(),
                created_at_ms: 2000,
                updated_at_ms: 2500,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut o = pb::OutboxItem {
            id: "out_1".into(),
            reply_id: "trg_2".into(),
            connector: "acme".into(),
            receipt: "1700.1".into(),
            ..Default::default()
        };
        o.set_state(pb::OutboxState::OutboxSent);
        let d = ThreadData {
            thread: pb::Thread {
                id: "thr_1".into(),
                ..Default::default()
            },
            triggers: vec![
                (reply, None),
                (trg, Some("given to a new worker, wrk_1".into())),
            ],
            more_triggers: false,
            workers: vec![w],
            commands: HashMap::new(),
            approvals: vec![],
            outbox: vec![o],
        };
        let v = Viewer {
            who: "admin:a",
            read_only: false,
            csrf: "t",
        };
        let page = thread_page(&v, &d, 10_000);
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("<img"), "{page}");
        assert!(!page.contains("done <b>"), "{page}");
        let said = page.find("alert(1)").unwrap();
        let started = page.find("task <a href=\"/workers/wrk_1\"").unwrap();
        let replied = page.find("byom replied").unwrap();
        assert!(said < started && started < replied, "{page}");
        assert!(page.contains("→ given to a new worker, wrk_1"));
        assert!(page.contains("receipt <code>1700.1</code>"), "{page}");
        assert_eq!(cut("abcdef", 3), "abc… (3 more characters)");
        assert_eq!(cut("ab", 3), "ab");
    }

    #[test]
    fn stalled_failing_and_over_budget_workers_need_a_person() {
        let now = 10 * STALLED_AFTER_MS;
        let w = |status: &str, updated: u64, report: &str| pb::Worker {
            summary: Some(pb::WorkerSummary {
                id: "wrk_1".into(),
                status: status.into(),
                updated_at_ms: updated,
                last_report: report.into(),
                running_commands: 1,
                ..Default::default()
            }),
            steps: 64,
            ..Default::default()
        };
        assert_eq!(attention(&w("running", now - 1000, ""), now), None);
        let stalled = attention(&w("running", now - STALLED_AFTER_MS, ""), now).unwrap();
        assert!(
            stalled.contains("15 min") && stalled.contains("1 command"),
            "{stalled}"
        );
        let mut failing = w("running", now, "");
        failing.failures = 3;
        assert!(attention(&failing, now).unwrap().contains("3 in a row"));
        let stuck = "stopped after 64 model calls (max_worker_steps): it looks stuck or looping";
        assert!(attention(&w("failed", now, stuck), now)
            .unwrap()
            .starts_with("over budget"));
        assert_eq!(attention(&w("failed", now, "model unreachable"), now), None);
        assert_eq!(
            attention(&w("waiting", 0, ""), now),
            None,
            "the approval is listed"
        );
    }
}
