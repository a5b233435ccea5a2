//! The Router and the Workers as one deterministic state machine: an event
//! and a [`World`] (time, fresh IDs, policies, machines, object lookup) in,
//! [`Effect`]s out. No I/O, no clock, no randomness of its own: the same
//! events with the same world give the same effects, which is what lets the
//! driver persist every step and the simulator replay a day in milliseconds.
//!
//! One step reads the time once ([`World::now`]); effects go into an outbox
//! that [`Core::handle`] drains; records change only through accessors that
//! mark them for writing ([`records`]). The concerns live apart: the Router
//! ([`router`]), workers and their tools ([`workers`], [`tools`]), programs
//! and approvals ([`programs`]), recall ([`recall`]), event markup
//! ([`markup`]), persistence ([`persist`]) and the invariants the simulator
//! checks after every step ([`invariants`]).

mod approvals;
mod containment;
pub use containment::read_only;
mod invariants;
mod markup;
mod persist;
mod programs;
mod recall;
mod records;
mod router;
mod tools;
mod workers;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::budgets::Budgets;
use crate::event::{Effect, Event, RouterItem};
use crate::state::{Approval, RouterState, WorkerState, WorkerStatus};
use crate::world::{Read, Unavailable, World};
use crate::Ms;

use records::Records;

/// Sources whose threads are chat: short replies.
/// Events a worker may hold before its next turn; past it the oldest go
/// (the triggers themselves stay in the store).
pub const MAX_QUEUED_EVENTS: usize = 1000;
/// Items waiting for the Router. Reaching it means the model is far behind;
/// the oldest are dropped, counted in `Stats::dropped` and logged.
pub const MAX_ROUTER_QUEUE: usize = 100_000;
/// Triggers handled by workers the Router keeps for its global picture.
pub const MAX_OBSERVED: usize = 50;
/// Tool calls acted on from one model reply; more are answered with an error.
pub const MAX_TOOL_CALLS_PER_REPLY: usize = 32;
/// Workers (subagents included) running or waiting, across all tasks.
pub const MAX_ACTIVE_WORKERS: usize = 512;
/// Commands one worker may have running at once.
pub const MAX_RUNNING_COMMANDS: usize = 16;
/// Characters of one reply; a longer one is cut with a pointer.
pub const MAX_REPLY_CHARS: usize = 16 * 1024;
/// Router model failures in a row before people waiting are told.
pub const ROUTER_FAILURES_BEFORE_NOTICE: u32 = 3;
/// Model failures in a row before a worker gives up.
pub const MAX_MODEL_FAILURES: u32 = 5;
/// Longest backoff between model retries after `complete` gave up.
pub const MAX_RETRY_BACKOFF_MS: Ms = 5 * 60 * 1000;
/// Timeout of a command an agent starts without one.
pub const DEFAULT_COMMAND_TIMEOUT_MS: u64 = 600_000;

/// The whole agent state.
#[derive(Debug)]
pub struct Core {
    budgets: Budgets,
    records: Records,
    /// Effects of the step in progress, drained by [`Core::handle`].
    out: Vec<Effect>,
    /// The step's time, read once from the world.
    now: Ms,
    /// Triggers on subscribed threads go straight to their workers (off:
    /// the Router decides every trigger; for comparisons).
    pub pass_through: bool,
    /// What became of triggers this step, written with it (never read
    /// back by the core: they are for people).
    fates: Vec<(String, String)>,
    /// The first world read this step could not make: the step is void.
    void: std::cell::RefCell<Option<Unavailable>>,
}

impl Core {
    pub fn new(budgets: Budgets) -> Core {
        Core {
            budgets,
            records: Records::default(),
            out: Vec::new(),
            now: 0,
            pass_through: true,
            fates: Vec::new(),
            void: std::cell::RefCell::new(None),
        }
    }

    /// A world read's value; when it failed, `closed` (what denies: the
    /// step goes on deciding nothing it could regret) and the step is void.
    pub(super) fn read<T>(&self, r: Read<T>, closed: T) -> T {
        r.unwrap_or_else(|e| {
            self.void.borrow_mut().get_or_insert(e);
            closed
        })
    }

    /// A world read's value, or `None` (and the step void) when it failed:
    /// for callers that stop there.
    pub(super) fn got<T>(&self, r: Read<T>) -> Option<T> {
        self.read(r.map(Some), None)
    }

    /// Records what became of `trigger`; the first word stands.
    pub(super) fn fate(&mut self, trigger: &str, fate: String) {
        if !self.fates.iter().any(|(t, _)| t == trigger) {
            self.fates.push((trigger.to_string(), fate));
        }
    }

    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    pub fn router(&self) -> &RouterState {
        self.records.router()
    }

    /// Workers in memory: every live one, and ended ones until evicted.
    pub fn workers(&self) -> &BTreeMap<String, WorkerState> {
        self.records.workers()
    }

    pub fn worker(&self, id: &str) -> Option<&WorkerState> {
        self.records.worker(id)
    }

    pub fn approvals(&self) -> &BTreeMap<String, Approval> {
        self.records.approvals()
    }

