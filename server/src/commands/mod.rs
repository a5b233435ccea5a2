//! The commands service: the only writer of command state. People (the
//! API) and agents create commands here with one validation and one
//! machine picker; the gateway reports what daemons say through it; the
//! queue sweeper, the agents' watchdog and revocation end commands through
//! it. Every change is written (and, where something is acted on or
//! acknowledged, flushed) before anyone hears of it, and wakes whoever
//! watches the command.
//!
//! It never talks to a daemon: a machine with new work is woken
//! ([`crate::live::LiveMachine::wake`]) and the gateway's dispatcher for
//! that connection takes the work ([`Commands::dispatch_batch`]).

mod daemon;
pub mod queue;
pub mod streams;
mod wake;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use byom_protocol::id::CommandId;
use byom_protocol::limits;
use byom_protocol::pb::{self, CommandState};
use byom_store::{Store, StoreError};
use tokio::sync::watch;

use crate::idempotency::Pending;
use crate::live::decorate;
use crate::live::{LiveMachine, LiveMachines};
use queue::Candidate;
pub use streams::{Keeper, OutputKeep, StdinSource};
pub use wake::Wake;

/// States of a command the daemon has (or may have) received.
pub const ACTIVE: &[CommandState] = &[
    CommandState::Dispatched,
    CommandState::Running,
    CommandState::AwaitingLocalApproval,
];

/// A waiter's safety net in case a notification is missed.
const WAIT_POLL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    /// Not possible in the command's or the machine's current state.
    #[error("{0}")]
    Refused(String),
    /// Possible later: no machine is available now.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Full(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Which machine a new command runs on.
#[derive(Debug, Clone)]
pub enum Target {
    /// By ID or name.
    Machine(String),
    /// The least busy available machine with all these labels.
    Labels(BTreeMap<String, String>),
}

/// A command to create.
#[derive(Debug, Clone)]
pub struct NewCommand {
    /// The agents choose IDs (a replayed step then creates nothing new);
    /// `None`: a fresh one.
    pub id: Option<String>,
    pub target: Target,
    pub argv: Vec<String>,
    pub shell: String,
    pub cwd: String,
    pub env: HashMap<String, String>,
    pub stdin: Vec<u8>,
    /// Its stdin comes as a stream (`Exec`), not in `stdin`.
    pub stdin_stream: bool,
    /// On a pseudo-terminal of this size (rows, cols).
    pub tty: Option<(u32, u32)>,
    pub timeout_ms: u64,
    /// 0: the default queue TTL.
    pub queue_ttl_ms: u64,
    pub requested_by: String,
    /// Why the agent task behind it is untrusted (empty: it is not).
    pub taint: String,
    /// The person who approved it despite that.
    pub approved_by: String,
}

/// Who asks for an agent's command, and what the daemon's owner is told
/// about it.
pub struct Origin<'a> {
    pub requested_by: &'a str,
    pub taint: &'a str,
    pub approved_by: &'a str,
}

/// Longest reason for a command's taint the daemon is sent.
const MAX_TAINT_CHARS: usize = 1000;

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// What a daemon is sent to run a command.
pub fn exec_request(c: &pb::Command) -> pb::ExecRequest {
    pb::ExecRequest {
        command_id: c.id.clone(),
        argv: c.argv.clone(),
        shell: c.shell.clone(),
        cwd: c.cwd.clone(),
        env: c.env.clone(),
        stdin: c.stdin.clone(),
        stdin_stream: c.stdin_stream,
        tty: c.tty,
        rows: c.rows,
        cols: c.cols,
        timeout_ms: c.timeout_ms,
        requested_by: c.requested_by.clone(),
        tainted: c.tainted,
        taint: c.taint.clone(),
        approved_by: c.approved_by.clone(),
    }
}

#[derive(Clone)]
pub struct Commands {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    live: Arc<LiveMachines>,
    /// How long a machine may stay away after a command of its should have
    /// ended before the command is given up as lost.
    offline_allowance: Duration,
    /// Command → what its watchers are woken with on every change.
    watchers: Mutex<HashMap<String, watch::Sender<Wake>>>,
    /// What the store keeps of each output stream.
    keep: OutputKeep,
    /// Attached clients' output feeds and waiting stdin streams.
    feeds: streams::Feeds,
}

impl Commands {
    pub fn new(
        store: Store,
        live: Arc<LiveMachines>,
        offline_allowance: Duration,
        keep: OutputKeep,
    ) -> Commands {
        Commands {
            inner: Arc::new(Inner {
                store,
                live,
                offline_allowance,
                watchers: Mutex::new(HashMap::new()),
                keep,
                feeds: streams::Feeds::default(),
            }),
        }
    }

