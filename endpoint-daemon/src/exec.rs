//! Running commands and holding their results.
//!
//! Each command runs in its own process group so cancel and timeout kill
//! everything it started. Output of any length flows through a window per
//! stream: bytes are kept in memory until the server acknowledges them
//! (`OutputAck`), so a stream cut by a network drop can be re-attached
//! from the server's offsets, and a full window stops reading the
//! command's pipe, so a slow server or client slows the command instead of
//! filling memory (`OUTPUT_WINDOW_BYTES`).
//!
//! Invariant: a command ID is run at most once per daemon process: `seen`
//! remembers every ID this process accepted (bounded), and a repeat is
//! attached to, or refused, never run again.
//!
//! How a command runs (policy, sandbox, secrets) is decided in `plan`; its
//! process is started, fed and reaped in `process`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use byom_protocol::limits;
use byom_protocol::pb::{self, CommandState};
use tokio::sync::watch;

use crate::now_ms;
use crate::policy::Policy;

mod plan;
mod process;
use process::run_process;

/// After cancel or timeout, SIGTERM first, then SIGKILL after this grace.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// After the main process exits, how long its pipes may stay open (held by
/// background children) before the group is killed.
const PIPE_DRAIN: Duration = Duration::from_secs(2);

/// Where a streamed stdin goes: the process's pipe or its terminal.
pub type StdinWriter = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// One output stream: the bytes the server has not acknowledged yet.
#[derive(Default)]
struct Pipe {
    /// Offset of `buf[0]` in the stream: everything before it was
    /// acknowledged and forgotten.
    base: u64,
    buf: std::collections::VecDeque<u8>,
}

impl Pipe {
    /// Bytes written to the stream so far.
    fn end(&self) -> u64 {
        self.base + self.buf.len() as u64
    }
    fn ack(&mut self, to: u64) {
        let n = to.saturating_sub(self.base).min(self.buf.len() as u64);
        self.buf.drain(..n as usize);
        self.base += n;
    }
    /// At most `max` bytes from `from` (or from the oldest kept byte, if
    /// `from` was forgotten), with the offset they start at.
    fn read(&self, from: u64, max: usize) -> (u64, Vec<u8>) {
        let start = from.max(self.base);
        let skip = ((start - self.base) as usize).min(self.buf.len());
        let n = max.min(self.buf.len() - skip);
        let (a, b) = self.buf.as_slices();
        let mut out = Vec::with_capacity(n);
        if skip < a.len() {
            let k = n.min(a.len() - skip);
            out.extend_from_slice(&a[skip..skip + k]);
            out.extend_from_slice(&b[..n - k]);
        } else {
            let at = skip - a.len();
            out.extend_from_slice(&b[at..at + n]);
        }
        (start, out)
    }
}

#[derive(Default)]
struct Output {
    pipes: [Pipe; 2],
    /// Bytes were lost: a re-attach asked for output already forgotten.
    truncated: bool,
}

pub struct Entry {
    pub id: String,
    output: Mutex<Output>,
    started: Mutex<Option<pb::Started>>,
    exit: Mutex<Option<pb::Exit>>,
    /// Waiting for local approval under this rule.
    awaiting: Mutex<Option<String>>,
    /// Bumped on every change; streams wait on it.
    changed: watch::Sender<u64>,
    cancel: watch::Sender<Option<String>>,
    /// Bumped when the server acknowledges output: a full window may
    /// have room again.
    acked: watch::Sender<u64>,
    /// The process's stdin (a pipe, or its terminal), when it comes on a
    /// stream of its own: taken by that stream (see `conn::commands`).
    stdin: Mutex<Option<StdinWriter>>,
    /// Its terminal's master side, for resizes (`byom exec -t`).
    #[cfg(unix)]
    pty: Mutex<Option<std::os::fd::OwnedFd>>,
    /// Its stdin stream ended before its end.
    stdin_cut: std::sync::atomic::AtomicBool,
    /// Reads of the output pumps, and pumps waiting on a full window: a
    /// pipe still draining is not a pipe held open by a stray child.
    progress: std::sync::atomic::AtomicU64,
    blocked: std::sync::atomic::AtomicU32,
}

