//! The console's pages as HTML strings, rendered on the server from the
//! API's messages. Every value from outside goes through [`esc`]; the only
//! script and style are the files served beside the pages (the
//! Content-Security-Policy forbids inline ones), and every form that
//! changes something is a POST carrying the session's CSRF token.

use byom_protocol::pb;

/// Escapes text for HTML content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Who is looking, for the header and the forms.
pub struct Viewer<'a> {
    pub who: &'a str,
    pub read_only: bool,
    pub csrf: &'a str,
}

/// A whole page: header with navigation, `body`.
pub fn layout(title: &str, v: Option<&Viewer>, body: &str) -> String {
    let nav = match v {
        Some(v) => format!(
            r#"<nav><a href="/">Needs you</a> <a href="/tasks">Tasks</a> <a href="/threads">Threads</a> <a href="/machines">Machines</a> <a href="/commands">Commands</a> <a href="/audit">Audit</a> <a href="/connectors">Connectors</a> <a href="/trust">Trust</a>
<span class="who">{}{}</span>
<form method="post" action="/logout" class="inline"><input type="hidden" name="csrf" value="{}"><button>Sign out</button></form></nav>"#,
            esc(v.who),
            if v.read_only { " (read-only)" } else { "" },
            esc(v.csrf)
        ),
        None => String::new(),
    };
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{} · byom</title><link rel="stylesheet" href="/console.css"></head>
<body><header><strong>byom</strong> {nav}</header><main>
<h1>{}</h1>
{body}
</main></body></html>
"#,
        esc(title),
        esc(title)
    )
}

/// A page saying why something was refused, and what to do.
pub fn refusal(title: &str, why: &str, next: &str) -> String {
    layout(
        title,
        None,
        &format!("<p class=\"refused\">{}</p><p>{}</p>", esc(why), esc(next)),
    )
}

/// How long ago `ms` was, for people.
pub fn ago(ms: u64, now: u64) -> String {
    if ms == 0 {
        return "—".into();
    }
    let s = now.saturating_sub(ms) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

/// A machine's state, as `byom machines ls` says it.
pub fn machine_state(m: &pb::Machine) -> &'static str {
    if m.revoked {
        "revoked"
    } else if m.online && m.paused {
        "paused"
    } else if m.online {
        "online"
    } else if m.asleep_since_ms != 0 {
        "asleep"
    } else {
        "offline"
    }
}

/// A command line as shown: the shell text, or the argv joined.
pub fn command_line(c: &pb::Command) -> String {
    if !c.shell.is_empty() {
        c.shell.clone()
    } else {
        c.argv.join(" ")
    }
}

/// The Retry button of a failed reply (none for a read-only session).
pub fn retry_form(v: &Viewer, id: &str) -> String {
    if v.read_only {
        return String::new();
    }
    format!(
        r#"<form method="post" action="/outbox/{id}/retry" class="inline"><input type="hidden" name="csrf" value="{csrf}"><button id="retry-{id}">Retry</button></form>"#,
        id = esc(id),
        csrf = esc(v.csrf)
    )
}

/// What "Needs you" shows.
pub struct NeedsYou<'a> {
    pub approvals: &'a [pb::Approval],
    /// Workers stalled, failing or over budget, and why.
    pub workers: &'a [(pb::Worker, String)],
    /// Machines not online that hold queued commands.
    pub waiting_machines: Vec<&'a pb::Machine>,
    pub failed_outbox: &'a [pb::OutboxItem],
    /// A note from the last action (e.g. "Approved apr_…").
    pub note: Option<String>,
    /// What the page lists, hashed: its live stream says when it moves.
    pub digest: String,
}

