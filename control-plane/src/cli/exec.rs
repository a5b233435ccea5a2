//! `byom exec`: run a command on a machine and stream its output, exiting
//! with the remote exit code; Ctrl-C cancels the remote command.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use byom_api::{Client, Seen, WatchOptions};
use byom_protocol::pb::{self, CommandState};
use clap::Args;

use serde_json::json;

use super::exec_notes::{exit_status, warn_before};
use super::output::{command_json, print_json, reason};
use super::parse_kv;

/// Reconnect attempts of `byom exec` while the server restarts.
const EXEC_RECONNECTS: u32 = 120;

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Machine ID or name (or use --label to pick one). Everything after
    /// it is the command, as with ssh: `byom exec lap uname -a`.
    pub machine: Option<String>,
    /// Run on the least busy online machine with this label (k=v, repeatable).
    #[arg(long = "label", value_parser = parse_kv)]
    pub labels: Vec<(String, String)>,
    /// With --label: run on every online machine with those labels at once,
    /// each line prefixed with the machine's name; the exit code is the
    /// worst of theirs.
    #[arg(long, requires = "labels")]
    pub all: bool,
    /// Kill the command after this long (e.g. 30s, 5m; at most 7d).
    #[arg(long, value_parser = super::parse_timeout)]
    pub timeout: Option<Duration>,
    /// Working directory on the machine.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment variable (K=V, repeatable).
    #[arg(long = "env", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Send this process's stdin to the command even from a terminal
    /// (without it, stdin is sent when it is a pipe or a file).
    #[arg(short = 'i', long, conflicts_with = "no_stdin")]
    pub stdin: bool,
    /// Do not send stdin (as ssh -n): for loops that read their own stdin.
    #[arg(short = 'n', long = "no-stdin")]
    pub no_stdin: bool,
    /// Run it on a terminal on the machine (as ssh -t): every key,
    /// Ctrl-C and Ctrl-Z go to it, and it follows this window's size.
    /// Without a command, a login shell. The machine's owner decides who
    /// may (`[terminal]` in its policy: admins by default).
    #[arg(short = 't', long, conflicts_with_all = ["no_stdin", "all", "detach", "json"])]
    pub tty: bool,
    /// Run a shell command line via `sh -c` instead of argv.
    #[arg(long = "sh", value_name = "COMMAND_LINE")]
    pub shell: Option<String>,
    /// Queue the command and print its ID instead of waiting.
    #[arg(long)]
    pub detach: bool,
    /// How long the command may wait for an offline machine (at most 7d).
    #[arg(long, value_parser = super::parse_queue_ttl)]
    pub queue_ttl: Option<Duration>,
    /// Print one JSON object when the command ends (its record with its
    /// stdout and stderr) instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// With --json: print events as they happen, one JSON object per line
    /// (output chunks, state changes, then the final record).
    #[arg(long, requires = "json")]
    pub follow: bool,
    /// Create the command at most once for this key: running `byom exec`
    /// again with the same key (say, after a lost answer) returns the first
    /// command instead of a second. Default: a fresh key per invocation,
    /// reused by this invocation's own retries.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// The command and its arguments (`--` before them is optional).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub argv: Vec<String>,
}

/// How long `byom exec` waits for stdin to end before it streams it: a
/// pipe still open then (`tail -f log | byom exec …`) or longer than a
/// request carries goes as a stream.
const STDIN_WAIT: Duration = Duration::from_millis(100);

/// What the command reads.
enum Input {
    /// All of it, small enough to go in the request.
    Whole(Vec<u8>),
    /// A stream: what was read so far, then the rest as it comes.
    Stream(
        Vec<u8>,
        tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    ),
}

