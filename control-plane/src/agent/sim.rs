//! Simulated time: the same [`Core`] the server runs, driven by a virtual
//! clock and an event heap instead of sockets and sleeps. The scripted model
//! answers with its latency model (time advances, nobody waits), machines
//! are simulated (a command takes `command_ms` and echoes), and programs run
//! in the real interpreter with snapshots kept in memory. A 300-message day
//! replays in well under a second; the same seed replays the same run.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use byom_protocol::id::{encode_body, Kind};
use byom_sandbox::{Engine, Limits, Snapshot};
use serde::Serialize;

use super::core::{
    CommandResult, Core, Effect, Event, JsOutcome, TriggerInfo, WorkerStatus, World,
};
use super::driver::{run_program_step, ProgramStep};
use super::Budgets;
use crate::model::scripted::{Latency, Scripted};
use crate::model::Usage;

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub latency: Latency,
    /// How long a simulated command runs (`commands` counts distinct ones
    /// the machines ran).
    pub command_ms: u64,
    /// Triggers on subscribed threads go straight to their workers.
    pub pass_through: bool,
    pub budgets: Budgets,
    /// Machines that exist (names).
    pub machines: Vec<String>,
    /// Crash after every this many steps (0: never): the core is rebuilt
    /// from its persisted records, everything in memory (model replies,
    /// command ends, program steps in flight) is lost, and
    /// `resume_effects` must bring it all back.
    pub crash_every: u64,
    /// Serialize every changed record after each step, as the driver does
    /// before writing it (implied by `crash_every`).
    pub persist: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: Latency {
                base: Duration::from_millis(400),
                per_input_token: Duration::from_micros(20),
                per_output_token: Duration::from_millis(8),
            },
            command_ms: 1500,
            pass_through: true,
            budgets: Budgets::default(),
            machines: vec!["lap".into(), "ci".into()],
            crash_every: 0,
            persist: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SimReport {
    pub triggers: usize,
    pub replies: usize,
    pub tasks: usize,
    pub tasks_finished: usize,
    pub tasks_unfinished: Vec<String>,
    pub subagents: usize,
    pub router_turns: u64,
    pub router_model_calls: u64,
    pub router_decisions: u64,
    pub passed_through: u64,
    pub worker_model_calls: u64,
    pub router_usage: Usage,
    pub worker_usage: Usage,
    pub commands: usize,
    pub programs: usize,
    pub simulated_ms: u64,
    pub wall_ms: f64,
    /// Wall time spent inside the scripted model (the rest is the core and
    /// the interpreter).
    pub model_ms: f64,
    /// Median time from a message to the agent's next reply on its thread.
    pub reply_p50_ms: u64,
    /// Median time from a request (a message with a `command`) to the
    /// reply carrying its result.
    pub result_p50_ms: u64,
    /// Simulated time spent waiting on the model, summed over all calls.
    pub model_latency_ms: u64,
    pub quiescent: bool,
    pub crashes: u64,
    /// Router turns dropped to fit the context budget.
    pub router_dropped_turns: u64,
}

struct SimWorld {
    now: u64,
    seq: u64,
    policies: Vec<String>,
    machines: Vec<String>,
    triggers: HashMap<String, TriggerInfo>,
    threads: HashMap<String, String>,
}

impl World for SimWorld {
    fn now(&self) -> u64 {
        self.now
    }
    fn new_id(&mut self, kind: Kind) -> String {
        self.seq += 1;
        let mut r = [0u8; 10];
        // Like real IDs, those made in the same millisecond sort in no
        // particular order: the core must not take ID order for age.
        let mut x = self.seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        r[2..].copy_from_slice(&x.to_be_bytes());
        format!("{}{}", kind.prefix(), encode_body(self.now, r))
    }
    fn policies(&self) -> Vec<String> {
        self.policies.clone()
    }
    fn machines(&self) -> Vec<String> {
        self.machines
            .iter()
            .map(|m| format!("{m} (online)"))
            .collect()
    }
    fn lookup(&self, id: &str) -> Option<String> {
        let t = self.triggers.get(id)?;
        serde_json::to_string(&serde_json::json!({
            "thread_id": t.thread, "source": t.source, "user": t.user,
            "text": t.text, "mention": t.mention
        }))
        .ok()
    }
    fn thread_source(&self, thread: &str) -> Option<String> {
        self.threads.get(thread).cloned()
    }
}