pub fn home(v: &Viewer, n: &NeedsYou, now: u64) -> String {
    let mut b = String::new();
    if let Some(note) = &n.note {
        b.push_str(&format!("<p class=\"note\" id=\"note\">{}</p>", esc(note)));
    }
    b.push_str(&format!(
        "<h2>Approvals waiting ({})</h2>",
        n.approvals.len()
    ));
    if n.approvals.is_empty() {
        b.push_str("<p class=\"empty\">Nothing waits for an approval.</p>");
    }
    for a in n.approvals {
        b.push_str(&approval(v, a, now));
    }
    b.push_str(&format!(
        "<h2>Workers stalled or over budget ({})</h2>",
        n.workers.len()
    ));
    if n.workers.is_empty() {
        b.push_str("<p class=\"empty\">No worker is stalled, failing or over budget.</p>");
    } else {
        b.push_str("<table><tr><th>Worker</th><th>Status</th><th>Task</th><th>Why</th><th>Updated</th></tr>");
        for (w, why) in n.workers {
            let s = w.summary.clone().unwrap_or_default();
            b.push_str(&format!(
                "<tr><td><a href=\"/workers/{id}\">{id}</a></td><td class=\"state {st}\">{st}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&s.task.chars().take(200).collect::<String>()),
                esc(why),
                ago(s.updated_at_ms, now),
                id = esc(&s.id),
                st = esc(&s.status),
            ));
        }
        b.push_str("</table>");
    }
    b.push_str(&format!(
        "<h2>Machines away with work queued ({})</h2>",
        n.waiting_machines.len()
    ));
    if n.waiting_machines.is_empty() {
        b.push_str("<p class=\"empty\">No machine that is away holds queued work.</p>");
    } else {
        b.push_str("<table><tr><th>Machine</th><th>State</th><th>Queued</th><th>Last seen</th><th>Why</th></tr>");
        for m in &n.waiting_machines {
            b.push_str(&format!(
                "<tr><td>{}</td><td class=\"state {st}\">{st}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&m.name),
                m.queued_commands,
                ago(m.last_seen_ms, now),
                esc(&m.offline_reason),
                st = machine_state(m),
            ));
        }
        b.push_str("</table>");
    }
    b.push_str(&format!(
        "<h2>Replies that failed to send ({})</h2>",
        n.failed_outbox.len()
    ));
    if n.failed_outbox.is_empty() {
        b.push_str("<p class=\"empty\">No failed replies.</p>");
    } else {
        b.push_str(
            "<table><tr><th>ID</th><th>Connector</th><th>Thread</th><th>Error</th><th></th></tr>",
        );
        for o in n.failed_outbox {
            b.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&o.id),
                esc(&o.connector),
                esc(&o.external),
                esc(&o.last_error),
                retry_form(v, &o.id)
            ));
        }
        b.push_str("</table>");
    }
    b.push_str(&format!(
        "<p class=\"muted\" id=\"needs-you\" data-events=\"/needs-you/events?since={}\">This page reloads itself when something here changes.</p><script src=\"/console.js\"></script>",
        esc(&n.digest)
    ));
    layout("Needs you", Some(v), &b)
}

/// One waiting approval: the core's request exactly, and its buttons.
fn approval(v: &Viewer, a: &pb::Approval, now: u64) -> String {
    let flags = a
        .flags
        .as_ref()
        .map(|f| {
            let mut s = Vec::new();
            for (on, name) in [
                (!f.untrusted.is_empty(), "A untrusted input"),
                (!f.sensitive.is_empty(), "B sensitive access"),
                (!f.acts.is_empty(), "C state change"),
            ] {
                if on {
                    s.push(name);
                }
            }
            if s.is_empty() {
                "none".into()
            } else {
                s.join(", ")
            }
        })
        .unwrap_or_default();
    let buttons = if v.read_only {
        "<p class=\"muted\">Read-only session: answer with <code>byom approvals</code> or a full session.</p>".to_string()
    } else {
        format!(
            r#"<form method="post" action="/approvals/{id}/approve" class="inline"><input type="hidden" name="csrf" value="{csrf}"><button class="approve" id="approve-{id}">Approve</button></form>
<form method="post" action="/approvals/{id}/deny" class="inline"><input type="hidden" name="csrf" value="{csrf}"><button class="deny" id="deny-{id}">Deny</button></form>"#,
            id = esc(&a.id),
            csrf = esc(v.csrf)
        )
    };
    let action = if a.action.is_empty() {
        String::new()
    } else {
        format!(
            "<p>Action:</p><pre class=\"action\">{}</pre>",
            esc(&a.action)
        )
    };
    format!(
        r#"<section class="approval" id="{id}"><p><strong>{id}</strong> · code <code>{code}</code> · {kind}{machine} · asked {asked} · worker {worker}</p>
<pre class="question">{question}</pre>{action}
<p class="muted">Flags: {flags} · may answer: {approvers}</p>
{buttons}</section>"#,
        id = esc(&a.id),
        code = esc(&a.code),
        kind = esc(&a.kind),
        machine = if a.machine.is_empty() {
            String::new()
        } else {
            format!(" on {}", esc(&a.machine))
        },
        asked = ago(a.created_at_ms, now),
        worker = esc(&a.worker),
        question = esc(&a.question),
        flags = esc(&flags),
        approvers = esc(&if a.approvers.is_empty() {
            "any admin".to_string()
        } else {
            a.approvers.join(", ")
        }),
    )
}

