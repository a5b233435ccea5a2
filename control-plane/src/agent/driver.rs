//! The agents' I/O shell: one task that owns the [`Core`], feeds it events
//! from the store's inbox (triggers, answers, cancels, all durable before
//! they are acknowledged) and from its own effects (model replies, command
//! ends, interpreter steps), and commits every step to the store before it
//! acts on it:
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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use byom_protocol::id::{encode_body, CommandId, Kind};
use byom_protocol::pb::{self, CommandState};
use byom_sandbox::{Capability, Engine, Interpreter, Limits, Outcome, Snapshot};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify, Semaphore};

use super::core::{CommandResult, Core, Effect, Event, JsCallReq, JsOutcome, World, ROUTER};
use super::Budgets;
use crate::model::{complete, Model, RetryPolicy};
use crate::pki::now_ms;
use crate::server::Shared;
use crate::store::{Op, Space, Store};

/// Internal events (model replies, command ends, program steps) waiting
/// for the loop.
pub const INTERNAL_EVENTS: usize = 4096;
/// Model calls in flight at once across all sessions.
pub const MAX_CONCURRENT_MODEL_CALLS: usize = 32;
/// Interpreter steps running at once.
pub const MAX_CONCURRENT_JS: usize = 4;
/// A step's commit slower than this is logged: the agents wait on it.
const SLOW_COMMIT: Duration = Duration::from_secs(2);
/// Inbox entries read per pass.
const INBOX_BATCH: usize = 64;
/// Output bytes read back for a finished command (the core cuts further).
const OUTPUT_READ: usize = 64 * 1024;
/// Bytes of a command's output `recall` can see.
const RECALL_OUTPUT: usize = 1 << 20;
/// How often retries and the watchdog run.
const TICK: Duration = Duration::from_secs(1);
/// A command whose machine has been offline this long is declared lost.
pub const LOST_AFTER: Duration = Duration::from_secs(30 * 60);

/// What the server hands the agents.
pub struct AgentConfig {
    pub router_model: Arc<dyn Model>,
    pub worker_model: Arc<dyn Model>,
    pub budgets: Budgets,
    pub retry: RetryPolicy,
    pub js_key: Vec<u8>,
    pub js_limits: Limits,
}

/// The handle the API and webhooks use to reach the agent loop.
pub struct AgentHandle {
    pub wake: Notify,
    pub events: mpsc::Sender<Event>,
}

/// Inbox key: time then a process-local sequence, so entries sort in
/// arrival order across restarts.
pub fn inbox_op(ev: &Event) -> Op {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = format!("i/{:016}{:010}", now_ms(), seq % 10_000_000_000);
    Op::put(
        Space::Agents,
        key.into_bytes(),
        serde_json::to_vec(ev).unwrap_or_default(),
    )
}

/// Puts an event in the durable inbox and wakes the loop.
pub async fn enqueue(shared: &Shared, ev: &Event) -> Result<(), crate::store::StoreError> {
    shared.store.batch(&[inbox_op(ev)])?;
    shared.store.flush_async().await?;
    shared.agents.wake.notify_one();
    Ok(())
}

struct LiveWorld {
    shared: Arc<Shared>,
}

impl World for LiveWorld {
    fn now(&self) -> u64 {
        now_ms()
    }
    fn new_id(&mut self, kind: Kind) -> String {
        let mut r = [0u8; 10];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut r);
        format!("{}{}", kind.prefix(), encode_body(now_ms(), r))
    }
    fn policies(&self) -> Vec<String> {
        self.shared
            .store
            .list_policies()
            .map(|v| {
                v.into_iter()
                    .map(|p| format!("{} ({})", p.text, p.id))
                    .collect()
            })
            .unwrap_or_default()
    }
    fn machines(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .shared
            .store
            .list_machines()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| !m.revoked)
            .map(|m| {
                let online = self
                    .shared
                    .live_machine(&m.id)
                    .is_some_and(|l| l.conn.close_reason().is_none());
                let mut labels: Vec<String> =
                    m.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.sort();
                format!(
                    "{} ({}, {}{}{})",
                    m.name,
                    m.id,
                    if online { "online" } else { "offline" },
                    if labels.is_empty() { "" } else { ", " },
                    labels.join(",")
                )
            })
            .collect();
        v.sort();
        v
    }
    fn lookup(&self, id: &str) -> Option<String> {
        lookup(&self.shared.store, id)
    }
    fn thread_source(&self, thread: &str) -> Option<String> {
        self.shared
            .store
            .get_thread(thread)
            .ok()
            .flatten()
            .map(|t| t.source)
    }
}

