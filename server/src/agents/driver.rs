//! The agents' I/O shell: one task that owns the [`Core`], feeds it events
//! from the durable inbox (triggers, answers, cancels) and from its own
//! effects (model replies, command ends, interpreter steps), and commits
//! every step to the store before it acts on it:
//!
//! 1. `core.handle(event)` → effects;
//! 2. one atomic batch: the changed records, the replies, the inbox entry's
//!    deletion; then flush;
//! 3. run the effects.
//!
//! A crash between 2 and 3 loses nothing: on start, [`Core::resume_effects`]
//! starts again whatever was in flight. Commands carry IDs chosen in step 1
//! and are created only if absent, so none runs twice. Model calls may be
//! made twice (they are idempotent); interpreter steps replay from the same
//! snapshot.

use std::sync::Arc;
use std::time::Duration;

use byom_agent::event::{CommandResult, Effect, Event, JsOutcome, Reply, SessionKind};
use byom_agent::storage::keys;
use byom_agent::{Budgets, Core};
use byom_protocol::id::Kind;
use byom_protocol::pb::{self, CommandState};
use byom_sandbox::{ErrorKind, Limits, Snapshot};
use byom_store::{Op, Space, Store, StoreError};
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::programs::{error, run_program_step, Step};
use super::world::{new_id, paused_programs, LiveWorld};
use super::AgentInbox;
use crate::commands::{Commands, Origin, Target};
use crate::live::LiveMachines;
use crate::model::{complete, Model, RetryPolicy};
use crate::triggers::Triggers;

/// Internal events (model replies, command ends, program steps) waiting
/// for the loop.
pub const INTERNAL_EVENTS: usize = 4096;
/// Model calls in flight at once across all sessions.
pub const MAX_CONCURRENT_MODEL_CALLS: usize = 32;
/// Interpreter steps running at once.
pub const MAX_CONCURRENT_JS: usize = 4;
/// A step's commit slower than this is logged: the agents wait on it.
const SLOW_COMMIT: Duration = Duration::from_secs(2);
/// Inbox entries read per pass, and passes before other events get a turn.
const INBOX_BATCH: usize = 64;
const INBOX_PASSES: usize = 1000;
/// Output bytes read back for a finished command (the core cuts further).
const OUTPUT_READ: usize = 64 * 1024;
/// How often retries and the watchdog run.
const TICK: Duration = Duration::from_secs(1);
/// Agent records and messages read at once on a reload.
const MAX_RECORDS: usize = 10_000_000;

/// What the server hands the agents.
#[derive(Clone)]
pub struct AgentConfig {
    pub router_model: Arc<dyn Model>,
    pub worker_model: Arc<dyn Model>,
    pub budgets: Budgets,
    pub retry: RetryPolicy,
    pub js_key: Vec<u8>,
    pub js_limits: Limits,
}

/// The handles the driver works with.
#[derive(Clone)]
pub struct Handles {
    pub store: Store,
    pub live: Arc<LiveMachines>,
    pub commands: Commands,
    pub triggers: Triggers,
    pub inbox: AgentInbox,
    pub channels: Arc<crate::channels::Channels>,
    /// Ends the agents: server shutdown, or (with replicas) the lease lost.
    pub shutdown: CancellationToken,
    /// With replicas: the lease's epoch, which every commit is guarded by.
    pub fence: Option<byom_store::Guard>,
}

struct Driver {
    h: Arc<Handles>,
    cfg: Arc<AgentConfig>,
    core: Core,
    /// Commands whose workers were told their machine is offline (told
    /// again only after it came back and went away again).
    told_offline: std::collections::HashSet<String>,
    tx: mpsc::Sender<Event>,
    models: Arc<Semaphore>,
    js: Arc<Semaphore>,
}

