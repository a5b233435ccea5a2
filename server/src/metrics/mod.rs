//! The figures counted where things happen, for `/metrics`: command queue
//! waits and dispatch latency (told by the store, [`StoreMetrics`]), store
//! commit times, model calls per role (time, tokens, errors), the Router's
//! batches and busy time, the agents' workers and approvals (published by
//! whichever task runs them), outbox send failures and connections the
//! gates refused. What is cheaper to read than to count (commands waiting,
//! machines, connections, outbox backlog) is read at scrape time by
//! [`crate::monitor`], which also serves the page.
//!
//! One process-wide registry, like every Prometheus client's default: the
//! figures are this process's, so each replica serves its own. Every label
//! takes a value from a short fixed list (states, roles, gates) or a
//! connector's name (bounded by [`MAX_CONNECTOR_SERIES`]); never a command,
//! a person, a thread or a machine.

pub mod text;

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use byom_protocol::pb::{self, CommandState};
pub use text::{HistogramData, Kind, Text};

/// Bucket bounds, in seconds (or items), chosen for what each measures.
/// A queue wait runs from milliseconds (a connected machine) to a day (a
/// laptop asleep overnight).
const QUEUE_WAIT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0, 14400.0, 86400.0,
];
/// Dispatch to start: a QUIC round trip and a process spawn.
const DISPATCH_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// A model request, retries included: the seed measured 2.5 to 3.9 s.
const MODEL_BOUNDS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 13.0, 21.0, 34.0, 60.0, 120.0, 300.0,
];
/// A commit: sub-millisecond writes to a slow disk's seconds-long fsync.
const COMMIT_BOUNDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Triggers per Router turn.
const BATCH_BOUNDS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0];

/// Connectors counted by name; past this many, the rest count as `other`
/// (connectors are configured by hand: a handful in practice).
pub const MAX_CONNECTOR_SERIES: usize = 64;

/// The agents' figures as their task last saw them.
#[derive(Debug, Clone, Default)]
struct AgentFigures {
    /// Workers in memory (every live one) by status.
    workers: BTreeMap<&'static str, u64>,
    approvals_open: u64,
    /// When the oldest open approval was asked (ms since the epoch).
    oldest_open_ms: Option<u64>,
    router_queue: u64,
}

/// Time with a call in flight, as the union of the calls' intervals.
#[derive(Default)]
struct Busy {
    in_flight: u32,
    since: Option<Instant>,
    total: Duration,
}

impl Busy {
    fn now(&self) -> Duration {
        self.total + self.since.map_or(Duration::ZERO, |s| s.elapsed())
    }
}

#[derive(Default)]
struct Registry {
    queue_wait: Mutex<Option<HistogramData>>,
    dispatch: Mutex<Option<HistogramData>>,
    finished: Mutex<BTreeMap<&'static str, u64>>,
    commit: Mutex<BTreeMap<&'static str, HistogramData>>,
    model_seconds: Mutex<BTreeMap<&'static str, HistogramData>>,
    model_errors: Mutex<BTreeMap<&'static str, u64>>,
    tokens: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    router_batch: Mutex<Option<HistogramData>>,
    router_busy: Mutex<Busy>,
    agents: Mutex<Option<AgentFigures>>,
    outbox_errors: Mutex<BTreeMap<String, u64>>,
    outbox_given_up: Mutex<BTreeMap<String, u64>>,
    gate_refused: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

static METRICS: LazyLock<Registry> = LazyLock::new(Registry::default);

/// Plain figures: a panic elsewhere while one was held leaves them usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn observe(h: &Mutex<Option<HistogramData>>, bounds: &[f64], v: f64) {
    lock(h)
        .get_or_insert_with(|| HistogramData::new(bounds))
        .observe(bounds, v);
}

fn observe_in<K: Ord>(m: &Mutex<BTreeMap<K, HistogramData>>, key: K, bounds: &[f64], v: f64) {
    lock(m)
        .entry(key)
        .or_insert_with(|| HistogramData::new(bounds))
        .observe(bounds, v);
}

fn secs_between(from_ms: u64, to_ms: u64) -> f64 {
    to_ms.saturating_sub(from_ms) as f64 / 1000.0
}

/// Told by the store of every command change and commit.
pub struct StoreMetrics;

