//! `byom commands ls|show|cancel`.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use byom_api::{Client, Seen, WatchOptions};
use byom_protocol::pb::{self, CommandState};
use clap::Subcommand;
use serde_json::Value;

use super::output::{
    ago, command_json, command_line, human, or_dash, outcome, print_json, safe_line, table,
};

/// How long `commands show` waits for more output of a running command.
const SHOW_IDLE: Duration = Duration::from_millis(500);

#[derive(Subcommand, Debug)]
pub enum CommandsCmd {
    /// List commands, newest first.
    Ls {
        #[arg(long)]
        machine: Option<String>,
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// Show a command with its full output.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a queued or running command.
    Cancel { id: String },
}

pub async fn run(c: &mut Client, cmd: CommandsCmd) -> anyhow::Result<i32> {
    match cmd {
        CommandsCmd::Ls {
            machine,
            state,
            limit,
            json,
        } => {
            let state = match state {
                None => CommandState::Unspecified,
                Some(s) => CommandState::parse(&s).with_context(|| {
                    format!("unknown state {s:?}: use queued, dispatched, running, exited, failed, cancelled, timed_out, lost or denied")
                })?,
            };
            let r = c
                .list_commands(pb::ListCommandsRequest {
                    machine: machine.unwrap_or_default(),
                    state: state as i32,
                    limit,
                    since_ms: 0,
                })
                .await?
                .into_inner();
            if json {
                print_json(&Value::Array(r.commands.iter().map(command_json).collect()));
            } else {
                let names = super::machines::machine_names(c).await?;
                table(
                    &["ID", "MACHINE", "STATE", "RESULT", "CREATED", "COMMAND"],
                    r.commands
                        .iter()
                        .map(|x| {
                            let mut line = safe_line(&command_line(x));
                            if line.chars().count() > 60 {
                                line = line.chars().take(57).collect::<String>() + "...";
                            }
                            vec![
                                x.id.clone(),
                                names
                                    .get(&x.machine_id)
                                    .cloned()
                                    .unwrap_or_else(|| x.machine_id.clone()),
                                x.state().name().to_string(),
                                if x.state().is_terminal() {
                                    outcome(x)
                                } else {
                                    "-".into()
                                },
                                ago(x.created_at_ms),
                                line,
                            ]
                        })
                        .collect(),
                );
            }
        }
        CommandsCmd::Show { id, json } => {
            let cmd = c
                .get_command(pb::CommandRef { id: id.clone() })
                .await?
                .into_inner()
                .command
                .unwrap_or_default();
            let (out, err) = collect_output(c, &id, !json).await?;
            if json {
                let mut v = command_json(&cmd);
                v["stdout"] = Value::String(String::from_utf8_lossy(&out).into_owned());
                v["stderr"] = Value::String(String::from_utf8_lossy(&err).into_owned());
                print_json(&v);
            } else {
                println!(
                    "{} on {}: {}",
                    cmd.id,
                    cmd.machine_id,
                    safe_line(&command_line(&cmd))
                );
                println!(
                    "  state:    {}{}",
                    cmd.state().name(),
                    if cmd.reason.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", safe_line(&cmd.reason))
                    }
                );
                if cmd.state().is_terminal() {
                    println!(
                        "  result:   {} after {}",
                        outcome(&cmd),
                        human(cmd.duration_ms)
                    );
                }
                println!(
                    "  created:  {} by {}",
                    ago(cmd.created_at_ms),
                    or_dash(&cmd.requested_by)
                );
                if !cmd.sandbox.is_empty() {
                    println!(
                        "  sandbox:  {}; network {}",
                        safe_line(&cmd.sandbox),
                        if cmd.network { "reachable" } else { "denied" }
                    );
                }
                if cmd.stdout_elided + cmd.stderr_elided > 0 {
                    println!(
                        "  output:   {} of {} stdout bytes and {} of {} stderr bytes kept (the store keeps the head and the tail; the client attached got all)",
                        cmd.stdout_bytes - cmd.stdout_elided,
                        cmd.stdout_bytes,
                        cmd.stderr_bytes - cmd.stderr_elided,
                        cmd.stderr_bytes
                    );
                }
                if cmd.truncated {
                    println!("  output:   bytes were lost on the way (a reconnect asked the machine for output it had handed on)");
                }
                if cmd.stdin_cut {
                    println!("  stdin:    cut before its end (the client or its connection went)");
                }
                if !out.is_empty() {
                    println!("--- stdout ({} bytes)", out.len());
                    std::io::stdout().write_all(&out)?;
                    if !out.ends_with(b"\n") {
                        println!();
                    }
                }
                if !err.is_empty() {
                    println!("--- stderr ({} bytes)", err.len());
                    std::io::stdout().write_all(&err)?;
                    if !err.ends_with(b"\n") {
                        println!();
                    }
                }
            }
        }
        CommandsCmd::Cancel { id } => {
            let cmd = c
                .cancel_command(pb::CancelCommandRequest {
                    id,
                    reason: String::new(),
                })
                .await?
                .into_inner()
                .command
                .unwrap_or_default();
            if cmd.state() == CommandState::Cancelled {
                println!("cancelled {}", cmd.id);
            } else {
                println!(
                    "cancelling {}: the machine kills it when it gets the request",
                    cmd.id
                );
            }
        }
    }
    Ok(0)
}

/// All output stored so far for a finished or running command; with
/// `mark`, a line where bytes were not kept says how many.
pub async fn collect_output(
    c: &mut Client,
    id: &str,
    mark: bool,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut at = [0u64; 2];
    // A finished command's watch ends by itself; a running one's output so
    // far is enough for `show`.
    let opts = WatchOptions {
        idle: Some(SHOW_IDLE),
        reconnects: 0,
    };
    byom_api::watch_to_end(c, id, opts, |seen| {
        if let Seen::Output(o) = seen {
            let i = usize::from(o.stream == pb::OutputStream::Stderr as i32);
            let buf = if i == 1 { &mut err } else { &mut out };
            if mark && o.offset > at[i] {
                let gap = format!("\n[byom: {} bytes not kept here]\n", o.offset - at[i]);
                buf.extend_from_slice(gap.as_bytes());
            }
            at[i] = o.offset + o.data.len() as u64;
            buf.extend_from_slice(&o.data);
        }
    })
    .await
    .map_err(super::watch_err)?;
    Ok((out, err))
}
