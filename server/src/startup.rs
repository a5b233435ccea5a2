//! `byom server`: checks its configuration, opens the store and the PKI,
//! binds the QUIC gateway (with its TCP fallback), the admin API and the
//! webhook port, writes the bound addresses to `<data-dir>/server.json`,
//! hands each task the few handles it needs, and runs until SIGTERM or
//! SIGINT. Everything it holds in memory (live connections, watchers) is
//! rebuilt from the store and from daemons reconnecting, so `kill -9` at
//! any instant loses nothing acknowledged.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use byom_agent::Budgets;
use byom_store::Store;
use tokio_util::sync::CancellationToken;

use crate::agents::driver::{self, AgentConfig};
use crate::agents::AgentInbox;
use crate::commands::Commands;
use crate::gateway::{Gateway, Transport};
use crate::identity::ServerIdentity;
use crate::live::LiveMachines;
pub use crate::model::ModelOptions;
use crate::pki::Pki;
use crate::tls::RevokedSet;
use crate::triggers::Triggers;
use crate::vault::Vault;

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
    /// How long a machine may stay offline, after a command of its should
    /// have ended, before the command is given up as lost (a laptop asleep
    /// overnight keeps its work).
    pub offline_allowance: Duration,
    /// What the store keeps of each command output stream (head and
    /// tail); the attached client gets it all.
    pub output_keep: crate::commands::OutputKeep,
    /// HTTPS address for webhooks (POST /hooks/SOURCE, HMAC-signed, and
    /// the connectors' endpoints).
    pub listen_webhook: SocketAddr,
    /// The webhook port's certificate chain and key (PEM), for a name
    /// GitHub and Slack can verify; `None`: the server's own certificate.
    pub webhook_tls: Option<(PathBuf, PathBuf)>,
    /// Plain HTTP on the webhook port from other machines too (a proxy in
    /// front terminates TLS); from this machine it is always accepted.
    pub webhook_plain: bool,
    /// The release to hand out (see [`crate::dist`]); `None`: look beside
    /// the binary.
    pub dist: Option<PathBuf>,
    /// `postgres://…` (or `postgresql://…`): a store shared by replicas.
    /// `None`: the embedded store in the data dir.
    pub store: Option<String>,
    /// The key a shared store's secrets are sealed with.
    pub store_key_file: Option<PathBuf>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (plain HTTP):
    /// beside the admin API on its port by default (see [`crate::monitor`]
    /// for why), on a port of their own, or nowhere.
    pub listen_metrics: crate::monitor::Listen,
    /// Where the web console is served (HTTPS, the server's certificate):
    /// see [`crate::console`].
    pub listen_console: crate::console::Listen,
    /// How long a console login link lives (at most 5 minutes; shorter
    /// for tests).
    pub console_link_ttl: Duration,
    pub models: ModelOptions,
}

/// Written to `<data-dir>/server.json` (and the API address to
/// `<data-dir>/admin/api.json`) for the CLI, tests and the demo.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServerInfo {
    pub quic_addr: String,
    pub tcp_addr: String,
    pub webhook_addr: String,
    pub api_addr: String,
    /// Where `/metrics` is served in plain HTTP (the API's address by
    /// default); empty when it is not.
    #[serde(default)]
    pub metrics_addr: String,
    /// The web console's base URL (`https://…`); empty when it is off.
    #[serde(default)]
    pub console_url: String,
    pub public_addr: String,
    pub ca_sha256: String,
    pub pid: u32,
    pub version: String,
}

/// How often queued commands are checked against their TTL.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Idempotency keys are expired every this many sweeps (hourly).
const IDEMPOTENCY_SWEEP_EVERY: u64 = 720;
/// Ephemeral QUIC ports tried for one whose TCP twin is free too.
const MATCHING_PORT_TRIES: usize = 64;
/// Longest a TCP fallback's TLS handshake may take.
const TUNNEL_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Then how soon a QUIC connection must be established over it.
const TUNNEL_ESTABLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// A tunnel that carries nothing this long is closed (QUIC keeps a live
/// one busy with keep-alives).
const TUNNEL_IDLE_TIMEOUT: Duration =
    Duration::from_secs(2 * byom_protocol::limits::QUIC_IDLE_TIMEOUT.as_secs());