impl byom_store::Observer for StoreMetrics {
    fn command(&self, from: Option<CommandState>, c: &pb::Command) {
        let to = c.state();
        if from == Some(to) {
            return;
        }
        let m = &*METRICS;
        match (from, to) {
            // Created straight into a free slot, or taken from the queue.
            (None | Some(CommandState::Queued), CommandState::Dispatched) => observe(
                &m.queue_wait,
                QUEUE_WAIT_BOUNDS,
                secs_between(c.created_at_ms, c.dispatched_at_ms),
            ),
            // The daemon said it started: by this server's clock, as the
            // dispatch was (a local approval's wait is a person's, not
            // dispatch latency).
            (Some(CommandState::Dispatched), CommandState::Running) => observe(
                &m.dispatch,
                DISPATCH_BOUNDS,
                secs_between(c.dispatched_at_ms, byom_wire::now_ms()),
            ),
            _ => {}
        }
        if to.is_terminal() && !from.is_some_and(|f| f.is_terminal()) {
            *lock(&m.finished).entry(to.name()).or_default() += 1;
        }
    }

    fn commit(&self, kind: byom_store::Commit, took: Duration) {
        observe_in(
            &METRICS.commit,
            kind.name(),
            COMMIT_BOUNDS,
            took.as_secs_f64(),
        );
    }
}

/// The agents' roles, as labels.
pub fn role(kind: byom_agent::event::SessionKind) -> &'static str {
    match kind {
        byom_agent::event::SessionKind::Router => "router",
        byom_agent::event::SessionKind::Worker => "worker",
    }
}

/// A model call of `role` is starting: the Router's count as busy time.
pub fn model_call_started(role: &'static str) {
    if role == "router" {
        let mut b = lock(&METRICS.router_busy);
        if b.in_flight == 0 {
            b.since = Some(Instant::now());
        }
        b.in_flight += 1;
    }
}

/// A model call of `role` ended after `took` (retries included), with the
/// provider's token counts if it succeeded.
pub fn model_call_ended(
    role: &'static str,
    took: Duration,
    usage: Option<&byom_agent::llm::Usage>,
) {
    let m = &*METRICS;
    if role == "router" {
        let mut b = lock(&m.router_busy);
        b.in_flight = b.in_flight.saturating_sub(1);
        if b.in_flight == 0 {
            if let Some(s) = b.since.take() {
                b.total += s.elapsed();
            }
        }
    }
    observe_in(&m.model_seconds, role, MODEL_BOUNDS, took.as_secs_f64());
    match usage {
        Some(u) => {
            let mut t = lock(&m.tokens);
            *t.entry((role, "input")).or_default() += u.input_tokens;
            *t.entry((role, "cached")).or_default() += u.cache_read_tokens;
            *t.entry((role, "output")).or_default() += u.output_tokens;
        }
        None => *lock(&m.model_errors).entry(role).or_default() += 1,
    }
}

/// The Router started a turn on `items` triggers.
pub fn router_turn(items: usize) {
    observe(&METRICS.router_batch, BATCH_BOUNDS, items as f64);
}

/// The agents' state after a step (None: they stopped here, e.g. another
/// replica took them over).
pub fn agents_seen(core: Option<&byom_agent::Core>) {
    let figures = core.map(|core| {
        let mut f = AgentFigures::default();
        for w in core.workers().values() {
            *f.workers.entry(w.status.name()).or_default() += 1;
        }
        for a in core.approvals().values() {
            if a.state == byom_agent::state::ApprovalState::Open {
                f.approvals_open += 1;
                let oldest = f.oldest_open_ms.get_or_insert(a.created_ms);
                *oldest = (*oldest).min(a.created_ms);
            }
        }
        f.router_queue = core.router().queue.len() as u64;
        f
    });
    *lock(&METRICS.agents) = figures;
}

fn connector_key(m: &BTreeMap<String, u64>, connector: &str) -> String {
    if m.contains_key(connector) || m.len() < MAX_CONNECTOR_SERIES {
        connector.to_string()
    } else {
        "other".to_string()
    }
}

/// A send on `connector` failed; `given_up`: the item will not be retried.
pub fn outbox_send_failed(connector: &str, given_up: bool) {
    let m = &*METRICS;
    let mut e = lock(&m.outbox_errors);
    let k = connector_key(&e, connector);
    *e.entry(k).or_default() += 1;
    drop(e);
    if given_up {
        let mut g = lock(&m.outbox_given_up);
        let k = connector_key(&g, connector);
        *g.entry(k).or_default() += 1;
    }
}

/// A gate refused (or evicted, to make room) a connection.
pub fn gate_refused(gate: &'static str, reason: &'static str) {
    *lock(&METRICS.gate_refused)
        .entry((gate, reason))
        .or_default() += 1;
}

