//! What `byom exec` says about a command besides its output: warnings
//! before it runs, and the exit status it ends with.

use byom_protocol::pb::{self, CommandState};

use super::output::ago;

/// Exit status `byom exec` returns for a finished command (like ssh and
/// timeout(1): the remote code, 128+signal, 124 for a timeout).
pub fn exit_status(c: &pb::Command) -> i32 {
    match c.state() {
        CommandState::Exited => match (c.exit_code, c.signal) {
            (Some(code), _) => code,
            (None, Some(sig)) => 128 + sig,
            _ => 0,
        },
        CommandState::TimedOut => 124,
        CommandState::Denied => 126,
        CommandState::Cancelled => 130,
        _ => 255,
    }
}

/// Says what the machine will do with the command before it runs: an
/// environment variable its policy drops, an owner's pause, or that it is
/// offline.
pub fn warn_before(m: &pb::Machine, cmd: &pb::Command, env: &[(String, String)]) {
    for (k, _) in env {
        if let Some(p) = m.env_scrub.iter().find(|p| glob(p, k)) {
            eprintln!(
                "byom: warning: {}'s policy drops {k} (it matches {p} in [env] scrub); the command runs without it",
                m.name
            );
        }
    }
    if m.paused {
        eprintln!(
            "byom: {} is paused by its owner; {} is queued and runs when they resume it (`byomd resume` on {}); waiting (Ctrl-C cancels it, --detach returns at once)",
            m.name, cmd.id, m.name
        );
    } else if !m.online {
        let why = if m.offline_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", m.offline_reason)
        };
        eprintln!(
            "byom: {} is offline (last seen {}{why}). {} is queued and will run when it connects; waiting (Ctrl-C cancels it, --detach returns at once)",
            m.name,
            ago(m.last_seen_ms),
            cmd.id
        );
    }
}

/// `*` matches any run of characters (the policy's env patterns).
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|i| tail.is_char_boundary(*i))
                .any(|i| glob(rest, &tail[i..]))
        }
    }
}
