//! `/metrics` (Prometheus text format), `/healthz` and `/readyz`, in plain
//! HTTP, GET only.
//!
//! Where: by default on the admin API's port, told apart from the API by
//! its first byte (a TLS handshake record is 0x16; an HTTP request starts
//! with a method's letter), as the webhook port already tells HTTPS from
//! HTTP. The API needs a client certificate that Prometheus and a load
//! balancer's health check do not have, and operators expect to scrape and
//! probe the port the server already has with plain HTTP (etcd serves
//! `/metrics` on its client port the same way). The admin port listens on
//! loopback by default, so the figures are this machine's until the
//! operator opens that port. `--listen-metrics ADDR` moves them to a port
//! of their own (say `0.0.0.0:9464` for a Prometheus elsewhere, leaving
//! the API on loopback); `--listen-metrics off` serves them nowhere. The
//! startup banner and `server.json` (`metrics_addr`) say where they are.
//!
//! Nothing here needs a credential, so nothing here may reveal one: the
//! figures carry no command text, no names of people, machines or threads,
//! only counts by state, role, gate or connector.
//!
//! A scrape reads what is cheaper to read than to count (commands not yet
//! ended, machines, connections, outbox queues) from the store, bounded
//! (the queue index holds only unfinished commands, whatever the history),
//! within [`SCRAPE_STORE_TIMEOUT`], and at most once per
//! [`MIN_STORE_READ_INTERVAL`]; scrapes arriving meanwhile get that look.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use byom_protocol::pb::CommandState;
use byom_store::Store;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::live::LiveMachines;
use crate::metrics::{Kind, Text};

/// Where `/metrics` and the health checks are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// On the admin API's port, beside the API (see the module's doc).
    Admin,
    /// On a port of their own.
    Addr(SocketAddr),
    /// Nowhere.
    Off,
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Listen, String> {
        match s {
            "admin" => Ok(Listen::Admin),
            "off" => Ok(Listen::Off),
            a => a.parse().map(Listen::Addr).map_err(|e| {
                format!("{a:?}: give HOST:PORT (e.g. 0.0.0.0:9464), admin or off ({e})")
            }),
        }
    }
}

/// Longest a scrape waits for the store; then it answers without those
/// figures (and `byom_store_up 0`).
pub const SCRAPE_STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// Scrapes closer together than this share one look at the store.
pub const MIN_STORE_READ_INTERVAL: Duration = Duration::from_secs(1);
/// Longest `/readyz` waits for the store to answer a read.
pub const READY_TIMEOUT: Duration = Duration::from_secs(3);
/// Time a client has to send its request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection stays open (Prometheus reconnects).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(300);
/// Connections to a `--listen-metrics` port: at most, and from one address.
pub const MAX_CONNECTIONS: usize = 64;
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 16;

/// What `/readyz` says: ready (how) or not (why).
type Readiness = Result<String, String>;

/// What the pages read.
#[derive(Clone)]
pub struct Monitor {
    store: Store,
    live: Arc<LiveMachines>,
    cluster: Arc<Cluster>,
    /// The last look at the store: when, and what it wrote.
    last: Arc<tokio::sync::Mutex<Option<(Instant, String)>>>,
    /// The last readiness check: when, and what it said.
    last_ready: Arc<tokio::sync::Mutex<Option<(Instant, Readiness)>>>,
    /// Store reads made for `/readyz` (what a flood of probes costs).
    ready_reads: Arc<std::sync::atomic::AtomicU64>,
}

impl Monitor {
    pub fn new(store: Store, live: Arc<LiveMachines>, cluster: Arc<Cluster>) -> Monitor {
        // Counted from now on: command changes and commit times.
        if !store.observe(Arc::new(crate::metrics::StoreMetrics)) {
            tracing::debug!("the store already had an observer");
        }
        Monitor {
            store,
            live,
            cluster,
            last: Arc::default(),
            last_ready: Arc::default(),
            ready_reads: Arc::default(),
        }
    }