impl ExecArgs {
    /// `byom shell MACHINE`: a login shell on a terminal there.
    pub fn shell(machine: String) -> ExecArgs {
        ExecArgs {
            machine: Some(machine),
            labels: Vec::new(),
            all: false,
            timeout: None,
            cwd: None,
            env: Vec::new(),
            stdin: false,
            no_stdin: false,
            tty: true,
            shell: None,
            detach: false,
            queue_ttl: None,
            json: false,
            follow: false,
            idempotency_key: None,
            argv: Vec::new(),
        }
    }
}

/// Reads this process's stdin on a thread of its own, in chunks, as the
/// consumer takes them (a bounded channel: a slow command slows the read).
fn stdin_chunks() -> tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            let mut buf = vec![0u8; byom_protocol::limits::MAX_OUTPUT_CHUNK_BYTES];
            match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.blocking_send(Ok(buf)).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    rx
}

/// Reads stdin for the command: whole, if it ends soon and fits in the
/// request, else as a stream.
async fn read_stdin() -> anyhow::Result<Input> {
    let max = byom_protocol::limits::MAX_STDIN_BYTES;
    let mut rx = stdin_chunks();
    let mut head = Vec::new();
    let deadline = tokio::time::Instant::now() + STDIN_WAIT;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Ok(b))) => {
                head.extend_from_slice(&b);
                if head.len() > max {
                    return Ok(Input::Stream(head, rx));
                }
            }
            Ok(Some(Err(e))) => return Err(e).context("reading stdin"),
            Ok(None) => return Ok(Input::Whole(head)),
            Err(_) => return Ok(Input::Stream(head, rx)),
        }
    }
}

/// Sends `head` and then the rest of stdin to the command, in chunks; a
/// read error ends it early (then `failed` is set).
fn forward_stdin(
    head: Vec<u8>,
    mut rest: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    failed: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        for piece in head.chunks(byom_protocol::limits::MAX_OUTPUT_CHUNK_BYTES) {
            if tx.send(piece.to_vec()).await.is_err() {
                return;
            }
        }
        while let Some(r) = rest.recv().await {
            match r {
                Ok(b) => {
                    if tx.send(b).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    eprintln!("byom: reading stdin failed: {e}; the command's stdin ends here");
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
            }
        }
    });
    rx
}

/// Checks the command line and reads stdin; the request to send (without
/// a machine when `--all` fans it out).
fn request(a: &mut ExecArgs) -> anyhow::Result<pb::CreateCommandRequest> {
    // Chosen by label: a first word given is the command's, not a machine.
    if !a.labels.is_empty() {
        if let Some(m) = a.machine.take() {
            a.argv.insert(0, m);
        }
    } else if a.machine.is_none() {
        bail!("say where: byom exec MACHINE COMMAND [ARGS…], or --label k=v to pick by label");
    }
    // With a terminal and no command: the login shell there (the machine
    // names it, as ssh gives).
    if a.shell.is_none() && a.argv.is_empty() && !a.tty {
        bail!("nothing to run: give the command after the machine (byom exec lap uname -a) or --sh 'COMMAND LINE'");
    }
    if a.shell.is_some() && !a.argv.is_empty() {
        bail!("give either --sh 'COMMAND LINE' or a command after the machine, not both");
    }
    Ok(pb::CreateCommandRequest {
        machine: a.machine.clone().unwrap_or_default(),
        labels: a.labels.iter().cloned().collect(),
        argv: a.argv.clone(),
        shell: a.shell.clone().unwrap_or_default(),
        cwd: a.cwd.clone().unwrap_or_default(),
        env: a.env.iter().cloned().collect(),
        stdin: Vec::new(),
        timeout_ms: a.timeout.map(|d| d.as_millis() as u64).unwrap_or(0),
        queue_ttl_ms: a.queue_ttl.map(|d| d.as_millis() as u64).unwrap_or(0),
        idempotency_key: a.idempotency_key.clone().unwrap_or_else(byom_api::new_key),
        ..Default::default()
    })
}