impl Entry {
    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }
    pub fn is_finished(&self) -> bool {
        self.exit.lock().map(|e| e.is_some()).unwrap_or(true)
    }
    pub fn cancel(&self, reason: &str) {
        self.cancel.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason.to_string());
                true
            } else {
                false
            }
        });
    }
    fn held_bytes(&self) -> u64 {
        self.output
            .lock()
            .map(|o| o.pipes.iter().map(|p| p.buf.len() as u64).sum())
            .unwrap_or(0)
    }
    /// The server has the output up to these offsets: forget it.
    pub fn ack(&self, offsets: [u64; 2]) {
        if let Ok(mut o) = self.output.lock() {
            for (p, to) in o.pipes.iter_mut().zip(offsets) {
                p.ack(to);
            }
        }
        self.acked.send_modify(|v| *v += 1);
    }
    /// Its process waits for a stdin stream not yet opened.
    pub fn wants_stdin(&self) -> bool {
        self.stdin.lock().map(|s| s.is_some()).unwrap_or(false)
    }
    /// Resizes its terminal (the kernel tells its foreground job).
    pub fn resize(&self, rows: u32, cols: u32) {
        #[cfg(unix)]
        if let Ok(p) = self.pty.lock() {
            if let Some(fd) = p.as_ref() {
                process::set_size(fd, rows, cols);
            }
        }
        #[cfg(not(unix))]
        let _ = (rows, cols);
    }
    /// Takes the process's stdin for its stream (once).
    pub fn take_stdin(&self) -> Option<StdinWriter> {
        self.stdin.lock().ok().and_then(|mut s| s.take())
    }
    /// Its stdin stream was cut before its end (or never came): the
    /// process's stdin is closed and the exit record says so.
    pub fn cut_stdin(&self) {
        if let Some(s) = self.take_stdin() {
            drop(s);
            self.mark_stdin_cut();
        }
    }
    pub fn mark_stdin_cut(&self) {
        self.stdin_cut
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
    /// The rule this command waits on for local approval, if it does.
    pub fn awaiting(&self) -> Option<String> {
        self.awaiting.lock().ok().and_then(|a| a.clone())
    }
    pub fn started(&self) -> Option<pb::Started> {
        self.started.lock().ok().and_then(|s| *s)
    }
    pub fn exit(&self) -> Option<pb::Exit> {
        self.exit.lock().ok().and_then(|s| s.clone())
    }
    /// Output of a stream from `offset`, at most `max` bytes, with the
    /// offset it starts at: later than `offset` when those bytes were
    /// already acknowledged and forgotten (then `truncated` is set, as
    /// the asker lost them).
    pub fn output_from(&self, stream: pb::OutputStream, offset: u64, max: usize) -> (u64, Vec<u8>) {
        let Ok(mut o) = self.output.lock() else {
            return (offset, Vec::new());
        };
        let i = usize::from(stream == pb::OutputStream::Stderr);
        let (at, data) = o.pipes[i].read(offset, max);
        if at > offset {
            o.truncated = true;
        }
        (at, data)
    }
    /// Whether a stream has output past `offset`.
    pub fn has_output(&self, stream: pb::OutputStream, offset: u64) -> bool {
        let i = usize::from(stream == pb::OutputStream::Stderr);
        self.output
            .lock()
            .map(|o| o.pipes[i].end() > offset)
            .unwrap_or(false)
    }
}

#[derive(Default)]
struct Table {
    entries: HashMap<String, Arc<Entry>>,
    /// Finished entries in finishing order, for eviction.
    finished: VecDeque<String>,
    seen: HashSet<String>,
    seen_order: VecDeque<String>,
}