    /// The whole `/metrics` page.
    pub async fn metrics(&self) -> String {
        let stored = self.stored().await;
        let mut t = Text::new();
        t.family(
            "byom_build_info",
            Kind::Gauge,
            "The running byom version (always 1).",
        );
        t.sample(
            "byom_build_info",
            &[("version", byom_protocol::VERSION)],
            1.0,
        );
        t.single(
            "byom_quic_connections",
            Kind::Gauge,
            "Daemons connected to this server (QUIC, directly or over the TCP fallback).",
            self.live.all().len() as f64,
        );
        crate::metrics::write(&mut t, byom_wire::now_ms());
        let mut page = t.finish();
        page.push_str(&stored);
        page
    }

    /// The figures read from the store, fresh or from a look made less
    /// than [`MIN_STORE_READ_INTERVAL`] ago.
    async fn stored(&self) -> String {
        let mut last = self.last.lock().await;
        if let Some((at, text)) = &*last {
            if at.elapsed() < MIN_STORE_READ_INTERVAL {
                return text.clone();
            }
        }
        let (store, cluster) = (self.store.clone(), self.cluster.clone());
        let here = self.here();
        let read = tokio::task::spawn_blocking(move || read_store(&store, &cluster, &here));
        let mut t = Text::new();
        let up = match tokio::time::timeout(SCRAPE_STORE_TIMEOUT, read).await {
            Ok(Ok(Ok(f))) => {
                f.write(&mut t);
                true
            }
            Ok(Ok(Err(e))) => {
                tracing::warn!("metrics: cannot read the store: {e}");
                false
            }
            Ok(Err(e)) => {
                tracing::warn!("metrics: the store read failed: {e}");
                false
            }
            Err(_) => {
                tracing::warn!("metrics: the store did not answer within {SCRAPE_STORE_TIMEOUT:?}");
                false
            }
        };
        t.single(
            "byom_store_up",
            Kind::Gauge,
            "1 if the store answered this scrape's reads in time.",
            if up { 1.0 } else { 0.0 },
        );
        let text = t.finish();
        *last = Some((Instant::now(), text.clone()));
        text
    }

    /// The machines connected here, and whether each is paused.
    fn here(&self) -> BTreeMap<String, bool> {
        self.live
            .all()
            .iter()
            .filter(|l| l.online())
            .map(|l| (l.machine_id.clone(), l.paused()))
            .collect()
    }

    /// `/readyz`: whether this server can serve, and why not; probes
    /// closer together than [`MIN_STORE_READ_INTERVAL`] share one check
    /// (anyone who reaches the port may probe, and the store's connections
    /// are few: the server's own work needs them).
    pub async fn ready(&self) -> Result<String, String> {
        let mut last = self.last_ready.lock().await;
        if let Some((at, said)) = &*last {
            if at.elapsed() < MIN_STORE_READ_INTERVAL {
                return said.clone();
            }
        }
        let said = self.check_ready().await;
        *last = Some((Instant::now(), said.clone()));
        said
    }

    async fn check_ready(&self) -> Result<String, String> {
        self.ready_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (store, shared) = (self.store.clone(), self.cluster.shared());
        let me = self.cluster.replica.clone();
        let read = tokio::task::spawn_blocking(move || crate::agents::lease::holder(&store));
        let holder = match tokio::time::timeout(READY_TIMEOUT, read).await {
            Ok(Ok(Ok(h))) => h,
            Ok(Ok(Err(e))) => return Err(format!("the store cannot be read: {e}")),
            Ok(Err(e)) => return Err(format!("the store read failed: {e}")),
            Err(_) => {
                return Err(format!(
                    "the store did not answer within {} s",
                    READY_TIMEOUT.as_secs()
                ))
            }
        };
        if !shared {
            return Ok("ready: the store answers".into());
        }
        let now = byom_wire::now_ms();
        match holder {
            None => Err("the agents' lease is not known yet".into()),
            Some((h, until)) if h == me && until > now => {
                Ok(format!("ready: replica {me}; it runs the agents"))
            }
            Some((h, until)) if !h.is_empty() && until > now => Ok(format!(
                "ready: replica {me}; the agents run on replica {h}"
            )),
            Some(_) => Ok(format!(
                "ready: replica {me}; no replica holds the agents' lease now (one takes it within seconds)"
            )),
        }
    }

