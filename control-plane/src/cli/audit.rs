//! `byom audit ls`: who ran what where, newest first.

use anyhow::Context;
use byom_api::Client;
use byom_protocol::pb;
use clap::Subcommand;
use serde_json::{json, Value};

use super::output::{ago, command_line, or_dash, outcome, print_json, safe_line, table, time};

#[derive(Subcommand, Debug)]
pub enum AuditCmd {
    /// Commands with who asked, where, what, and how it ended; newest first.
    Ls {
        #[arg(long)]
        machine: Option<String>,
        /// Only since this long ago (e.g. 1h, 7d) or this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
}

/// `--since`: a duration ago (1h, 7d) or an RFC 3339 time.
fn parse_since(s: &str) -> anyhow::Result<u64> {
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(byom_wire::now_ms().saturating_sub(d.as_millis() as u64));
    }
    byom_protocol::time::parse_rfc3339(s)
        .with_context(|| format!("--since {s:?}: use a duration (1h, 7d) or an RFC 3339 time"))
}

pub async fn run(c: &mut Client, cmd: AuditCmd) -> anyhow::Result<i32> {
    let AuditCmd::Ls {
        machine,
        since,
        limit,
        json,
    } = cmd;
    let since_ms = match since {
        Some(s) => parse_since(&s)?,
        None => 0,
    };
    let r = c
        .list_commands(pb::ListCommandsRequest {
            machine: machine.unwrap_or_default(),
            state: 0,
            limit,
            since_ms,
        })
        .await?
        .into_inner();
    if json {
        let v: Vec<Value> = r
            .commands
            .iter()
            .map(|x| {
                json!({
                    "id": x.id, "requested_by": x.requested_by, "approved_by": x.approved_by, "taint": x.taint, "machine_id": x.machine_id,
                    "command": command_line(x), "cwd": x.cwd, "created_at": time(x.created_at_ms),
                    "started_at": time(x.started_at_ms), "finished_at": time(x.finished_at_ms),
                    "state": x.state().name(), "exit_code": x.exit_code, "signal": x.signal,
                    "stdout_bytes": x.stdout_bytes, "stderr_bytes": x.stderr_bytes, "reason": x.reason,
                })
            })
            .collect();
        print_json(&Value::Array(v));
        return Ok(0);
    }
    let names = super::machines::machine_names(c).await?;
    table(
        &[
            "WHEN",
            "WHO",
            "APPROVED BY",
            "MACHINE",
            "RESULT",
            "OUT/ERR",
            "CWD",
            "COMMAND",
        ],
        r.commands
            .iter()
            .map(|x| {
                vec![
                    ago(x.created_at_ms),
                    or_dash(&x.requested_by),
                    or_dash(&x.approved_by),
                    names
                        .get(&x.machine_id)
                        .cloned()
                        .unwrap_or_else(|| x.machine_id.clone()),
                    if x.state().is_terminal() {
                        outcome(x)
                    } else {
                        x.state().name().to_string()
                    },
                    format!("{}/{}", x.stdout_bytes, x.stderr_bytes),
                    safe_line(&or_dash(&x.cwd)),
                    safe_line(&command_line(x)),
                ]
            })
            .collect(),
    );
    Ok(0)
}
