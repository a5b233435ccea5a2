//! How the CLI shows things: tables and relative times for people, JSON
//! with RFC 3339 UTC times (milliseconds) for scripts, one spelling per
//! fact.

use std::collections::HashMap;

use byom_protocol::pb::{self, CommandState};
use serde_json::{json, Value};

/// `ms` as RFC 3339 (null when unset).
pub fn time(ms: u64) -> Value {
    if ms == 0 {
        Value::Null
    } else {
        Value::String(byom_protocol::time::rfc3339(ms))
    }
}

/// How long ago (or from now) `ms` is.
pub fn ago(ms: u64) -> String {
    if ms == 0 {
        return "never".into();
    }
    let now = byom_wire::now_ms();
    if ms > now {
        return format!("in {}", human(ms - now));
    }
    format!("{} ago", human(now - ms))
}

/// [`ago`] of an RFC 3339 time in JSON (as the agents' replies carry).
pub fn ago_at(v: &Value) -> String {
    ago(v
        .as_str()
        .and_then(byom_protocol::time::parse_rfc3339)
        .unwrap_or(0))
}

pub fn human(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

pub fn labels(l: &HashMap<String, String>) -> String {
    let mut v: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
    v.sort();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

pub fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// A table with a header row; the last column is not padded.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(x) = w.get_mut(i) {
                *x = (*x).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!(
                    "{:width$}  ",
                    c,
                    width = w.get(i).copied().unwrap_or(0)
                ));
            }
        }
        println!("{}", s.trim_end());
    };
    line(headers.iter().map(|s| s.to_string()).collect());
    for r in rows {
        line(r);
    }
}

