//! The operator's pages: the **audit** trail (every command with who
//! asked, who approved, where and how it ended, as `byom audit ls` reads
//! it; newest first, a page at a time), **connectors and the outbox**
//! (each connector's backlog, failed replies with **Retry**: the API's
//! own `retry_outbox`, as the signed-in person) and **trust and
//! approvers** (what `byom trust ls` shows; edits stay on the CLI, where
//! the server checks the editor is an approver for every machine).

use std::collections::HashMap;

use byom_protocol::pb;
use tonic::Status;

use super::pages::{ago, command_line, esc, layout, retry_form, Viewer};
use super::Console;

/// Commands on one page of the audit trail.
pub const AUDIT_ROWS: usize = 100;
/// Outbox items on the connectors page: failed ones, and recent ones.
pub const FAILED_ROWS: u32 = 100;
pub const RECENT_ROWS: u32 = 50;

fn outbox_state(o: &pb::OutboxItem) -> String {
    let s = o.state().as_str_name();
    s.strip_prefix("OUTBOX_").unwrap_or(s).to_lowercase()
}

pub fn audit_page(
    v: &Viewer,
    cs: &[pb::Command],
    names: &HashMap<String, String>,
    older: Option<&str>,
    first: bool,
    now: u64,
) -> String {
    let mut b = String::from(
        "<p class=\"muted\">Every command, newest first: who asked (a person is <code>admin:NAME</code>, a worker its ID), who approved it, where and how it ended.</p>\
<table><tr><th>When</th><th>Who</th><th>Approved by</th><th>Machine</th><th>Result</th><th>Out/err bytes</th><th>Directory</th><th>Command</th></tr>",
    );
    for c in cs {
        let result = match (c.state().is_terminal(), c.exit_code, c.signal) {
            (true, Some(e), _) => format!("{} {e}", c.state().name()),
            (true, None, Some(s)) => format!("{} (signal {s})", c.state().name()),
            _ => c.state().name().to_string(),
        };
        b.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"state\">{}</td><td>{}/{}</td><td><code>{}</code></td><td><a href=\"/commands/{id}\"><code>{}</code></a></td></tr>",
            ago(c.created_at_ms, now),
            esc(&c.requested_by),
            esc(&c.approved_by),
            esc(names.get(&c.machine_id).unwrap_or(&c.machine_id)),
            esc(&result),
            c.stdout_bytes,
            c.stderr_bytes,
            esc(&c.cwd),
            esc(&command_line(c).chars().take(300).collect::<String>()),
            id = esc(&c.id),
        ));
    }
    b.push_str("</table>");
    if cs.is_empty() {
        b.push_str("<p class=\"empty\">No commands here.</p>");
    }
    b.push_str("<p class=\"pages\">");
    if !first {
        b.push_str("<a href=\"/audit\">Newest</a> ");
    }
    if let Some(o) = older {
        b.push_str(&format!(
            "<a href=\"/audit?before={}\" id=\"older\">Older</a>",
            esc(o)
        ));
    }
    b.push_str("</p>");
    layout("Audit", Some(v), &b)
}

pub fn connectors_page(
    v: &Viewer,
    cs: &[pb::ConnectorView],
    failed: &[pb::OutboxItem],
    recent: &[pb::OutboxItem],
    note: Option<&str>,
    now: u64,
) -> String {
    let mut b = String::new();
    if let Some(n) = note {
        b.push_str(&format!("<p class=\"note\" id=\"note\">{}</p>", esc(n)));
    }
    b.push_str("<table><tr><th>Name</th><th>Kind</th><th>Waiting to send</th><th>Credentials</th><th>Provider posts to</th><th>Added</th></tr>");
    for c in cs {
        let creds: Vec<&str> = [
            (c.has_token, "token"),
            (c.has_secret, "secret"),
            (c.has_private_key, "private key"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect();
        b.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td><td>{}</td></tr>",
            esc(&c.name),
            esc(&c.kind),
            c.outbox_pending,
            esc(&creds.join(", ")),
            esc(c.webhook_url.as_deref().unwrap_or("")),
            c.webhook_note
                .as_deref()
                .map(|n| format!(" <span class=\"muted\">{}</span>", esc(n)))
                .unwrap_or_default(),
            ago(c.created_at_ms, now),
        ));
    }
    b.push_str("</table>");
    if cs.is_empty() {
        b.push_str("<p class=\"empty\">No connectors: replies stay in byom (<code>byom connectors add</code>).</p>");
    }
    b.push_str(&format!("<h2>Failed replies ({})</h2>", failed.len()));
    if failed.is_empty() {
        b.push_str("<p class=\"empty\">No failed replies.</p>");
    } else {
        b.push_str("<table><tr><th>ID</th><th>Connector</th><th>Thread</th><th>Attempts</th><th>Error</th><th></th></tr>");
        for o in failed {
            b.push_str(&format!(
                "<tr><td><code>{}</code></td><td>{}</td><td><a href=\"/threads/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&o.id),
                esc(&o.connector),
                esc(&o.thread_id),
                esc(&o.external),
                o.attempts,
                esc(&o.last_error),
                retry_form(v, &o.id),
            ));
        }
        b.push_str("</table>");
    }
    b.push_str(&format!("<h2>Recent replies ({})</h2>", recent.len()));
    b.push_str("<table><tr><th>ID</th><th>Connector</th><th>Thread</th><th>State</th><th>Receipt</th><th>Created</th></tr>");
    for o in recent {
        b.push_str(&format!(
            "<tr><td><code>{}</code></td><td>{}</td><td><a href=\"/threads/{}\">{}</a></td><td class=\"state\">{}</td><td><code>{}</code></td><td>{}</td></tr>",
            esc(&o.id),
            esc(&o.connector),
            esc(&o.thread_id),
            esc(&o.external),
            esc(&outbox_state(o)),
            esc(&o.receipt),
            ago(o.created_at_ms, now),
        ));
    }
    b.push_str("</table>");
    layout("Connectors and outbox", Some(v), &b)
}