/// How long tasks get to finish at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// The sockets the server listens on.
struct Bound {
    quic: std::net::UdpSocket,
    tcp: tokio::net::TcpListener,
    api: tokio::net::TcpListener,
    webhook: tokio::net::TcpListener,
    /// `--listen-metrics ADDR`'s port.
    metrics: Option<tokio::net::TcpListener>,
    /// The web console's port.
    console: Option<tokio::net::TcpListener>,
}

async fn bind(opts: &ServerOptions) -> anyhow::Result<Bound> {
    // Daemons look for the TCP fallback on the QUIC port number; an
    // ephemeral port is chosen so that both are free on it.
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
    let (quic, same_port_tcp) = match pair {
        Some((udp, tcp)) => (udp, Some(tcp)),
        None => (
            std::net::UdpSocket::bind(opts.listen_quic)
                .with_context(|| format!("cannot bind QUIC on {}", opts.listen_quic))?,
            None,
        ),
    };
    let quic_addr = quic.local_addr()?;
    let api = tokio::net::TcpListener::bind(opts.listen_api)
        .await
        .with_context(|| format!("cannot bind the API on {}", opts.listen_api))?;
    let tcp = match (opts.listen_tcp, same_port_tcp) {
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
    let webhook = tokio::net::TcpListener::bind(opts.listen_webhook)
        .await
        .with_context(|| format!("cannot bind webhooks on {}", opts.listen_webhook))?;
    let metrics = match opts.listen_metrics {
        crate::monitor::Listen::Addr(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot bind metrics on {a}"))?,
        ),
        _ => None,
    };
    let console = crate::console::bind(opts.listen_console).await?;
    Ok(Bound {
        quic,
        tcp,
        api,
        webhook,
        metrics,
        console,
    })
}

/// The release to ship: `--dist DIR` must load (a bad one is a
/// configuration error, said at start); one found beside the binary is
/// only used if it loads.
fn load_dist(
    given: Option<&std::path::Path>,
    pki: &Pki,
) -> anyhow::Result<Option<Arc<crate::dist::Dist>>> {
    let (dir, explicit) = match given {
        Some(d) => (d.to_path_buf(), true),
        None => match crate::dist::Dist::find_default() {
            Some(d) => (d, false),
            None => return Ok(None),
        },
    };
    match crate::dist::Dist::load(&dir, pki) {
        Ok(d) => {
            tracing::info!(dir = %dir.display(), version = %d.manifest.version, artifacts = d.manifest.artifacts.len(), "shipping this release to laptops");
            Ok(Some(Arc::new(d)))
        }
        Err(e) if explicit => Err(anyhow::Error::new(e).context("--dist")),
        Err(e) => {
            tracing::warn!("not shipping the release beside the binary: {e}");
            Ok(None)
        }
    }
}

/// Where other machines post webhooks: `https://` the public host (or the
/// bound address) and the webhook port; said plainly when the port
/// listens on loopback only, where no one else can reach it.
fn webhook_base(opts: &ServerOptions, bound: SocketAddr, public_addr: &str) -> (String, String) {
    let host = if bound.ip().is_unspecified() {
        public_addr
            .rsplit_once(':')
            .map(|(h, _)| h.to_string())
            .unwrap_or_else(byom_wire::hostname)
    } else {
        match bound.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        }
    };
    let base = format!("https://{host}:{}", bound.port());
    let note = if bound.ip().is_loopback() {
        format!("the webhook port listens on {bound} only: start the server with --listen-webhook 0.0.0.0:{} for GitHub or Slack to reach it", bound.port())
    } else if opts.webhook_tls.is_none() {
        "the webhook port shows the server's own certificate: give --webhook-tls-cert and --webhook-tls-key for one GitHub and Slack can verify".to_string()
    } else {
        String::new()
    };
    (base, note)
}

