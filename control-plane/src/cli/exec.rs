//! `byom exec`: run a command on a machine and stream its output, exiting
//! with the remote exit code; Ctrl-C cancels the remote command.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use byom_api::{Client, Seen, WatchOptions};
use byom_protocol::pb::{self, CommandState};
use clap::Args;

use super::output::{ago, command_json, print_json, reason};
use super::parse_kv;

/// Reconnect attempts of `byom exec` while the server restarts.
const EXEC_RECONNECTS: u32 = 120;

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Machine ID or name (or use --label to pick one).
    #[arg(required_unless_present = "labels")]
    pub machine: Option<String>,
    /// Run on the least busy online machine with this label (k=v, repeatable).
    #[arg(long = "label", value_parser = parse_kv, conflicts_with = "machine")]
    pub labels: Vec<(String, String)>,
    /// Kill the command after this long (e.g. 30s, 5m; at most 7d).
    #[arg(long, value_parser = super::parse_timeout)]
    pub timeout: Option<Duration>,
    /// Working directory on the machine.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment variable (K=V, repeatable).
    #[arg(long = "env", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Send this process's stdin to the command.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Run a shell command line via `sh -c` instead of argv.
    #[arg(long = "sh", value_name = "COMMAND_LINE")]
    pub shell: Option<String>,
    /// Queue the command and print its ID instead of waiting.
    #[arg(long)]
    pub detach: bool,
    /// How long the command may wait for an offline machine (at most 7d).
    #[arg(long, value_parser = super::parse_queue_ttl)]
    pub queue_ttl: Option<Duration>,
    /// Print the final command record as JSON instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// Create the command at most once for this key: running `byom exec`
    /// again with the same key (say, after a lost answer) returns the first
    /// command instead of a second. Default: a fresh key per invocation,
    /// reused by this invocation's own retries.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// The command and its arguments.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

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

/// Reads stdin for the command (bounded by what the protocol carries).
fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let max = byom_protocol::limits::MAX_STDIN_BYTES;
    let mut stdin = Vec::new();
    std::io::stdin()
        .take(max as u64 + 1)
        .read_to_end(&mut stdin)?;
    if stdin.len() > max {
        bail!("stdin is larger than {max} bytes; copy the data to the machine another way");
    }
    Ok(stdin)
}

pub async fn run(c: &mut Client, a: ExecArgs) -> anyhow::Result<i32> {
    if a.shell.is_none() && a.argv.is_empty() {
        bail!("nothing to run: give a command after `--` (byom exec M -- CMD ARGS) or --sh 'COMMAND LINE'");
    }
    if a.shell.is_some() && !a.argv.is_empty() {
        bail!("give either --sh 'COMMAND LINE' or a command after `--`, not both");
    }
    let stdin = if a.stdin { read_stdin()? } else { Vec::new() };
    let req = pb::CreateCommandRequest {
        machine: a.machine.clone().unwrap_or_default(),
        labels: a.labels.into_iter().collect(),
        argv: a.argv,
        shell: a.shell.unwrap_or_default(),
        cwd: a.cwd.unwrap_or_default(),
        env: a.env.into_iter().collect(),
        stdin,
        timeout_ms: a.timeout.map(|d| d.as_millis() as u64).unwrap_or(0),
        queue_ttl_ms: a.queue_ttl.map(|d| d.as_millis() as u64).unwrap_or(0),
        idempotency_key: a.idempotency_key.unwrap_or_else(byom_api::new_key),
    };
    // Sent again, with the same key, if the server restarts meanwhile.
    let cmd = byom_api::until_answered(|| {
        let (mut c, req) = (c.clone(), req.clone());
        async move { c.create_command(req).await }
    })
    .await?
    .into_inner()
    .command
    .context("server returned no command")?;
    let m = c
        .get_machine(pb::MachineRef {
            machine: cmd.machine_id.clone(),
        })
        .await?
        .into_inner()
        .machine
        .unwrap_or_default();
    if a.detach {
        if a.json {
            print_json(&command_json(&cmd));
        } else {
            println!("{}", cmd.id);
            if !m.online {
                eprintln!(
                    "{} is offline; {} is queued and runs when it connects",
                    m.name, cmd.id
                );
            }
        }
        return Ok(0);
    }
    if !m.online {
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
    let interactive = std::io::stderr().is_terminal();
    let mut told_approval = false;
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut write_err = None;
    let mut canceller = c.clone();
    let opts = WatchOptions {
        idle: None,
        reconnects: EXEC_RECONNECTS,
    };
    let end = {
        let watch = byom_api::watch_to_end(c, &cmd.id, opts, |seen| match seen {
            Seen::Output(o) => {
                let r = if o.stream == pb::OutputStream::Stderr as i32 {
                    stderr.write_all(&o.data).and_then(|_| stderr.flush())
                } else {
                    stdout.write_all(&o.data).and_then(|_| stdout.flush())
                };
                if let Err(e) = r {
                    write_err.get_or_insert(e);
                }
            }
            Seen::State(s)
                if s.state() == CommandState::AwaitingLocalApproval && !told_approval =>
            {
                told_approval = true;
                eprintln!(
                "byom: {} waits for the owner of {} to approve it on the machine (`byomd approve {}`)",
                s.id, m.name, s.id
            );
            }
            Seen::State(_) => {}
        });
        tokio::pin!(watch);
        let mut cancels = 0u32;
        loop {
            tokio::select! {
                r = &mut watch => break r.map_err(super::watch_err)?,
                _ = tokio::signal::ctrl_c() => {
                    cancels += 1;
                    if cancels > 1 {
                        eprintln!("byom: not waiting; {} may still be cancelling", cmd.id);
                        return Ok(130);
                    }
                    if interactive {
                        eprintln!("byom: cancelling {} (Ctrl-C again to stop waiting)", cmd.id);
                    }
                    let _ = canceller
                        .cancel_command(pb::CancelCommandRequest {
                            id: cmd.id.clone(),
                            reason: "cancelled with Ctrl-C".into(),
                        })
                        .await;
                }
            }
        }
    };
    if let Some(e) = write_err {
        return Err(e.into());
    }
    let Some(s) = end else {
        bail!(
            "lost the server while waiting for {}; see `byom commands show {}`",
            cmd.id,
            cmd.id
        );
    };
    if a.json {
        print_json(&command_json(&s));
    }
    if s.truncated {
        eprintln!(
            "byom: output truncated at {} bytes",
            byom_protocol::limits::MAX_COMMAND_OUTPUT_BYTES
        );
    }
    match s.state() {
        CommandState::Exited => {}
        CommandState::TimedOut => eprintln!("byom: {} timed out{}", s.id, reason(&s)),
        other => eprintln!("byom: {} {}{}", s.id, other.name(), reason(&s)),
    }
    Ok(exit_status(&s))
}
