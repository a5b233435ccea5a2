//! Running commands and holding their results.
//!
//! Each command runs in its own process group so cancel and timeout kill
//! everything it started. Output is kept in memory per command (bounded by
//! `MAX_COMMAND_OUTPUT_BYTES`; beyond it output is dropped and `truncated`
//! is reported) until the server acknowledges the exit, so a stream cut by a
//! network drop can be re-attached from the server's offsets.
//!
//! Invariant: a command ID is run at most once per daemon process: `seen`
//! remembers every ID this process accepted (bounded), and a repeat is
//! attached to, or refused, never run again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use byom_protocol::limits;
use byom_protocol::pb::{self, CommandState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::now_ms;
use crate::policy::{Decision, Policy};
use crate::secrets::{Scrubber, Stream};

/// After cancel or timeout, SIGTERM first, then SIGKILL after this grace.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// After the main process exits, how long its pipes may stay open (held by
/// background children) before the group is killed.
const PIPE_DRAIN: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
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
            .map(|o| (o.stdout.len() + o.stderr.len()) as u64)
            .unwrap_or(0)
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
    /// Output of a stream from `offset`, at most `max` bytes.
    pub fn output_from(&self, stream: pb::OutputStream, offset: u64, max: usize) -> Vec<u8> {
        let Ok(o) = self.output.lock() else {
            return Vec::new();
        };
        let buf = if stream == pb::OutputStream::Stderr {
            &o.stderr
        } else {
            &o.stdout
        };
        let start = (offset as usize).min(buf.len());
        let end = (start + max).min(buf.len());
        buf[start..end].to_vec()
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
}

impl Default for Runner {
    fn default() -> Self {
        Self::new()
    }
}

impl Runner {
    pub fn new() -> Self {
        let mut r = [0u8; 8];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut r);
        Self {
            table: Mutex::new(Table::default()),
            instance_id: format!("{}-{}", std::process::id(), crate::tls::hex(&r)),
            max_concurrency: limits::MAX_CONCURRENT_COMMANDS,
            policy: Mutex::new(None),
            config_dir: None,
            draining: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A runner that enforces `policy` on every command and resolves
    /// secrets from the config dir the policy lives in.
    pub fn with_policy(policy: Policy) -> Self {
        let mut r = Self::new();
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
                .is_some_and(|d| crate::paused_flag(d).exists())
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

    pub fn policy_info(&self) -> (String, String) {
        match self.policy.lock().ok().and_then(|p| p.clone()) {
            Some(p) => (p.digest.clone(), p.summary()),
            None => (String::new(), "no local policy".into()),
        }
    }

    /// Asks the policy (re-read if the file changed) about a command, then
    /// puts secret values in place of their handles.
    fn plan(&self, req: &pb::ExecRequest) -> Result<Plan, (CommandState, String)> {
        let timeout = (req.timeout_ms > 0).then(|| Duration::from_millis(req.timeout_ms));
        let (cwd, timeout, scrub, confirm, run_as) = {
            let Ok(mut guard) = self.policy.lock() else {
                return Err((CommandState::Failed, "daemon policy state poisoned".into()));
            };
            match guard.as_mut() {
                None => (
                    (!req.cwd.is_empty()).then(|| std::path::PathBuf::from(&req.cwd)),
                    timeout,
                    Vec::new(),
                    None,
                    None,
                ),
                Some(policy) => {
                    if let Some(e) = policy.reload_if_changed() {
                        tracing::error!(
                            "policy change ignored, keeping the previous policy: {e:#}"
                        );
                    }
                    let r = crate::policy::Request {
                        argv: &req.argv,
                        shell: &req.shell,
                        cwd: &req.cwd,
                        env: Some(&req.env),
                        stdin: &req.stdin,
                        timeout,
                        requested_by: &req.requested_by,
                        taint: match (req.tainted, req.taint.is_empty()) {
                            (false, _) => "",
                            (true, true) => "no reason given",
                            (true, false) => &req.taint,
                        },
                        approved_by: &req.approved_by,
                    };
                    match policy.check(&r) {
                        Ok(Decision::Allow {
                            cwd,
                            timeout,
                            scrub,
                            confirm,
                            run_as,
                        }) => (Some(cwd), timeout, scrub, confirm, run_as),
                        Ok(Decision::Deny { rule }) => {
                            return Err((
                                CommandState::Denied,
                                format!("denied by local policy: {rule}"),
                            ))
                        }
                        Err(msg) => return Err((CommandState::Failed, msg)),
                    }
                }
            }
        };
        let uses_secrets = |s: &str| s.contains("{{secret:");
        let any = req.argv.iter().any(|a| uses_secrets(a))
            || uses_secrets(&req.shell)
            || req.env.values().any(|v| uses_secrets(v))
            || String::from_utf8_lossy(&req.stdin).contains("{{secret:");
        let secrets = match &self.config_dir {
            Some(d) => crate::secrets::load_values(d)
                .map_err(|e| (CommandState::Failed, format!("cannot read secrets: {e:#}")))?,
            None => Default::default(),
        };
        let sub = |s: &str| {
            crate::secrets::substitute(s, &secrets).map_err(|e| (CommandState::Failed, e))
        };
        let (argv, shell, env, stdin) = if any {
            let argv = req
                .argv
                .iter()
                .map(|a| sub(a))
                .collect::<Result<Vec<_>, _>>()?;
            let shell = sub(&req.shell)?;
            let env = req
                .env
                .iter()
                .map(|(k, v)| Ok((k.clone(), sub(v)?)))
                .collect::<Result<HashMap<_, _>, (CommandState, String)>>()?;
            let stdin = match std::str::from_utf8(&req.stdin) {
                Ok(t) if t.contains("{{secret:") => sub(t)?.into_bytes(),
                _ => req.stdin.clone(),
            };
            (argv, shell, env, stdin)
        } else {
            (
                req.argv.clone(),
                req.shell.clone(),
                req.env.clone(),
                req.stdin.clone(),
            )
        };
        Ok(Plan {
            cwd,
            timeout,
            scrub,
            argv,
            shell,
            env,
            stdin,
            secrets,
            confirm,
            run_as,
            config_dir: self.config_dir.clone(),
        })
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
        });
        t.entries.insert(req.command_id.clone(), entry.clone());
        drop(t);
        let plan = self.plan(&req);
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
                Ok(plan) => run_process(&e, req, plan).await,
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

#[cfg(unix)]
fn kill_group(pgid: u32, sig: i32) {
    // SAFETY: killpg only sends a signal; a stale pgid fails with ESRCH.
    unsafe {
        libc::killpg(pgid as libc::pid_t, sig);
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
#[cfg(not(unix))]
fn kill_group(_pgid: u32, _sig: i32) {}

async fn pump<R: tokio::io::AsyncRead + Unpin>(
    entry: Arc<Entry>,
    mut r: R,
    stream: Stream,
    scrub: Arc<std::sync::Mutex<Scrubber>>,
) {
    // Filled without zeroing first: most commands print little or nothing.
    let mut raw = Vec::with_capacity(limits::MAX_OUTPUT_CHUNK_BYTES);
    loop {
        raw.clear();
        let n: usize = r.read_buf(&mut raw).await.unwrap_or_default();
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
                for (i, buf) in out.iter().enumerate() {
                    let used = (o.stdout.len() + o.stderr.len()) as u64;
                    let room = limits::MAX_COMMAND_OUTPUT_BYTES.saturating_sub(used) as usize;
                    let take = buf.len().min(room);
                    if take < buf.len() {
                        o.truncated = true;
                    }
                    let dst = if i == 1 { &mut o.stderr } else { &mut o.stdout };
                    dst.extend_from_slice(&buf[..take]);
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

async fn run_process(entry: &Arc<Entry>, req: pb::ExecRequest, plan: Plan) -> pb::Exit {
    if let Some(rule) = plan.confirm.clone() {
        if let Err(exit) = await_approval(entry, &req, &plan, &rule).await {
            return exit;
        }
    }
    let t0 = Instant::now();
    let mut cmd = if !plan.shell.is_empty() {
        let mut c = tokio::process::Command::new("sh");
        c.arg("-c").arg(&plan.shell);
        c
    } else if let Some((prog, args)) = plan.argv.split_first() {
        let mut c = tokio::process::Command::new(prog);
        c.args(args);
        c
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
    cmd.stdin(if req.stdin.is_empty() {
        Stdio::null()
    } else {
        Stdio::piped()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    // A cancel that came before the process exists (with the request, or
    // while it waited) means it never starts; the watch below only sees
    // cancels from here on.
    let mut cancel = entry.cancel.subscribe();
    if let Some(reason) = cancel.borrow_and_update().clone() {
        return exit_record(CommandState::Cancelled, reason, t0, 0);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let what = req.argv.first().map(String::as_str).unwrap_or("sh");
            drop(plan);
            return exit_record(
                CommandState::Failed,
                format!("cannot start {what:?}: {e}"),
                t0,
                0,
            );
        }
    };
    let pid = child.id().unwrap_or(0);
    let started_at_ms = now_ms();
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
    let out = child
        .stdout
        .take()
        .map(|o| tokio::spawn(pump(entry.clone(), o, Stream::Out, scrub.clone())));
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
        kill_group(pid, SIGTERM);
        let grace = tokio::time::timeout(KILL_GRACE, child.wait()).await;
        match grace {
            Ok(s) => break s,
            Err(_) => {
                kill_group(pid, SIGKILL);
                break child.wait().await;
            }
        }
    };
    // Background children may hold the pipes open: give them a moment, then
    // take the group down so nothing outlives the command.
    let drain = async {
        if let Some(o) = out {
            let _ = o.await;
        }
        if let Some(e) = err {
            let _ = e.await;
        }
    };
    if tokio::time::timeout(PIPE_DRAIN, drain).await.is_err() {
        kill_group(pid, SIGKILL);
    }
    if ended_by.is_some() {
        kill_group(pid, SIGKILL);
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
        exit.stdout_bytes = o.stdout.len() as u64;
        exit.stderr_bytes = o.stderr.len() as u64;
        exit.truncated = o.truncated;
    }
    exit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str, shell: &str) -> pb::ExecRequest {
        pb::ExecRequest {
            command_id: id.into(),
            shell: shell.into(),
            ..Default::default()
        }
    }

    async fn wait(e: &Arc<Entry>) -> pb::Exit {
        let mut rx = e.subscribe();
        for _ in 0..200 {
            if let Some(x) = e.exit() {
                return x;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await;
        }
        panic!("command did not finish");
    }

    #[tokio::test]
    async fn runs_once_and_reports() {
        let r = Arc::new(Runner::new());
        let Admission::Started(e) = r.admit(req("cmd_1", "echo out; echo err >&2; exit 3")) else {
            panic!()
        };
        let x = wait(&e).await;
        assert_eq!(x.exit_code, Some(3));
        assert_eq!(e.output_from(pb::OutputStream::Stdout, 0, 100), b"out\n");
        assert_eq!(e.output_from(pb::OutputStream::Stderr, 0, 100), b"err\n");
        assert!(matches!(
            r.admit(req("cmd_1", "true")),
            Admission::Existing(_)
        ));
        assert_eq!(r.inventory().1, vec!["cmd_1".to_string()]);
        r.acknowledge("cmd_1");
        assert!(matches!(
            r.admit(req("cmd_1", "true")),
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
        let Admission::Started(e) = r.admit(req("cmd_c", &format!("touch {}", marker.display())))
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
        let mut q = req("cmd_2", "sleep 30 & sleep 30; echo never");
        q.timeout_ms = 300;
        let Admission::Started(e) = r.admit(q) else {
            panic!()
        };
        let t = Instant::now();
        let x = wait(&e).await;
        assert_eq!(x.state(), CommandState::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[tokio::test]
    async fn output_is_bounded() {
        let r = Arc::new(Runner::new());
        let Admission::Started(e) = r.admit(req("cmd_3", "head -c 9000000 /dev/zero")) else {
            panic!()
        };
        let x = wait(&e).await;
        assert!(x.truncated);
        assert_eq!(x.stdout_bytes, limits::MAX_COMMAND_OUTPUT_BYTES);
    }
}