/// The server's identity: PKI (certificates naming the public host), what
/// it hands out to laptops, and the machines it refuses.
fn identity(
    opts: &ServerOptions,
    store: &Store,
    vault: &Vault,
    quic_addr: SocketAddr,
) -> anyhow::Result<ServerIdentity> {
    let public_addr = match &opts.public_addr {
        Some(a) => a.clone(),
        None if quic_addr.ip().is_unspecified() => {
            format!("{}:{}", byom_wire::hostname(), quic_addr.port())
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
    let pki = Pki::load_or_create(vault, &opts.data_dir.join("admin"), &names)
        .with_context(|| format!("cannot set up the PKI in {}", vault.describe()))?;
    let dist = load_dist(opts.dist.as_deref(), &pki)?;
    let site = Arc::new(crate::dist::Site::new(dist, &pki, &public_addr)?);
    let revoked = Arc::new(RevokedSet::default());
    for m in store.list_machines()? {
        if m.revoked {
            revoked.insert(&m.id);
        }
    }
    let token_key = vault.key(crate::vault::TOKEN_KEY)?;
    Ok(ServerIdentity {
        pki,
        site,
        revoked,
        public_addr,
        quic_addr,
        cert_ttl: opts.cert_ttl,
        token_key,
    })
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn run(opts: ServerOptions) -> anyhow::Result<()> {
    private_data_dir(&opts.data_dir)?;
    // Configuration errors first, before anything is opened or bound.
    let budgets = agent_budgets(&opts)?;
    let rules = crate::triggers::load_rules(&opts.data_dir)?;
    // Held for the process's life: the OS drops it when we exit, however.
    let _lock = lock_data_dir(&opts.data_dir)?;
    let (store, vault) = open_store(&opts)?;
    let agent_cfg = agent_config(&opts, &store, &vault, budgets)?;
    let bound = bind(&opts).await?;
    let quic_addr = bound.quic.local_addr()?;
    let tcp_addr = bound.tcp.local_addr()?;
    let api_addr = bound.api.local_addr()?;
    let webhook_addr = bound.webhook.local_addr()?;
    let metrics_addr = match (&bound.metrics, opts.listen_metrics) {
        (Some(l), _) => l.local_addr()?.to_string(),
        (None, crate::monitor::Listen::Admin) => api_addr.to_string(),
        (None, _) => String::new(),
    };
    let webhook_key = vault.key(crate::vault::WEBHOOK_KEY)?;
    if matches!(vault, Vault::Sealed { .. }) {
        // For the operator, like the admin credentials: the key webhook
        // senders sign with. The server reads it from the store.
        let path = opts.data_dir.join(crate::vault::WEBHOOK_KEY);
        byom_wire::write_atomic(&path, &webhook_key, 0o600)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let identity = Arc::new(identity(&opts, &store, &vault, quic_addr)?);
    let console_url = match &bound.console {
        Some(l) => Some(crate::console::base_url(
            l.local_addr()?,
            &identity.public_addr,
        )),
        None => None,
    };

    // Every connection is a file: use all the kernel allows, and size the
    // pre-authentication gates so strangers can never take all of them.
    let open_files = crate::gate::raise_open_files();
    let gates = crate::gate::Gates::new(open_files);
    tracing::info!(open_files, "open-file limit");

    // The handles: each task gets the ones it needs.
    let shutdown = CancellationToken::new();
    let cluster = crate::cluster::Cluster::join(&store);
    cluster.set_addr(&identity.public_addr);
    if cluster.shared() {
        tracing::info!(replica = %cluster.replica, "one of the replicas sharing the store");
    }
    let live = Arc::new(LiveMachines::new(cluster.clone()));
    // Before any work flows: the store tells it what it counts.
    let monitor = crate::monitor::Monitor::new(store.clone(), live.clone(), cluster.clone());
    let commands = Commands::new(
        store.clone(),
        live.clone(),
        opts.offline_allowance,
        opts.output_keep,
    );
    let inbox = AgentInbox::new(store.clone()).in_cluster(cluster.clone());
    let triggers = Triggers::new(store.clone(), rules, inbox.clone()).with_context(
        agent_cfg.budgets.context_messages,
        agent_cfg.budgets.context_chars,
    );
    // A rules file edited while the server runs wins over what was set
    // before it; without one, the rules set at runtime stay.
    if !opts.data_dir.join("sources.toml").exists() {
        triggers.load_stored_rules();
    }
    let idem = crate::idempotency::Idempotency::new(store.clone());
    let channels = crate::channels::Channels::new(
        store.clone(),
        triggers.clone(),
        shutdown.clone(),
        webhook_base(&opts, webhook_addr, &identity.public_addr),
    );
    // With replicas, connectors run where the agents do (see agents::lease).
    channels.set_active(!cluster.shared());

    let quic_cfg = crate::tls::quic_server_config(&identity.pki, identity.revoked.clone())?;
    let endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(quic_cfg),
        bound.quic,
        Arc::new(quinn::TokioRuntime),
    )?;
    let tunnel = Arc::new(byom_wire::tunnel::StreamSocket::new());
    let tcp_endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some(crate::tls::quic_server_config(
            &identity.pki,
            identity.revoked.clone(),
        )?),
        tunnel.clone(),
        Arc::new(quinn::TokioRuntime),
    )?;
    let api_tls = crate::tls::api_server_config(&identity.pki)?;
    let webhook_transport = crate::webhook::Transport {
        tls: Arc::new(crate::tls::webhook_server_config(
            &identity.pki,
            opts.webhook_tls
                .as_ref()
                .map(|(c, k)| (c.as_path(), k.as_path())),
        )?),
        plain_from_anywhere: opts.webhook_plain,
    };
    let outer_tls = crate::tls::tunnel_server_config(&identity.pki)?;

    let info = ServerInfo {
        quic_addr: quic_addr.to_string(),
        tcp_addr: tcp_addr.to_string(),
        webhook_addr: webhook_addr.to_string(),
        api_addr: api_addr.to_string(),
        metrics_addr,
        console_url: console_url.clone().unwrap_or_default(),
        public_addr: identity.public_addr.clone(),
        ca_sha256: byom_wire::hex(&identity.pki.ca_sha256),
        pid: std::process::id(),
        version: byom_protocol::VERSION.to_string(),
    };
    // server.json last: it is the "ready" signal scripts wait for, and the
    // CLI they then run needs api.json.
    byom_wire::write_atomic(
        &opts.data_dir.join("admin").join("api.json"),
        &serde_json::to_vec_pretty(&serde_json::json!({ "api_addr": api_addr.to_string() }))?,
        0o644,
    )?;
    byom_wire::write_atomic(
        &opts.data_dir.join("server.json"),
        &serde_json::to_vec_pretty(&info)?,
        0o644,
    )?;
    tracing::info!(quic = %quic_addr, tcp = %tcp_addr, api = %api_addr, data_dir = %opts.data_dir.display(), "byom server listening");
    let models =
        serde_json::json!({"router": opts.models.router(), "worker": opts.models.worker()});
    if let Err(e) = store.put_channel_state("", MODELS_KEY, models.to_string().as_bytes()) {
        tracing::warn!("cannot record the models in use: {e}");
    }
    next_steps(&opts, &info);

    let gw = Gateway {
        store: store.clone(),
        identity: identity.clone(),
        live: live.clone(),
        commands: commands.clone(),
        shutdown: shutdown.clone(),
    };
    let quic_transport = Arc::new(Transport {
        name: "quic",
        tunnel: None,
        gate: Some(gates.quic.clone()),
    });
    // Tunnels are admitted through their own gate before QUIC starts.
    let tcp_transport = Arc::new(Transport {
        name: "tcp",
        tunnel: Some(tunnel.clone()),
        gate: None,
    });
    let gw_quic = tokio::spawn(crate::gateway::serve(
        gw.clone(),
        endpoint.clone(),
        quic_transport,
    ));
    let gw_tcp = tokio::spawn(crate::gateway::serve(
        gw,
        tcp_endpoint.clone(),
        tcp_transport,
    ));
    let hooks = crate::webhook::Hooks {
        triggers: triggers.clone(),
        idem: idem.clone(),
        key: Arc::new(webhook_key),
        channels: channels.clone(),
    };
    let supervisor = tokio::spawn(channels.clone().supervise());
    let rules_watch = tokio::spawn(crate::triggers::watch_rules_file(
        opts.data_dir.join("sources.toml"),
        triggers.clone(),
        shutdown.clone(),
    ));
    let webhooks = tokio::spawn(crate::webhook::serve(
        hooks,
        bound.webhook,
        webhook_transport,
        gates.webhooks.clone(),
        shutdown.clone(),
    ));
    let tcp_accept = tokio::spawn(accept_tunnels(
        bound.tcp,
        outer_tls,
        identity.site.clone(),
        tunnel,
        gates.tunnels.clone(),
        shutdown.clone(),
    ));
    let api = crate::admin::Api {
        store: store.clone(),
        identity: identity.clone(),
        live: live.clone(),
        commands: commands.clone(),
        triggers: triggers.clone(),
        agents: inbox.clone(),
        idem: idem.clone(),
        shutdown: shutdown.clone(),
        channels: channels.clone(),
        console_url,
        console_link_ttl: opts.console_link_ttl,
    };
    let console_task = match bound.console {
        Some(l) => Some(tokio::spawn(
            crate::console::Console::new(api.clone()).serve(
                l,
                crate::tls::webhook_server_config(&identity.pki, None)?,
                shutdown.clone(),
            ),
        )),
        None => None,
    };
    let metrics_task = bound
        .metrics
        .map(|l| tokio::spawn(monitor.clone().serve(l, shutdown.clone())));
    let api = tokio::spawn(crate::admin::serve(
        api,
        bound.api,
        api_tls,
        gates.api.clone(),
        (opts.listen_metrics == crate::monitor::Listen::Admin).then_some(monitor),
    ));
    let sweeper = tokio::spawn(sweep(commands.clone(), idem, shutdown.clone()));
    let heartbeat = tokio::spawn(cluster.clone().heartbeat(shutdown.clone()));
    let followers = tokio::spawn(crate::replicas::follow(
        crate::replicas::Followers {
            live: live.clone(),
            commands: commands.clone(),
            identity: identity.clone(),
            inbox: inbox.clone(),
        },
        shutdown.clone(),
    ));
    let agents = tokio::spawn(crate::agents::lease::run(
        driver::Handles {
            store: store.clone(),
            live,
            commands,
            triggers,
            inbox,
            channels,
            shutdown: shutdown.clone(),
            fence: None,
        },
        agent_cfg,
        cluster,
    ));

    byom_wire::shutdown_signal().await;
    tracing::info!("shutting down: work stays in the store");
    shutdown.cancel();
    endpoint.close(0u32.into(), b"server shutting down");
    tcp_endpoint.close(0u32.into(), b"server shutting down");
    tcp_accept.abort();
    webhooks.abort();
    rules_watch.abort();
    supervisor.abort();
    gw_tcp.abort();
    if let Some(m) = metrics_task {
        m.abort();
    }
    if let Some(c) = console_task {
        c.abort();
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        let _ = gw_quic.await;
        let _ = api.await;
        let _ = sweeper.await;
        let _ = agents.await;
        let _ = heartbeat.await;
        let _ = followers.await;
    })
    .await;
    store.flush_async().await?;
    Ok(())
}

/// The data dir holds command environments, outputs, keys and the CA: it
/// and everything the server writes in it are the owner's alone (0700,
/// files 0600). A dir that others could read is closed, and said so.
fn private_data_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        // Files the store and the PKI create get no group or other bits.
        // SAFETY: umask only changes this process's file-creation mask.
        unsafe {
            libc::umask(0o077);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create data dir {}", dir.display()))?;
        let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make {} private (chmod 700)", dir.display()))?;
            tracing::warn!(
                "data dir {} was open to others (mode {mode:o}); it holds command environments, outputs and keys, so it is now 700",
                dir.display()
            );
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create data dir {}", dir.display()))?;
    Ok(())
}

/// Takes `<data-dir>/server.lock` (an advisory lock, with our PID in the
/// file), so a second server on the same data dir says who holds it
/// instead of failing somewhere deep in the store.
#[cfg(unix)]
fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let path = dir.join("server.lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            let pid = pid.trim();
            anyhow::bail!(
                "the data dir {} is in use by another byom server{}: stop it first{}, or give this one another --data-dir",
                dir.display(),
                if pid.is_empty() { String::new() } else { format!(" (pid {pid})") },
                if pid.is_empty() { String::new() } else { format!(" (kill {pid})") },
            );
        }
        return Err(err).with_context(|| format!("cannot lock {}", path.display()));
    }
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{}", std::process::id())?;
    f.flush()?;
    Ok(f)
}

