//! `byom server`: opens the store and PKI, binds the QUIC gateway and the
//! admin API, writes the bound addresses to `<data-dir>/server.json`, and
//! runs until SIGTERM/SIGINT. Everything it holds in memory (live
//! connections, watchers) is rebuilt from the store and from daemons
//! reconnecting, so `kill -9` at any instant loses nothing acknowledged.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use byom_protocol::pb::{self, CommandState};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::gateway::LiveMachine;
use crate::pki::{now_ms, Pki};
use crate::store::Store;
use crate::tls::RevokedSet;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub data_dir: PathBuf,
    pub listen_quic: SocketAddr,
    pub listen_api: SocketAddr,
    /// TCP address of the fallback transport (QUIC tunnelled in TLS over
    /// TCP) for daemons whose UDP is blocked. Default: the QUIC port, on TCP.
    pub listen_tcp: Option<SocketAddr>,
    /// Address daemons dial (goes into pairing tokens). Defaults to the bound
    /// QUIC address, with an unspecified IP replaced by this host's name.
    pub public_addr: Option<String>,
    pub cert_ttl: Duration,
    /// HTTP address for webhooks (POST /hooks/SOURCE, HMAC-signed).
    pub listen_webhook: SocketAddr,
    pub models: crate::cli::ModelArgs,
}

/// How often queued commands are checked against their TTL.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Written to `<data-dir>/server.json` (and the API address to
/// `<data-dir>/admin/api.json`) for the CLI, tests and the demo.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServerInfo {
    pub quic_addr: String,
    pub tcp_addr: String,
    pub webhook_addr: String,
    pub api_addr: String,
    pub public_addr: String,
    pub ca_sha256: String,
    pub pid: u32,
    pub version: String,
}

/// State shared by the gateway, the API and the background tasks.
pub struct Shared {
    pub store: Store,
    pub pki: Pki,
    pub revoked: Arc<RevokedSet>,
    pub live: Mutex<HashMap<String, Arc<LiveMachine>>>,
    watchers: Mutex<HashMap<String, watch::Sender<u64>>>,
    pub public_addr: String,
    pub quic_addr: SocketAddr,
    pub cert_ttl: Duration,
    pub shutdown: CancellationToken,
    /// Fast-path rules per source (`<data-dir>/sources.toml`).
    pub rules: crate::triggers::Rules,
    /// Every stored trigger, for `byom events tail`.
    pub triggers_tx: tokio::sync::broadcast::Sender<pb::Trigger>,
    /// The agent loop's inbox bell and internal event channel.
    pub agents: crate::agent::driver::AgentHandle,
}

/// Triggers buffered for slow `events tail` watchers (they skip ahead).
const TAIL_BUFFER: usize = 256;

impl Shared {
    pub fn live_machine(&self, id: &str) -> Option<Arc<LiveMachine>> {
        self.live.lock().ok()?.get(id).cloned()
    }

    /// Wakes everyone watching a command.
    pub fn notify(&self, cmd: &str) {
        if let Ok(mut w) = self.watchers.lock() {
            if let Some(tx) = w.get(cmd) {
                if tx.receiver_count() == 0 {
                    w.remove(cmd);
                } else {
                    tx.send_modify(|v| *v += 1);
                }
            }
        }
    }

    /// Subscribe before reading the store so no change is missed.
    pub fn subscribe(&self, cmd: &str) -> watch::Receiver<u64> {
        match self.watchers.lock() {
            Ok(mut w) => w
                .entry(cmd.to_string())
                .or_insert_with(|| watch::channel(0).0)
                .subscribe(),
            // A poisoned lock: watchers fall back to polling.
            Err(_) => watch::channel(0).1,
        }
    }
}

/// Ephemeral QUIC ports tried for one whose TCP twin is free too.
const MATCHING_PORT_TRIES: usize = 64;