/// Runs the agents until shutdown.
pub async fn run(h: Handles, cfg: AgentConfig) {
    let (tx, mut rx) = mpsc::channel(INTERNAL_EVENTS);
    let h = Arc::new(h);
    let mut d = Driver {
        core: Core::new(cfg.budgets.clone()),
        told_offline: Default::default(),
        h: h.clone(),
        cfg: Arc::new(cfg),
        tx,
        models: Arc::new(Semaphore::new(MAX_CONCURRENT_MODEL_CALLS)),
        js: Arc::new(Semaphore::new(MAX_CONCURRENT_JS)),
    };
    // Before anything restarts, so no program step is storing one.
    d.collect_snapshots();
    // The agents start only from a complete picture of their state.
    while let Err(e) = d.reload() {
        tracing::error!("cannot read the agents' state ({e}); retrying");
        tokio::select! {
            _ = h.shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        d.drain_inbox().await;
        tokio::select! {
            _ = h.shutdown.cancelled() => return,
            _ = h.inbox.woken() => {}
            Some(ev) = rx.recv() => { d.step(ev, None).await; }
            _ = tick.tick() => {
                d.step(Event::Tick, None).await;
                d.watchdog().await;
            }
        }
    }
}

impl Driver {
    fn world(&self) -> LiveWorld {
        LiveWorld {
            store: self.h.store.clone(),
            live: self.h.live.clone(),
        }
    }

    /// Rebuilds the core from the store and restarts what was in flight.
    /// A store that cannot be read is an error, never an empty state: the
    /// caller retries rather than run on (and overwrite) a partial picture.
    fn reload(&mut self) -> Result<(), StoreError> {
        let store = &self.h.store;
        let records = store.scan_prefix(Space::Agents, keys::RECORD, MAX_RECORDS)?;
        let numbered = |prefix: &str| -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
            Ok(store
                .scan_prefix(Space::Agents, prefix, MAX_RECORDS)?
                .into_iter()
                .filter_map(|(n, v)| Some((n.parse().ok()?, v)))
                .collect())
        };
        let queue = numbered(keys::ROUTER_QUEUE)?;
        let failed = std::cell::RefCell::new(None);
        let (core, errors) = Core::rebuild(
            self.cfg.budgets.clone(),
            records,
            |session| {
                numbered(&keys::messages_of(session)).unwrap_or_else(|e| {
                    *failed.borrow_mut() = Some(e);
                    Vec::new()
                })
            },
            queue,
            true,
        );
        if let Some(e) = failed.into_inner() {
            return Err(e);
        }
        for e in errors {
            tracing::error!("agent state: {e}; skipped");
        }
        self.core = core;
        crate::metrics::agents_seen(Some(&self.core));
        let fx = self.core.resume_effects();
        if !fx.is_empty() {
            tracing::info!(
                "agents resumed: {} operations in flight restarted",
                fx.len()
            );
        }
        self.run_effects(fx);
        Ok(())
    }

    /// At start-up (no program step can be running yet), snapshots no
    /// worker is paused on are left over from a crash between storing a
    /// snapshot and committing the step that refers to it: drop them.
    fn collect_snapshots(&self) {
        let store = &self.h.store;
        let Ok(ids) = store.snapshot_ids() else {
            return;
        };
        let Ok(paused) = paused_programs(store) else {
            return;
        };
        let used: std::collections::HashSet<String> =
            paused.into_iter().map(|(_, snp)| snp).collect();
        let mut dropped = 0;
        for id in ids.into_iter().filter(|id| !used.contains(id)) {
            if store.delete_snapshot(&id).is_ok() {
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::info!("dropped {dropped} snapshots no program is paused on");
        }
    }

    async fn drain_inbox(&mut self) {
        for _ in 0..INBOX_PASSES {
            let entries = match self
                .h
                .store
                .scan_prefix(Space::Agents, keys::INBOX, INBOX_BATCH)
            {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!("cannot read the agent inbox: {e}");
                    return;
                }
            };
            if entries.is_empty() {
                return;
            }
            for (k, v) in entries {
                let key = format!("{}{k}", keys::INBOX).into_bytes();
                match serde_json::from_slice::<Event>(&v) {
                    Ok(ev) => {
                        if !self.step(ev, Some(key)).await {
                            return;
                        }
                    }
                    Err(e) => {
                        // Set aside in the same write that takes it out of
                        // the inbox: what comes after it goes on.
                        let aside = format!("{}{k}", keys::UNREADABLE);
                        tracing::error!(
                            "unreadable agent inbox entry kept as {aside} and skipped: {e}"
                        );
                        let _ = self.h.store.batch(&[
                            Op::put(Space::Agents, aside.into_bytes(), v.clone()),
                            Op::delete(Space::Agents, key),
                        ]);
                    }
                }
            }
        }
    }

    /// One event through the core, committed, then acted on. False if the
    /// store refused the commit (the core was rebuilt from the store).
    async fn step(&mut self, ev: Event, inbox_key: Option<Vec<u8>>) -> bool {
        let mut world = self.world();
        // Built only when it will be logged: this runs for every event.
        let summary = tracing::enabled!(tracing::Level::DEBUG).then(|| ev.summary());
        let turns = self.core.router().stats.turns;
        let fx = match self.core.handle(&mut world, ev) {
            Ok(fx) => fx,
            Err(e) => {
                // Decided on nothing: the step never happened. Its inbox
                // entry (if any) stays and runs again once the store
                // answers; what was in flight restarts from the store.
                tracing::warn!("an agent step could not read the store ({e}); it runs again");
                drop(self.core.take_writes());
                self.rebuild().await;
                return false;
            }
        };
        if let Some(summary) = summary {
            // Quiet ticks (most of them) are not worth a line each.
            if summary != "tick" || !fx.is_empty() {
                let effects: Vec<String> = fx.iter().map(Effect::summary).collect();
                tracing::debug!(?effects, "agent step: {summary}");
            }
        }
        #[cfg(debug_assertions)]
        if let Err(e) = self.core.check_invariants() {
            tracing::error!("agent invariant broken after a step: {e}");
        }
        let mut ops: Vec<Op> = self
            .core
            .take_writes()
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => Op::put(Space::Agents, k.into_bytes(), v),
                None => Op::delete(Space::Agents, k.into_bytes()),
            })
            .collect();
        let mut replies = Vec::new();
        let mut outgoing = Vec::new();
        for (seq, e) in fx.iter().enumerate() {
            if let Effect::Reply(r) = e {
                let t = reply_trigger(r);
                ops.push(Op::trigger(&t));
                replies.push(t);
                // Its way out, if the thread is on a connector: in the same
                // commit, so a reply is never made but not sent, nor sent
                // twice by a step that runs again.
                match crate::channels::outbox::item_for(
                    &self.h.store,
                    &r.id,
                    &r.thread,
                    &r.text,
                    seq as u32,
                ) {
                    Ok(Some(it)) => {
                        ops.extend(Op::outbox(&it));
                        outgoing.push(it.connector);
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!("cannot read the thread of reply {}: {e}", r.id),
                }
            }
        }
        if let Some(k) = inbox_key {
            ops.push(Op::delete(Space::Agents, k));
        }
        if !ops.is_empty() && !self.commit(&ops).await {
            return false;
        }
        for t in replies {
            self.h.triggers.published(t);
        }
        for c in outgoing {
            self.h.channels.outbox_ready(&c);
        }
        if self.core.router().stats.turns > turns {
            crate::metrics::router_turn(self.core.router().turn_items.len());
        }
        // Ended workers live on in the store only: memory stays bounded by
        // the live ones.
        self.core.evict_closed();
        crate::metrics::agents_seen(Some(&self.core));
        self.run_effects(fx);
        true
    }

    /// Writes a step atomically and durably. On failure the core goes back
    /// to what the store holds (the step never happened; its inbox entry
    /// is still there and runs again).
    async fn commit(&mut self, ops: &[Op]) -> bool {
        let started = std::time::Instant::now();
        let applied = match &self.h.fence {
            Some(g) => self.h.store.batch_if(g, ops),
            None => self.h.store.batch(ops).map(|()| true),
        };
        let r = match applied {
            Ok(true) => self.h.store.flush_async().await,
            Ok(false) => {
                // Another replica took the agents over while this one was
                // away: nothing more from here, ever, under this epoch.
                tracing::warn!("the agents' lease moved to another replica: standing down");
                self.h.shutdown.cancel();
                return false;
            }
            Err(e) => Err(e),
        };
        let took = started.elapsed();
        if took > SLOW_COMMIT {
            tracing::warn!(
                ms = took.as_millis() as u64,
                ops = ops.len(),
                "slow agent commit"
            );
        }
        let Err(e) = r else {
            return true;
        };
        tracing::error!("cannot commit an agent step ({e}); reloading from the store");
        self.rebuild().await;
        false
    }

    /// Goes back to what the store holds, retrying until it can (or the
    /// server stops).
    async fn rebuild(&mut self) {
        for attempt in 1..=u32::MAX {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match self.reload() {
                Ok(()) => break,
                Err(e) if self.h.shutdown.is_cancelled() => {
                    tracing::error!("giving up reloading at shutdown: {e}");
                    break;
                }
                Err(e) => tracing::error!(attempt, "cannot reload the agents' state: {e}"),
            }
        }
    }

    fn run_effects(&self, fx: Vec<Effect>) {
        for e in fx {
            match e {
                Effect::Reply(_) => {}
                Effect::CallModel {
                    session,
                    kind,
                    turn,
                    request,
                } => {
                    let model = match kind {
                        SessionKind::Router => self.cfg.router_model.clone(),
                        SessionKind::Worker => self.cfg.worker_model.clone(),
                    };
                    let tx = self.tx.clone();
                    let policy = self.cfg.retry.clone();
                    let sem = self.models.clone();
                    let role = crate::metrics::role(kind);
                    tokio::spawn(async move {
                        let _permit = sem.acquire_owned().await;
                        let started = std::time::Instant::now();
                        crate::metrics::model_call_started(role);
                        let result = complete(model.as_ref(), &request, &policy)
                            .await
                            .map_err(|e| e.to_string());
                        crate::metrics::model_call_ended(
                            role,
                            started.elapsed(),
                            result.as_ref().ok().map(|r| &r.usage),
                        );
                        tracing::debug!(
                            session,
                            turn,
                            ms = started.elapsed().as_millis() as u64,
                            "model call finished"
                        );
                        let _ = tx
                            .send(Event::ModelDone {
                                session,
                                turn,
                                result,
                            })
                            .await;
                    });
                }
                Effect::StartCommand {
                    worker,
                    cmd,
                    machine,
                    labels,
                    command,
                    timeout_ms,
                    taint,
                    approved_by,
                } => {
                    let h = self.h.clone();
                    let tx = self.tx.clone();
                    tokio::spawn(async move {
                        let target = if machine.is_empty() {
                            Target::Labels(labels)
                        } else {
                            Target::Machine(machine)
                        };
                        let created = h
                            .commands
                            .ensure(
                                &cmd,
                                Origin {
                                    requested_by: &worker,
                                    taint: &taint,
                                    approved_by: &approved_by,
                                },
                                target,
                                &command,
                                timeout_ms,
                            )
                            .await;
                        let result = match created {
                            Ok(()) => match h.commands.wait_end(&cmd).await {
                                Ok(c) => command_result(&h.store, &c),
                                Err(e) => failed(e.to_string()),
                            },
                            Err(e) => failed(e.to_string()),
                        };
                        let _ = tx
                            .send(Event::CommandDone {
                                worker,
                                cmd,
                                result,
                            })
                            .await;
                    });
                }
                Effect::StopCommand { cmd, reason } => {
                    let commands = self.h.commands.clone();
                    tokio::spawn(async move {
                        if let Err(e) = commands.cancel(&cmd, &reason).await {
                            tracing::debug!("stop {cmd}: {e}");
                        }
                    });
                }
                Effect::RunJs {
                    worker,
                    run,
                    code,
                    clock_ms,
                } => self.spawn_js(worker, run, JsStep::Run { code, clock_ms }),
                Effect::ResumeJs {
                    worker,
                    run,
                    snapshot,
                    call,
                    result,
                } => self.spawn_js(
                    worker,
                    run,
                    JsStep::Resume {
                        snapshot,
                        call,
                        result,
                    },
                ),
                Effect::DropSnapshot { snapshot } => {
                    if let Err(e) = self.h.store.delete_snapshot(&snapshot) {
                        tracing::warn!("cannot drop {snapshot}: {e}");
                    }
                }
            }
        }
    }

    fn spawn_js(&self, worker: String, run: u64, step: JsStep) {
        let store = self.h.store.clone();
        let cfg = self.cfg.clone();
        let tx = self.tx.clone();
        let sem = self.js.clone();
        tokio::spawn(async move {
            let _permit = sem.acquire_owned().await;
            let handle = tokio::runtime::Handle::current();
            let started = std::time::Instant::now();
            let outcome =
                tokio::task::spawn_blocking(move || handle.block_on(js_step(&store, &cfg, step)))
                    .await
                    .unwrap_or_else(|e| {
                        error(ErrorKind::Internal, format!("interpreter task failed: {e}"))
                    });
            tracing::debug!(
                worker,
                run,
                ms = started.elapsed().as_millis() as u64,
                "program step finished"
            );
            let _ = tx
                .send(Event::JsDone {
                    worker,
                    run,
                    outcome,
                })
                .await;
        });
    }

    /// Tells a worker when the machine of one of its running commands goes
    /// away: the command stays pending (a sleeping laptop keeps its work)
    /// until the machine is back or the offline allowance passes.
    async fn watchdog(&mut self) {
        let cmds: Vec<(String, String)> = self
            .core
            .workers()
            .values()
            .filter(|w| !w.status.is_closed())
            .flat_map(|w| {
                w.commands
                    .iter()
                    .filter(|(_, c)| !c.done)
                    .map(|(k, _)| (w.id.clone(), k.clone()))
            })
            .collect();
        let live: std::collections::HashSet<&String> = cmds.iter().map(|(_, c)| c).collect();
        self.told_offline.retain(|c| live.contains(c));
        for (worker, cmd) in cmds {
            let Ok(Some(c)) = self.h.store.get_command(&cmd) else {
                continue;
            };
            let held = matches!(
                c.state(),
                CommandState::Dispatched
                    | CommandState::Running
                    | CommandState::AwaitingLocalApproval
            );
            if !held || self.h.live.online(&c.machine_id) {
                self.told_offline.remove(&cmd);
                continue;
            }
            if !self.told_offline.insert(cmd.clone()) {
                continue;
            }
            let m = self.h.store.get_machine(&c.machine_id).ok().flatten();
            let (name, seen) = m.map(|m| (m.name, m.last_seen_ms)).unwrap_or_default();
            let deadline = self.h.commands.offline_deadline(&c, seen);
            let note = format!(
                "machine {name} is offline (last seen {}); the command stays pending and its result comes when the machine is back, unless it is still away at {} (then it is lost). Wait, shell_stop it, or run it on another machine.",
                byom_protocol::time::rfc3339(seen),
                byom_protocol::time::rfc3339(deadline)
            );
            let _ = self
                .tx
                .send(Event::CommandPending { worker, cmd, note })
                .await;
        }
    }
}