/// What to do with an ExecRequest.
pub enum Admission {
    /// Started now.
    Started(Arc<Entry>),
    /// This process already has it: attach.
    Existing(Arc<Entry>),
    /// This process ran it and no longer holds its result.
    AlreadyRan,
    /// Refused (error code, message).
    Refused(&'static str, String),
}

/// Runs commands and holds their results for this daemon process.
pub struct Runner {
    table: Mutex<Table>,
    pub instance_id: String,
    pub max_concurrency: usize,
    /// The owner's local policy; `None` only in tests that run raw.
    policy: Mutex<Option<Policy>>,
    /// The config dir (secrets, pause flag); `None`: neither.
    config_dir: Option<std::path::PathBuf>,
    /// Draining for an upgrade (or a trial daemon): reported as paused so
    /// the server sends nothing new.
    draining: std::sync::atomic::AtomicBool,
    /// The OS sandbox commands run in (`None`: run raw, as unit tests do).
    #[cfg(target_os = "linux")]
    sandbox: Option<crate::sandbox::host::Host>,
}

/// How a command will run, once the policy said yes.
struct Plan {
    cwd: Option<std::path::PathBuf>,
    timeout: Option<Duration>,
    scrub: Vec<String>,
    /// The command with `{{secret:NAME}}` handles replaced by values.
    argv: Vec<String>,
    shell: String,
    env: HashMap<String, String>,
    stdin: Vec<u8>,
    /// Secret values to scrub from output.
    secrets: std::collections::BTreeMap<String, String>,
    /// The policy rule that makes this command wait for local approval.
    confirm: Option<String>,
    /// The local user it runs as, if not byomd's own.
    #[cfg_attr(not(unix), allow(dead_code))]
    run_as: Option<crate::policy::RunAs>,
    config_dir: Option<std::path::PathBuf>,
    /// The OS sandbox it runs in (argv, env and cwd filled at the start).
    #[cfg(target_os = "linux")]
    sandbox: Option<crate::sandbox::Spec>,
    /// Whether it could reach the network (told to the server).
    network: bool,
    /// The sandbox it gets, as `byom commands show` says it.
    sandbox_level: String,
}

impl Default for Runner {
    fn default() -> Self {
        Self::new()
    }
}

impl Runner {
    pub fn new() -> Self {
        let r = byom_protocol::random::bytes::<8>();
        Self {
            table: Mutex::new(Table::default()),
            instance_id: format!("{}-{}", std::process::id(), crate::tls::hex(&r)),
            max_concurrency: limits::MAX_CONCURRENT_COMMANDS,
            policy: Mutex::new(None),
            config_dir: None,
            draining: std::sync::atomic::AtomicBool::new(false),
            #[cfg(target_os = "linux")]
            sandbox: None,
        }
    }

    /// A runner that enforces `policy` on every command and resolves
    /// secrets from the config dir the policy lives in.
    pub fn with_policy(policy: Policy) -> Self {
        Self::with_policy_and_helper(policy, crate::sandbox::default_helper())
    }

    /// As [`Runner::with_policy`], with the sandbox helper at `helper`
    /// (byomd itself; tests point it at the built binary).
    pub fn with_policy_and_helper(policy: Policy, helper: std::path::PathBuf) -> Self {
        let mut r = Self::new();
        #[cfg(target_os = "linux")]
        {
            let dir = policy.path.parent().unwrap_or(std::path::Path::new("."));
            r.sandbox = Some(crate::sandbox::host::Host::new(helper, dir));
        }
        #[cfg(not(target_os = "linux"))]
        let _ = helper;
        r.config_dir = policy.path.parent().map(|p| p.to_path_buf());
        if let Some(n) = policy.max_concurrency() {
            r.max_concurrency = n.min(limits::MAX_CONCURRENT_COMMANDS);
        }
        r.policy = Mutex::new(Some(policy));
        r
    }

    /// The owner's kill switch: `<config-dir>/paused` exists.
    pub fn is_paused(&self) -> bool {
        self.is_draining()
            || self
                .config_dir
                .as_ref()
                .is_some_and(|d| crate::is_paused(d))
    }