/// (worker, snapshot) for every stored worker whose program is paused on a
/// snapshot: the one place that knows where a record keeps it.
fn paused_programs(store: &Store) -> Result<Vec<(String, String)>, crate::store::StoreError> {
    Ok(store
        .agent_records()?
        .into_iter()
        .filter(|(k, _)| k.starts_with(Kind::Worker.prefix()))
        .filter_map(|(k, v)| {
            let w = serde_json::from_slice::<Value>(&v).ok()?;
            Some((k, w["js"]["snapshot"].as_str()?.to_string()))
        })
        .collect())
}

/// The full text of a stored object for recall/read.
pub fn lookup(store: &Store, id: &str) -> Option<String> {
    match Kind::of(id)? {
        Kind::Trigger => {
            let t = store.get_trigger(id).ok()??;
            Some(
                serde_json::to_string_pretty(&json!({
                    "id": t.id, "thread_id": t.thread_id, "source": t.source, "user": t.user,
                    "text": t.text, "mention": t.mention, "from_bot": t.from_bot,
                    "created_at_ms": t.created_at_ms, "decision": t.decision().as_str_name(),
                }))
                .ok()?,
            )
        }
        Kind::Thread => {
            let th = store.get_thread(id).ok()??;
            let mut ts = store.list_triggers(Some(id), 50).ok()?;
            ts.reverse();
            let mut s = format!("thread {} on {} ({})\n", th.id, th.source, th.external);
            for t in ts {
                s.push_str(&format!("{} {}: {}\n", t.id, t.user, t.text));
            }
            Some(s)
        }
        Kind::Command => {
            let c = store.get_command(id).ok()??;
            let read = |stream: i32| -> String {
                let chunks = store
                    .read_output(id, stream, 0, RECALL_OUTPUT)
                    .unwrap_or_default();
                let bytes: Vec<u8> = chunks.into_iter().flat_map(|(_, b)| b).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            };
            Some(format!(
                "command {} on {}: {}\nstate: {} exit: {}\nstdout:\n{}\nstderr:\n{}",
                c.id,
                c.machine_id,
                if c.shell.is_empty() {
                    c.argv.join(" ")
                } else {
                    c.shell.clone()
                },
                c.state().name(),
                c.exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                read(pb::OutputStream::Stdout as i32),
                read(pb::OutputStream::Stderr as i32),
            ))
        }
        Kind::Snapshot => {
            let b = store.get_snapshot(id).ok()??;
            // The program it belongs to, if it is still paused on it.
            let owner = paused_programs(store)
                .ok()?
                .into_iter()
                .find(|(_, snp)| snp == id)
                .map(|(worker, _)| worker);
            Some(
                json!({"id": id, "bytes": b.len(), "paused_program_of": owner,
                       "what": "a paused interpreter's memory (signed, compressed)"})
                .to_string(),
            )
        }
        Kind::Worker | Kind::Approval => {
            let b = store.agent_record(id).ok()??;
            String::from_utf8(b).ok()
        }
        _ => None,
    }
}

struct Driver {
    shared: Arc<Shared>,
    cfg: Arc<AgentConfig>,
    core: Core,
    tx: mpsc::Sender<Event>,
    models: Arc<Semaphore>,
    js: Arc<Semaphore>,
}

/// Runs the agents until shutdown.
pub async fn run(shared: Arc<Shared>, cfg: Arc<AgentConfig>, mut rx: mpsc::Receiver<Event>) {
    let tx = shared.agents.events.clone();
    let mut d = Driver {
        core: Core::new(cfg.budgets.clone()),
        shared: shared.clone(),
        cfg,
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
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        d.drain_inbox().await;
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = shared.agents.wake.notified() => {}
            Some(ev) = rx.recv() => { d.step(ev, None).await; }
            _ = tick.tick() => {
                d.step(Event::Tick, None).await;
                d.watchdog().await;
            }
        }
    }
}