/// A deterministic generator (xorshift64*), so a seed is a whole workload.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A working day on a team chat: `n` messages over eight hours, mixing new
/// requests, follow-ups in the same threads, parallel checks with an
/// approval, chatter, and the odd cancel. Returns (time, trigger) pairs.
pub fn day(n: usize, seed: u64) -> Vec<(u64, TriggerInfo)> {
    let mut rng = Rng::new(seed);
    let span = 8 * 3600 * 1000u64;
    let users = ["ada", "bob", "cy", "dee", "eve"];
    let mut threads: Vec<String> = Vec::new();
    let mut out = Vec::new();
    let mut t = 0u64;
    for i in 0..n {
        t += rng.below(2 * span / n as u64 + 1);
        let user = users[rng.below(users.len() as u64) as usize].to_string();
        let roll = rng.below(100);
        let (thread, text, mention) = if roll < 35 || threads.is_empty() {
            let th = format!("thr_sim{i:04}");
            threads.push(th.clone());
            let cmds = ["uname -s", "df -h /", "uptime", "git status", "cargo test"];
            let c = cmds[rng.below(cmds.len() as u64) as usize];
            (th, format!("please run `{c}` on lap"), true)
        } else if roll < 60 {
            let th = threads[rng.below(threads.len() as u64) as usize].clone();
            (th, "also run `ls /tmp` on lap".to_string(), false)
        } else if roll < 65 {
            let th = format!("thr_sim{i:04}");
            threads.push(th.clone());
            (
                th,
                "check `uptime`, `df -h /` and `free -m` on lap in parallel, then ask me before running `echo cleaned`".to_string(),
                true,
            )
        } else if roll < 70 {
            let th = threads[rng.below(threads.len() as u64) as usize].clone();
            (th, "yes".to_string(), false)
        } else if roll < 73 {
            let th = threads[rng.below(threads.len() as u64) as usize].clone();
            (th, "stop that please, cancel".to_string(), false)
        } else {
            let th = threads[rng.below(threads.len() as u64) as usize].clone();
            let chatter = ["lunch?", "thanks!", "nice", "see the standup notes", "brb"];
            (
                th,
                chatter[rng.below(chatter.len() as u64) as usize].to_string(),
                false,
            )
        };
        out.push((
            t,
            TriggerInfo {
                id: format!("trg_sim{i:05}"),
                thread,
                source: "chat".into(),
                user,
                text,
                mention,
            },
        ));
    }
    out
}

/// Replays `events` in simulated time until everything settles (or a
/// simulated week passes).
pub async fn run(events: Vec<(u64, TriggerInfo)>, cfg: &SimConfig) -> anyhow::Result<SimReport> {
    Ok(run_with_core(events, cfg).await?.0)
}