    /// Answers one request.
    async fn handle(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<Full<Bytes>> {
        let get = matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD);
        let (status, ctype, body) = match (get, req.uri().path()) {
            (false, _) => (405, "text/plain; charset=utf-8", "GET only\n".to_string()),
            (true, "/metrics") => (
                200,
                crate::metrics::text::CONTENT_TYPE,
                self.metrics().await,
            ),
            (true, "/healthz") => (200, "text/plain; charset=utf-8", "ok\n".to_string()),
            (true, "/readyz") => match self.ready().await {
                Ok(why) => (200, "text/plain; charset=utf-8", format!("{why}\n")),
                Err(why) => (
                    503,
                    "text/plain; charset=utf-8",
                    format!("not ready: {why}\n"),
                ),
            },
            (true, _) => (
                404,
                "text/plain; charset=utf-8",
                "not found: this port serves /metrics, /healthz and /readyz in plain HTTP\n"
                    .to_string(),
            ),
        };
        hyper::Response::builder()
            .status(status)
            .header("content-type", ctype)
            .header("cache-control", "no-store")
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default()
    }

    /// Serves one plain HTTP connection (its ticket held while it lives).
    pub async fn serve_conn(&self, tcp: tokio::net::TcpStream, ticket: crate::gate::Ticket) {
        let me = self.clone();
        let svc = hyper::service::service_fn(move |req| {
            let me = me.clone();
            async move { Ok::<_, Infallible>(me.handle(req).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(tcp), svc);
        tokio::select! {
            _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn) => {}
            _ = ticket.evicted() => {}
        }
    }

    /// Serves the pages on a port of their own until shutdown.
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: CancellationToken) {
        let gate = crate::gate::Gate::new(
            "metrics",
            "metrics connections",
            MAX_CONNECTIONS,
            MAX_CONNECTIONS_PER_ADDRESS,
        );
        while let Some((tcp, _, ticket)) = crate::gate::accept(&listener, &gate, &shutdown).await {
            let me = self.clone();
            tokio::spawn(async move { me.serve_conn(tcp, ticket).await });
        }
    }
}

/// What a scrape reads from the store.
#[derive(Debug, Default)]
struct Stored {
    commands: BTreeMap<&'static str, u64>,
    machines: BTreeMap<&'static str, u64>,
    /// Connector → items waiting.
    outbox: BTreeMap<String, u64>,
}

/// States of commands not yet ended, always listed.
const UNFINISHED: &[CommandState] = &[
    CommandState::Queued,
    CommandState::Dispatched,
    CommandState::Running,
    CommandState::AwaitingLocalApproval,
];

/// Machine states, as `byom machines ls` says them.
const MACHINE_STATES: &[&str] = &["online", "paused", "asleep", "offline"];

/// One look at the store: bounded reads (the queue index, the machines,
/// each connector's queue up to its limit).
fn read_store(
    store: &Store,
    cluster: &Cluster,
    here: &BTreeMap<String, bool>,
) -> Result<Stored, byom_store::StoreError> {
    let mut s = Stored::default();
    for c in store.all_pending()? {
        *s.commands.entry(c.state().name()).or_default() += 1;
    }
    let elsewhere = cluster.present_elsewhere()?;
    for m in store.list_machines()? {
        if m.revoked {
            continue;
        }
        let state = match here.get(&m.id) {
            Some(true) => "paused",
            Some(false) => "online",
            None if elsewhere.contains(&m.id) => {
                if m.paused {
                    "paused"
                } else {
                    "online"
                }
            }
            None if m.asleep_since_ms != 0 => "asleep",
            None => "offline",
        };
        *s.machines.entry(state).or_default() += 1;
    }
    let mut connectors = store.list_connectors()?;
    connectors.truncate(crate::metrics::MAX_CONNECTOR_SERIES);
    for c in connectors {
        let n = store.outbox_queue_len(&c.name, byom_store::OUTBOX_QUEUE_LIMIT)?;
        s.outbox.insert(c.name, n as u64);
    }
    Ok(s)
}

impl Stored {
    fn write(&self, t: &mut Text) {
        t.family(
            "byom_commands",
            Kind::Gauge,
            "Commands not yet ended, by state (ended ones: byom_commands_finished_total).",
        );
        for st in UNFINISHED {
            let n = self.commands.get(st.name()).copied().unwrap_or(0);
            t.sample("byom_commands", &[("state", st.name())], n as f64);
        }
        t.family(
            "byom_machines",
            Kind::Gauge,
            "Paired machines (not revoked) by state.",
        );
        for st in MACHINE_STATES {
            let n = self.machines.get(st).copied().unwrap_or(0);
            t.sample("byom_machines", &[("state", st)], n as f64);
        }
        t.family(
            "byom_outbox_backlog",
            Kind::Gauge,
            "Replies waiting to be sent, by connector.",
        );
        for (c, n) in &self.outbox {
            t.sample("byom_outbox_backlog", &[("connector", c)], *n as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use byom_protocol::pb;
    use byom_store::{Op, Space};
    use prost::Message;

    fn command(id: usize, machine: &str, state: CommandState) -> pb::Command {
        pb::Command {
            id: format!("cmd_{id:08}"),
            machine_id: machine.into(),
            argv: vec!["sh".into(), "-c".into(), "secret text".into()],
            state: state as i32,
            created_at_ms: 1,
            ..Default::default()
        }
    }

    /// A flood of readiness probes (anyone who reaches the port may send
    /// them) costs the store one read per interval, not one per probe.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readiness_probes_share_one_store_read() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open_sled(d.path()).unwrap();
        let cluster = Cluster::alone();
        let live = Arc::new(LiveMachines::new(cluster.clone()));
        let m = Monitor::new(store, live, cluster);
        let probes: Vec<_> = (0..200)
            .map(|_| {
                let m = m.clone();
                tokio::spawn(async move { m.ready().await })
            })
            .collect();
        for p in probes {
            assert!(p.await.unwrap().is_ok());
        }
        let reads = m.ready_reads.load(std::sync::atomic::Ordering::Relaxed);
        assert!(reads <= 2, "{reads} store reads for 200 probes");
    }

    /// 10,000 commands in the store, all but a few ended: a scrape reads
    /// the unfinished ones through the queue index, never the history.
    #[test]
    fn a_scrape_reads_only_unfinished_commands() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open_sled(d.path()).unwrap();
        for (i, (name, asleep, paused)) in [("a", 0, false), ("b", 5, false), ("c", 0, true)]
            .into_iter()
            .enumerate()
        {
            let mut m = pb::Machine {
                id: format!("mch_{i}"),
                name: name.into(),
                asleep_since_ms: asleep,
                paused,
                ..Default::default()
            };
            store.create_machine(&mut m).unwrap();
        }
        let ended: Vec<Op> = (0..9_990)
            .map(|i| {
                let c = command(i, "mch_0", CommandState::Exited);
                Op::put(Space::Commands, c.id.clone(), c.encode_to_vec())
            })
            .collect();
        store.batch(&ended).unwrap();
        for i in 9_990..10_000 {
            store
                .create_command(&command(i, "mch_1", CommandState::Queued), &[])
                .unwrap();
        }
        let here = BTreeMap::from([("mch_0".to_string(), false)]);
        let started = Instant::now();
        let s = read_store(&store, &Cluster::alone(), &here).unwrap();
        let took = started.elapsed();
        assert_eq!(s.commands.get("queued"), Some(&10));
        assert_eq!(s.commands.len(), 1, "{:?}", s.commands);
        assert_eq!(
            s.machines,
            BTreeMap::from([("online", 1), ("asleep", 1), ("offline", 1)])
        );
        // Generous for a debug build on a busy machine; the 9,990 ended
        // commands are never read.
        assert!(took < Duration::from_secs(2), "{took:?}");
        let mut t = Text::new();
        s.write(&mut t);
        let page = t.finish();
        assert!(
            page.contains("byom_commands{state=\"queued\"} 10\n"),
            "{page}"
        );
        assert!(page.contains("byom_commands{state=\"running\"} 0\n"));
        assert!(!page.contains("secret") && !page.contains("mch_"), "{page}");
    }
}