/// Text from outside (channels, webhooks, daemons) made safe for a
/// terminal: control characters (escape sequences, `\r`, backspace) and
/// bidirectional overrides are shown as escapes, so a message can neither
/// repaint the screen nor forge a line. Newlines and tabs stay.
pub fn safe(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    for c in t.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' => {
                out.push_str(&format!("\\u{{{:04x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// [`safe`] on one line: newlines and tabs escaped too.
pub fn safe_line(t: &str) -> String {
    safe(t).replace('\n', "\\n").replace('\t', "\\t")
}

pub fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Text on one line, cut to `max` characters, made safe for a terminal.
pub fn one_line(t: &str, max: usize) -> String {
    let t: String = safe(t).split_whitespace().collect::<Vec<_>>().join(" ");
    if t.chars().count() > max {
        format!("{}…", t.chars().take(max).collect::<String>())
    } else {
        t
    }
}

pub fn machine_json(m: &pb::Machine) -> Value {
    json!({
        "id": m.id, "name": m.name, "labels": m.labels, "online": m.online,
        "last_seen": time(m.last_seen_ms), "version": m.version, "os": m.os, "arch": m.arch,
        "hostname": m.hostname, "revoked": m.revoked, "revoked_at": time(m.revoked_at_ms),
        "created_at": time(m.created_at_ms), "cert_not_after": time(m.cert_not_after_ms),
        "public_key_sha256": m.public_key_sha256, "token_id": m.token_id,
        "queued_commands": m.queued_commands, "running_commands": m.running_commands,
        "remote_addr": m.remote_addr, "offline_reason": m.offline_reason,
        "asleep_since": time(m.asleep_since_ms),
        "policy_digest": m.policy_digest, "policy_summary": m.policy_summary, "paused": m.paused, "transport": m.transport,
        "sandbox": m.sandbox,
    })
}

pub fn command_json(c: &pb::Command) -> Value {
    json!({
        "id": c.id, "machine_id": c.machine_id, "argv": c.argv, "shell": c.shell,
        "cwd": c.cwd, "env": c.env, "timeout_ms": c.timeout_ms, "state": c.state().name(),
        "created_at": time(c.created_at_ms), "queue_deadline": time(c.queue_deadline_ms),
        "dispatched_at": time(c.dispatched_at_ms), "started_at": time(c.started_at_ms),
        "finished_at": time(c.finished_at_ms), "exit_code": c.exit_code, "signal": c.signal,
        "reason": c.reason, "stdout_bytes": c.stdout_bytes, "stderr_bytes": c.stderr_bytes,
        "truncated": c.truncated, "stdout_elided": c.stdout_elided,
        "stderr_elided": c.stderr_elided, "stdin_cut": c.stdin_cut, "tty": c.tty, "duration_ms": c.duration_ms, "requested_by": c.requested_by,
        "cancel_requested": c.cancel_requested, "pid": c.pid,
        "tainted": c.tainted, "taint": c.taint, "approved_by": c.approved_by,
        "network": c.network, "sandbox": c.sandbox,
    })
}

pub fn token_json(t: &pb::Token) -> Value {
    json!({
        "id": t.id, "name": t.name, "labels": t.labels, "created_at": time(t.created_at_ms),
        "expires_at": time(t.expires_at_ms), "used_at": time(t.used_at_ms),
        "used_by": t.used_by, "revoked": t.revoked, "reusable": t.reusable,
        "max_uses": t.max_uses, "uses": t.uses,
    })
}

pub fn trigger_json(t: &pb::Trigger) -> Value {
    json!({
        "id": t.id, "thread_id": t.thread_id, "source": t.source, "user": t.user, "text": t.text,
        "mention": t.mention, "from_bot": t.from_bot, "created_at": time(t.created_at_ms),
        "decision": t.decision().name(), "reason": t.reason, "user_name": t.user_name,
        "channel": t.channel, "external_id": t.external_id, "reply_to": t.reply_to, "link": t.link,
        "author_association": t.author_association, "kind": t.kind,
        "trusted": t.trusted, "trust": t.trust, "principal": t.principal,
    })
}

pub fn trigger_line(t: &pb::Trigger) -> String {
    let mut text: String = t.text.chars().take(80).collect();
    if t.text.chars().count() > 80 {
        text.push('…');
    }
    format!(
        "{}  {}  {}/{}  {}{}: {}  [{}]",
        t.id,
        ago(t.created_at_ms),
        safe_line(&t.source),
        t.thread_id,
        safe_line(&t.user),
        if t.mention { " (@)" } else { "" },
        safe_line(&text),
        t.decision().name()
    )
}

/// A command as a line a shell would take.
pub fn command_line(c: &pb::Command) -> String {
    if !c.shell.is_empty() {
        return c.shell.clone();
    }
    c.argv
        .iter()
        .map(|a| {
            if a.is_empty()
                || a.chars()
                    .any(|ch| ch.is_whitespace() || "'\"$`\\|&;<>()*?".contains(ch))
            {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a finished command ended, in a word or two.
pub fn outcome(c: &pb::Command) -> String {
    match c.state() {
        CommandState::Exited => match (c.exit_code, c.signal) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(sig)) => format!("signal {sig}"),
            _ => "exited".into(),
        },
        s => s.name().to_string(),
    }
}

/// `: REASON`, or nothing.
pub fn reason(c: &pb::Command) -> String {
    if c.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", c.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_ages() {
        assert_eq!(time(0), Value::Null);
        assert_eq!(time(1_796_107_970_123), "2026-12-01T06:52:50.123Z");
        assert_eq!(ago_at(&Value::Null), "never");
        assert!(ago_at(&time(byom_wire::now_ms() - 5000)).ends_with("s ago"));
        assert_eq!(human(90_000), "90s");
        assert_eq!(human(3 * 86_400_000), "3d");
    }

    #[test]
    fn outside_text_cannot_drive_the_terminal() {
        let evil = "ok\x1b[2J\x1b]0;pwned\x07\rbyom › approved\u{202e}gnp.exe";
        let s = safe(evil);
        assert!(
            !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{s:?}"
        );
        assert!(
            s.contains("\\x1b[2J") && s.contains("\\x0d") && s.contains("\\u{202e}"),
            "{s}"
        );
        assert_eq!(safe("two\nlines\tand tab"), "two\nlines\tand tab");
        assert_eq!(safe_line("two\nlines"), "two\\nlines");
        assert!(!one_line("a\x1bb", 80).contains('\x1b'));
    }

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let c = pb::Command {
            argv: vec!["echo".into(), "a b".into(), "it's".into(), "".into()],
            ..Default::default()
        };
        assert_eq!(command_line(&c), "echo 'a b' 'it'\\''s' ''");
    }
}