fn counters<K>(
    t: &mut Text,
    name: &str,
    help: &str,
    m: &Mutex<BTreeMap<K, u64>>,
    labels: impl Fn(&K) -> Vec<(&'static str, String)>,
) {
    t.family(name, Kind::Counter, help);
    for (k, v) in lock(m).iter() {
        let l = labels(k);
        let l: Vec<(&str, &str)> = l.iter().map(|(a, b)| (*a, b.as_str())).collect();
        t.sample(name, &l, *v as f64);
    }
}

fn histogram(
    t: &mut Text,
    name: &str,
    help: &str,
    bounds: &[f64],
    h: &Mutex<Option<HistogramData>>,
) {
    t.family(name, Kind::Histogram, help);
    let h = lock(h)
        .clone()
        .unwrap_or_else(|| HistogramData::new(bounds));
    t.histogram(name, &[], bounds, &h);
}

fn histograms(
    t: &mut Text,
    name: &str,
    help: &str,
    label: &str,
    values: &[&'static str],
    bounds: &[f64],
    m: &Mutex<BTreeMap<&'static str, HistogramData>>,
) {
    t.family(name, Kind::Histogram, help);
    let m = lock(m).clone();
    for v in values {
        let h = m
            .get(v)
            .cloned()
            .unwrap_or_else(|| HistogramData::new(bounds));
        t.histogram(name, &[(label, v)], bounds, &h);
    }
}

/// Command end states, always listed (at 0 until one happens).
const FINISHED: &[CommandState] = &[
    CommandState::Exited,
    CommandState::Failed,
    CommandState::Cancelled,
    CommandState::TimedOut,
    CommandState::Lost,
    CommandState::Denied,
];

/// Writes the figures counted as things happened; `now_ms` dates the
/// oldest approval's age.
pub fn write(t: &mut Text, now_ms: u64) {
    let m = &*METRICS;
    histogram(
        t,
        "byom_command_queue_wait_seconds",
        "Time commands waited in their machine's queue before being dispatched.",
        QUEUE_WAIT_BOUNDS,
        &m.queue_wait,
    );
    histogram(
        t,
        "byom_command_dispatch_seconds",
        "Time from dispatching a command to its daemon saying it started.",
        DISPATCH_BOUNDS,
        &m.dispatch,
    );
    t.family(
        "byom_commands_finished_total",
        Kind::Counter,
        "Commands that ended, by end state, written by this server.",
    );
    {
        let f = lock(&m.finished);
        for s in FINISHED {
            let n = f.get(s.name()).copied().unwrap_or(0);
            t.sample(
                "byom_commands_finished_total",
                &[("state", s.name())],
                n as f64,
            );
        }
    }
    histograms(
        t,
        "byom_store_commit_seconds",
        "Time the store took to commit: an atomic write (op=write) or a durable flush (op=flush).",
        "op",
        &["write", "flush"],
        COMMIT_BOUNDS,
        &m.commit,
    );
    histograms(
        t,
        "byom_model_request_seconds",
        "Time a model request took, retries included, by agent role.",
        "role",
        &["router", "worker"],
        MODEL_BOUNDS,
        &m.model_seconds,
    );
    t.family(
        "byom_model_request_errors_total",
        Kind::Counter,
        "Model requests that failed after their retries, by agent role.",
    );
    {
        let e = lock(&m.model_errors);
        for r in ["router", "worker"] {
            let n = e.get(r).copied().unwrap_or(0);
            t.sample("byom_model_request_errors_total", &[("role", r)], n as f64);
        }
    }
    t.family(
        "byom_model_tokens_total",
        Kind::Counter,
        "Model tokens by agent role and kind: input (cached included), cached (input read from the provider's prefix cache), output.",
    );
    {
        let tk = lock(&m.tokens);
        for r in ["router", "worker"] {
            for k in ["input", "cached", "output"] {
                let n = tk.get(&(r, k)).copied().unwrap_or(0);
                t.sample(
                    "byom_model_tokens_total",
                    &[("role", r), ("kind", k)],
                    n as f64,
                );
            }
        }
    }
    histogram(
        t,
        "byom_router_batch_size",
        "Triggers the Router took in one turn.",
        BATCH_BOUNDS,
        &m.router_batch,
    );
    t.single(
        "byom_router_busy_seconds_total",
        Kind::Counter,
        "Time the Router had a model request in flight; its rate is the Router's busy fraction.",
        lock(&m.router_busy).now().as_secs_f64(),
    );
    write_agents(t, now_ms);
    counters(
        t,
        "byom_outbox_send_errors_total",
        "Failed attempts to send an outbox item, by connector.",
        &m.outbox_errors,
        |c| vec![("connector", c.clone())],
    );
    counters(
        t,
        "byom_outbox_failed_total",
        "Outbox items given up on (failed for good or out of retries), by connector.",
        &m.outbox_given_up,
        |c| vec![("connector", c.clone())],
    );
    counters(
        t,
        "byom_gate_refused_total",
        "Connections refused before authentication by a gate (gate: quic, tunnel, api, webhook; reason: per_address, full, evicted).",
        &m.gate_refused,
        |(g, r)| vec![("gate", g.to_string()), ("reason", r.to_string())],
    );
}

/// The agents' gauges: only where the agents run (with replicas, the
/// lease holder); `byom_agents_running` says which process that is.
fn write_agents(t: &mut Text, now_ms: u64) {
    let a = lock(&METRICS.agents).clone();
    t.single(
        "byom_agents_running",
        Kind::Gauge,
        "1 if this process runs the agents (with replicas: holds the agents' lease).",
        if a.is_some() { 1.0 } else { 0.0 },
    );
    let Some(a) = a else {
        return;
    };
    t.family(
        "byom_workers",
        Kind::Gauge,
        "Workers not yet ended, by status.",
    );
    for s in ["running", "waiting", "idle"] {
        let n = a.workers.get(s).copied().unwrap_or(0);
        t.sample("byom_workers", &[("state", s)], n as f64);
    }
    t.single(
        "byom_approvals_waiting",
        Kind::Gauge,
        "Approval requests waiting for a person's answer.",
        a.approvals_open as f64,
    );
    t.single(
        "byom_approval_oldest_age_seconds",
        Kind::Gauge,
        "Age of the oldest approval request waiting (0 when none waits).",
        a.oldest_open_ms.map_or(0.0, |o| secs_between(o, now_ms)),
    );
    t.single(
        "byom_router_queue_length",
        Kind::Gauge,
        "Triggers waiting for the Router's next turn.",
        a.router_queue as f64,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> String {
        let mut t = Text::new();
        write(&mut t, 0);
        t.finish()
    }

    /// The value of the sample line starting with `key` (a name and its
    /// labels).
    fn value(page: &str, key: &str) -> f64 {
        page.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in\n{page}"))
    }

    /// The store tells of a command's life; the queue wait, the dispatch
    /// and the end are counted once each, whatever else is written.
    #[test]
    fn a_commands_life_is_counted_from_the_store() {
        let d = tempfile::tempdir().unwrap();
        let store = byom_store::Store::open_sled(d.path()).unwrap();
        assert!(store.observe(std::sync::Arc::new(StoreMetrics)));
        let before = page();
        let now = byom_wire::now_ms();
        let c = pb::Command {
            id: "cmd_metrics_1".into(),
            machine_id: "mch_1".into(),
            state: CommandState::Queued as i32,
            created_at_ms: now - 2_000,
            ..Default::default()
        };
        store.create_command(&c, &[]).unwrap();
        let go = |from: CommandState, to: CommandState| {
            store
                .transition(&c.id, &[from], to, |c| {
                    if to == CommandState::Dispatched {
                        c.dispatched_at_ms = now;
                    }
                })
                .unwrap()
                .expect("moved");
        };
        go(CommandState::Queued, CommandState::Dispatched);
        go(CommandState::Dispatched, CommandState::Running);
        // A change of fields only is no transition.
        store
            .update_command(&c.id, |c| {
                c.pid = 7;
                Ok(())
            })
            .unwrap();
        go(CommandState::Running, CommandState::Exited);
        let after = page();
        let delta = |k: &str| value(&after, k) - value(&before, k);
        assert_eq!(delta("byom_command_queue_wait_seconds_count"), 1.0);
        let waited = delta("byom_command_queue_wait_seconds_sum");
        assert!((1.9..2.1).contains(&waited), "{waited}");
        assert_eq!(
            delta("byom_command_queue_wait_seconds_bucket{le=\"2.5\"}"),
            1.0
        );
        assert_eq!(
            delta("byom_command_queue_wait_seconds_bucket{le=\"1\"}"),
            0.0
        );
        assert_eq!(delta("byom_command_dispatch_seconds_count"), 1.0);
        assert_eq!(delta("byom_commands_finished_total{state=\"exited\"}"), 1.0);
        assert!(delta("byom_store_commit_seconds_count{op=\"write\"}") >= 5.0);
    }

    #[test]
    fn router_busy_time_is_the_union_of_its_calls() {
        let before = lock(&METRICS.router_busy).now();
        model_call_started("router");
        model_call_started("router");
        std::thread::sleep(Duration::from_millis(30));
        model_call_ended("router", Duration::from_millis(30), None);
        std::thread::sleep(Duration::from_millis(30));
        model_call_ended("router", Duration::from_millis(60), None);
        let busy = lock(&METRICS.router_busy).now() - before;
        assert!(
            busy >= Duration::from_millis(60) && busy < Duration::from_millis(500),
            "{busy:?}"
        );
        assert_eq!(lock(&METRICS.router_busy).in_flight, 0);
    }
}