    /// What the store keeps of a command's output.
    pub fn output_keep(&self) -> OutputKeep {
        self.inner.keep
    }

    /// Every output chunk of command `id` from now on, for the client
    /// attached to it: the command's stream waits while it is full.
    pub fn attach_output(&self, id: &str) -> tokio::sync::mpsc::Receiver<pb::Output> {
        self.inner.feeds.attach(id)
    }

    pub fn detach_output(&self, id: &str) {
        self.inner.feeds.detach(id)
    }

    /// Hands an output chunk to the client attached to its command, if
    /// one is (here), once it has room.
    pub async fn publish_output(&self, id: &str, o: &pb::Output) {
        self.inner.feeds.publish(id, o).await
    }

    /// Keeps an `Exec` call's stdin for its command's start.
    pub fn put_stdin(&self, id: &str, s: StdinSource) {
        self.inner.feeds.put_stdin(id, s)
    }

    /// The stdin stream of a command starting now, if its call is here.
    pub fn take_stdin(&self, id: &str) -> Option<StdinSource> {
        self.inner.feeds.take_stdin(id)
    }

    pub(crate) fn store(&self) -> &Store {
        &self.inner.store
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.store().flush_async().await
    }

    // ── creating ──

    fn resolve(&self, target: &Target) -> Result<pb::Machine, CommandError> {
        match target {
            Target::Machine(m) => match self.store().resolve_machine(m)? {
                Some(x) => Ok(x),
                None => Err(match self.store().revoked_named(m)? {
                    Some(_) => CommandError::Refused(format!(
                        "machine {m} was revoked; pair it again with a new token (`byom token create --name {m}`)"
                    )),
                    None => CommandError::NotFound(format!(
                        "no machine {m:?}: see `byom machines ls`"
                    )),
                }),
            },
            Target::Labels(want) => {
                let candidates: Vec<Candidate> = self
                    .store()
                    .list_machines()?
                    .into_iter()
                    .map(|m| {
                        let m = decorate(self.store(), &self.inner.live, m);
                        Candidate {
                            online: m.online,
                            paused: m.paused,
                            load: m.running_commands + m.queued_commands,
                            machine: m,
                        }
                    })
                    .collect();
                queue::pick(&candidates, want).map_err(|e| match e {
                    queue::PickError::NoMatch(_) => CommandError::NotFound(e.to_string()),
                    queue::PickError::Unavailable { .. } => {
                        CommandError::Unavailable(e.to_string())
                    }
                })
            }
        }
    }