fn failed(reason: String) -> CommandResult {
    CommandResult {
        state: "failed".into(),
        exit_code: None,
        stdout: String::new(),
        stderr: String::new(),
        duration_ms: 0,
        reason,
        network: false,
    }
}

/// A finished command as the agents see it, with (the start of) its output.
fn command_result(store: &Store, c: &pb::Command) -> CommandResult {
    let read = |stream: pb::OutputStream| -> String {
        let chunks = store
            .read_output(&c.id, stream as i32, 0, OUTPUT_READ)
            .unwrap_or_default();
        let bytes: Vec<u8> = chunks.into_iter().flat_map(|(_, b)| b).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let exited = c.state() == CommandState::Exited;
    CommandResult {
        state: c.state().name().to_string(),
        exit_code: if exited { c.exit_code } else { None },
        stdout: read(pb::OutputStream::Stdout),
        stderr: read(pb::OutputStream::Stderr),
        duration_ms: c
            .finished_at_ms
            .saturating_sub(c.started_at_ms.max(c.created_at_ms)),
        reason: c.reason.clone(),
        network: c.network,
    }
}

/// What the driver asks for: a step naming its snapshot by ID.
enum JsStep {
    Run {
        code: String,
        clock_ms: u64,
    },
    Resume {
        snapshot: String,
        call: u32,
        result: Result<Value, String>,
    },
}

/// A step of the server: snapshots come from and go to the store.
async fn js_step(store: &Store, cfg: &AgentConfig, step: JsStep) -> JsOutcome {
    let step = match step {
        JsStep::Run { code, clock_ms } => Step::Run { code, clock_ms },
        JsStep::Resume {
            snapshot,
            call,
            result,
        } => match store.get_snapshot(&snapshot) {
            Ok(Some(bytes)) => Step::Resume {
                snapshot: bytes,
                call,
                result,
            },
            Ok(None) => {
                return error(
                    ErrorKind::BadSnapshot,
                    format!("snapshot {snapshot} is missing from the store"),
                )
            }
            Err(e) => return error(ErrorKind::Internal, e.to_string()),
        },
    };
    let keep = |snap: Snapshot| {
        let id = new_id(Kind::Snapshot);
        // Durable before the core may refer to it.
        store
            .put_snapshot(&id, snap.as_bytes())
            .and_then(|_| store.flush())
            .map(|_| id)
            .map_err(|e| e.to_string())
    };
    run_program_step(cfg.js_limits.clone(), &cfg.js_key, &cfg.budgets, step, keep).await
}

/// A reply as the trigger it is stored as (from `byom`, on its thread).
fn reply_trigger(r: &Reply) -> pb::Trigger {
    let mut t = pb::Trigger {
        id: r.id.clone(),
        thread_id: r.thread.clone(),
        source: r.source.clone(),
        user: "byom".into(),
        text: r.text.clone(),
        mention: false,
        from_bot: true,
        created_at_ms: byom_wire::now_ms(),
        reason: "the agent's reply".into(),
        // What it may carry of someone untrusted stays with it: whoever
        // reads the thread later reads that too.
        trusted: r.untrusted.is_none(),
        trust: r.untrusted.clone().unwrap_or_default(),
        ..Default::default()
    };
    t.set_decision(pb::TriggerDecision::Ignored);
    t
}