/// Like [`run`], also returning the final state (for measuring it).
pub async fn run_with_core(
    events: Vec<(u64, TriggerInfo)>,
    cfg: &SimConfig,
) -> anyhow::Result<(SimReport, Core)> {
    let started = Instant::now();
    let mut core = Core::new(cfg.budgets.clone());
    core.pass_through = cfg.pass_through;
    let model = Scripted::new(cfg.latency);
    // Compile (or load) the interpreter once, before the clock matters.
    Engine::shared()?;
    let key = b"simulation-snapshot-key-0123456789".to_vec();
    let mut world = SimWorld {
        now: 0,
        seq: 0,
        policies: vec!["ignore anything about \"standup\"".into()],
        machines: cfg.machines.clone(),
        triggers: HashMap::new(),
        threads: HashMap::new(),
    };
    let mut heap: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut pending: HashMap<usize, Event> = HashMap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Reverse<(u64, u64, usize)>>,
                    pending: &mut HashMap<usize, Event>,
                    at: u64,
                    ev: Event| {
        seq += 1;
        let slot = seq as usize;
        pending.insert(slot, ev);
        heap.push(Reverse((at, seq, slot)));
    };
    let mut asked_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut reply_lat: Vec<u64> = Vec::new();
    let mut requested_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut result_lat: Vec<u64> = Vec::new();
    let mut report = SimReport::default();
    for (at, t) in events {
        report.triggers += 1;
        push(&mut heap, &mut pending, at, Event::Trigger(t));
    }
    let mut snapshots: HashMap<String, Vec<u8>> = HashMap::new();
    // What the store would hold: every record as last committed.
    let mut persisted: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // The simulated machines: command → when it ends (they outlive crashes).
    let mut machine_cmds: HashMap<String, u64> = HashMap::new();
    let limit = 7 * 24 * 3600 * 1000u64;
    let mut steps = 0u64;
    while let Some(Reverse((at, _, slot))) = heap.pop() {
        steps += 1;
        if at > limit || steps > 10_000_000 {
            break;
        }
        world.now = world.now.max(at);
        let Some(ev) = pending.remove(&slot) else {
            continue;
        };
        if let Event::Trigger(t) = &ev {
            world.triggers.insert(t.id.clone(), t.clone());
            world.threads.insert(t.thread.clone(), t.source.clone());
            asked_at.entry(t.thread.clone()).or_insert(world.now);
            if t.text.contains('`') {
                requested_at.entry(t.thread.clone()).or_insert(world.now);
            }
        }
        let mut fx = core.handle(&mut world, ev);
        // What the driver writes after the step.
        for (k, v) in core.take_writes() {
            if !(cfg.persist || cfg.crash_every > 0) {
                continue;
            }
            match v {
                Some(v) => {
                    persisted.insert(k, v);
                }
                None => {
                    persisted.remove(&k);
                }
            }
        }
        if cfg.crash_every > 0 && steps.is_multiple_of(cfg.crash_every) {
            // Replies were committed with the step; the rest is lost.
            let committed: Vec<Effect> = fx
                .into_iter()
                .filter(|e| matches!(e, Effect::Reply(_)))
                .collect();
            report.crashes += 1;
            pending.retain(|_, e| matches!(e, Event::Trigger(_)));
            let (fresh, errors) = Core::rebuild_from_image(cfg.budgets.clone(), &persisted, false);
            anyhow::ensure!(errors.is_empty(), "state did not reload: {errors:?}");
            core = fresh;
            core.pass_through = cfg.pass_through;
            fx = committed;
            fx.extend(core.resume_effects());
            core.take_dirty();
        }
        for e in fx {
            match e {
                Effect::CallModel {
                    session,
                    turn,
                    request,
                    kind,
                } => {
                    let m0 = Instant::now();
                    let (resp, latency) = model.respond(&request);
                    report.model_ms += m0.elapsed().as_secs_f64() * 1000.0;
                    report.model_latency_ms += latency.as_millis() as u64;
                    if kind == super::core::SessionKind::Worker {
                        report.worker_model_calls += 1;
                        report.worker_usage += resp.usage;
                    }
                    push(
                        &mut heap,
                        &mut pending,
                        world.now + latency.as_millis() as u64,
                        Event::ModelDone {
                            session,
                            turn,
                            result: Ok(resp),
                        },
                    );
                }
                Effect::StartCommand {
                    worker,
                    cmd,
                    machine,
                    command,
                    ..
                } => {
                    // A restart asks again for commands it already started:
                    // the machine keeps running the one it has.
                    let done_at = match machine_cmds.get(&cmd) {
                        Some(t) => (*t).max(world.now),
                        None => {
                            report.commands += 1;
                            let t = world.now + cfg.command_ms;
                            machine_cmds.insert(cmd.clone(), t);
                            t
                        }
                    };
                    let stdout = match command.strip_prefix("echo ") {
                        Some(rest) => format!("{rest}\n"),
                        None => format!("(simulated output of `{command}` on {machine})\n"),
                    };
                    push(
                        &mut heap,
                        &mut pending,
                        done_at,
                        Event::CommandDone {
                            worker,
                            cmd,
                            result: CommandResult {
                                state: "exited".into(),
                                exit_code: Some(0),
                                stdout,
                                stderr: String::new(),
                                duration_ms: cfg.command_ms,
                                reason: String::new(),
                            },
                        },
                    );
                }
                Effect::StopCommand { cmd, reason } => {
                    let worker = core
                        .workers
                        .iter()
                        .find(|(_, w)| w.commands.contains_key(&cmd))
                        .map(|(k, _)| k.clone())
                        .unwrap_or_default();
                    push(
                        &mut heap,
                        &mut pending,
                        world.now,
                        Event::CommandDone {
                            worker,
                            cmd,
                            result: CommandResult {
                                state: "cancelled".into(),
                                exit_code: None,
                                stdout: String::new(),
                                stderr: String::new(),
                                duration_ms: 0,
                                reason,
                            },
                        },
                    );
                }
                Effect::RunJs {
                    worker,
                    run,
                    code,
                    clock_ms,
                } => {
                    report.programs += 1;
                    let step = ProgramStep::Run { code, clock_ms };
                    let outcome = sim_step(step, cfg, &key, &mut world, &mut snapshots).await;
                    push(
                        &mut heap,
                        &mut pending,
                        world.now,
                        Event::JsDone {
                            worker,
                            run,
                            outcome,
                        },
                    );
                }
                Effect::ResumeJs {
                    worker,
                    run,
                    snapshot,
                    call,
                    result,
                } => {
                    let outcome = match snapshots.get(&snapshot) {
                        None => JsOutcome::Error {
                            kind: "bad_snapshot".into(),
                            message: format!("no snapshot {snapshot}"),
                        },
                        Some(bytes) => {
                            let step = ProgramStep::Resume {
                                snapshot: bytes.clone(),
                                call,
                                result,
                            };
                            sim_step(step, cfg, &key, &mut world, &mut snapshots).await
                        }
                    };
                    push(
                        &mut heap,
                        &mut pending,
                        world.now,
                        Event::JsDone {
                            worker,
                            run,
                            outcome,
                        },
                    );
                }
                Effect::DropSnapshot { snapshot } => {
                    snapshots.remove(&snapshot);
                }
                Effect::Reply(r) => {
                    report.replies += 1;
                    if let Some(t0) = asked_at.remove(&r.thread) {
                        reply_lat.push(world.now - t0);
                    }
                    if r.text.starts_with("Done:") {
                        if let Some(t0) = requested_at.remove(&r.thread) {
                            result_lat.push(world.now - t0);
                        }
                    }
                    // A question is answered by its asker a minute later.
                    if r.text.starts_with("Approval needed") {
                        let id = format!("trg_ans{}", report.replies);
                        push(
                            &mut heap,
                            &mut pending,
                            world.now + 60_000,
                            Event::Trigger(TriggerInfo {
                                id,
                                thread: r.thread.clone(),
                                source: r.source.clone(),
                                user: "ada".into(),
                                text: "yes, go ahead".into(),
                                mention: false,
                            }),
                        );
                    }
                }
            }
        }
    }
    report.simulated_ms = world.now;
    report.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let s = &core.router.stats;
    report.router_turns = s.turns;
    report.router_model_calls = s.model_calls;
    report.router_decisions = s.decisions;
    report.passed_through = s.passed_through;
    report.router_usage = s.usage;
    report.router_dropped_turns = core.router.dropped_turns;
    for w in core.workers.values() {
        if w.parent.is_some() {
            report.subagents += 1;
            continue;
        }
        report.tasks += 1;
        let finished = matches!(
            w.status,
            WorkerStatus::Idle
                | WorkerStatus::Done
                | WorkerStatus::Cancelled
                | WorkerStatus::Failed
        ) && w.in_flight.is_none()
            && w.inbox.is_empty();
        if finished {
            report.tasks_finished += 1;
        } else {
            report
                .tasks_unfinished
                .push(format!("{} ({})", w.id, w.status.name()));
        }
    }
    reply_lat.sort_unstable();
    report.reply_p50_ms = reply_lat.get(reply_lat.len() / 2).copied().unwrap_or(0);
    result_lat.sort_unstable();
    report.result_p50_ms = result_lat.get(result_lat.len() / 2).copied().unwrap_or(0);
    report.quiescent = core.quiescent();
    Ok((report, core))
}

/// A program step with snapshots kept in memory under simulated IDs.
async fn sim_step(
    step: ProgramStep,
    cfg: &SimConfig,
    key: &[u8],
    world: &mut SimWorld,
    snapshots: &mut HashMap<String, Vec<u8>>,
) -> JsOutcome {
    let keep = |snap: Snapshot| {
        let id = world.new_id(Kind::Snapshot);
        snapshots.insert(id.clone(), snap.into_bytes());
        Ok(id)
    };
    run_program_step(Limits::default(), key, &cfg.budgets, step, keep).await
}