    /// Validates, picks the machine, stores the command (flushed, with
    /// `claim`'s idempotency record in the same batch) and has it sent.
    ///
    /// When the machine is connected here with a free slot and nothing
    /// queued before it, the command is stored `dispatched` to that
    /// connection and handed straight to its dispatcher: one write and one
    /// flush instead of a queued write, a read of the queue, a dispatch
    /// write and a second flush. Otherwise it is stored `queued` and the
    /// machine's dispatcher, wherever it is, is woken.
    pub async fn create(
        &self,
        n: NewCommand,
        claim: Option<&Pending>,
    ) -> Result<pb::Command, CommandError> {
        let invalid = |m: String| Err(CommandError::Invalid(m));
        if let Some(id) = &n.id {
            if CommandId::parse(id).is_err() {
                return invalid(format!("{id:?} is not a command ID"));
            }
        }
        // A terminal with neither runs the machine's login shell.
        let login = n.tty.is_some() && n.argv.is_empty() && n.shell.is_empty();
        if n.argv.is_empty() == n.shell.is_empty() && !login {
            return invalid("give either argv or a shell command line".into());
        }
        let line: usize = n.argv.iter().map(|a| a.len() + 1).sum::<usize>() + n.shell.len();
        if line > limits::MAX_COMMAND_LINE_BYTES {
            return invalid(format!(
                "command line too long: {line} bytes, limit {}",
                limits::MAX_COMMAND_LINE_BYTES
            ));
        }
        if n.stdin.len() > limits::MAX_STDIN_BYTES {
            return invalid(format!(
                "stdin too large: {} bytes, limit {}",
                n.stdin.len(),
                limits::MAX_STDIN_BYTES
            ));
        }
        if n.env.len() > limits::MAX_ENV_VARS {
            return invalid(format!(
                "at most {} environment variables",
                limits::MAX_ENV_VARS
            ));
        }
        if n.env
            .keys()
            .any(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return invalid("bad environment variable name".into());
        }
        let env_bytes: usize = n.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if env_bytes > limits::MAX_ENV_BYTES {
            return invalid(format!(
                "environment too large: {env_bytes} bytes, limit {}",
                limits::MAX_ENV_BYTES
            ));
        }
        if n.cwd.len() > limits::MAX_CWD_BYTES {
            return invalid(format!(
                "working directory too long: {} bytes, limit {}",
                n.cwd.len(),
                limits::MAX_CWD_BYTES
            ));
        }
        if n.timeout_ms > ms(limits::MAX_COMMAND_TIMEOUT) {
            return invalid(format!(
                "timeout too long: at most {}",
                humantime::format_duration(limits::MAX_COMMAND_TIMEOUT)
            ));
        }
        let m = self.resolve(&n.target)?;
        if m.revoked {
            return Err(CommandError::Refused(format!(
                "machine {} was revoked; pair it again with a new token",
                m.name
            )));
        }
        if n.queue_ttl_ms > ms(limits::MAX_QUEUE_TTL) {
            return invalid(format!(
                "queue TTL too long: at most {}",
                humantime::format_duration(limits::MAX_QUEUE_TTL)
            ));
        }
        let ttl = if n.queue_ttl_ms == 0 {
            ms(limits::DEFAULT_QUEUE_TTL)
        } else {
            n.queue_ttl_ms
        };
        let now = byom_wire::now_ms();
        let mut c = pb::Command {
            id: n.id.unwrap_or_else(|| CommandId::new(now).to_string()),
            machine_id: m.id.clone(),
            argv: n.argv,
            shell: n.shell,
            cwd: n.cwd,
            env: n.env,
            stdin: n.stdin,
            stdin_stream: n.stdin_stream,
            tty: n.tty.is_some(),
            rows: n.tty.map_or(0, |t| t.0),
            cols: n.tty.map_or(0, |t| t.1),
            timeout_ms: n.timeout_ms,
            state: CommandState::Queued as i32,
            created_at_ms: now,
            queue_deadline_ms: now + ttl,
            requested_by: n.requested_by,
            tainted: !n.taint.is_empty(),
            taint: n.taint.chars().take(MAX_TAINT_CHARS).collect(),
            approved_by: n.approved_by,
            ..Default::default()
        };
        // What the API accepts must reach the machine: the frame that will
        // carry it is checked now, not when it fails to be sent.
        let frame = pb::ToDaemon {
            msg: Some(pb::to_daemon::Msg::Exec(exec_request(&c))),
        };
        let size = prost::Message::encoded_len(&frame);
        if size > limits::MAX_FRAME_BYTES {
            return invalid(format!(
                "the command is too large to send to a machine: {size} bytes with its arguments, environment, stdin and working directory; at most {}",
                limits::MAX_FRAME_BYTES
            ));
        }
        let extra = claim.map(|p| p.ops(&c.id, "")).unwrap_or_default();
        // Counted and stored under the connection's admission, so that
        // concurrent creations see each other in the count.
        let here = self.inner.live.get(&m.id);
        let admission = match &here {
            Some(l) => Some(l.admission.lock().await),
            None => None,
        };
        let queued = self.store().pending_count(&m.id)?;
        if queued >= limits::MAX_QUEUED_PER_MACHINE {
            return Err(CommandError::Full(format!(
                "machine {} already has {queued} commands waiting; cancel some or wait",
                m.name
            )));
        }
        let direct = here.clone().and_then(|l| self.direct_slot(l, queued));
        if let Some(live) = &direct {
            c.set_state(CommandState::Dispatched);
            c.dispatched_at_ms = now;
            c.instance_id = live.instance_id.clone();
        }
        let stored = self.store().create_command(&c, &extra);
        drop(admission);
        // Acknowledged (and sent) only once durable.
        let r = match stored {
            Ok(()) => self.flush().await,
            Err(e) => Err(e),
        };
        match (r, direct) {
            (Ok(()), Some(live)) => live.hand(c.clone()),
            (Ok(()), None) => self.inner.live.wake(&m.id),
            (Err(e), direct) => {
                if let Some(live) = direct {
                    live.release(1);
                }
                return Err(e.into());
            }
        }
        Ok(c)
    }