pub async fn run(opts: ServerOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.data_dir)
        .with_context(|| format!("cannot create data dir {}", opts.data_dir.display()))?;
    // Configuration errors first, before anything is opened or bound.
    let agent_cfg = Arc::new(agent_config(&opts)?);
    let store = Store::open_sled(&opts.data_dir.join("store"))
        .with_context(|| format!("cannot open the store in {}", opts.data_dir.display()))?;

    // Bind first so the certificate can name the public host. Daemons look
    // for the TCP fallback on the QUIC port number; an ephemeral port is
    // chosen so that both are free on it.
    let mut pair = None;
    if opts.listen_quic.port() == 0 && opts.listen_tcp.is_none() {
        for _ in 0..MATCHING_PORT_TRIES {
            let udp = std::net::UdpSocket::bind(opts.listen_quic)
                .with_context(|| format!("cannot bind QUIC on {}", opts.listen_quic))?;
            if let Ok(tcp) = std::net::TcpListener::bind(udp.local_addr()?) {
                pair = Some((udp, tcp));
                break;
            }
        }
    }
    let (quic_socket, same_port_tcp) = match pair {
        Some((udp, tcp)) => (udp, Some(tcp)),
        None => (
            std::net::UdpSocket::bind(opts.listen_quic)
                .with_context(|| format!("cannot bind QUIC on {}", opts.listen_quic))?,
            None,
        ),
    };
    let quic_addr = quic_socket.local_addr()?;
    let api_listener = tokio::net::TcpListener::bind(opts.listen_api)
        .await
        .with_context(|| format!("cannot bind the API on {}", opts.listen_api))?;
    let api_addr = api_listener.local_addr()?;
    // The fallback listens on the QUIC port number unless told otherwise, so
    // a pairing token's address works for both.
    let tcp_listener = match (opts.listen_tcp, same_port_tcp) {
        (_, Some(l)) => {
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)?
        }
        (Some(a), None) => tokio::net::TcpListener::bind(a)
            .await
            .with_context(|| format!("cannot bind the TCP fallback on {a}"))?,
        (None, None) => match tokio::net::TcpListener::bind(quic_addr).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(
                    "TCP port {} is taken ({e}); the TCP fallback uses another port, where daemons will not look for it",
                    quic_addr.port()
                );
                tokio::net::TcpListener::bind(SocketAddr::new(quic_addr.ip(), 0)).await?
            }
        },
    };
    let tcp_addr = tcp_listener.local_addr()?;
    let webhook_listener = tokio::net::TcpListener::bind(opts.listen_webhook)
        .await
        .with_context(|| format!("cannot bind webhooks on {}", opts.listen_webhook))?;
    let webhook_addr = webhook_listener.local_addr()?;
    let rules = crate::triggers::Rules::load(&opts.data_dir)?;
    let (agent_tx, agent_rx) = tokio::sync::mpsc::channel(crate::agent::driver::INTERNAL_EVENTS);
    let webhook_key = crate::webhook::load_or_create_key(&opts.data_dir)?;

    let public_addr = match &opts.public_addr {
        Some(a) => a.clone(),
        None if quic_addr.ip().is_unspecified() => {
            format!("{}:{}", crate::hostname(), quic_addr.port())
        }
        None => quic_addr.to_string(),
    };
    let public_host = public_addr
        .rsplit_once(':')
        .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
        .unwrap_or_default();
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if !public_host.is_empty() && !names.contains(&public_host) {
        names.push(public_host);
    }
    let pki = Pki::load_or_create(&opts.data_dir, &names).context("cannot set up the PKI")?;

    let revoked = Arc::new(RevokedSet::default());
    for m in store.list_machines()? {
        if m.revoked {
            revoked.insert(&m.id);
        }
    }

    let shared = Arc::new(Shared {
        store,
        revoked: revoked.clone(),
        live: Mutex::new(HashMap::new()),
        watchers: Mutex::new(HashMap::new()),
        public_addr: public_addr.clone(),
        quic_addr,
        cert_ttl: opts.cert_ttl,
        shutdown: CancellationToken::new(),
        pki,
        rules,
        triggers_tx: tokio::sync::broadcast::channel(TAIL_BUFFER).0,
        agents: crate::agent::driver::AgentHandle {
            wake: tokio::sync::Notify::new(),
            events: agent_tx,
        },
    });

    let quic_cfg = crate::tls::quic_server_config(&shared.pki, revoked)?;
    let endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(quic_cfg),
        quic_socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    let api_tls = crate::tls::api_server_config(&shared.pki)?;

    let tunnel = Arc::new(byom_wire::tunnel::StreamSocket::new());
    let tcp_endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some(crate::tls::quic_server_config(
            &shared.pki,
            shared.revoked.clone(),
        )?),
        tunnel.clone(),
        Arc::new(quinn::TokioRuntime),
    )?;
    let outer_tls = crate::tls::tunnel_server_config(&shared.pki)?;

    let info = ServerInfo {
        quic_addr: quic_addr.to_string(),
        tcp_addr: tcp_addr.to_string(),
        webhook_addr: webhook_addr.to_string(),
        api_addr: api_addr.to_string(),
        public_addr,
        ca_sha256: crate::pki::hex(&shared.pki.ca_sha256),
        pid: std::process::id(),
        version: byom_protocol::VERSION.to_string(),
    };
    let json = serde_json::to_vec_pretty(&info)?;
    // server.json last: it is the "ready" signal scripts wait for, and the
    // CLI they then run needs api.json.
    crate::pki::write_atomic(
        &opts.data_dir.join("admin").join("api.json"),
        &serde_json::to_vec_pretty(&serde_json::json!({ "api_addr": api_addr.to_string() }))?,
        0o644,
    )?;
    crate::pki::write_atomic(&opts.data_dir.join("server.json"), &json, 0o644)?;
    tracing::info!(quic = %quic_addr, tcp = %tcp_addr, api = %api_addr, data_dir = %opts.data_dir.display(), "byom server listening");

    let quic_transport = Arc::new(crate::gateway::Transport {
        name: "quic",
        tunnel: None,
    });
    let tcp_transport = Arc::new(crate::gateway::Transport {
        name: "tcp",
        tunnel: Some(tunnel.clone()),
    });
    let gw = tokio::spawn(crate::gateway::serve(
        shared.clone(),
        endpoint.clone(),
        quic_transport,
    ));
    let gw_tcp = tokio::spawn(crate::gateway::serve(
        shared.clone(),
        tcp_endpoint.clone(),
        tcp_transport,
    ));
    let webhooks = tokio::spawn(crate::webhook::serve(
        shared.clone(),
        webhook_listener,
        webhook_key,
    ));
    let tcp_accept = tokio::spawn(accept_tunnels(
        shared.clone(),
        tcp_listener,
        outer_tls,
        tunnel,
    ));
    let api = tokio::spawn(crate::api::serve(shared.clone(), api_listener, api_tls));
    let sweeper = tokio::spawn(sweep_queue(shared.clone()));
    let agents = tokio::spawn(crate::agent::driver::run(
        shared.clone(),
        agent_cfg,
        agent_rx,
    ));

    shutdown_signal().await;
    tracing::info!("shutting down: work stays in the store");
    shared.shutdown.cancel();
    endpoint.close(0u32.into(), b"server shutting down");
    tcp_endpoint.close(0u32.into(), b"server shutting down");
    tcp_accept.abort();
    webhooks.abort();
    gw_tcp.abort();
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        let _ = gw.await;
        let _ = api.await;
        let _ = sweeper.await;
        let _ = agents.await;
    })
    .await;
    shared.store.flush_async().await?;
    Ok(())
}