impl Driver {
    /// Rebuilds the core from the store and restarts what was in flight.
    /// A store that cannot be read is an error, never an empty state: the
    /// caller retries rather than run on (and overwrite) a partial picture.
    fn reload(&mut self) -> Result<(), crate::store::StoreError> {
        let store = self.shared.store.clone();
        let records = store.agent_records()?;
        let queue = store.agent_queue()?;
        let failed = std::cell::RefCell::new(None);
        let (core, errors) = Core::rebuild(
            self.cfg.budgets.clone(),
            records,
            |session| match store.agent_messages(session) {
                Ok(m) => m,
                Err(e) => {
                    *failed.borrow_mut() = Some(e);
                    Vec::new()
                }
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
        let fx = self.core.resume_effects();
        let n = fx.len();
        self.core.take_dirty();
        if n > 0 {
            tracing::info!("agents resumed: {n} operations in flight restarted");
        }
        self.run_effects(fx);
        Ok(())
    }

    /// At start-up (no program step can be running yet), snapshots no
    /// worker is paused on are left over from a crash between storing a
    /// snapshot and committing the step that refers to it: drop them.
    fn collect_snapshots(&self) {
        let Ok(ids) = self.shared.store.snapshot_ids() else {
            return;
        };
        let Ok(paused) = paused_programs(&self.shared.store) else {
            return;
        };
        let used: std::collections::HashSet<String> =
            paused.into_iter().map(|(_, snp)| snp).collect();
        let mut dropped = 0;
        for id in ids.into_iter().filter(|id| !used.contains(id)) {
            if self.shared.store.delete_snapshot(&id).is_ok() {
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::info!("dropped {dropped} snapshots no program is paused on");
        }
    }

    async fn drain_inbox(&mut self) {
        for _ in 0..1000 {
            let entries = match self.shared.store.agent_inbox(INBOX_BATCH) {
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
                match serde_json::from_slice::<Event>(&v) {
                    Ok(ev) => {
                        if !self.step(ev, Some(k)).await {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::error!("unreadable agent inbox entry dropped: {e}");
                        let _ = self.shared.store.batch(&[Op::delete(Space::Agents, k)]);
                    }
                }
            }
        }
    }

    /// One event through the core, committed, then acted on. False if the
    /// store refused the commit (the core was rebuilt from the store).
    async fn step(&mut self, ev: Event, inbox_key: Option<Vec<u8>>) -> bool {
        let mut world = LiveWorld {
            shared: self.shared.clone(),
        };
        // Built only when it will be logged: this runs for every event.
        let summary = tracing::enabled!(tracing::Level::DEBUG).then(|| ev.summary());
        let fx = self.core.handle(&mut world, ev);
        if let Some(summary) = summary {
            // Quiet ticks (most of them) are not worth a line each.
            if summary != "tick" || !fx.is_empty() {
                let effects: Vec<String> = fx.iter().map(Effect::summary).collect();
                tracing::debug!(?effects, "agent step: {summary}");
            }
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
        for e in &fx {
            if let Effect::Reply(r) = e {
                let t = reply_trigger(r);
                ops.push(Op::trigger(&t));
                replies.push(t);
            }
        }
        if let Some(k) = inbox_key {
            ops.push(Op::delete(Space::Agents, k));
        }
        if !ops.is_empty() {
            let started = std::time::Instant::now();
            let r = match self.shared.store.batch(&ops) {
                Ok(()) => self.shared.store.flush_async().await,
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
            if let Err(e) = r {
                tracing::error!("cannot commit an agent step ({e}); reloading from the store");
                // Back to what the store holds (the step never happened);
                // the inbox entry is still there and runs again.
                for attempt in 1..=u32::MAX {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    match self.reload() {
                        Ok(()) => break,
                        Err(e) if self.shared.shutdown.is_cancelled() => {
                            tracing::error!("giving up reloading at shutdown: {e}");
                            break;
                        }
                        Err(e) => tracing::error!(attempt, "cannot reload the agents' state: {e}"),
                    }
                }
                return false;
            }
        }
        for t in replies {
            let _ = self
                .shared
                .store
                .touch_thread(&t.thread_id, t.created_at_ms);
            let _ = self.shared.triggers_tx.send(t);
        }
        // Ended workers live on in the store only: memory stays bounded by
        // the live ones.
        self.core.evict_closed();
        self.run_effects(fx);
        true
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
                        super::core::SessionKind::Router => self.cfg.router_model.clone(),
                        super::core::SessionKind::Worker => self.cfg.worker_model.clone(),
                    };
                    let tx = self.tx.clone();
                    let policy = self.cfg.retry.clone();
                    let sem = self.models.clone();
                    tokio::spawn(async move {
                        let _permit = sem.acquire_owned().await;
                        let started = std::time::Instant::now();
                        let result = complete(model.as_ref(), &request, &policy)
                            .await
                            .map_err(|e| e.to_string());
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
                } => {
                    let shared = self.shared.clone();
                    let tx = self.tx.clone();
                    tokio::spawn(async move {
                        let result = match ensure_command(
                            &shared, &worker, &cmd, &machine, &labels, &command, timeout_ms,
                        )
                        .await
                        {
                            Ok(()) => wait_command(&shared, &cmd).await,
                            Err(reason) => CommandResult {
                                state: "failed".into(),
                                exit_code: None,
                                stdout: String::new(),
                                stderr: String::new(),
                                duration_ms: 0,
                                reason,
                            },
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
                    let shared = self.shared.clone();
                    tokio::spawn(async move {
                        if let Err(e) = cancel_command(&shared, &cmd, &reason).await {
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
                    if let Err(e) = self.shared.store.delete_snapshot(&snapshot) {
                        tracing::warn!("cannot drop {snapshot}: {e}");
                    }
                }
            }
        }
    }

    fn spawn_js(&self, worker: String, run: u64, step: JsStep) {
        let shared = self.shared.clone();
        let cfg = self.cfg.clone();
        let tx = self.tx.clone();
        let sem = self.js.clone();
        tokio::spawn(async move {
            let _permit = sem.acquire_owned().await;
            let handle = tokio::runtime::Handle::current();
            let started = std::time::Instant::now();
            let outcome = tokio::task::spawn_blocking(move || {
                handle.block_on(js_step(&shared.store, &cfg, step))
            })
            .await
            .unwrap_or_else(|e| JsOutcome::Error {
                kind: "internal".into(),
                message: format!("interpreter task failed: {e}"),
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

    /// Commands dispatched to a machine that has been gone too long are
    /// declared lost, so their workers hear about it.
    async fn watchdog(&self) {
        let now = now_ms();
        let mut ids = Vec::new();
        for w in self.core.workers.values() {
            if w.status.is_closed() {
                continue;
            }
            for (cmd, c) in &w.commands {
                if !c.done {
                    ids.push(cmd.clone());
                }
            }
        }
        for id in ids {
            let Ok(Some(c)) = self.shared.store.get_command(&id) else {
                continue;
            };
            let st = c.state();
            if st != CommandState::Dispatched && st != CommandState::Running {
                continue;
            }
            if self.shared.live_machine(&c.machine_id).is_some() {
                continue;
            }
            let seen = self
                .shared
                .store
                .get_machine(&c.machine_id)
                .ok()
                .flatten()
                .map(|m| m.last_seen_ms)
                .unwrap_or(0);
            if now.saturating_sub(seen) < LOST_AFTER.as_millis() as u64 {
                continue;
            }
            let r = self.shared.store.transition(
                &id,
                &[CommandState::Dispatched, CommandState::Running],
                CommandState::Lost,
                |c| {
                    c.reason = format!(
                        "its machine has been offline for over {} minutes",
                        LOST_AFTER.as_secs() / 60
                    );
                    c.finished_at_ms = now;
                },
            );
            if let Ok(Some(_)) = r {
                let _ = self.shared.store.flush_async().await;
                self.shared.notify(&id);
            }
        }
    }
}

/// One interpreter step of a worker's program.
pub enum ProgramStep {
    /// The first eval of the code, with the virtual clock starting there.
    Run { code: String, clock_ms: u64 },
    /// Restore the snapshot (its bytes) and settle call `call`.
    Resume {
        snapshot: Vec<u8>,
        call: u32,
        result: Result<Value, String>,
    },
}

fn js_error(kind: &str, message: impl Into<String>) -> JsOutcome {
    JsOutcome::Error {
        kind: kind.into(),
        message: message.into(),
    }
}

/// The capabilities a worker's program has: all durable, so the program
/// pauses on each and the core decides what happens.
pub fn js_capabilities(b: &Budgets) -> Vec<Capability> {
    vec![
        Capability::durable("tools", "exec")
            .with_schema(json!({"type": "object", "properties": {
                "machine": {"type": "string", "maxLength": 200},
                "command": {"type": "string", "maxLength": 8192},
                "timeout_s": {"type": "integer", "minimum": 1, "maximum": 86400}
            }, "required": ["command"], "additionalProperties": false}))
            .with_policy(16, 64),
        Capability::durable("agents", "spawn")
            .with_schema(json!({"type": "object", "properties": {
                "task": {"type": "string", "maxLength": 8000},
                "machine": {"type": "string", "maxLength": 200}
            }, "required": ["task"], "additionalProperties": false}))
            .with_policy(b.max_subagents, b.max_subagents),
        Capability::durable("human", "ask")
            .with_schema(json!({"type": "string", "maxLength": 2000}))
            .with_policy(1, 4),
    ]
}

/// Runs one program step to its end or next pause. A pause hands the
/// snapshot to `keep`, which makes it durable and names it; the server
/// keeps it in the store, the simulator in memory.
pub async fn run_program_step(
    limits: Limits,
    key: &[u8],
    budgets: &Budgets,
    step: ProgramStep,
    keep: impl FnOnce(Snapshot) -> Result<String, String>,
) -> JsOutcome {
    let engine = match Engine::shared() {
        Ok(e) => e,
        Err(e) => return js_error("internal", format!("the interpreter is unavailable: {e}")),
    };
    let caps = js_capabilities(budgets);
    let (out, logs) = match step {
        ProgramStep::Run { code, clock_ms } => {
            let mut it = match Interpreter::new_at(&engine, limits, caps, key, clock_ms) {
                Ok(it) => it,
                Err(e) => return js_error("internal", e.to_string()),
            };
            let out = it.eval(&code).await;
            (out, it.take_logs())
        }
        ProgramStep::Resume {
            snapshot,
            call,
            result,
        } => {
            let snap = Snapshot::from_bytes(snapshot);
            let mut it = match Interpreter::restore(&engine, limits, caps, &snap, key) {
                Ok(it) => it,
                Err((kind, message)) => return js_error(kind.name(), message),
            };
            let out = it.resume(call, result).await;
            (out, it.take_logs())
        }
    };
    match out {
        Outcome::Done(result) => JsOutcome::Done { result, logs },
        Outcome::Error(kind, message) => js_error(kind.name(), message),
        Outcome::Paused(snap) => {
            let pending = match snap.pending_unverified() {
                Ok(p) => p,
                Err(e) => return js_error("bad_snapshot", e.to_string()),
            };
            match keep(snap) {
                Ok(snapshot) => JsOutcome::Paused {
                    snapshot,
                    pending: pending
                        .into_iter()
                        .map(|p| JsCallReq {
                            id: p.id,
                            capability: p.capability,
                            args: p.args,
                        })
                        .collect(),
                },
                Err(e) => js_error("internal", format!("cannot keep the snapshot: {e}")),
            }
        }
    }
}

/// A step of the server: snapshots come from and go to the store.
async fn js_step(store: &Store, cfg: &AgentConfig, step: JsStep) -> JsOutcome {
    let step = match step {
        JsStep::Run { code, clock_ms } => ProgramStep::Run { code, clock_ms },
        JsStep::Resume {
            snapshot,
            call,
            result,
        } => match store.get_snapshot(&snapshot) {
            Ok(Some(bytes)) => ProgramStep::Resume {
                snapshot: bytes,
                call,
                result,
            },
            Ok(None) => {
                return js_error(
                    "bad_snapshot",
                    format!("snapshot {snapshot} is missing from the store"),
                )
            }
            Err(e) => return js_error("internal", e.to_string()),
        },
    };
    let keep = |snap: Snapshot| {
        let mut r = [0u8; 10];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut r);
        let id = format!("{}{}", Kind::Snapshot.prefix(), encode_body(now_ms(), r));
        // Durable before the core may refer to it.
        store
            .put_snapshot(&id, snap.as_bytes())
            .and_then(|_| store.flush())
            .map(|_| id)
            .map_err(|e| e.to_string())
    };
    run_program_step(cfg.js_limits.clone(), &cfg.js_key, &cfg.budgets, step, keep).await
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

fn reply_trigger(r: &super::core::Reply) -> pb::Trigger {
    let mut t = pb::Trigger {
        id: r.id.clone(),
        thread_id: r.thread.clone(),
        source: r.source.clone(),
        user: "byom".into(),
        text: r.text.clone(),
        mention: false,
        from_bot: true,
        created_at_ms: now_ms(),
        reason: "the agent's reply".into(),
        ..Default::default()
    };
    t.set_decision(pb::TriggerDecision::Ignored);
    t
}

/// Creates the command unless it already exists (a restart re-issues
/// starts; the ID makes them idempotent).
async fn ensure_command(
    shared: &Arc<Shared>,
    worker: &str,
    cmd: &str,
    machine: &str,
    labels: &BTreeMap<String, String>,
    command: &str,
    timeout_ms: u64,
) -> Result<(), String> {
    let store = &shared.store;
    if store.get_command(cmd).map_err(|e| e.to_string())?.is_some() {
        return Ok(());
    }
    let m = if !machine.is_empty() {
        store
            .resolve_machine(machine)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!("no machine {machine:?}; paired machines are listed by `byom machines ls`")
            })?
    } else {
        let mut all: Vec<pb::Machine> = store
            .list_machines()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|m| !m.revoked && labels.iter().all(|(k, v)| m.labels.get(k) == Some(v)))
            .collect();
        // Online machines first, then by name: deterministic.
        all.sort_by_key(|m| (shared.live_machine(&m.id).is_none(), m.name.clone()));
        all.into_iter()
            .next()
            .ok_or_else(|| format!("no machine has the labels {labels:?}"))?
    };
    if m.revoked {
        return Err(format!("machine {} was revoked", m.name));
    }
    if command.is_empty() {
        return Err("the command text was lost".into());
    }
    if command.len() > byom_protocol::limits::MAX_COMMAND_LINE_BYTES {
        return Err("command line too long".into());
    }
    CommandId::parse(cmd).map_err(|e| e.to_string())?;
    let now = now_ms();
    let c = pb::Command {
        id: cmd.to_string(),
        machine_id: m.id.clone(),
        shell: command.to_string(),
        timeout_ms: timeout_ms.min(byom_protocol::limits::MAX_COMMAND_TIMEOUT.as_millis() as u64),
        state: CommandState::Queued as i32,
        created_at_ms: now,
        queue_deadline_ms: now + byom_protocol::limits::DEFAULT_QUEUE_TTL.as_millis() as u64,
        requested_by: worker.to_string(),
        ..Default::default()
    };
    store.create_command(&c).map_err(|e| e.to_string())?;
    store.flush_async().await.map_err(|e| e.to_string())?;
    if let Some(live) = shared.live_machine(&m.id) {
        let shared = shared.clone();
        tokio::spawn(async move { crate::gateway::dispatch_queued(&shared, &live).await });
    }
    Ok(())
}

/// Waits for a command to end and summarises it.
async fn wait_command(shared: &Arc<Shared>, cmd: &str) -> CommandResult {
    let mut rx = shared.subscribe(cmd);
    loop {
        let c = match shared.store.get_command(cmd) {
            Ok(Some(c)) => c,
            Ok(None) => {
                return CommandResult {
                    state: "failed".into(),
                    exit_code: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    duration_ms: 0,
                    reason: "the command disappeared from the store".into(),
                }
            }
            Err(e) => {
                tracing::warn!("reading {cmd}: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if c.state().is_terminal() {
            let read = |stream: pb::OutputStream| -> String {
                let chunks = shared
                    .store
                    .read_output(cmd, stream as i32, 0, OUTPUT_READ)
                    .unwrap_or_default();
                let bytes: Vec<u8> = chunks.into_iter().flat_map(|(_, b)| b).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            };
            let exited = c.state() == CommandState::Exited;
            return CommandResult {
                state: c.state().name().to_string(),
                exit_code: if exited { c.exit_code } else { None },
                stdout: read(pb::OutputStream::Stdout),
                stderr: read(pb::OutputStream::Stderr),
                duration_ms: c
                    .finished_at_ms
                    .saturating_sub(c.started_at_ms.max(c.created_at_ms)),
                reason: c.reason.clone(),
            };
        }
        // Woken on every change; the timeout covers a missed wake-up.
        let _ = tokio::time::timeout(Duration::from_secs(5), rx.changed()).await;
    }
}

/// Cancels a command: a queued one at once, a running one on its machine.
pub async fn cancel_command(
    shared: &Arc<Shared>,
    id: &str,
    reason: &str,
) -> Result<pb::Command, crate::store::StoreError> {
    let store = &shared.store;
    let now = now_ms();
    let c = match store.transition(id, &[CommandState::Queued], CommandState::Cancelled, |c| {
        c.reason = reason.to_string();
        c.finished_at_ms = now;
    })? {
        Some(c) => c,
        None => {
            let c = store.update_command(id, |c| {
                if !c.state().is_terminal() {
                    c.cancel_requested = true;
                }
                Ok(())
            })?;
            if !c.state().is_terminal() {
                if let Some(live) = shared.live_machine(&c.machine_id) {
                    live.cancel(&c.id, reason);
                }
            }
            c
        }
    };
    store.flush_async().await?;
    shared.notify(&c.id);
    Ok(c)
}

/// `ROUTER` re-exported for the API's object lookups.
pub const ROUTER_KEY: &str = ROUTER;