    pub fn set_draining(&self, on: bool) {
        self.draining.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The owner's `[upgrade] auto_upgrade`.
    pub fn auto_upgrade(&self) -> bool {
        self.policy
            .lock()
            .ok()
            .and_then(|p| p.as_ref().map(|p| p.auto_upgrade()))
            .unwrap_or(false)
    }

    /// Programs the policy declares read-only (told to the server).
    pub fn read_only(&self) -> Vec<String> {
        match self.policy.lock().ok().and_then(|p| p.clone()) {
            Some(p) => p.read_only(),
            None => Vec::new(),
        }
    }

    /// Environment variable patterns the policy scrubs (told to the server).
    pub fn env_scrub(&self) -> Vec<String> {
        match self.policy.lock().ok().and_then(|p| p.clone()) {
            Some(p) => p.env_scrub(),
            None => Vec::new(),
        }
    }

    /// The sandbox commands get here now: `full`, `partial (…)`, `none (…)`.
    pub fn sandbox_level(&self) -> String {
        let rules = match self.policy.lock().ok().and_then(|p| p.clone()) {
            Some(p) => p.file.sandbox.clone(),
            None => return "none (no local policy)".into(),
        };
        #[cfg(target_os = "linux")]
        if let Some(h) = &self.sandbox {
            return h.level(&rules).to_string();
        }
        crate::sandbox::Support::default().level(&rules).to_string()
    }

    pub fn policy_info(&self) -> (String, String) {
        match self.policy.lock().ok().and_then(|p| p.clone()) {
            Some(p) => (p.digest.clone(), p.summary()),
            None => (String::new(), "no local policy".into()),
        }
    }

    /// (running, held) command IDs for Hello.
    pub fn inventory(&self) -> (Vec<String>, Vec<String>) {
        let Ok(t) = self.table.lock() else {
            return (Vec::new(), Vec::new());
        };
        let mut running = Vec::new();
        let mut held = Vec::new();
        for (id, e) in &t.entries {
            if e.is_finished() {
                held.push(id.clone());
            } else {
                running.push(id.clone());
            }
        }
        (running, held)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Entry>> {
        self.table.lock().ok()?.entries.get(id).cloned()
    }

    pub fn running_count(&self) -> usize {
        self.table
            .lock()
            .map(|t| t.entries.values().filter(|e| !e.is_finished()).count())
            .unwrap_or(0)
    }

    /// The server has persisted the result: forget it.
    pub fn acknowledge(&self, id: &str) {
        if let Ok(mut t) = self.table.lock() {
            if t.entries.get(id).is_some_and(|e| e.is_finished()) {
                t.entries.remove(id);
                t.finished.retain(|x| x != id);
            }
        }
    }

    /// Kills every running command (revocation, shutdown).
    pub fn cancel_all(&self, reason: &str) {
        if let Ok(t) = self.table.lock() {
            for e in t.entries.values() {
                e.cancel(reason);
            }
        }
    }

    pub fn admit(self: &Arc<Self>, req: pb::ExecRequest) -> Admission {
        // The ID names files here (approvals, temp dirs): only a real one.
        if byom_protocol::id::CommandId::parse(&req.command_id).is_err() {
            return Admission::Refused(
                "bad_request",
                format!(
                    "{:?} is not a command ID",
                    req.command_id.chars().take(64).collect::<String>()
                ),
            );
        }
        let Ok(mut t) = self.table.lock() else {
            return Admission::Refused("internal", "daemon state poisoned".into());
        };
        if let Some(e) = t.entries.get(&req.command_id) {
            return Admission::Existing(e.clone());
        }
        if t.seen.contains(&req.command_id) {
            return Admission::AlreadyRan;
        }
        if self.is_paused() {
            // Not seen: the server queues it again and sends it after resume.
            return Admission::Refused(
                "paused",
                "the machine's owner paused byomd (`byomd resume` to continue)".into(),
            );
        }
        let running = t.entries.values().filter(|e| !e.is_finished()).count();
        if running >= self.max_concurrency {
            return Admission::Refused(
                "busy",
                format!(
                    "the daemon already runs {running} commands (limit {})",
                    self.max_concurrency
                ),
            );
        }
        t.seen.insert(req.command_id.clone());
        t.seen_order.push_back(req.command_id.clone());
        while t.seen_order.len() > limits::MAX_SEEN_COMMAND_IDS {
            if let Some(old) = t.seen_order.pop_front() {
                t.seen.remove(&old);
            }
        }
        let entry = Arc::new(Entry {
            id: req.command_id.clone(),
            output: Mutex::new(Output::default()),
            started: Mutex::new(None),
            exit: Mutex::new(None),
            awaiting: Mutex::new(None),
            changed: watch::channel(0).0,
            cancel: watch::channel(None).0,
            acked: watch::channel(0).0,
            stdin: Mutex::new(None),
            #[cfg(unix)]
            pty: Mutex::new(None),
            stdin_cut: std::sync::atomic::AtomicBool::new(false),
            progress: std::sync::atomic::AtomicU64::new(0),
            blocked: std::sync::atomic::AtomicU32::new(0),
        });
        t.entries.insert(req.command_id.clone(), entry.clone());
        drop(t);
        let t_plan = Instant::now();
        let mut req = req;
        let login = req.tty && req.argv.is_empty() && req.shell.is_empty();
        if login {
            // A terminal with no command: the login shell here, named,
            // so the policy judges the program that will run.
            req.argv = vec![login_shell(), "-l".into()];
        }
        let plan = self.plan(&req, login);
        tracing::debug!(
            cmd = %req.command_id,
            plan_us = t_plan.elapsed().as_micros() as u64,
            "policy and sandbox planned"
        );
        let runner = self.clone();
        let e = entry.clone();
        let audit = crate::audit::Record {
            at_ms: 0,
            id: req.command_id.clone(),
            requested_by: req.requested_by.clone(),
            command: if req.shell.is_empty() {
                req.argv.join(" ")
            } else {
                req.shell.clone()
            },
            cwd: req.cwd.clone(),
            state: String::new(),
            exit_code: None,
            signal: None,
            duration_ms: 0,
            stdout_bytes: 0,
            stderr_bytes: 0,
            reason: String::new(),
            taint: if req.tainted {
                req.taint.clone()
            } else {
                String::new()
            },
            approved_by: req.approved_by.clone(),
        };
        let audit_dir = self.config_dir.clone();
        tokio::spawn(async move {
            let exit = match plan {
                Ok(plan) => run_process(&runner, &e, req, plan).await,
                Err((state, reason)) => {
                    tracing::warn!(cmd = %e.id, "{reason}");
                    exit_record(state, reason, Instant::now(), 0)
                }
            };
            if let Some(dir) = &audit_dir {
                let state = pb::CommandState::try_from(exit.state)
                    .map(|s| s.name())
                    .unwrap_or("unknown");
                let rec = crate::audit::Record {
                    at_ms: now_ms(),
                    state: state.to_string(),
                    exit_code: exit.exit_code,
                    signal: exit.signal,
                    duration_ms: exit.duration_ms,
                    stdout_bytes: exit.stdout_bytes,
                    stderr_bytes: exit.stderr_bytes,
                    reason: exit.reason.clone(),
                    ..audit
                };
                crate::audit::append(dir, &rec);
            }
            if let Ok(mut x) = e.exit.lock() {
                *x = Some(exit);
            }
            e.bump();
            runner.finished(&e.id);
        });
        Admission::Started(entry)
    }

    /// Keeps held results within their bounds, evicting the oldest.
    fn finished(&self, id: &str) {
        let Ok(mut t) = self.table.lock() else { return };
        if !t.entries.contains_key(id) {
            return;
        }
        t.finished.push_back(id.to_string());
        loop {
            let held: u64 = t
                .entries
                .values()
                .filter(|e| e.is_finished())
                .map(|e| e.held_bytes())
                .sum();
            if t.finished.len() <= limits::MAX_HELD_RESULTS && held <= limits::MAX_HELD_OUTPUT_BYTES
            {
                break;
            }
            let Some(old) = t.finished.pop_front() else {
                break;
            };
            tracing::warn!(cmd = %old, "dropping an undelivered result: too many held results");
            t.entries.remove(&old);
        }
    }
}

/// This user's login shell (its passwd entry's), else `/bin/sh`.
fn login_shell() -> String {
    #[cfg(unix)]
    {
        // SAFETY: getpwuid returns a pointer into static storage or null;
        // its shell is copied out at once.
        unsafe {
            let pw = libc::getpwuid(libc::geteuid());
            if !pw.is_null() && !(*pw).pw_shell.is_null() {
                let sh = std::ffi::CStr::from_ptr((*pw).pw_shell)
                    .to_string_lossy()
                    .into_owned();
                if sh.starts_with('/') && !sh.ends_with("/nologin") && !sh.ends_with("/false") {
                    return sh;
                }
            }
        }
    }
    "/bin/sh".into()
}

fn exit_record(
    state: CommandState,
    reason: String,
    started: Instant,
    started_at_ms: u64,
) -> pb::Exit {
    pb::Exit {
        state: state as i32,
        reason,
        duration_ms: started.elapsed().as_millis() as u64,
        started_at_ms,
        finished_at_ms: now_ms(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A well-formed command ID.
    fn id(n: u8) -> String {
        format!("cmd_{n:0>26}")
    }

    fn req(id: &str, shell: &str) -> pb::ExecRequest {
        pb::ExecRequest {
            command_id: id.into(),
            shell: shell.into(),
            ..Default::default()
        }
    }

    async fn wait(e: &Arc<Entry>) -> pb::Exit {
        // Bounded by time, not by wakeups: every output chunk wakes it, and
        // a loaded machine reads a big output in many small chunks.
        let mut rx = e.subscribe();
        let deadline = Instant::now() + Duration::from_secs(20);
        for _ in 0..1_000_000 {
            if let Some(x) = e.exit() {
                return x;
            }
            if Instant::now() > deadline {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await;
        }
        panic!("command did not finish");
    }

    #[tokio::test]
    async fn runs_once_and_reports() {
        let r = Arc::new(Runner::new());
        let Admission::Started(e) = r.admit(req(&id(1), "echo out; echo err >&2; exit 3")) else {
            panic!()
        };
        let x = wait(&e).await;
        assert_eq!(x.exit_code, Some(3));
        assert_eq!(
            e.output_from(pb::OutputStream::Stdout, 0, 100),
            (0, b"out\n".to_vec())
        );
        assert_eq!(
            e.output_from(pb::OutputStream::Stderr, 0, 100),
            (0, b"err\n".to_vec())
        );
        assert!(matches!(
            r.admit(req(&id(1), "true")),
            Admission::Existing(_)
        ));
        assert_eq!(r.inventory().1, vec![id(1)]);
        r.acknowledge(&id(1));
        assert!(matches!(
            r.admit(req(&id(1), "true")),
            Admission::AlreadyRan
        ));
    }

    /// A cancel right behind the request (before the process exists) means
    /// it never starts.
    #[tokio::test]
    async fn a_cancel_before_the_start_means_it_never_runs() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let r = Arc::new(Runner::new());
        let Admission::Started(e) = r.admit(req(&id(2), &format!("touch {}", marker.display())))
        else {
            panic!()
        };
        e.cancel("cancelled by admin");
        let x = wait(&e).await;
        assert_eq!(x.state(), CommandState::Cancelled, "{x:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !marker.exists(),
            "a command cancelled before it started ran"
        );
    }

    #[tokio::test]
    async fn timeout_kills_the_group() {
        let r = Arc::new(Runner::new());
        let mut q = req(&id(3), "sleep 30 & sleep 30; echo never");
        q.timeout_ms = 300;
        let Admission::Started(e) = r.admit(q) else {
            panic!()
        };
        let t = Instant::now();
        let x = wait(&e).await;
        assert_eq!(x.state(), CommandState::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    /// The server's ID names files here: a path in it is refused.
    #[tokio::test]
    async fn a_command_id_that_is_not_one_is_refused() {
        let r = Arc::new(Runner::new());
        for bad in ["../../etc/x", "cmd_../../x", "", "cmd_1"] {
            assert!(
                matches!(
                    r.admit(req(bad, "true")),
                    Admission::Refused("bad_request", _)
                ),
                "{bad:?} was taken"
            );
        }
    }

    /// Output of any length flows through a window: a full one stops the
    /// command (it blocks writing its pipe) until the server acknowledges,
    /// and nothing is dropped.
    #[tokio::test]
    async fn a_full_window_slows_the_command_and_loses_nothing() {
        let r = Arc::new(Runner::new());
        let total = 3 * limits::OUTPUT_WINDOW_BYTES as u64 + 12345;
        let Admission::Started(e) = r.admit(req(
            &id(4),
            &format!("head -c {total} /dev/zero; echo done >&2"),
        )) else {
            panic!()
        };
        // Nobody acknowledges: the window fills and the command waits.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(e.exit().is_none(), "the command ran past a full window");
        assert!(e.held_bytes() <= limits::OUTPUT_WINDOW_BYTES as u64 * 2);
        // Read and acknowledge like the server does, to the end.
        let mut at = 0u64;
        let deadline = Instant::now() + Duration::from_secs(30);
        while e.exit().is_none() || e.has_output(pb::OutputStream::Stdout, at) {
            assert!(Instant::now() < deadline, "stuck at {at}");
            let (from, data) = e.output_from(pb::OutputStream::Stdout, at, 1 << 20);
            assert_eq!(from, at, "bytes were skipped");
            assert!(data.iter().all(|b| *b == 0));
            at += data.len() as u64;
            e.ack([at, 0]);
            if data.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let x = wait(&e).await;
        assert_eq!(at, total);
        assert_eq!(x.stdout_bytes, total);
        assert!(!x.truncated);
        // An attach from an offset already forgotten is told where the
        // kept bytes start, and the loss is recorded.
        let (from, _) = e.output_from(pb::OutputStream::Stdout, 0, 10);
        assert_eq!(from, total);
    }

    #[test]
    fn a_pipe_reads_across_its_ring() {
        let mut p = Pipe::default();
        p.buf.extend(0u8..10);
        p.ack(4);
        p.buf.extend(10u8..14);
        assert_eq!(p.read(4, 100), (4, (4u8..14).collect::<Vec<_>>()));
        assert_eq!(p.read(6, 3), (6, vec![6, 7, 8]));
        assert_eq!(p.read(0, 2), (4, vec![4, 5]));
        assert_eq!(p.read(20, 2), (20, vec![]));
        assert_eq!(p.end(), 14);
    }
}
