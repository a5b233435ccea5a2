//! A command's process, from the owner's local approval to its exit:
//! started in its sandbox (or, without one, in a process group of its
//! own), output pumped and scrubbed into its entry, killed whole on
//! timeout or cancel.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use byom_protocol::limits;
use byom_protocol::pb::{self, CommandState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{exit_record, Entry, Plan, Runner, KILL_GRACE, PIPE_DRAIN};
use crate::now_ms;
use crate::secrets::{Scrubber, Stream};

/// Everything a command started, to signal as one: its process group
/// (on Linux the sandbox helper's, whose PID 1 takes the namespace down),
/// or on Windows its job.
struct Tree {
    #[cfg_attr(not(unix), allow(dead_code))]
    pgid: u32,
    #[cfg(windows)]
    job: Option<crate::sandbox::windows::Job>,
}

impl Tree {
    fn kill(&self, sig: i32) {
        #[cfg(unix)]
        // SAFETY: killpg only sends a signal; a stale pgid fails with ESRCH.
        unsafe {
            libc::killpg(self.pgid as libc::pid_t, sig);
        }
        #[cfg(windows)]
        if let Some(j) = &self.job {
            let _ = sig;
            j.kill();
        }
        #[cfg(not(any(unix, windows)))]
        let _ = sig;
    }
}

#[cfg(unix)]
const SIGTERM: i32 = libc::SIGTERM;
#[cfg(unix)]
const SIGKILL: i32 = libc::SIGKILL;
#[cfg(not(unix))]
const SIGTERM: i32 = 15;
#[cfg(not(unix))]
const SIGKILL: i32 = 9;

async fn pump<R: tokio::io::AsyncRead + Unpin>(
    entry: Arc<Entry>,
    mut r: R,
    stream: Stream,
    scrub: Arc<std::sync::Mutex<Scrubber>>,
) {
    // Filled without zeroing first: most commands print little or nothing.
    let mut raw = Vec::with_capacity(limits::MAX_OUTPUT_CHUNK_BYTES);
    let mut acked = entry.acked.subscribe();
    loop {
        // A full window: the server has not taken what we have. The
        // command waits (its pipe fills) rather than memory growing.
        let mut waited = false;
        while entry
            .output
            .lock()
            .map(|o| {
                o.pipes
                    .iter()
                    .any(|p| p.buf.len() >= limits::OUTPUT_WINDOW_BYTES)
            })
            .unwrap_or(false)
        {
            if !waited {
                waited = true;
                entry
                    .blocked
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if acked.changed().await.is_err() {
                return;
            }
        }
        if waited {
            entry
                .blocked
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        raw.clear();
        let n: usize = r.read_buf(&mut raw).await.unwrap_or_default();
        entry
            .progress
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Secret values never leave the machine: split across reads, or
        // between stdout and stderr, or encoded.
        let out = match scrub.lock() {
            Ok(mut s) if n == 0 => s.finish(stream),
            Ok(mut s) => s.push(stream, &raw[..n]),
            // Never send unscrubbed output: a poisoned scrubber ends it.
            Err(_) => return,
        };
        if out.iter().any(|o| !o.is_empty()) {
            if let Ok(mut o) = entry.output.lock() {
                for (p, buf) in o.pipes.iter_mut().zip(out.iter()) {
                    p.buf.extend(buf.iter());
                }
            }
            entry.bump();
        }
        if n == 0 {
            return;
        }
    }
}

/// Waits for the owner's `byomd approve|deny ID`. Ok: approved; Err: the
/// exit record (denied or cancelled).
async fn await_approval(
    entry: &Arc<Entry>,
    req: &pb::ExecRequest,
    plan: &Plan,
    rule: &str,
) -> Result<(), pb::Exit> {
    let t0 = Instant::now();
    let Some(dir) = &plan.config_dir else {
        return Err(exit_record(
            CommandState::Denied,
            "local approval needed but no config dir".into(),
            t0,
            0,
        ));
    };
    let command = if req.shell.is_empty() {
        req.argv.join(" ")
    } else {
        req.shell.clone()
    };
    let r = crate::approvals::Request {
        id: entry.id.clone(),
        command,
        cwd: plan
            .cwd
            .as_ref()
            .map(|c| c.display().to_string())
            .unwrap_or_default(),
        rule: rule.to_string(),
        requested_at_ms: now_ms(),
    };
    if let Err(e) = crate::approvals::request(dir, &r) {
        return Err(exit_record(
            CommandState::Failed,
            format!("cannot ask for local approval: {e:#}"),
            t0,
            0,
        ));
    }
    tracing::warn!(cmd = %entry.id, "waiting for local approval: byomd approve {} (or deny)", entry.id);
    if let Ok(mut a) = entry.awaiting.lock() {
        *a = Some(rule.to_string());
    }
    entry.bump();
    let mut cancel = entry.cancel.subscribe();
    let result = loop {
        if let Some(ok) = crate::approvals::answer(dir, &entry.id) {
            break if ok {
                Ok(())
            } else {
                Err(exit_record(
                    CommandState::Denied,
                    "denied by the machine's owner (byomd deny)".into(),
                    t0,
                    0,
                ))
            };
        }
        if let Some(reason) = cancel.borrow().clone() {
            break Err(exit_record(CommandState::Cancelled, reason, t0, 0));
        }
        let _ = tokio::time::timeout(crate::approvals::POLL, cancel.changed()).await;
    };
    crate::approvals::clear(dir, &entry.id);
    result
}

/// How long the sandbox helper may take to start a command before byomd
/// gives up on it.
#[cfg(target_os = "linux")]
const SANDBOX_START: std::time::Duration = std::time::Duration::from_secs(30);

/// A started process, and the sandbox it runs in.
struct Spawned {
    child: tokio::process::Child,
    /// The private temp dir to remove when it ends.
    #[cfg(target_os = "linux")]
    tmp: Option<crate::sandbox::Tmp>,
    /// Our end of the helper's "byomd is alive" pipe, held to the end.
    #[cfg(target_os = "linux")]
    alive: Option<std::os::fd::OwnedFd>,
    /// The helper's report of network use, read when it ends.
    #[cfg(target_os = "linux")]
    usage: Option<std::os::fd::OwnedFd>,
    #[cfg(windows)]
    job: Option<crate::sandbox::windows::Job>,
}

/// A command's terminal (`tty`): byomd keeps the master side, the slave
/// becomes the command's stdin, stdout and stderr.
#[cfg(unix)]
pub(super) struct Pty {
    pub master: std::os::fd::OwnedFd,
    pub slave: std::os::fd::OwnedFd,
}

/// Both sides are close-on-exec from their first moment, so a command
/// started meanwhile on another thread cannot inherit this terminal.
#[cfg(target_os = "linux")]
fn open_pty(rows: u32, cols: u32) -> std::io::Result<Pty> {
    use std::os::fd::FromRawFd;
    let last = std::io::Error::last_os_error;
    // SAFETY: each call checks its result; the descriptors become owned.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if m < 0 {
            return Err(last());
        }
        let master = std::os::fd::OwnedFd::from_raw_fd(m);
        if libc::grantpt(m) != 0 || libc::unlockpt(m) != 0 {
            return Err(last());
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(m, name.as_mut_ptr(), name.len()) != 0 {
            return Err(last());
        }
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if s < 0 {
            return Err(last());
        }
        let slave = std::os::fd::OwnedFd::from_raw_fd(s);
        set_size(&master, rows, cols);
        Ok(Pty { master, slave })
    }
}

/// Elsewhere: openpty, then close-on-exec (a moment when a command
/// started on another thread could inherit it).
#[cfg(all(unix, not(target_os = "linux")))]
fn open_pty(rows: u32, cols: u32) -> std::io::Result<Pty> {
    use std::os::fd::FromRawFd;
    let (mut m, mut s) = (-1, -1);
    let ws = winsize(rows, cols);
    // SAFETY: openpty writes two descriptors we then own.
    let r = unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are new and ours.
    unsafe {
        libc::fcntl(m, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(s, libc::F_SETFD, libc::FD_CLOEXEC);
        Ok(Pty {
            master: std::os::fd::OwnedFd::from_raw_fd(m),
            slave: std::os::fd::OwnedFd::from_raw_fd(s),
        })
    }
}

#[cfg(unix)]
fn winsize(rows: u32, cols: u32) -> libc::winsize {
    libc::winsize {
        ws_row: rows.min(u16::MAX as u32) as u16,
        ws_col: cols.min(u16::MAX as u32) as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Sets a terminal's size through its master side.
#[cfg(unix)]
pub(super) fn set_size(master: &std::os::fd::OwnedFd, rows: u32, cols: u32) {
    use std::os::fd::AsRawFd;
    let ws = winsize(rows, cols);
    // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
    unsafe {
        libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws);
    }
}

fn stdio(cmd: &mut tokio::process::Command, req: &pb::ExecRequest, pty: Option<&Pty>) {
    #[cfg(unix)]
    if let Some(p) = pty {
        let io = || {
            p.slave
                .try_clone()
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null())
        };
        cmd.stdin(io()).stdout(io()).stderr(io()).kill_on_drop(true);
        return;
    }
    cmd.stdin(if req.stdin.is_empty() && !req.stdin_stream {
        Stdio::null()
    } else {
        Stdio::piped()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
}

/// Starts the command: in its sandbox when it has one (the helper
/// reports once the program was exec'd, or why not), else directly in a
/// process group of its own. Err: why it did not start.
async fn spawn(
    runner: &Runner,
    req: &pb::ExecRequest,
    plan: &Plan,
    argv: Vec<String>,
    pty: Option<&Pty>,
) -> Result<Spawned, String> {
    #[cfg(target_os = "linux")]
    if let (Some(spec), Some(host)) = (&plan.sandbox, &runner.sandbox) {
        let t0 = Instant::now();
        let mut spec = spec.clone();
        spec.tty = pty.is_some();
        let cwd = plan.cwd.clone().unwrap_or_else(|| "/".into());
        host.finish(
            &mut spec,
            argv,
            &plan.env,
            &plan.scrub,
            plan.run_as.as_ref(),
            &cwd,
        )
        .map_err(|e| format!("cannot make the command's temp dir: {e}"))?;
        let finish_us = t0.elapsed().as_micros() as u64;
        let prepared = crate::sandbox::prepare(&host.helper, &spec)
            .map_err(|e| format!("cannot prepare the sandbox: {e}"))?;
        let report = prepared.report;
        let alive = prepared.alive;
        let usage = prepared.usage;
        let mut cmd = tokio::process::Command::from(prepared.cmd);
        stdio(&mut cmd, req, pty);
        let child = cmd.spawn();
        // Our copies of the spec and the report's write end: the report
        // ends when the helper's last copy does.
        drop(prepared.keep);
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                host.clean(&spec);
                return Err(format!("cannot start the sandbox helper: {e}"));
            }
        };
        let spawn_us = t0.elapsed().as_micros() as u64 - finish_us;
        let read = crate::sandbox::read_report_async(report);
        let failed = match tokio::time::timeout(SANDBOX_START, read).await {
            Ok(Some(r)) if r.ok => {
                // Where a command's start goes: making its temp dir and
                // environment, starting the helper, the helper's setup
                // (from its start to the command's exec), all of it.
                tracing::debug!(
                    finish_us,
                    spawn_us,
                    setup_us = r.setup_us,
                    total_us = t0.elapsed().as_micros() as u64,
                    "command started in its sandbox"
                );
                None
            }
            Ok(Some(r)) => Some(r.error),
            Ok(_) => Some("the sandbox helper ended without saying why (see byomd's log)".into()),
            Err(_) => Some(format!(
                "the sandbox helper did not start the command within {}",
                humantime::format_duration(SANDBOX_START)
            )),
        };
        if let Some(why) = failed {
            let _ = child.kill().await;
            host.clean(&spec);
            return Err(why);
        }
        // Only the temp dir is needed from here on; the command line and
        // environment (secrets in them) are not kept.
        return Ok(Spawned {
            child,
            tmp: spec.tmp,
            alive: Some(alive),
            usage: spec.observe_net.then_some(usage),
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = runner;
    let Some((prog, args)) = argv.split_first() else {
        return Err("empty command".into());
    };
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args);
    if let Some(cwd) = &plan.cwd {
        cmd.current_dir(cwd);
    }
    #[cfg(unix)]
    if let Some(r) = &plan.run_as {
        // As root, std drops the supplementary groups before setuid.
        cmd.uid(r.uid).gid(r.gid);
        cmd.env("HOME", &r.home)
            .env("USER", &r.user)
            .env("LOGNAME", &r.user);
    }
    cmd.envs(&plan.env);
    for k in &plan.scrub {
        cmd.env_remove(k);
    }
    stdio(&mut cmd, req, pty);
    #[cfg(unix)]
    if pty.is_some() {
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // A session of its own with the terminal as its
                // controlling one (so also a process group to kill).
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    } else {
        cmd.process_group(0);
    }
    match cmd.spawn() {
        Ok(child) => {
            #[cfg(windows)]
            let job = match crate::sandbox::windows::Job::new() {
                Ok(j) => {
                    match child.raw_handle().map(|h| j.assign(h)) {
                        Some(Ok(())) => Some(j),
                        _ => {
                            tracing::warn!("cannot put the command in a job: its process tree is not contained");
                            None
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!("cannot make a job for the command: {e}");
                    None
                }
            };
            Ok(Spawned {
                child,
                #[cfg(target_os = "linux")]
                tmp: None,
                #[cfg(target_os = "linux")]
                alive: None,
                #[cfg(target_os = "linux")]
                usage: None,
                #[cfg(windows)]
                job,
            })
        }
        Err(e) => {
            let what = req.argv.first().map(String::as_str).unwrap_or("sh");
            Err(format!("cannot start {what:?}: {e}"))
        }
    }
}

pub(super) async fn run_process(
    runner: &Runner,
    entry: &Arc<Entry>,
    req: pb::ExecRequest,
    plan: Plan,
) -> pb::Exit {
    if let Some(rule) = plan.confirm.clone() {
        if let Err(exit) = await_approval(entry, &req, &plan, &rule).await {
            return exit;
        }
    }
    let t0 = Instant::now();
    let argv: Vec<String> = if !plan.shell.is_empty() {
        vec!["sh".into(), "-c".into(), plan.shell.clone()]
    } else if !plan.argv.is_empty() {
        plan.argv.clone()
    } else {
        return exit_record(CommandState::Failed, "empty command".into(), t0, 0);
    };
    if let Some(cwd) = &plan.cwd {
        if !cwd.is_dir() {
            return exit_record(
                CommandState::Failed,
                format!(
                    "working directory {} does not exist on this machine",
                    cwd.display()
                ),
                t0,
                0,
            );
        }
    }
    // A cancel that came before the process exists (with the request, or
    // while it waited) means it never starts; the watch below only sees
    // cancels from here on.
    let mut cancel = entry.cancel.subscribe();
    if let Some(reason) = cancel.borrow_and_update().clone() {
        return exit_record(CommandState::Cancelled, reason, t0, 0);
    }
    #[cfg(unix)]
    let pty = match req.tty.then(|| open_pty(req.rows, req.cols)).transpose() {
        Ok(p) => p,
        Err(e) => {
            return exit_record(
                CommandState::Failed,
                format!("cannot open a terminal for it: {e}"),
                t0,
                0,
            )
        }
    };
    #[cfg(not(unix))]
    let pty: Option<Pty> = None;
    let spawned = match spawn(runner, &req, &plan, argv, pty.as_ref()).await {
        Ok(s) => s,
        Err(reason) => {
            drop(plan);
            return exit_record(CommandState::Failed, reason, t0, 0);
        }
    };
    // The command holds the slave now; our end is the master: read as
    // its output, written as its stdin, resized.
    #[cfg(unix)]
    let terminal = match pty {
        Some(p) => {
            drop(p.slave);
            let (Ok(r), Ok(w)) = (p.master.try_clone(), p.master.try_clone()) else {
                return exit_record(
                    CommandState::Failed,
                    "cannot use its terminal".into(),
                    t0,
                    0,
                );
            };
            if let Ok(mut slot) = entry.pty.lock() {
                *slot = Some(p.master);
            }
            Some((
                tokio::fs::File::from_std(std::fs::File::from(r)),
                tokio::fs::File::from_std(std::fs::File::from(w)),
            ))
        }
        None => None,
    };
    let mut child = spawned.child;
    #[cfg(target_os = "linux")]
    let spawned_tmp = spawned.tmp;
    #[cfg(target_os = "linux")]
    let _alive = spawned.alive;
    #[cfg(target_os = "linux")]
    let usage = spawned.usage;
    let pid = child.id().unwrap_or(0);
    let tree = Tree {
        pgid: pid,
        #[cfg(windows)]
        job: spawned.job,
    };
    let started_at_ms = now_ms();
    // A streamed stdin is handed to its stream before the start is
    // known, so the stream finds it once the server hears of the start.
    #[cfg(unix)]
    let (term_out, term_in) = match terminal {
        Some((r, w)) => (Some(r), Some(w)),
        None => (None, None),
    };
    #[cfg(not(unix))]
    let (term_out, term_in): (Option<tokio::fs::File>, Option<tokio::fs::File>) = (None, None);
    if req.stdin_stream {
        let w: Option<super::StdinWriter> = match term_in {
            Some(t) => Some(Box::new(t)),
            None => child
                .stdin
                .take()
                .map(|s| Box::new(s) as super::StdinWriter),
        };
        if let (Some(w), Ok(mut slot)) = (w, entry.stdin.lock()) {
            *slot = Some(w);
        }
    }
    if let Ok(mut s) = entry.started.lock() {
        *s = Some(pb::Started { pid, started_at_ms });
    }
    entry.bump();
    if let Some(mut stdin) = child.stdin.take() {
        let data = plan.stdin.clone();
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        });
    }
    // One scrubber for both streams: a value split between them is caught.
    let scrub = Arc::new(std::sync::Mutex::new(Scrubber::new(&plan.secrets)));
    let out = match term_out {
        Some(t) => Some(tokio::spawn(pump(
            entry.clone(),
            t,
            Stream::Out,
            scrub.clone(),
        ))),
        None => child
            .stdout
            .take()
            .map(|o| tokio::spawn(pump(entry.clone(), o, Stream::Out, scrub.clone()))),
    };
    let err = child
        .stderr
        .take()
        .map(|e| tokio::spawn(pump(entry.clone(), e, Stream::Err, scrub.clone())));

    let timeout = plan.timeout;
    let mut ended_by: Option<(CommandState, String)> = None;
    let status = loop {
        let deadline = async {
            match timeout {
                Some(t) => tokio::time::sleep(t.saturating_sub(t0.elapsed())).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            s = child.wait() => break s,
            _ = deadline, if ended_by.is_none() => {
                ended_by = Some((CommandState::TimedOut, format!("killed after the {} timeout", humantime::format_duration(timeout.unwrap_or_default()))));
            }
            r = cancel.changed(), if ended_by.is_none() => {
                if r.is_err() { continue; }
                let reason = cancel.borrow().clone().unwrap_or_else(|| "cancelled".into());
                ended_by = Some((CommandState::Cancelled, reason));
            }
        }
        // Ask nicely, then insist; the whole group either way.
        tree.kill(SIGTERM);
        let grace = tokio::time::timeout(KILL_GRACE, child.wait()).await;
        match grace {
            Ok(s) => break s,
            Err(_) => {
                tree.kill(SIGKILL);
                break child.wait().await;
            }
        }
    };
    // Background children may hold the pipes open: give them a moment, then
    // take the group down so nothing outlives the command. Time spent
    // waiting for the server to take output (a full window) or reading
    // what is left does not count: only a pipe held open and silent.
    let drain = async {
        if let Some(o) = out {
            let _ = o.await;
        }
        if let Some(e) = err {
            let _ = e.await;
        }
    };
    tokio::pin!(drain);
    let mut killed = false;
    loop {
        let before = entry.progress.load(std::sync::atomic::Ordering::Relaxed);
        if tokio::time::timeout(PIPE_DRAIN, &mut drain).await.is_ok() {
            break;
        }
        let moved = entry.progress.load(std::sync::atomic::Ordering::Relaxed) != before;
        let waiting = entry.blocked.load(std::sync::atomic::Ordering::Relaxed) > 0;
        if !killed && !moved && !waiting {
            // Once the group is dead the pipes end, and the pumps with them.
            tree.kill(SIGKILL);
            killed = true;
        }
    }
    // It ended without wanting (more of) its stdin: not a cut.
    drop(entry.take_stdin());
    #[cfg(unix)]
    if let Ok(mut p) = entry.pty.lock() {
        p.take();
    }
    if ended_by.is_some() {
        tree.kill(SIGKILL);
    }
    let mut exit = match ended_by {
        Some((state, reason)) => exit_record(state, reason, t0, started_at_ms),
        None => exit_record(CommandState::Exited, String::new(), t0, started_at_ms),
    };
    exit.pid = pid;
    match status {
        Ok(s) => {
            exit.exit_code = s.code();
            #[cfg(unix)]
            {
                use std::os::unix::process::ExitStatusExt;
                exit.signal = s.signal();
            }
        }
        Err(e) => {
            exit.state = CommandState::Failed as i32;
            exit.reason = format!("waiting for the process failed: {e}");
        }
    }
    if let Ok(o) = entry.output.lock() {
        exit.stdout_bytes = o.pipes[0].end();
        exit.stderr_bytes = o.pipes[1].end();
        exit.truncated = o.truncated;
    }
    exit.stdin_cut = entry.stdin_cut.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(target_os = "linux")]
    if let Some(t) = &spawned_tmp {
        crate::sandbox::host::remove_tmp(t);
    }
    // Could reach the network, and (where the sandbox watched) did: the
    // kernel's word, not a guess from the command's text.
    exit.network = plan.network;
    #[cfg(target_os = "linux")]
    if let Some(u) = &usage {
        exit.network = plan.network && crate::sandbox::netwatch::read_usage(u);
    }
    exit.sandbox = plan.sandbox_level.clone();
    exit
}