#[cfg(not(unix))]
fn lock_data_dir(_dir: &std::path::Path) -> anyhow::Result<()> {
    Ok(())
}

/// Server-wide setting naming the models in use, for `byom router` and
/// `byom workers show`.
pub const MODELS_KEY: &str = "models";

/// What a person starting the server does next: where the credentials
/// are, the line that points the CLI at them, the token command, and the
/// addresses and model in use. On stderr, with the logs: stdout may be
/// closed under a service manager.
fn next_steps(opts: &ServerOptions, info: &ServerInfo) {
    use std::io::Write;
    let creds = opts.data_dir.join("admin");
    let default = byom_api::default_data_dir() == opts.data_dir;
    let point = if default {
        format!(
            "  (the CLI finds them by default; elsewhere: export BYOM_CREDS={})",
            creds.display()
        )
    } else {
        format!("  export BYOM_CREDS={}", creds.display())
    };
    let (router, worker) = (opts.models.router(), opts.models.worker());
    let model = if router == worker {
        format!("  model:    {}", crate::model::describe(&router))
    } else {
        format!(
            "  router:   {}\n  workers:  {}",
            crate::model::describe(&router),
            crate::model::describe(&worker)
        )
    };
    let metrics = if info.metrics_addr.is_empty() {
        "  metrics:  off (--listen-metrics ADDR serves them)".to_string()
    } else {
        format!(
            "  metrics:  http://{}/metrics   health: /healthz, /readyz (plain HTTP)",
            info.metrics_addr
        )
    };
    let console = if info.console_url.is_empty() {
        "  console:  off (--listen-console ADDR serves it)".to_string()
    } else {
        format!(
            "  console:  {}   (`byom console` prints a one-time login link)",
            info.console_url
        )
    };
    let text = format!(
        "\nbyom server {} is up (pid {}, data dir {})\n  daemons:  {} (QUIC/UDP; TCP fallback {})\n  admin API: {}   webhooks: {}\n{metrics}\n{console}\n{model}\n\nAdmin credentials are in {}. In another shell:\n{point}\n  byom token create --name lap        # then on the laptop: byomd pair <token>\n  byom machines ls\n\n",
        info.version,
        info.pid,
        opts.data_dir.display(),
        info.public_addr,
        info.tcp_addr,
        info.api_addr,
        info.webhook_addr,
        creds.display(),
    );
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// The store `opts` names (the embedded one in the data dir by default)
/// and where the server's secrets live with it.
fn open_store(opts: &ServerOptions) -> anyhow::Result<(Store, Vault)> {
    let Some(url) = &opts.store else {
        let store = Store::open_sled(&opts.data_dir.join("store"))
            .with_context(|| format!("cannot open the store in {}", opts.data_dir.display()))?;
        return Ok((store, Vault::Dir(opts.data_dir.clone())));
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        anyhow::bail!(
            "--store {}: only postgres://… (or postgresql://…) URLs are known; leave --store out for the embedded store",
            redact_url(url)
        );
    }
    let Some(key_file) = &opts.store_key_file else {
        anyhow::bail!(
            "a shared store keeps the server's CA and keys in the database, sealed: give the key with --store-key-file FILE (or BYOM_STORE_KEY_FILE), kept apart from the database; the first replica creates it if it does not exist"
        );
    };
    let backend = byom_store::PgBackend::connect(url)
        .with_context(|| format!("cannot open the store {}", redact_url(url)))?;
    let store = Store::new(Arc::new(backend));
    let vault = Vault::sealed(store.clone(), key_file)?;
    tracing::info!(store = %redact_url(url), "shared store");
    Ok((store, vault))
}

/// `url` without its password, for messages and logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The agents' budgets: `<data-dir>/agents.toml` (`[budgets]`, validated)
/// if there is one; else what a replica stored; else the defaults.
fn agent_budgets(opts: &ServerOptions) -> anyhow::Result<Option<String>> {
    let path = opts.data_dir.join("agents.toml");
    match std::fs::read_to_string(&path) {
        Ok(t) => {
            Budgets::from_toml(&t)
                .map_err(|e| anyhow::anyhow!("{} is not valid: {e}", path.display()))?;
            Ok(Some(t))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Server-wide setting holding the last agents.toml a server was given, so
/// replicas started without the file use it too.
pub(crate) const AGENTS_TOML_KEY: &str = "agents.toml";

/// Models, budgets and the interpreter's snapshot key.
fn agent_config(
    opts: &ServerOptions,
    store: &Store,
    vault: &Vault,
    budgets: Option<String>,
) -> anyhow::Result<AgentConfig> {
    let m = &opts.models;
    let (router, worker) = (m.router(), m.worker());
    let budgets = match budgets {
        Some(t) => {
            store.put_channel_state("", AGENTS_TOML_KEY, t.as_bytes())?;
            Budgets::from_toml(&t).map_err(|e| anyhow::anyhow!("agents.toml is not valid: {e}"))?
        }
        None => match store.channel_state("", AGENTS_TOML_KEY)? {
            Some(t) => Budgets::from_toml(&String::from_utf8_lossy(&t))
                .map_err(|e| anyhow::anyhow!("the stored agents.toml is not valid: {e}"))?,
            None => Budgets::default(),
        },
    };
    let js_key = vault.key(crate::vault::SNAPSHOT_KEY)?;
    tracing::info!(router = %router, worker = %worker, "agent models");
    Ok(AgentConfig {
        router_model: crate::model::from_spec(&router, m)?,
        worker_model: crate::model::from_spec(&worker, m)?,
        budgets,
        retry: crate::model::RetryPolicy::default(),
        js_key,
        js_limits: byom_sandbox::Limits {
            wall_clock: Duration::from_secs(10),
            ..byom_sandbox::Limits::default()
        },
    })
}

/// Accepts TLS-over-TCP connections and attaches each to the tunnel socket
/// the second QUIC endpoint reads from. Tunnels need no client certificate
/// at this outer layer, so each is a stranger's until QUIC is established
/// over it: admitted through `gate`, closed if its TLS or QUIC handshake
/// does not finish in time, and evicted first when the gate is full.
async fn accept_tunnels(
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
    site: Arc<crate::dist::Site>,
    tunnel: Arc<byom_wire::tunnel::StreamSocket>,
    gate: Arc<crate::gate::Gate>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    while let Some((tcp, remote, ticket)) = crate::gate::accept(&listener, &gate, &shutdown).await {
        let acceptor = acceptor.clone();
        let tunnel = tunnel.clone();
        let site = site.clone();
        tokio::spawn(async move {
            let Some(Ok(tls)) = ticket
                .within(TUNNEL_HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                .await
            else {
                return;
            };
            // The same port serves laptops' downloads: whatever did not
            // ask for the tunnel (curl offers http/1.1) gets HTTPS.
            if tls.get_ref().1.alpn_protocol() != Some(crate::tls::TUNNEL_ALPN) {
                tracing::debug!(%remote, "HTTPS download connection");
                tokio::select! {
                    _ = crate::dist::serve(site, tls) => {}
                    _ = ticket.evicted() => {}
                }
                return;
            }
            tracing::debug!(%remote, "TCP fallback connection");
            let limits = byom_wire::tunnel::StreamLimits {
                establish_within: Some(TUNNEL_ESTABLISH_TIMEOUT),
                idle: Some(TUNNEL_IDLE_TIMEOUT),
            };
            let mut att = tunnel.attach_limited(tls, remote.to_string(), limits);
            loop {
                tokio::select! {
                    _ = &mut att.closed => break,
                    _ = ticket.evicted() => {
                        tunnel.detach(&att.addr);
                        break;
                    }
                    r = att.established.changed() => {
                        if r.is_err() {
                            break;
                        }
                        if *att.established.borrow() {
                            ticket.established();
                        }
                    }
                }
            }
        });
    }
}

/// Fails queued commands whose queue TTL passed without their machine
/// connecting; now and then forgets idempotency keys past their window.
async fn sweep(
    commands: Commands,
    idem: crate::idempotency::Idempotency,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        commands.sweep_expired().await;
        if n.is_multiple_of(IDEMPOTENCY_SWEEP_EVERY) {
            let idem = idem.clone();
            let _ = tokio::task::spawn_blocking(move || idem.expire()).await;
        }
        n += 1;
    }
}
