//! Simulated time: the same [`Core`] the server runs, driven by a virtual
//! clock and an event heap instead of sockets and sleeps. The scripted
//! model answers with its latency model (time advances, nobody waits),
//! machines are simulated (a command takes `command_ms` and echoes), and
//! programs run in whatever [`Programs`] the caller gives: the real
//! interpreter in the server's tests, [`ScriptedPrograms`] here. After every
//! step the core's invariants are checked; optionally the core crashes and
//! is rebuilt from what it wrote. The same seed replays the same run.

mod scripted_programs;
mod workload;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::future::Future;
use std::time::{Duration, Instant};

use byom_protocol::id::Kind;
use serde::Serialize;

pub use scripted_programs::ScriptedPrograms;
pub use workload::{day, mixed_day, Rng, UNTRUSTED_MARK};

use crate::budgets::Budgets;
use crate::core::Core;
use crate::event::{CommandResult, Effect, Event, SessionKind, TriggerInfo};
use crate::llm::Usage;
use crate::programs::{ProgramStep, Programs};
use crate::scripted::{Latency, Scripted};
use crate::state::WorkerStatus;
use crate::trust::{Approver, Trust};
use crate::world::{TestWorld, World};

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub latency: Latency,
    /// How long a simulated command runs.
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
    /// before writing it (implied by `crash_every` and `outage_every`).
    pub persist: bool,
    /// The store is away for every this many steps (0: never): each read
    /// of the world fails, the step must be void, and the driver's answer
    /// (nothing written, the core rebuilt, in-flight work restarted,
    /// people's messages offered again) must change nothing anyone sees.
    pub outage_every: u64,
    /// Check the core's invariants after every step (off only to measure
    /// the core alone: the check reads every record).
    pub check_invariants: bool,
    /// Who is trusted and who approves.
    pub trust: Trust,
    /// Labels per machine (`ci` is labelled `sensitive=false`).
    pub labels: HashMap<String, BTreeMap<String, String>>,
    /// Who answers a question asked on a thread, picked in turn by a
    /// generator seeded with `answer_seed`; an answer from someone who may
    /// not approve is followed by `answerers[0]`'s.
    pub answerers: Vec<String>,
    pub answer_seed: u64,
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
            outage_every: 0,
            check_invariants: true,
            trust: Trust {
                approvers: vec![Approver {
                    principal: "ada".into(),
                    label: None,
                }],
                ..Trust::default()
            },
            labels: [(
                "ci".to_string(),
                [("sensitive".to_string(), "false".to_string())].into(),
            )]
            .into(),
            answerers: vec!["ada".into()],
            answer_seed: 1,
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
    /// Tasks that ended (done or failed) without their result reaching
    /// any of their own threads.
    pub tasks_unreported: Vec<String>,
    pub subagents: usize,
    pub router_turns: u64,
    pub router_model_calls: u64,
    pub router_decisions: u64,
    pub passed_through: u64,
    pub worker_model_calls: u64,
    pub router_usage: Usage,
    pub worker_usage: Usage,
    /// Distinct commands the simulated machines ran.
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
    /// Steps voided because the world could not be read.
    pub voided: u64,
    /// Commands held for an approval, and those that then ran with one.
    pub held: usize,
    pub approved_runs: usize,
    /// Answers refused because their author may not approve.
    pub refused_answers: usize,
    /// Router turns dropped to fit the context budget.
    pub router_dropped_turns: u64,
    /// Snapshots the interpreter still keeps at the end (none should leak).
    pub snapshots_left: usize,
}

/// Why a simulation stopped short.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("after step {step} ({event}): invariant broken: {why}")]
    Invariant {
        step: u64,
        event: String,
        why: String,
    },
    #[error("after the crash at step {step}, the state did not reload: {why}")]
    Reload { step: u64, why: String },
}

/// Simulated steps at most (a runaway loop stops here, not the machine).
const MAX_STEPS: u64 = 10_000_000;
/// Simulated time at most: a week.
const MAX_SIMULATED_MS: u64 = 7 * 24 * 3600 * 1000;

/// Events waiting for their simulated time, in time order (ties in the
/// order they were scheduled).
#[derive(Default)]
struct Agenda {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, Event>,
    seq: u64,
    /// The place of the event `next` gave last.
    last: (u64, u64),
}