pub async fn run(c: &mut Client, mut a: ExecArgs) -> anyhow::Result<i32> {
    let mut req = request(&mut a)?;
    if a.tty {
        return terminal(c, req).await;
    }
    // As ssh: a pipe or a file is the command's input; a terminal is not,
    // unless asked (-i); -n never.
    let send_stdin = !a.no_stdin && (a.stdin || !std::io::stdin().is_terminal());
    let input = if send_stdin {
        read_stdin().await?
    } else {
        Input::Whole(Vec::new())
    };
    let stdin_failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let streamed = match input {
        Input::Whole(b) => {
            req.stdin = b;
            None
        }
        Input::Stream(..) if a.all || a.detach => bail!(
            "stdin longer than {} bytes (or still open) streams to one attached command: run it without --all and --detach, or copy the data first (byom cp)",
            byom_protocol::limits::MAX_STDIN_BYTES
        ),
        Input::Stream(head, rest) => Some(forward_stdin(head, rest, stdin_failed.clone())),
    };
    if a.all {
        if a.detach || a.json {
            bail!("--all streams every machine's lines; run it without --detach and --json");
        }
        return super::exec_all::run(c, &a.labels, &a.env, req).await;
    }
    // Sent again, with the same key, if the server restarts meanwhile.
    // Attached, the command is created and followed in one call.
    let (cmd, run) = if let Some(stdin) = streamed {
        let run = byom_api::exec(c, req, stdin).await?;
        (run.command.clone(), Some(run))
    } else if a.detach {
        let cmd = byom_api::until_answered(|| {
            let (mut c, req) = (c.clone(), req.clone());
            async move { c.create_command(req).await }
        })
        .await?
        .into_inner()
        .command
        .context("server returned no command")?;
        (cmd, None)
    } else {
        let run = byom_api::run_command(c, req).await?;
        (run.command.clone(), Some(run))
    };
    let m = c
        .get_machine(pb::MachineRef {
            machine: cmd.machine_id.clone(),
        })
        .await?
        .into_inner()
        .machine
        .unwrap_or_default();
    let Some(run) = run else {
        if a.json {
            print_json(&command_json(&cmd));
        } else {
            println!("{}", cmd.id);
        }
        warn_before(&m, &cmd, &a.env);
        return Ok(0);
    };
    warn_before(&m, &cmd, &a.env);
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
    // --json keeps stdout for JSON: the output is collected (or, with
    // --follow, printed as events).
    let mut captured: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut cut_json = false;
    // Where each stream is; a chunk past it means bytes we never got.
    let mut at = [0u64; 2];
    let mut lost = [0u64; 2];
    let (json, follow) = (a.json, a.follow);
    let end = {
        let watch = run.to_end(c, opts, |seen| match seen {
            Seen::Output(o) => {
                let err = o.stream == pb::OutputStream::Stderr as i32;
                let i = usize::from(err);
                lost[i] += o.offset.saturating_sub(at[i]);
                at[i] = at[i].max(o.offset + o.data.len() as u64);
                let r = if follow {
                    event_line(
                        &json!({"event": "output", "stream": if err {"stderr"} else {"stdout"},
                                       "data": String::from_utf8_lossy(&o.data)}),
                    )
                } else if json {
                    let buf = &mut captured[usize::from(err)];
                    let room = (byom_protocol::limits::MAX_COMMAND_OUTPUT_BYTES as usize)
                        .saturating_sub(buf.len());
                    cut_json |= o.data.len() > room;
                    buf.extend_from_slice(&o.data[..o.data.len().min(room)]);
                    Ok(())
                } else if err {
                    stderr.write_all(&o.data).and_then(|_| stderr.flush())
                } else {
                    stdout.write_all(&o.data).and_then(|_| stdout.flush())
                };
                if let Err(e) = r {
                    write_err.get_or_insert(e);
                }
            }
            Seen::State(s) => {
                if follow {
                    if let Err(e) =
                        event_line(&json!({"event": "state", "state": s.state().name()}))
                    {
                        write_err.get_or_insert(e);
                    }
                }
                if s.state() == CommandState::AwaitingLocalApproval && !told_approval {
                    told_approval = true;
                    eprintln!(
                        "byom: {} waits for the owner of {} to approve it on the machine (`byomd approve {}`)",
                        s.id, m.name, s.id
                    );
                }
            }
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
        let mut v = command_json(&s);
        if follow {
            event_line(&json!({"event": "end", "command": v}))?;
        } else {
            v["stdout"] = json!(String::from_utf8_lossy(&captured[0]));
            v["stderr"] = json!(String::from_utf8_lossy(&captured[1]));
            print_json(&v);
        }
    }
    if cut_json {
        eprintln!(
            "byom: --json keeps the first {} bytes of each stream; --json --follow (or no --json) gives all of it",
            byom_protocol::limits::MAX_COMMAND_OUTPUT_BYTES
        );
    }
    match s.state() {
        CommandState::Exited => {}
        CommandState::TimedOut => eprintln!("byom: {} timed out{}", s.id, reason(&s)),
        other => eprintln!("byom: {} {}{}", s.id, other.name(), reason(&s)),
    }
    let status = exit_status(&s);
    // Bytes lost on the way: the status says so, whatever the command's.
    let mut losses = Vec::new();
    for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
        let missing = lost[i] + [s.stdout_bytes, s.stderr_bytes][i].saturating_sub(at[i]);
        if missing > 0 {
            losses.push(format!(
                "{missing} bytes of {name} did not reach this client"
            ));
        }
    }
    if s.truncated {
        losses.push("the machine was asked for output it had already handed on".into());
    }
    if s.stdin_cut || stdin_failed.load(std::sync::atomic::Ordering::Relaxed) {
        losses.push("the command's stdin was cut before its end".into());
    }
    if !losses.is_empty() {
        eprintln!(
            "byom: {}: {} (it exited with {status}); exiting 255",
            s.id,
            losses.join("; ")
        );
        return Ok(EXIT_LOST);
    }
    Ok(status)
}

/// `byom exec`'s status when bytes were lost on the way (stdin cut,
/// output not delivered), as ssh's for its own failures.
const EXIT_LOST: i32 = 255;

/// One NDJSON line on stdout, flushed (a reader acts on each event).
fn event_line(v: &serde_json::Value) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    out.flush()
}