    /// Applies one event and returns the effects the shell must carry out,
    /// in order (the outbox, drained). When a read of the world failed the
    /// step is void: no effects, and the records in memory are not to be
    /// trusted; the caller writes nothing, rebuilds the core from the
    /// store and offers the event again (as after a failed commit).
    pub fn handle(&mut self, world: &mut dyn World, ev: Event) -> Result<Vec<Effect>, Unavailable> {
        self.now = world.now();
        self.void.borrow_mut().take();
        match ev {
            Event::Trigger(t) => self.on_trigger(world, t),
            Event::ModelDone {
                session,
                turn,
                result,
            } => {
                if session == crate::storage::keys::ROUTER {
                    self.router_model_done(world, turn, result);
                } else {
                    self.worker_model_done(world, &session, turn, result);
                }
            }
            Event::CommandDone {
                worker,
                cmd,
                result,
            } => self.command_done(&worker, &cmd, result),
            Event::CommandPending { worker, cmd, note } => {
                self.command_pending(&worker, &cmd, &note)
            }
            Event::JsDone {
                worker,
                run,
                outcome,
            } => self.js_done(world, &worker, run, outcome),
            Event::Answer {
                approval,
                approved,
                answer,
                by,
            } => {
                if let Err(e) = self.answer(world, &approval, approved, answer, &by) {
                    tracing::info!("answer for {approval} not applied: {e}");
                }
            }
            Event::Cancel { worker, by } => {
                self.finish_worker(
                    world,
                    &worker,
                    WorkerStatus::Cancelled,
                    &format!("cancelled by {by}"),
                    true,
                );
            }
            Event::Tick => self.tick(world),
        }
        self.pump(world);
        let out = std::mem::take(&mut self.out);
        match self.void.borrow_mut().take() {
            None => Ok(out),
            Some(e) => {
                self.fates.clear();
                Err(e)
            }
        }
    }

    /// Starts every turn that can start: each worker's if it has input and
    /// no call in flight, then the Router's likewise.
    fn pump(&mut self, world: &mut dyn World) {
        let now = self.now;
        let ready: Vec<String> = self
            .records
            .workers()
            .iter()
            .filter(|(_, w)| {
                !w.status.is_closed()
                    && w.in_flight.is_none()
                    && !w.inbox.is_empty()
                    && w.retry_at.is_none_or(|t| now >= t)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for id in ready {
            self.start_worker_turn(world, &id);
        }
        // Workers first: one that stops here reports to the Router, whose
        // turn must then start now, not at the next event.
        let r = self.records.router();
        if r.in_flight.is_none() && !r.queue.is_empty() && r.retry_at.is_none_or(|t| now >= t) {
            self.records.router_mut().retry_at = None;
            self.start_router_turn(world);
        }
    }

    /// Time passes: model retries that are due, and idle workers retiring.
    fn tick(&mut self, world: &mut dyn World) {
        self.expire_approvals();
        let now = self.now;
        let due: Vec<String> = self
            .records
            .workers()
            .iter()
            .filter(|(_, w)| !w.status.is_closed() && w.retry_at.is_some_and(|t| now >= t))
            .map(|(k, _)| k.clone())
            .collect();
        for id in due {
            if let Some(w) = self.records.worker_mut(&id) {
                w.retry_at = None;
                let turn = w.in_flight.unwrap_or(w.turn);
                w.in_flight = Some(turn);
                let e = self.worker_call(&id, turn);
                self.out.extend(e);
            }
        }
        // The Router's retry is started by `pump` once `retry_at` passes.
        let retire = self.budgets.idle_retire_ms;
        let idle: Vec<String> = self
            .records
            .workers()
            .iter()
            .filter(|(_, w)| {
                w.status == WorkerStatus::Idle && now.saturating_sub(w.updated_ms) >= retire
            })
            .map(|(k, _)| k.clone())
            .collect();
        for id in idle {
            self.finish_worker(world, &id, WorkerStatus::Done, "", false);
        }
    }

    /// Drops ended workers and answered approvals from memory; their
    /// records stay in the store (call after they were written).
    pub fn evict_closed(&mut self) {
        self.records.evict_closed();
    }

    /// Whether nothing is in flight or waiting anywhere (simulation end).
    pub fn quiescent(&self) -> bool {
        let r = self.records.router();
        r.in_flight.is_none()
            && r.queue.is_empty()
            && self.records.workers().values().all(|w| {
                w.status.is_closed()
                    || (w.in_flight.is_none()
                        && w.inbox.is_empty()
                        && w.js.is_none()
                        && w.commands.values().all(|c| c.done))
            })
    }
}

/// Appends to the Router's queue, dropping its oldest item when full (the
/// trigger itself stays in the store, readable by ID).
fn push_bounded(r: &mut RouterState, it: RouterItem) {
    if r.queue.len() >= MAX_ROUTER_QUEUE {
        tracing::error!("router queue full ({MAX_ROUTER_QUEUE}); dropping its oldest item");
        r.queue.pop_front();
        r.stats.dropped += 1;
    }
    r.queue.push_back(it);
}

fn backoff(failures: u32) -> Ms {
    (1000u64 << failures.min(16)).min(MAX_RETRY_BACKOFF_MS)
}