pub fn trust_page(v: &Viewer, t: &pb::TrustConfig) -> String {
    let list = |l: &[String]| {
        if l.is_empty() {
            "<span class=\"muted\">(none)</span>".to_string()
        } else {
            l.iter()
                .map(|x| format!("<code>{}</code>", esc(x)))
                .collect::<Vec<_>>()
                .join(" ")
        }
    };
    let mut b = format!(
        r#"<table class="facts">
<tr><th>Trusted</th><td>{}</td></tr>
<tr><th>GitHub authors</th><td>{}</td></tr>
<tr><th>Slack members</th><td>{}</td></tr>
<tr><th>Matrix homeservers</th><td>{}</td></tr>
</table>
<h2>Approvers ({})</h2>"#,
        list(&t.trusted),
        list(&t.github_associations),
        if t.slack_members {
            "trusted"
        } else {
            "not trusted"
        },
        list(&t.matrix_homeservers),
        t.approvers.len()
    );
    b.push_str("<table><tr><th>Who</th><th>For</th></tr>");
    for a in &t.approvers {
        b.push_str(&format!(
            "<tr><td><code>{}</code></td><td>{}</td></tr>",
            esc(&a.principal),
            a.label
                .as_deref()
                .map(|l| format!("machines labelled <code>{}</code>", esc(l)))
                .unwrap_or_else(|| "every machine".into())
        ));
    }
    b.push_str("</table><p class=\"muted\">Changes: <code>byom trust add|rm|set</code> and <code>byom trust approvers add|rm</code>, by an approver for every machine.</p>");
    layout("Trust and approvers", Some(v), &b)
}

impl Console {
    /// `GET /audit[?before=cmd_…]`: a page of the audit trail.
    pub(super) fn audit(&self, v: &Viewer, query: &str, now: u64) -> Result<String, Status> {
        let before = super::form_field(query, "before")
            .map(|b| {
                super::object_id(b, "cmd_")
                    .ok_or_else(|| Status::invalid_argument("before= names a command (cmd_…)"))
            })
            .transpose()?;
        let mut cs = self
            .api
            .store
            .commands_before(before, AUDIT_ROWS + 1)
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let older = (cs.len() > AUDIT_ROWS).then(|| cs[AUDIT_ROWS - 1].id.clone());
        cs.truncate(AUDIT_ROWS);
        for c in &mut cs {
            c.stdin.clear();
        }
        let names = self.machine_names()?;
        Ok(audit_page(
            v,
            &cs,
            &names,
            older.as_deref(),
            before.is_none(),
            now,
        ))
    }

    /// `GET /connectors`: connectors, failed and recent replies.
    pub(super) fn connectors(&self, v: &Viewer, query: &str, now: u64) -> Result<String, Status> {
        let ch = &self.api.channels;
        let op = |e: crate::channels::admin::OpError| Status::unavailable(e.to_string());
        let cs = ch.list_connectors().map_err(op)?;
        let failed = ch.list_outbox(true, FAILED_ROWS).map_err(op)?;
        let recent = ch.list_outbox(false, RECENT_ROWS).map_err(op)?;
        let note = super::form_field(query, "retried")
            .and_then(|id| super::object_id(id, "out_"))
            .map(|id| format!("{id} is queued again."));
        Ok(connectors_page(
            v,
            &cs,
            &failed,
            &recent,
            note.as_deref(),
            now,
        ))
    }

    pub(super) fn trust(&self, v: &Viewer) -> Result<String, Status> {
        Ok(trust_page(v, &self.api.get_trust()?))
    }

    /// `POST /outbox/ID/retry`: the API's retry, as `who`; where to go.
    pub(super) async fn retry(&self, id: &str, who: &str) -> Result<String, Status> {
        use crate::channels::admin::OpError;
        match self.api.channels.retry_outbox(id).await {
            Ok(_) => {
                tracing::info!(outbox = id, by = %who, "retried in the console");
                Ok(format!("/connectors?retried={id}"))
            }
            Err(OpError::NotFound(m)) => Err(Status::not_found(m)),
            Err(OpError::Invalid(m)) | Err(OpError::Exists(m)) => {
                Err(Status::failed_precondition(m))
            }
            Err(OpError::Unavailable(m)) => Err(Status::unavailable(m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_is_escaped_and_read_only_has_no_buttons() {
        let mut o = pb::OutboxItem {
            id: "out_1".into(),
            connector: "<b>c</b>".into(),
            last_error: "<script>x</script>".into(),
            ..Default::default()
        };
        o.set_state(pb::OutboxState::OutboxFailed);
        let mut v = Viewer {
            who: "admin:a",
            read_only: false,
            csrf: "t",
        };
        let page = connectors_page(&v, &[], std::slice::from_ref(&o), &[], None, 0);
        assert!(!page.contains("<script>x"), "{page}");
        assert!(!page.contains("<b>c"), "{page}");
        assert!(page.contains("action=\"/outbox/out_1/retry\""));
        v.read_only = true;
        let page = connectors_page(&v, &[], &[o], &[], None, 0);
        assert!(!page.contains("/retry"), "{page}");
        let t = pb::TrustConfig {
            trusted: vec!["<i>x".into()],
            ..Default::default()
        };
        assert!(!trust_page(&v, &t).contains("<i>"));
    }
}