/// Models, budgets (`<data-dir>/agents.toml`, `[budgets]`) and the
/// interpreter's snapshot key (`<data-dir>/js-snapshot.key`).
fn agent_config(opts: &ServerOptions) -> anyhow::Result<crate::agent::driver::AgentConfig> {
    let m = &opts.models;
    let router = m.router_model.clone().unwrap_or_else(|| m.model.clone());
    let worker = m.worker_model.clone().unwrap_or_else(|| m.model.clone());
    #[derive(serde::Deserialize, Default)]
    #[serde(default, deny_unknown_fields)]
    struct File {
        budgets: crate::agent::Budgets,
    }
    let path = opts.data_dir.join("agents.toml");
    let file: File = match std::fs::read_to_string(&path) {
        Ok(t) => toml::from_str(&t)
            .map_err(|e| anyhow::anyhow!("{} is not valid: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => File::default(),
        Err(e) => return Err(e.into()),
    };
    tracing::info!(router = %router, worker = %worker, "agent models");
    Ok(crate::agent::driver::AgentConfig {
        router_model: crate::model::from_spec(&router, m)?,
        worker_model: crate::model::from_spec(&worker, m)?,
        budgets: file.budgets,
        retry: crate::model::RetryPolicy::default(),
        js_key: crate::js::load_or_create_key(&opts.data_dir.join("js-snapshot.key"))?,
        js_limits: byom_sandbox::Limits {
            wall_clock: Duration::from_secs(10),
            ..byom_sandbox::Limits::default()
        },
    })
}

/// TLS handshakes on the TCP fallback in progress at once.
const MAX_TUNNEL_HANDSHAKES: usize = 256;

/// Accepts TLS-over-TCP connections and attaches each to the tunnel socket
/// the second QUIC endpoint reads from.
async fn accept_tunnels(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
    tunnel: Arc<byom_wire::tunnel::StreamSocket>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_TUNNEL_HANDSHAKES));
    loop {
        let (tcp, remote) = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("TCP fallback accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let acceptor = acceptor.clone();
        let tunnel = tunnel.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(t)) => t,
                    _ => return,
                };
            drop(permit);
            tracing::debug!(%remote, "TCP fallback connection");
            tunnel.attach(tls, remote.to_string());
        });
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Fails queued commands whose queue TTL passed without their machine
/// connecting.
async fn sweep_queue(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let pending = match shared.store.all_pending() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("queue sweep failed: {e}");
                continue;
            }
        };
        let now = now_ms();
        let mut changed = false;
        for c in pending {
            if c.state() == CommandState::Queued
                && c.queue_deadline_ms != 0
                && now >= c.queue_deadline_ms
            {
                let r = shared.store.transition(&c.id, &[CommandState::Queued], CommandState::Failed, |c: &mut pb::Command| {
                    c.reason = "not delivered: the machine did not connect before the queue TTL ran out".into();
                    c.finished_at_ms = now;
                });
                match r {
                    Ok(Some(_)) => {
                        changed = true;
                        shared.notify(&c.id);
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(cmd = %c.id, "cannot expire command: {e}"),
                }
            }
        }
        if changed {
            if let Err(e) = shared.store.flush_async().await {
                tracing::warn!("flush failed: {e}");
            }
        }
    }
}