/// `byom exec -t` and `byom shell`: the command on a terminal there, this
/// one in raw mode until it ends; its status is the command's.
async fn terminal(c: &mut Client, mut req: pb::CreateCommandRequest) -> anyhow::Result<i32> {
    let (rows, cols) = super::terminal::size_or_default();
    req.tty = true;
    req.rows = rows;
    req.cols = cols;
    let input = tokio_stream::wrappers::ReceiverStream::new(super::terminal::input());
    let run = byom_api::exec_stream(c, req, input).await?;
    let id = run.command.id.clone();
    let raw = super::terminal::Raw::enter();
    let mut stdout = std::io::stdout();
    let mut write_err = None;
    let opts = WatchOptions {
        idle: None,
        reconnects: EXEC_RECONNECTS,
    };
    let end = run
        .to_end(c, opts, |seen| {
            if let Seen::Output(o) = seen {
                if let Err(e) = stdout.write_all(&o.data).and_then(|_| stdout.flush()) {
                    write_err.get_or_insert(e);
                }
            }
        })
        .await;
    drop(raw);
    if let Some(e) = write_err {
        return Err(e.into());
    }
    let Some(s) = end.map_err(super::watch_err)? else {
        bail!("lost the server while in {id}; see `byom commands show {id}`");
    };
    match s.state() {
        CommandState::Exited => {}
        other => eprintln!("byom: {} {}{}", s.id, other.name(), reason(&s)),
    }
    Ok(exit_status(&s))
}