impl Agenda {
    fn at(&mut self, t: u64, ev: Event) {
        self.seq += 1;
        self.events.insert(self.seq, ev);
        self.heap.push(Reverse((t, self.seq)));
    }
    fn next(&mut self) -> Option<(u64, Event)> {
        loop {
            let Reverse((t, seq)) = self.heap.pop()?;
            if let Some(ev) = self.events.remove(&seq) {
                self.last = (t, seq);
                return Some((t, ev));
            }
        }
    }
    /// The event `next` gave last, back in its place: offered again first.
    fn again(&mut self, ev: Event) {
        let (t, seq) = self.last;
        self.events.insert(seq, ev);
        self.heap.push(Reverse((t, seq)));
    }
    /// A crash loses everything in flight but people's messages.
    fn crash(&mut self) {
        self.events.retain(|_, e| matches!(e, Event::Trigger(_)));
    }
}

/// The core as the store holds it after step `step` (a crash, a void
/// step): what the driver rebuilds from.
fn rebuild(
    cfg: &SimConfig,
    persisted: &BTreeMap<String, Vec<u8>>,
    step: u64,
) -> Result<Core, SimError> {
    let (mut core, errors) = Core::rebuild_from_image(cfg.budgets.clone(), persisted, false);
    if !errors.is_empty() {
        return Err(SimError::Reload {
            step,
            why: errors.join("; "),
        });
    }
    core.pass_through = cfg.pass_through;
    Ok(core)
}

/// Replays `events` in simulated time until everything settles (or a
/// simulated week passes).
pub async fn run<P: Programs>(
    events: Vec<(u64, TriggerInfo)>,
    cfg: &SimConfig,
    programs: &mut P,
) -> Result<SimReport, SimError> {
    Ok(run_with_core(events, cfg, programs).await?.0)
}