    /// The machine's connection on this server, with a slot reserved, if
    /// a new command may skip the queue: the daemon is connected here and
    /// not paused, and each of the machine's `pending` unfinished commands
    /// is one the connection holds (none is queued before this one).
    fn direct_slot(&self, live: Arc<LiveMachine>, pending: usize) -> Option<Arc<LiveMachine>> {
        if !live.online() || live.paused() || live.unfinished() != pending {
            return None;
        }
        (live.reserve(1) == 1).then_some(live)
    }

    /// The agents' create: the worker chose the ID, so a step replayed
    /// after a restart finds the command and creates nothing.
    pub async fn ensure(
        &self,
        id: &str,
        origin: Origin<'_>,
        target: Target,
        shell: &str,
        timeout_ms: u64,
    ) -> Result<(), CommandError> {
        if self.store().get_command(id)?.is_some() {
            return Ok(());
        }
        if shell.is_empty() {
            return Err(CommandError::Invalid("the command text was lost".into()));
        }
        self.create(
            NewCommand {
                id: Some(id.to_string()),
                target,
                argv: Vec::new(),
                shell: shell.to_string(),
                cwd: String::new(),
                env: HashMap::new(),
                stdin: Vec::new(),
                stdin_stream: false,
                tty: None,
                // A model's timeout is a wish: the longest allowed serves it.
                timeout_ms: timeout_ms.min(ms(limits::MAX_COMMAND_TIMEOUT)),
                queue_ttl_ms: 0,
                requested_by: origin.requested_by.to_string(),
                taint: origin.taint.to_string(),
                approved_by: origin.approved_by.to_string(),
            },
            None,
        )
        .await
        .map(|_| ())
    }

    // ── ending ──

    /// Cancels a command. One that has not started running (queued, sent,
    /// or waiting for its owner's approval) ends now; the daemon, if it has
    /// it, is told to drop it (also when it reconnects later). A running
    /// one ends when its daemon reports it killed.
    pub async fn cancel(&self, id: &str, reason: &str) -> Result<pb::Command, CommandError> {
        let store = self.store();
        let c = store.get_command(id)?.ok_or_else(|| {
            CommandError::NotFound(format!("no command {id}: see `byom commands ls`"))
        })?;
        if c.state().is_terminal() {
            return Err(CommandError::Refused(format!(
                "{} already finished ({})",
                c.id,
                c.state().name()
            )));
        }
        let now = byom_wire::now_ms();
        let not_started = [
            CommandState::Queued,
            CommandState::Dispatched,
            CommandState::AwaitingLocalApproval,
        ];
        let c = match store.transition(id, &not_started, CommandState::Cancelled, |c| {
            c.reason = reason.to_string();
            c.cancel_requested = true;
            c.finished_at_ms = now;
        })? {
            Some(c) => c,
            None => store.update_command(id, |c| {
                if !c.state().is_terminal() {
                    c.cancel_requested = true;
                }
                Ok(())
            })?,
        };
        if c.cancel_requested {
            self.inner.live.cancel(&c.machine_id, &c.id, reason);
        }
        self.flush().await?;
        self.notify(&c.id);
        Ok(c)
    }

    /// Waits until a command ends and returns its final record (perhaps
    /// without its stdin).
    pub async fn wait_end(&self, id: &str) -> Result<pb::Command, CommandError> {
        let mut rx = self.subscribe(id);
        let end = loop {
            match self.store().get_command(id) {
                Ok(Some(c)) if c.state().is_terminal() => break Ok(c),
                Ok(Some(_)) => {}
                Ok(None) => {
                    break Err(CommandError::NotFound(format!(
                        "{id} disappeared from the store"
                    )))
                }
                Err(e) => tracing::warn!("reading {id}: {e}"),
            }
            // Woken on every change; the timeout covers a missed wake-up.
            let _ = tokio::time::timeout(WAIT_POLL, rx.changed()).await;
            if let Some(c) = rx.borrow_and_update().ended.as_deref() {
                break Ok(c.clone());
            }
        };
        drop(rx);
        self.unsubscribed(id);
        end
    }

