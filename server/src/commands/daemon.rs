//! The commands service, the gateway's side: what daemons report about
//! their commands (re-attached or lost after a Hello, taken from the
//! queue, started, output, waiting for local approval, refused, ended),
//! written before the daemon hears back.

use byom_protocol::pb::{self, CommandState};
use byom_store::StoreError;

use super::queue::{self, Action};
use super::{Commands, ACTIVE};
use crate::live::LiveMachine;

impl Commands {
    /// After a daemon's Hello: marks lost what a restarted daemon can no
    /// longer have; returns what to re-attach to and what to send again,
    /// including commands the daemon still has that ended here meanwhile
    /// (cancelled or lost while it was away), so it is told to stop them
    /// or can hand in their results and forget them.
    pub async fn reconcile(
        &self,
        live: &LiveMachine,
        hello: &pb::Hello,
    ) -> Vec<(pb::Command, Action)> {
        let pending = match self.store().pending_commands(&live.machine_id) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(machine = %live.machine_id, "cannot read the queue: {e}");
                return Vec::new();
            }
        };
        let now = byom_wire::now_ms();
        let mut changed = false;
        let mut out = Vec::new();
        for (id, action) in queue::plan(&pending, hello) {
            let Some(c) = pending.iter().find(|c| c.id == id) else {
                continue;
            };
            if action != Action::Lost {
                out.push((c.clone(), action));
                continue;
            }
            let r = self
                .store()
                .transition(&id, ACTIVE, CommandState::Lost, |c| {
                    c.reason = queue::LOST_REASON.into();
                    c.finished_at_ms = now;
                });
            if let Err(e) = r {
                tracing::warn!(cmd = %id, "cannot mark lost: {e}");
            }
            changed = true;
            self.notify(&id);
        }
        if changed {
            let _ = self.flush().await;
        }
        for id in queue::strays(&pending, hello) {
            match self.store().get_command(&id) {
                Ok(Some(c)) if c.state().is_terminal() && c.machine_id == live.machine_id => {
                    out.push((c, Action::Attach))
                }
                _ => {}
            }
        }
        out
    }

    /// Takes queued commands of a live machine, oldest first, up to its
    /// free slots: each is `dispatched` (flushed) before it is returned to
    /// be sent, holding a slot reserved for it.
    pub async fn dispatch_batch(&self, live: &LiveMachine) -> Vec<pb::Command> {
        if !live.online() || live.paused() {
            return Vec::new();
        }
        // Reserved before reading, so commands created straight into a
        // slot meanwhile cannot take more than the daemon runs at once.
        let free = live.reserve(usize::MAX);
        if free == 0 {
            // A slot freeing up looks again.
            live.set_backlog(true);
            return Vec::new();
        }
        live.set_backlog(false);
        let out = self.take_queued(live, free).await;
        live.release(free - out.len());
        out
    }

    async fn take_queued(&self, live: &LiveMachine, free: usize) -> Vec<pb::Command> {
        let pending = match self.store().pending_commands(&live.machine_id) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(machine = %live.machine_id, "cannot read the queue: {e}");
                live.set_backlog(true);
                return Vec::new();
            }
        };
        let now = byom_wire::now_ms();
        let mut out = Vec::new();
        for c in pending {
            if c.state() != CommandState::Queued || queue::expired(&c, now) {
                continue; // the sweeper fails expired ones
            }
            if out.len() >= free {
                live.set_backlog(true);
                break;
            }
            let r = self.store().transition(
                &c.id,
                &[CommandState::Queued],
                CommandState::Dispatched,
                |c| {
                    c.dispatched_at_ms = now;
                    c.instance_id = live.instance_id.clone();
                },
            );
            match r {
                Ok(Some(c)) => out.push(c),
                Ok(None) => {}
                Err(e) => tracing::warn!(cmd = %c.id, "cannot dispatch: {e}"),
            }
        }
        if out.is_empty() {
            return out;
        }
        // Durable before the daemon can act on any of them.
        if let Err(e) = self.flush().await {
            tracing::error!("flush failed, not dispatching: {e}");
            return Vec::new();
        }
        for c in &out {
            self.notify(&c.id);
        }
        out
    }

    pub fn started(&self, id: &str, pid: u32, started_at_ms: u64) -> Result<(), StoreError> {
        self.store().transition(
            id,
            &[
                CommandState::Dispatched,
                CommandState::AwaitingLocalApproval,
            ],
            CommandState::Running,
            |c| {
                c.pid = pid;
                c.started_at_ms = started_at_ms;
            },
        )?;
        self.notify(id);
        Ok(())
    }

    /// Takes an output chunk: what the store keeps of it (see
    /// [`super::streams`]) and the attached client's copy. Output implies
    /// the command runs (its `Started` may have gone to an earlier
    /// connection): `running` says whether that is known yet, and becomes
    /// true.
    pub async fn output(
        &self,
        id: &str,
        o: &pb::Output,
        running: &mut bool,
        keeper: &mut super::Keeper,
    ) -> Result<(), StoreError> {
        let stream = if o.stream == pb::OutputStream::Stderr as i32 {
            2
        } else {
            1
        };
        let head = o.offset < self.inner.keep.head;
        keeper.take(self.store(), stream, o.offset, &o.data)?;
        if !*running {
            *running = true;
            let _ = self.store().transition(
                id,
                &[CommandState::Dispatched],
                CommandState::Running,
                |_| {},
            );
        }
        self.publish_output(id, o).await;
        // Watchers read the store: wake them when it has more.
        if head {
            self.notify(id);
        }
        Ok(())
    }

    /// Writes the tail the store keeps of a command's output, when due
    /// (`now`: whatever its age).
    pub fn write_tail(
        &self,
        id: &str,
        keeper: &mut super::Keeper,
        now: bool,
    ) -> Result<(), StoreError> {
        if now || keeper.due() {
            keeper.write(self.store())?;
            self.notify(id);
        }
        Ok(())
    }

    /// The daemon's exit record, durable before the daemon may forget it.
    /// `live`: the connection it came on, which stops counting the command
    /// as unfinished in the same moment as the store's queue does (under
    /// its admission), so a creation never sees one count without the
    /// other and sends its command through the queue for nothing.
    pub async fn exited(
        &self,
        id: &str,
        x: &pb::Exit,
        live: Option<&LiveMachine>,
    ) -> Result<(), StoreError> {
        let state = match x.state() {
            s if s.is_terminal() => s,
            _ => CommandState::Failed,
        };
        // What the store did not keep of long output (its head and tail).
        let mut elided = [0u64; 2];
        for (i, total) in [x.stdout_bytes, x.stderr_bytes].into_iter().enumerate() {
            if total > self.inner.keep.head {
                elided[i] = super::streams::elided(self.store(), id, i as i32 + 1, total)?;
            }
        }
        let admission = match live {
            Some(l) => Some(l.admission.lock().await),
            None => None,
        };
        let ended = self.store().transition(id, ACTIVE, state, |c| {
            c.stdout_elided = elided[0];
            c.stderr_elided = elided[1];
            c.stdin_cut = x.stdin_cut;
            c.exit_code = x.exit_code;
            c.signal = x.signal;
            c.duration_ms = x.duration_ms;
            c.stdout_bytes = x.stdout_bytes;
            c.stderr_bytes = x.stderr_bytes;
            c.truncated = x.truncated;
            c.reason = x.reason.clone();
            c.network = x.network;
            // Shown to people: printable, bounded.
            c.sandbox = x
                .sandbox
                .chars()
                .filter(|c| !c.is_control())
                .take(512)
                .collect();
            if c.started_at_ms == 0 {
                c.started_at_ms = x.started_at_ms;
            }
            if c.pid == 0 {
                c.pid = x.pid;
            }
            c.finished_at_ms = if x.finished_at_ms != 0 {
                x.finished_at_ms
            } else {
                byom_wire::now_ms()
            };
        })?;
        if let Some(l) = live {
            l.ended(id);
        }
        drop(admission);
        self.flush().await?;
        match ended {
            Some(c) => self.notify_ended(c),
            None => self.notify(id),
        }
        Ok(())
    }

    /// The machine's owner must approve it locally first.
    pub fn awaiting_approval(&self, id: &str, rule: &str) -> Result<(), StoreError> {
        self.store().transition(
            id,
            &[CommandState::Dispatched],
            CommandState::AwaitingLocalApproval,
            |c| {
                c.reason =
                    format!("waiting for the machine's owner to approve it locally ({rule})");
            },
        )?;
        self.notify(id);
        Ok(())
    }

    /// Refused before it started because the daemon is paused: back in
    /// the queue until it resumes.
    pub async fn requeue(&self, id: &str) -> Result<(), StoreError> {
        self.store()
            .transition(id, &[CommandState::Dispatched], CommandState::Queued, |c| {
                c.instance_id.clear();
                c.dispatched_at_ms = 0;
            })?;
        self.flush().await?;
        self.notify(id);
        Ok(())
    }

    /// The daemon refused the command or no longer knows it.
    pub async fn refused(&self, id: &str, code: &str, message: &str) -> Result<(), StoreError> {
        let (state, reason) = match code {
            "unknown_command" => (
                CommandState::Lost,
                format!("the daemon no longer has this command: {message}"),
            ),
            "already_ran" => (
                CommandState::Lost,
                format!(
                    "the daemon already ran this command and no longer holds its result: {message}"
                ),
            ),
            _ => (CommandState::Failed, format!("{code}: {message}")),
        };
        self.store().transition(id, ACTIVE, state, |c| {
            c.reason = reason.clone();
            c.finished_at_ms = byom_wire::now_ms();
        })?;
        self.flush().await?;
        self.notify(id);
        Ok(())
    }
}