/// Like [`run`], also returning the final state (for measuring it).
pub async fn run_with_core<P: Programs>(
    events: Vec<(u64, TriggerInfo)>,
    cfg: &SimConfig,
    programs: &mut P,
) -> Result<(SimReport, Core), SimError> {
    let started = Instant::now();
    let mut core = Core::new(cfg.budgets.clone());
    core.pass_through = cfg.pass_through;
    let model = Scripted::new(cfg.latency);
    let mut world = TestWorld::default();
    world.policies = vec!["ignore anything about \"standup\"".into()];
    world.machines = cfg.machines.clone();
    world.trust = cfg.trust.clone();
    world.labels = cfg.labels.clone();
    let mut answers = Rng::new(cfg.answer_seed);
    let mut oracle = Oracle::default();
    let mut agenda = Agenda::default();
    let mut asked_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut reply_lat: Vec<u64> = Vec::new();
    let mut requested_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut reported: std::collections::BTreeSet<String> = Default::default();
    let mut result_lat: Vec<u64> = Vec::new();
    let mut report = SimReport::default();
    for (at, t) in events {
        report.triggers += 1;
        agenda.at(at, Event::Trigger(t));
    }
    // What the store would hold: every record as last committed.
    let mut persisted: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // The simulated machines: command → when it ends (they outlive crashes).
    let mut machine_cmds: HashMap<String, u64> = HashMap::new();
    let mut steps = 0u64;
    // `BYOM_SIM_TRACE=1` prints every step and reply: how a failing seed is read.
    let trace = std::env::var_os("BYOM_SIM_TRACE").is_some();
    while let Some((at, ev)) = agenda.next() {
        steps += 1;
        if at > MAX_SIMULATED_MS || steps > MAX_STEPS {
            break;
        }
        world.now = world.now.max(at);
        if let Event::Trigger(t) = &ev {
            world.saw(t);
            asked_at.entry(t.thread.clone()).or_insert(world.now);
            if t.text.contains('`') {
                requested_at.entry(t.thread.clone()).or_insert(world.now);
            }
        }
        let summary = ev.summary();
        if trace {
            eprintln!("{steps} {at} {summary}");
        }
        let outage = cfg.outage_every > 0 && steps.is_multiple_of(cfg.outage_every);
        world.unavailable = outage;
        let handled = core.handle(&mut world, ev.clone());
        world.unavailable = false;
        let mut fx = match handled {
            Ok(fx) => fx,
            Err(why) => {
                if !outage {
                    return Err(SimError::Invariant {
                        step: steps,
                        event: summary,
                        why: format!("void with the world readable: {why}"),
                    });
                }
                // As the driver does: nothing written, the core rebuilt
                // from the store, what was in flight restarted, and a
                // message from the inbox offered again.
                report.voided += 1;
                drop(core.take_writes());
                agenda.crash();
                if matches!(
                    ev,
                    Event::Trigger(_) | Event::Answer { .. } | Event::Cancel { .. }
                ) {
                    agenda.again(ev);
                }
                core = rebuild(cfg, &persisted, steps)?;
                core.resume_effects()
            }
        };
        oracle.saw_approvals(&core);
        if cfg.persist || cfg.crash_every > 0 || cfg.outage_every > 0 || cfg.check_invariants {
            oracle.saw_flags(&core).map_err(|why| SimError::Invariant {
                step: steps,
                event: summary.clone(),
                why,
            })?;
        }
        if cfg.check_invariants {
            core.check_invariants().map_err(|why| SimError::Invariant {
                step: steps,
                event: summary,
                why,
            })?;
        }
        // What the driver writes after the step.
        let writes = core.take_writes();
        if cfg.persist || cfg.crash_every > 0 || cfg.outage_every > 0 {
            for (k, v) in writes {
                match v {
                    Some(v) => persisted.insert(k, v),
                    None => persisted.remove(&k),
                };
            }
        }
        if cfg.crash_every > 0 && steps.is_multiple_of(cfg.crash_every) {
            // Replies were committed with the step; the rest is lost.
            fx.retain(|e| matches!(e, Effect::Reply(_)));
            report.crashes += 1;
            agenda.crash();
            core = rebuild(cfg, &persisted, steps)?;
            core.check_invariants().map_err(|why| SimError::Invariant {
                step: steps,
                event: "reload".into(),
                why,
            })?;
            fx.extend(core.resume_effects());
        }
        for e in fx {
            match e {
                Effect::CallModel {
                    session,
                    turn,
                    request,
                    kind,
                } => {
                    oracle.saw_request(&session, &request);
                    let m0 = Instant::now();
                    let (resp, latency) = model.respond(&request);
                    report.model_ms += m0.elapsed().as_secs_f64() * 1000.0;
                    report.model_latency_ms += latency.as_millis() as u64;
                    if kind == SessionKind::Worker {
                        report.worker_model_calls += 1;
                        report.worker_usage += resp.usage;
                    }
                    agenda.at(
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
                    approved_by,
                    labels,
                    ..
                } => {
                    // A restart asks again for what already started.
                    if !machine_cmds.contains_key(&cmd) {
                        let start = Start {
                            worker: &worker,
                            cmd: &cmd,
                            machine: &machine,
                            labels: &labels,
                            command: &command,
                            approved_by: &approved_by,
                        };
                        oracle.check_command(&core, &world, &start).map_err(|why| {
                            SimError::Invariant {
                                step: steps,
                                event: format!("start {cmd}"),
                                why,
                            }
                        })?;
                        if !approved_by.is_empty() {
                            report.approved_runs += 1;
                        }
                    }
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
                    let result = CommandResult {
                        state: "exited".into(),
                        exit_code: Some(0),
                        stdout,
                        stderr: String::new(),
                        duration_ms: cfg.command_ms,
                        reason: String::new(),
                        network: false,
                    };
                    agenda.at(
                        done_at,
                        Event::CommandDone {
                            worker,
                            cmd,
                            result,
                        },
                    );
                }
                Effect::StopCommand { cmd, reason } => {
                    let worker = core
                        .workers()
                        .iter()
                        .find(|(_, w)| w.commands.contains_key(&cmd))
                        .map(|(k, _)| k.clone())
                        .unwrap_or_default();
                    let result = CommandResult {
                        state: "cancelled".into(),
                        exit_code: None,
                        stdout: String::new(),
                        stderr: String::new(),
                        duration_ms: 0,
                        reason,
                        network: false,
                    };
                    agenda.at(
                        world.now,
                        Event::CommandDone {
                            worker,
                            cmd,
                            result,
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
                    let snp = world.new_id(Kind::Snapshot);
                    let outcome = programs.step(step, snp).await;
                    agenda.at(
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
                    let step = ProgramStep::Resume {
                        snapshot,
                        call,
                        result,
                    };
                    let snp = world.new_id(Kind::Snapshot);
                    let outcome = programs.step(step, snp).await;
                    agenda.at(
                        world.now,
                        Event::JsDone {
                            worker,
                            run,
                            outcome,
                        },
                    );
                }
                Effect::DropSnapshot { snapshot } => programs.drop_snapshot(&snapshot),
                Effect::Reply(r) => {
                    report.replies += 1;
                    if trace {
                        eprintln!("  reply on {}: {}", r.thread, r.text.replace('\n', " | "));
                    }
                    if let Some(t0) = asked_at.remove(&r.thread) {
                        reply_lat.push(world.now - t0);
                    }
                    // A result, or an approver's no to posting it: either
                    // way the people who asked heard how it ended.
                    if ["Done:", "failed:", "done:"]
                        .iter()
                        .any(|p| r.text.starts_with(p))
                        || (r.text.starts_with("Denied by")
                            && r.text.ends_with("will not be posted."))
                    {
                        reported.insert(r.thread.clone());
                    }
                    if r.text.starts_with("Done:") {
                        if let Some(t0) = requested_at.remove(&r.thread) {
                            result_lat.push(world.now - t0);
                        }
                    }
                    // A request is answered on its thread a minute later,
                    // by the code it carries: now and then with words that
                    // are not an answer (which must decide nothing); an
                    // answer refused, or words the core says are not one,
                    // are followed by an approver's.
                    let refused = r.text.contains("may not approve");
                    let hinted = r.text.starts_with("That is not an answer");
                    if refused {
                        report.refused_answers += 1;
                    }
                    // Every code the reply names (a hint names each open one).
                    let codes: Vec<String> = r
                        .text
                        .split("`approve ")
                        .skip(1)
                        .map(|c| c.chars().take(crate::approval::CODE_LEN).collect())
                        .collect();
                    let asks = r.text.starts_with("Approval needed") || refused || hinted;
                    if asks && !cfg.answerers.is_empty() && r.text.contains(" wants to ") {
                        report.held += 1;
                    }
                    for code in codes
                        .into_iter()
                        .filter(|_| asks && !cfg.answerers.is_empty())
                    {
                        let who = if refused || hinted {
                            cfg.answerers[0].clone()
                        } else {
                            let n = cfg.answerers.len() as u64;
                            cfg.answerers[answers.below(n) as usize].clone()
                        };
                        let roll = answers.below(10);
                        let text = match roll {
                            _ if hinted || refused => format!("approve {code}"),
                            0 => "yes, go ahead".to_string(),
                            1 => format!("do not approve {code}"),
                            2 => format!("deny {code}"),
                            _ => format!("approve {code}"),
                        };
                        let answer = TriggerInfo {
                            id: format!("trg_ans{}_{code}", report.replies),
                            thread: r.thread.clone(),
                            source: r.source.clone(),
                            trusted: world.trust.judge(&who, "").trusted,
                            user: who,
                            text,
                            mention: false,
                            at_ms: world.now + 60_000,
                            ..Default::default()
                        };
                        agenda.at(world.now + 60_000, Event::Trigger(answer));
                    }
                }
            }
        }
    }
    report.simulated_ms = world.now;
    report.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let r = core.router();
    report.router_turns = r.stats.turns;
    report.router_model_calls = r.stats.model_calls;
    report.router_decisions = r.stats.decisions;
    report.passed_through = r.stats.passed_through;
    report.router_usage = r.stats.usage;
    report.router_dropped_turns = r.dropped_turns;
    for w in core.workers().values() {
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
        if matches!(
            w.status,
            WorkerStatus::Idle | WorkerStatus::Done | WorkerStatus::Failed
        ) && !w.own_threads.iter().any(|t| reported.contains(t))
        {
            report.tasks_unreported.push(w.id.clone());
        }
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
    report.snapshots_left = programs.snapshots();
    Ok((report, core))
}

/// Runs a future that never waits on anything outside itself (a
/// simulation with [`ScriptedPrograms`]) to its end on this thread, without
/// an async runtime. Panics if it does wait: that future needs a runtime.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // A future that is ready in principle may still yield a few times.
    for _ in 0..1_000_000 {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("block_on: the future waits on something outside itself; run it in an async runtime")
}

/// The containment property, checked independently of the core's own
/// flags: a context is exposed when a model request of that worker (or of
/// a worker up its parent chain) held [`UNTRUSTED_MARK`]; a command an
/// exposed worker starts on a sensitive machine that is not declared
/// read-only must carry an approval that an approver gave.
#[derive(Default)]
struct Oracle {
    exposed: BTreeSet<String>,
    /// Every approval as last seen.
    approvals: HashMap<String, crate::state::Approval>,
    /// Every worker's A, B and C causes as last seen (counts).
    flags: HashMap<String, [usize; 3]>,
}

impl Oracle {
    /// Flags never decrease (an approval lets one act go, it clears
    /// nothing), and a worker once seen never goes missing: an ended one
    /// keeps its flags, across crashes and reloads.
    fn saw_flags(&mut self, core: &Core) -> Result<(), String> {
        for (id, before) in &self.flags {
            let Some(w) = core.worker(id) else {
                return Err(format!("{id} (flags {before:?}) is gone"));
            };
            let now = [
                w.flags.untrusted.len(),
                w.flags.sensitive.len(),
                w.flags.acts.len(),
            ];
            if now.iter().zip(before).any(|(n, b)| n < b) {
                return Err(format!("{id}'s flags went from {before:?} to {now:?}"));
            }
        }
        for (id, w) in core.workers() {
            let now = [
                w.flags.untrusted.len(),
                w.flags.sensitive.len(),
                w.flags.acts.len(),
            ];
            self.flags.insert(id.clone(), now);
        }
        Ok(())
    }

    fn saw_request(&mut self, session: &str, req: &crate::llm::Request) {
        if req.messages.iter().any(|m| m.text.contains(UNTRUSTED_MARK)) {
            self.exposed.insert(session.to_string());
        }
    }

    fn saw_approvals(&mut self, core: &Core) {
        for (id, a) in core.approvals() {
            self.approvals.insert(id.clone(), a.clone());
        }
    }

    fn exposed(&self, core: &Core, worker: &str) -> bool {
        let mut cur = Some(worker.to_string());
        for _ in 0..=crate::budgets::MAX_DEPTH_LIMIT {
            let Some(w) = cur else {
                return false;
            };
            if self.exposed.contains(&w) {
                return true;
            }
            cur = core.worker(&w).and_then(|x| x.parent.clone());
        }
        false
    }

    fn check_command(&self, core: &Core, world: &TestWorld, s: &Start) -> Result<(), String> {
        let Start {
            worker,
            cmd,
            machine,
            labels,
            command,
            approved_by,
        } = *s;
        let reach = world
            .machines_for(machine, labels)
            .map_err(|e| e.to_string())?;
        let sensitive = reach.is_empty() || reach.iter().any(|m| m.sensitive());
        let acts = reach.is_empty()
            || reach
                .iter()
                .any(|m| !crate::core::read_only(command, &m.read_only));
        // The core's own record must agree: all three flags, an approval.
        let flagged = core.worker(worker).is_some_and(|w| w.flags.all_three());
        let needed = (self.exposed(core, worker) && sensitive && acts) || flagged;
        if !needed {
            return Ok(());
        }
        if approved_by.is_empty() {
            return Err(format!(
                "{worker} started `{command}` on {machine:?} with untrusted input, a sensitive machine and a state change, and no approval"
            ));
        }
        let labels = reach.first().map(|m| m.labels.clone());
        if !world.trust.may_approve(approved_by, labels.as_ref()) {
            return Err(format!(
                "{worker} started `{command}` approved by {approved_by}, who may not approve"
            ));
        }
        let apr = core
            .worker(worker)
            .and_then(|w| w.commands.get(cmd))
            .and_then(|c| c.approval.clone())
            .unwrap_or_default();
        let Some(a) = self.approvals.get(&apr) else {
            return Err(format!(
                "{worker} started {cmd} citing {approved_by} and approval {apr:?}, which does not exist"
            ));
        };
        if a.state != crate::state::ApprovalState::Approved || a.by != approved_by {
            return Err(format!(
                "{worker} started {cmd} citing {approved_by}, but {apr} is {} by {:?}",
                a.state.name(),
                a.by
            ));
        }
        // Consent is an explicit act naming this request's code, for
        // exactly this command.
        let said = a.answer.as_str().and_then(crate::approval::parse_answer);
        if !said.is_some_and(|x| x.approve && x.code == a.code) {
            return Err(format!(
                "{worker} started {cmd} under {apr}, answered with {:?}: not `approve {}`",
                a.answer, a.code
            ));
        }
        if a.action != command {
            return Err(format!(
                "{worker} started `{command}` under {apr}, which approved `{}`",
                a.action
            ));
        }
        Ok(())
    }
}

/// A command as it is started.
struct Start<'a> {
    worker: &'a str,
    cmd: &'a str,
    machine: &'a str,
    labels: &'a BTreeMap<String, String>,
    command: &'a str,
    approved_by: &'a str,
}