    /// Fails queued commands whose queue TTL passed without their machine
    /// taking them, and loses those of machines gone past the offline
    /// allowance.
    pub async fn sweep_expired(&self) {
        let pending = match self.store().all_pending() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("queue sweep failed: {e}");
                return;
            }
        };
        let now = byom_wire::now_ms();
        let mut changed = self.lose_offline(&pending, now).await;
        for c in pending.iter().filter(|c| queue::expired(c, now)) {
            let r = self.store().transition(
                &c.id,
                &[CommandState::Queued],
                CommandState::Failed,
                |c| {
                    c.reason =
                        "not delivered: the machine did not connect before the queue TTL ran out"
                            .into();
                    c.finished_at_ms = now;
                },
            );
            match r {
                Ok(Some(_)) => {
                    changed = true;
                    self.notify(&c.id);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(cmd = %c.id, "cannot expire command: {e}"),
            }
        }
        if changed {
            if let Err(e) = self.flush().await {
                tracing::warn!("flush failed: {e}");
            }
        }
    }

    /// Declares `lost` the commands of machines that stayed away past the
    /// offline allowance (see [`queue::offline_deadline`]); a machine that
    /// comes back before then gets them re-attached.
    async fn lose_offline(&self, pending: &[pb::Command], now: u64) -> bool {
        let allowance = ms(self.inner.offline_allowance);
        let mut seen: HashMap<String, u64> = HashMap::new();
        let mut changed = false;
        for c in pending {
            let online = self.inner.live.online(&c.machine_id);
            if online || !ACTIVE.contains(&c.state()) {
                continue;
            }
            let last_seen = *seen.entry(c.machine_id.clone()).or_insert_with(|| {
                self.store()
                    .get_machine(&c.machine_id)
                    .ok()
                    .flatten()
                    .map(|m| m.last_seen_ms)
                    .unwrap_or(0)
            });
            if !queue::lost_offline(c, online, last_seen, now, allowance) {
                continue;
            }
            let r = self.store().transition(&c.id, ACTIVE, CommandState::Lost, |c| {
                c.reason = format!(
                    "its machine stayed offline past the offline allowance ({}) after it was last seen",
                    humantime::format_duration(self.inner.offline_allowance)
                );
                c.finished_at_ms = now;
            });
            if let Ok(Some(_)) = r {
                changed = true;
                self.notify(&c.id);
            }
        }
        changed
    }

    /// When a command on an offline machine will be given up, for telling
    /// whoever waits on it.
    pub fn offline_deadline(&self, c: &pb::Command, last_seen_ms: u64) -> u64 {
        queue::offline_deadline(c, last_seen_ms, ms(self.inner.offline_allowance))
    }

    /// A revoked machine runs nothing again: its queued commands are
    /// cancelled, those it had are lost.
    pub async fn machine_revoked(&self, machine_id: &str, reason: &str) -> Result<(), StoreError> {
        let now = byom_wire::now_ms();
        for c in self.store().pending_commands(machine_id)? {
            let to = if c.state() == CommandState::Queued {
                CommandState::Cancelled
            } else {
                CommandState::Lost
            };
            let mut from = vec![CommandState::Queued];
            from.extend_from_slice(ACTIVE);
            let _ = self.store().transition(&c.id, &from, to, |c| {
                c.reason = format!("machine revoked: {reason}");
                c.finished_at_ms = now;
            });
            self.notify(&c.id);
        }
        self.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whoever waits for a command's end is handed the final record (no
    /// read back, no stdin kept in memory), and no subscription outlives
    /// the wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_gets_the_final_record_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sled(dir.path()).unwrap();
        let live = Arc::new(LiveMachines::new(crate::cluster::Cluster::alone()));
        let commands = Commands::new(
            store.clone(),
            live,
            Duration::from_secs(60),
            OutputKeep::default(),
        );
        let c = pb::Command {
            id: "cmd_w".into(),
            machine_id: "mch_w".into(),
            state: CommandState::Dispatched as i32,
            stdin: vec![7; 1000],
            ..Default::default()
        };
        store.create_command(&c, &[]).unwrap();

        let waiter = {
            let commands = commands.clone();
            tokio::spawn(async move { commands.wait_end("cmd_w").await })
        };
        // Subscribed (the wait read the record and sleeps on its wake-up).
        for _ in 0..500 {
            if !commands.watched().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(commands.watched(), ["cmd_w"]);
        let exit = pb::Exit {
            state: CommandState::Exited as i32,
            exit_code: Some(3),
            ..Default::default()
        };
        commands.exited("cmd_w", &exit, None).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken by the end, not by polling")
            .unwrap()
            .unwrap();
        assert_eq!(end.state(), CommandState::Exited);
        assert_eq!(end.exit_code, Some(3));
        assert!(end.stdin.is_empty());
        assert!(commands.watched().is_empty(), "{:?}", commands.watched());
        // The store has it all the same.
        let stored = store.get_command("cmd_w").unwrap().unwrap();
        assert_eq!(stored.exit_code, Some(3));
        assert_eq!(stored.stdin.len(), 1000);
    }
}