pub fn machines(v: &Viewer, ms: &[pb::Machine], shipped: &str, now: u64) -> String {
    let mut b = String::from(
        "<table><tr><th>Name</th><th>State</th><th>Busy</th><th>Version</th><th>Sandbox</th><th>Labels</th><th>Last seen</th><th>ID</th></tr>",
    );
    for m in ms {
        let version = if !shipped.is_empty() && !m.version.is_empty() && m.version != shipped {
            format!("{} (behind {})", esc(&m.version), esc(shipped))
        } else {
            esc(&m.version)
        };
        let mut labels: Vec<_> = m.labels.iter().collect();
        labels.sort();
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("<code>{}={}</code>", esc(k), esc(v)))
            .collect();
        b.push_str(&format!(
            "<tr><td>{}</td><td class=\"state {st}\">{st}</td><td>{} running, {} queued</td><td>{version}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&m.name),
            m.running_commands,
            m.queued_commands,
            esc(&m.sandbox),
            labels.join(" "),
            ago(m.last_seen_ms, now),
            esc(&m.id),
            st = machine_state(m),
        ));
    }
    b.push_str("</table>");
    if ms.is_empty() {
        b.push_str("<p class=\"empty\">No machines yet: <code>byom token create</code>, then <code>byomd pair</code> on the laptop.</p>");
    }
    layout("Machines", Some(v), &b)
}

pub fn commands(
    v: &Viewer,
    cs: &[pb::Command],
    names: &std::collections::HashMap<String, String>,
    now: u64,
) -> String {
    let mut b = String::from(
        "<table><tr><th>ID</th><th>Machine</th><th>State</th><th>Exit</th><th>Command</th><th>By</th><th>Created</th></tr>",
    );
    for c in cs {
        b.push_str(&format!(
            "<tr><td><a href=\"/commands/{id}\">{id}</a></td><td>{}</td><td class=\"state\">{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            esc(names.get(&c.machine_id).unwrap_or(&c.machine_id)),
            esc(c.state().name()),
            c.exit_code.map(|e| e.to_string()).unwrap_or_default(),
            esc(&command_line(c)),
            esc(&c.requested_by),
            ago(c.created_at_ms, now),
            id = esc(&c.id),
        ));
    }
    b.push_str("</table>");
    if cs.is_empty() {
        b.push_str("<p class=\"empty\">No commands yet.</p>");
    }
    layout("Commands", Some(v), &b)
}

/// A command with the output the store holds so far (`out`: stdout and
/// stderr text, and the offsets they end at); the script follows the rest
/// live from those offsets.
pub fn command(
    v: &Viewer,
    c: &pb::Command,
    machine: &str,
    out: [(String, u64); 2],
    now: u64,
) -> String {
    let exit = match (c.exit_code, c.signal) {
        (Some(e), _) => e.to_string(),
        (None, Some(s)) => format!("signal {s}"),
        _ => String::new(),
    };
    let b = format!(
        r#"<table class="facts">
<tr><th>Command</th><td><code>{line}</code></td></tr>
<tr><th>Machine</th><td>{machine}</td></tr>
<tr><th>State</th><td id="state" class="state">{state}</td></tr>
<tr><th>Exit</th><td id="exit">{exit}</td></tr>
<tr><th>Requested by</th><td>{by}</td></tr>
<tr><th>Approved by</th><td>{approved}</td></tr>
<tr><th>Created</th><td>{created}</td></tr>
<tr><th>Reason</th><td id="reason">{reason}</td></tr>
</table>
<h2>Output</h2>
<pre id="stdout" class="out" data-events="/commands/{id}/events?stdout={so}&amp;stderr={se}">{stdout}</pre>
<h2>Errors</h2>
<pre id="stderr" class="out err">{stderr}</pre>
<p class="muted" id="live">{live}</p>
<script src="/console.js"></script>"#,
        id = esc(&c.id),
        line = esc(&command_line(c)),
        machine = esc(machine),
        state = esc(c.state().name()),
        by = esc(&c.requested_by),
        approved = esc(&c.approved_by),
        created = ago(c.created_at_ms, now),
        reason = esc(&c.reason),
        so = out[0].1,
        se = out[1].1,
        stdout = esc(&out[0].0),
        stderr = esc(&out[1].0),
        live = if c.state().is_terminal() {
            "Ended."
        } else {
            "Live: new output appears here as it arrives (reload without JavaScript)."
        },
    );
    layout(&format!("Command {}", c.id), Some(v), &b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_from_outside_is_escaped() {
        assert_eq!(
            esc(r#"<script>alert("x")</script>&'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
        let a = pb::Approval {
            id: "apr_1".into(),
            question: "run `rm -rf /` <img src=x onerror=alert(1)>".into(),
            ..Default::default()
        };
        let v = Viewer {
            who: "admin:<b>",
            read_only: false,
            csrf: "t",
        };
        let page = home(
            &v,
            &NeedsYou {
                approvals: &[a],
                workers: &[],
                waiting_machines: vec![],
                failed_outbox: &[],
                note: None,
                digest: "d".into(),
            },
            0,
        );
        assert!(!page.contains("<img"), "{page}");
        assert!(!page.contains("<b>"), "{page}");
        assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;"));
        assert!(page.contains("action=\"/approvals/apr_1/approve\""));
    }
}
