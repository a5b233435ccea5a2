//! `byomd run`: dial out, say Hello, keep the connection alive with a
//! heartbeat, run what the server sends, and reconnect forever with
//! exponential backoff and jitter. Commands keep running across connection
//! losses; their results wait in the [`Runner`] for the next connection.
//!
//! This file is the connection's life (status, Hello, heartbeat, renewal,
//! upgrade drain, reconnection); `transport` dials (QUIC, or TLS over TCP),
//! `commands` serves the command streams, and `doctor` checks it all.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use byom_protocol::limits;
use byom_protocol::pb::{self, to_daemon, to_server, ToDaemon, ToServer};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::exec::Runner;
use crate::identity::Identity;
use byom_wire::{read_frame, write_frame};

mod commands;
mod doctor;
mod transport;
use commands::accept_streams;
pub use doctor::{doctor, Check};
pub(crate) use transport::closed_for_good;
use transport::{
    connect_quic, connect_tcp, quic_probe_interval, revoked, QuicFail, Transport,
    QUIC_FALLBACK_AFTER,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that lasted this long resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(10);
/// How often the certificate's remaining lifetime is checked.
const RENEW_CHECK: Duration = Duration::from_secs(600);
const STATUS_FILE: &str = "run.json";
/// How long a stopping daemon waits for its close to reach the server.
const STOP_CLOSE_WAIT: Duration = Duration::from_millis(500);
/// How often the owner's pause flag is looked at.
const PAUSE_POLL: Duration = Duration::from_millis(250);

/// What `byomd run` is doing, for `byomd status`. Not session state: only
/// the connection state and the last error.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct RunStatus {
    pub pid: u32,
    pub state: String,
    pub since_ms: u64,
    pub server: String,
    pub last_error: String,
    /// The sandbox commands get (`full`, `partial (…)`, `none (…)`).
    #[serde(default)]
    pub sandbox: String,
}

impl RunStatus {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(STATUS_FILE)
    }
    pub fn load(dir: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(Self::path(dir)).ok()?).ok()
    }
}

/// The sandbox level last found, for `run.json`.
static SANDBOX_LEVEL: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// The runner's sandbox level, remembered for `byomd status` and logged
/// loudly when it changes and is not the whole sandbox.
fn sandbox_level(runner: &Runner) -> String {
    let level = runner.sandbox_level();
    if let Ok(mut last) = SANDBOX_LEVEL.lock() {
        if *last != level {
            if level == "full" {
                tracing::info!("sandbox: full");
            } else {
                tracing::warn!("sandbox: {level}; see `byomd doctor`");
            }
            *last = level.clone();
        }
    }
    level
}

fn set_status(dir: &Path, state: &str, server: &str, err: &str) {
    let s = RunStatus {
        pid: std::process::id(),
        state: state.into(),
        since_ms: crate::now_ms(),
        server: server.into(),
        last_error: err.into(),
        sandbox: SANDBOX_LEVEL.lock().map(|l| l.clone()).unwrap_or_default(),
    };
    if let Ok(j) = serde_json::to_vec_pretty(&s) {
        // Owner-only, like everything else in the config dir.
        let _ = crate::identity::write_atomic(&RunStatus::path(dir), &j, 0o600);
    }
}

enum End {
    /// Connection lost; reconnect. The bool says whether it was stable.
    Lost(String, bool),
    /// Got a fresh certificate; reconnect at once.
    Renewed,
    /// Drained for an upgrade; the connection is closed.
    Upgrade(crate::upgrade::Request),
    /// A trial daemon connected: its job is done.
    TrialDone,
    /// The server says this identity is no good any more.
    Revoked(String),
}

pub struct RunOptions {
    pub config_dir: PathBuf,
    pub server: Option<String>,
    /// Labels reported in Hello.
    pub labels: Vec<(String, String)>,
    /// Run as an upgrade's trial (see [`crate::upgrade`]): connect paused,
    /// write this file, exit. The daemon being upgraded holds the lock.
    pub upgrade_trial: Option<PathBuf>,
}

/// Holds an exclusive lock on `<config-dir>/run.lock` while `byomd run`
/// lives: two daemons with one identity would keep replacing each other's
/// connection.
struct RunLock(#[allow(dead_code)] std::fs::File);

/// Records the name the server now uses for this machine, so `byomd
/// status` shows what `byom machines ls` does.
fn follow_rename(dir: &Path, name: &str) {
    if name.is_empty() {
        return;
    }
    let Ok(mut id) = Identity::load(dir) else {
        return;
    };
    if id.name != name {
        tracing::info!(old = %id.name, new = %name, "renamed on the server");
        id.name = name.to_string();
        if let Err(e) = id.save(dir) {
            tracing::warn!("cannot record the new name {name}: {e:#}");
        }
    }
}

/// Most server addresses a daemon keeps.
const MAX_SERVER_ADDRS: usize = 16;

/// Where the replicas' addresses the server told are kept, one a line:
/// a file of its own, so writing it never races the identity's renewal.
fn replicas_file(dir: &Path) -> std::path::PathBuf {
    dir.join("replicas")
}

/// Keeps the replicas' addresses the server told (the latest list, not
/// every address ever heard: a replica gone is forgotten): when the one
/// dialed does not answer, the next is tried.
fn keep_server_addrs(dir: &Path, told: &[String]) {
    let mut addrs: Vec<&str> = Vec::new();
    for a in told {
        // Printable host:port only, as a line of the file.
        let ok =
            !a.is_empty() && a.len() <= 255 && a.chars().all(|c| c.is_ascii_graphic() && c != ',');
        if ok && !addrs.contains(&a.as_str()) && addrs.len() < MAX_SERVER_ADDRS {
            addrs.push(a);
        }
    }
    let text = addrs.join("\n");
    let path = replicas_file(dir);
    if std::fs::read_to_string(&path).unwrap_or_default() == text {
        return;
    }
    tracing::info!(servers = %addrs.join(","), "the server's replicas");
    if let Err(e) = byom_wire::write_atomic(&path, text.as_bytes(), 0o600) {
        tracing::warn!("cannot record the server's replicas: {e:#}");
    }
}

/// The replicas' addresses kept from the last HelloAck.
fn kept_server_addrs(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(replicas_file(dir))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .take(MAX_SERVER_ADDRS)
        .collect()
}

/// Whether a `byomd run` holds this config dir now (its lock, not a PID
/// that may have been reused since).
pub fn running(dir: &Path) -> bool {
    let Ok(f) = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("run.lock"))
    else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own; closing it releases ours.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        rc != 0
    }
    #[cfg(not(unix))]
    {
        drop(f);
        true
    }
}

fn lock_config_dir(dir: &Path) -> anyhow::Result<RunLock> {
    let path = dir.join("run.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file descriptor we own; released when it closes.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            bail!(
                "another `byomd run` is already using {}; stop it first (or use another --config-dir)",
                dir.display()
            );
        }
    }
    Ok(RunLock(f))
}

pub async fn run(opts: RunOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let dir = opts.config_dir;
    Identity::load(&dir)?;
    let trial = opts.upgrade_trial.clone();
    let _lock = match trial {
        Some(_) => None,
        None => Some(lock_config_dir(&dir)?),
    };
    // A policy that does not parse stops the daemon: never "anything goes".
    let policy = crate::policy::Policy::load(&dir)?;
    if trial.is_none() {
        // Approvals asked by an earlier daemon process are void: those
        // commands are lost, never run.
        crate::approvals::clear_all(&dir);
        // Just swapped in by an upgrade: roll back unless we reconnect.
        tokio::spawn(crate::upgrade::watch_swap(dir.clone()));
    }
    tracing::info!(policy = %policy.path.display(), digest = %policy.digest, "local policy: {}", policy.summary());
    let runner = Arc::new(Runner::with_policy(policy));
    runner.set_draining(trial.is_some());
    sandbox_level(&runner);
    let mut backoff = limits::RECONNECT_BACKOFF_MIN;
    // Which of the server's addresses to dial: the next one after a failure.
    let mut next = 0usize;
    tracing::info!(instance = %runner.instance_id, "byomd starting");
    loop {
        let ident = Identity::load(&dir)?;
        if ident.revoked {
            bail!("this machine was revoked by the server; run `byomd unpair`, then pair it again with a new token");
        }
        let key = ident.load_key(&dir)?;
        // Replicas of one server (`--server a,b,c`).
        let mut servers: Vec<String> = opts
            .server
            .clone()
            .unwrap_or_else(|| ident.server_addr.clone())
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        // Then the replicas the server told of (not with --server, which
        // names exactly where to dial).
        if opts.server.is_none() {
            for a in kept_server_addrs(&dir) {
                if !servers.contains(&a) {
                    servers.push(a);
                }
            }
        }
        let server = servers
            .get(next % servers.len().max(1))
            .cloned()
            .unwrap_or_else(|| ident.server_addr.clone());
        set_status(&dir, "connecting", &server, "");
        let started = Instant::now();
        let live = LiveConn::default();
        let end = tokio::select! {
            r = session(&dir, &ident, &key, &server, &runner, &opts.labels, trial.as_deref(), &live) => r,
            _ = shutdown.cancelled() => {
                set_status(&dir, "stopped", &server, "");
                runner.cancel_all("byomd stopped");
                // Let the kill signals land, and the stopped commands'
                // results go out, before the connection does.
                tokio::time::sleep(Duration::from_millis(200)).await;
                close_for_good(&live, "byomd stopped").await;
                return Ok(());
            }
        };
        match end {
            Ok(End::Renewed) => {
                backoff = limits::RECONNECT_BACKOFF_MIN;
                continue;
            }
            Ok(End::TrialDone) => return Ok(()),
            Ok(End::Upgrade(req)) => {
                set_status(&dir, "upgrading", &server, "");
                if let Some(exe) =
                    crate::upgrade::stage_and_try(&dir, opts.server.as_deref(), &req).await
                {
                    set_status(&dir, "restarting for an upgrade", &server, "");
                    // On success exec never returns: this process becomes
                    // the new daemon (the run lock closes on exec).
                    let e = crate::upgrade::exec_self(&exe);
                    tracing::error!("{e:#}");
                }
                runner.set_draining(false);
                backoff = limits::RECONNECT_BACKOFF_MIN;
                continue;
            }
            Ok(End::Revoked(why)) => {
                runner.cancel_all("machine revoked");
                tracing::error!("{why}");
                let mut ident = ident;
                ident.revoked = true;
                let _ = ident.save(&dir);
                set_status(&dir, "revoked", &server, &why);
                tokio::time::sleep(Duration::from_millis(500)).await;
                bail!("{why}");
            }
            Ok(End::Lost(why, stable)) => {
                next += 1;
                tracing::warn!("disconnected from {server}: {why}");
                set_status(&dir, "reconnecting", &server, &why);
                if stable || started.elapsed() >= STABLE_AFTER {
                    backoff = limits::RECONNECT_BACKOFF_MIN;
                }
            }
            Err(e) => {
                next += 1;
                let why = format!("{e:#}");
                tracing::warn!("cannot connect to {server}: {why}");
                set_status(&dir, "reconnecting", &server, &why);
            }
        }
        let jitter = backoff.mul_f64(fastrand::f64() * 0.5);
        tokio::select! {
            _ = tokio::time::sleep(backoff + jitter) => {}
            _ = shutdown.cancelled() => {
                set_status(&dir, "stopped", &server, "");
                runner.cancel_all("byomd stopped");
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Ok(());
            }
        }
        backoff = (backoff * 2).min(limits::RECONNECT_BACKOFF_MAX);
    }
}

/// Certificate renewal: a CSR for our existing key, answered with a new
/// certificate that we store atomically.
async fn renew(dir: &Path, conn: &quinn::Connection, key_pem: &str) -> anyhow::Result<()> {
    let key = rcgen::KeyPair::from_pem(key_pem)?;
    let (mut send, mut recv) = conn.open_bi().await?;
    let req = ToServer {
        msg: Some(to_server::Msg::Renew(pb::RenewRequest {
            csr_pem: crate::pair::csr(&key)?,
        })),
    };
    write_frame(&mut send, &req).await?;
    send.finish()?;
    let resp: Option<ToDaemon> =
        tokio::time::timeout(CONNECT_TIMEOUT, read_frame(&mut recv)).await??;
    match resp.and_then(|r| r.msg) {
        Some(to_daemon::Msg::Renew(r)) => {
            let mut ident = Identity::load(dir)?;
            ident.cert_pem = r.cert_pem;
            ident.save(dir)?;
            tracing::info!("certificate renewed");
            Ok(())
        }
        Some(to_daemon::Msg::Error(e)) => bail!("renewal refused: {}", e.message),
        _ => bail!("unexpected reply to renewal"),
    }
}

/// True when less than half of the certificate's lifetime is left.
fn needs_renewal(cert_pem: &str) -> bool {
    match crate::tls::cert_validity(cert_pem) {
        Some((not_after, lifetime)) => crate::now_ms() + lifetime / 2 >= not_after,
        None => true,
    }
}

/// Opens the control stream and says Hello; returns the stream and the
/// name the server knows this machine by.
async fn hello(
    conn: &quinn::Connection,
    runner: &Arc<Runner>,
    ident: &Identity,
    labels: &[(String, String)],
) -> anyhow::Result<(quinn::SendStream, quinn::RecvStream, pb::HelloAck)> {
    let (mut ctl_send, mut ctl_recv) = conn.open_bi().await?;
    let (running, held) = runner.inventory();
    let (policy_digest, policy_summary) = runner.policy_info();
    let hello = pb::Hello {
        protocol_version: byom_protocol::PROTOCOL_VERSION,
        machine_id: ident.machine_id.clone(),
        version: byom_protocol::version().into(),
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        hostname: crate::hostname(),
        instance_id: runner.instance_id.clone(),
        running,
        held,
        max_concurrency: runner.max_concurrency as u32,
        labels: labels.iter().cloned().collect(),
        policy_digest,
        policy_summary,
        paused: runner.is_paused(),
        read_only: runner.read_only(),
        env_scrub: runner.env_scrub(),
        sandbox: sandbox_level(runner),
    };
    write_frame(
        &mut ctl_send,
        &ToServer {
            msg: Some(to_server::Msg::Hello(hello)),
        },
    )
    .await?;
    let ack = tokio::time::timeout(CONNECT_TIMEOUT, read_frame::<ToDaemon>(&mut ctl_recv))
        .await
        .map_err(|_| anyhow::anyhow!("the server did not answer Hello"))??;
    let ack = match ack.and_then(|a| a.msg) {
        Some(to_daemon::Msg::HelloAck(a)) => a,
        Some(to_daemon::Msg::Error(e)) => bail!("the server refused Hello: {}", e.message),
        _ => bail!("unexpected reply to Hello"),
    };
    Ok((ctl_send, ctl_recv, ack))
}

/// The session's connection and its endpoint, once connected: a stopping
/// daemon closes it itself, so the server shows the machine offline at
/// once rather than when its heartbeats stop.
type LiveConn = std::sync::Mutex<Option<(quinn::Connection, quinn::Endpoint)>>;

/// Closes the connection in `live` (if any) and gives the close a moment
/// to reach the server.
async fn close_for_good(live: &LiveConn, why: &str) {
    let taken = live.lock().ok().and_then(|mut l| l.take());
    if let Some((conn, endpoint)) = taken {
        conn.close(0u32.into(), why.as_bytes());
        let _ = tokio::time::timeout(STOP_CLOSE_WAIT, endpoint.wait_idle()).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn session(
    dir: &Path,
    ident: &Identity,
    key: &str,
    server: &str,
    runner: &Arc<Runner>,
    labels: &[(String, String)],
    trial: Option<&Path>,
    live: &LiveConn,
) -> anyhow::Result<End> {
    let addr = crate::pair::resolve(server).await?;
    let cfg = crate::tls::machine_config(&ident.ca_pem, &ident.cert_pem, key)?;
    // QUIC first; if UDP gets no answer, or something on the way refuses
    // the handshake (a middlebox, a proxy that speaks no QUIC), the same
    // protocol tunnelled in TLS over TCP on the same port. Only the
    // server's own word that this machine is revoked is final.
    let quic = connect_quic(addr, cfg.clone(), QUIC_FALLBACK_AFTER).await;
    let why_tcp = match quic {
        Ok((c, e)) => Ok((c, e, Transport::Quic)),
        // Not even a revocation is believed here: a handshake's first
        // packets carry no proof of who sent them, so anyone on the path
        // could forge one. The server's own word comes after the
        // handshake (below), or inside the CA-pinned TCP tunnel.
        Err(QuicFail::Refused(e)) => {
            tracing::info!("QUIC handshake with {server} refused ({e}): trying TCP");
            Err(format!("the QUIC handshake was refused ({e})"))
        }
        Err(QuicFail::Other(e)) => return Err(e),
        Err(QuicFail::NoAnswer) => {
            tracing::info!(
                "no QUIC answer from {server} within {QUIC_FALLBACK_AFTER:?}: trying TCP"
            );
            Err("no answer over QUIC (UDP blocked?)".to_string())
        }
    };
    let (conn, _endpoint, transport) = match why_tcp {
        Ok(c) => c,
        Err(why) => match connect_tcp(addr, &ident.ca_pem, cfg).await {
            Ok((c, e)) => (c, e, Transport::Tcp),
            Err(e) => {
                if let Some(why) = e
                    .downcast_ref::<quinn::ConnectionError>()
                    .and_then(closed_for_good)
                {
                    return Ok(End::Revoked(why));
                }
                return Err(e.context(format!("{why}, and the TCP fallback failed")));
            }
        },
    };
    if let Ok(mut l) = live.lock() {
        *l = Some((conn.clone(), _endpoint.clone()));
    }
    let expired =
        crate::tls::cert_validity(&ident.cert_pem).is_none_or(|(na, _)| na <= crate::now_ms());
    if expired {
        tracing::info!("certificate expired: renewing with the existing key");
        let r = renew(dir, &conn, key).await;
        let gone = revoked(&conn);
        conn.close(0u32.into(), b"renewed");
        return match (r, gone) {
            (_, Some(why)) => Ok(End::Revoked(why)),
            (Ok(()), None) => Ok(End::Renewed),
            (Err(e), None) => Err(e),
        };
    }
    // In TLS 1.3 the client's handshake ends before the server has checked
    // its certificate, so a revoked machine learns it here, as the
    // connection's close reason behind whatever error the first I/O gives.
    let (mut ctl_send, ctl_recv, ack) = match hello(&conn, runner, ident, labels).await {
        Ok(v) => v,
        Err(e) => {
            return match revoked(&conn) {
                Some(why) => Ok(End::Revoked(why)),
                None => Err(e),
            }
        }
    };
    if let Some(report) = trial {
        tracing::info!("upgrade trial: connected to {server}");
        byom_wire::write_atomic(report, byom_protocol::version().as_bytes(), 0o600)?;
        conn.close(0u32.into(), b"upgrade trial done");
        return Ok(End::TrialDone);
    }
    let name = ack.machine_name;
    crate::upgrade::connected(dir);
    tracing::info!(machine = %ident.machine_id, %name, %server, transport = transport.name(), "connected");
    // An admin may have renamed the machine while it was away.
    follow_rename(dir, &name);
    keep_server_addrs(dir, &ack.server_addrs);
    set_status(
        dir,
        &format!("connected over {}", transport.name()),
        server,
        "",
    );
    let connected_at = Instant::now();

    let heartbeat = heartbeat(&mut ctl_send, ctl_recv, runner, dir);
    let streams = accept_streams(&conn, runner);
    let renewal = async {
        loop {
            if needs_renewal(&Identity::load(dir).map(|i| i.cert_pem).unwrap_or_default()) {
                if let Err(e) = renew(dir, &conn, key).await {
                    tracing::warn!("certificate renewal failed, will retry: {e:#}");
                }
            }
            // Check again well before the certificate could expire.
            let not_after = Identity::load(dir)
                .ok()
                .and_then(|i| crate::tls::cert_validity(&i.cert_pem))
                .map(|v| v.0)
                .unwrap_or(0);
            let remaining = not_after.saturating_sub(crate::now_ms());
            let wait =
                Duration::from_millis(remaining / 4).clamp(Duration::from_millis(500), RENEW_CHECK);
            tokio::time::sleep(wait).await;
        }
    };
    // On the TCP fallback, keep looking for QUIC to move back to it.
    let probe = async {
        if transport == Transport::Quic {
            return std::future::pending::<String>().await;
        }
        loop {
            tokio::time::sleep(quic_probe_interval()).await;
            let Ok(cfg) = crate::tls::machine_config(&ident.ca_pem, &ident.cert_pem, key) else {
                continue;
            };
            if let Ok((c, e)) = connect_quic(addr, cfg, QUIC_FALLBACK_AFTER).await {
                c.close(0u32.into(), b"probe");
                e.wait_idle().await;
                return "QUIC reachable again: moving back from the TCP fallback".to_string();
            }
        }
    };
    let upgrade = upgrade_wanted(dir, runner, &ack.dist_version);
    let why = tokio::select! {
        w = probe => return Ok(End::Lost(w, true)),
        req = upgrade => {
            conn.close(0u32.into(), b"upgrading");
            return Ok(End::Upgrade(req));
        }
        w = heartbeat => w,
        w = streams => w,
        _ = renewal => "renewal loop ended".to_string(),
        e = conn.closed() => {
            if let Some(why) = closed_for_good(&e) {
                return Ok(End::Revoked(why));
            }
            e.to_string()
        }
    };
    // A revocation close may race with our own read error; ask before
    // closing, which would overwrite the server's reason.
    if let Some(why) = revoked(&conn) {
        return Ok(End::Revoked(why));
    }
    conn.close(0u32.into(), why.as_bytes());
    Ok(End::Lost(why, connected_at.elapsed() >= STABLE_AFTER))
}

/// Resolves when this daemon should upgrade and has drained: `byomd
/// upgrade` asked, or the owner's `auto_upgrade` and a newer shipped
/// version. Draining reports the daemon paused and waits for its commands
/// to finish and their results to be taken (`--now`: cancels them).
async fn upgrade_wanted(dir: &Path, runner: &Runner, shipped: &str) -> crate::upgrade::Request {
    let mut tick = tokio::time::interval(PAUSE_POLL);
    let req = loop {
        tick.tick().await;
        if let Some(r) = crate::upgrade::take_request(dir) {
            break r;
        }
        if runner.auto_upgrade() && crate::upgrade::auto_wanted(dir, shipped) {
            break crate::upgrade::Request {
                at_ms: crate::now_ms(),
                ..Default::default()
            };
        }
    };
    runner.set_draining(true);
    let mut st = crate::upgrade::State {
        state: "draining".into(),
        from: byom_protocol::version().into(),
        to: shipped.into(),
        request_at_ms: req.at_ms,
        ..Default::default()
    };
    // --now: cancelled commands still get a moment to hand in their
    // results, so they end as cancelled rather than lost.
    let hurry = req.now.then(|| Instant::now() + crate::upgrade::NOW_GRACE);
    if req.now {
        runner.cancel_all("byomd is upgrading (--now)");
    }
    let mut last = usize::MAX;
    loop {
        let (running, held) = runner.inventory();
        if running.len() + held.len() == 0 || hurry.is_some_and(|t| Instant::now() >= t) {
            return req;
        }
        if running.len() + held.len() != last {
            last = running.len() + held.len();
            st.detail = format!(
                "waiting for {} running command(s) to finish ({} result(s) to deliver)",
                running.len(),
                held.len()
            );
            crate::upgrade::set_state(dir, &st);
        }
        tick.tick().await;
    }
}

/// Pings on the control stream; a server silent for HEARTBEAT_MISSES
/// intervals is dead (a restarted server never answers on the old
/// connection, and QUIC's idle timeout alone takes too long).
async fn heartbeat(
    send: &mut quinn::SendStream,
    mut recv_owned: quinn::RecvStream,
    runner: &Runner,
    dir: &Path,
) -> String {
    let (tx, mut rx) = mpsc::channel::<()>(8);
    let dir = dir.to_path_buf();
    // Reads must not be cancelled mid-frame, so they get their own task.
    let mut reader = tokio::spawn(async move {
        loop {
            match read_frame::<ToDaemon>(&mut recv_owned).await {
                Ok(Some(f)) => {
                    if let Some(to_daemon::Msg::Pong(p)) = f.msg {
                        follow_rename(&dir, &p.machine_name);
                    }
                    if tx.send(()).await.is_err() {
                        return "heartbeat stopped".to_string();
                    }
                }
                Ok(None) => return "server closed the control stream".to_string(),
                Err(e) => return format!("control stream failed: {e}"),
            }
        }
    });
    let mut seq = 0u64;
    let mut last_heard = Instant::now();
    let mut last_ping = Instant::now();
    let mut paused = runner.is_paused();
    let dead_after = limits::HEARTBEAT_INTERVAL * limits::HEARTBEAT_MISSES;
    // Sleep as the OS says it (logind), and as the clocks show it.
    let mut sleep = crate::power::subscribe();
    sleep.borrow_and_update();
    let mut suspended = crate::power::suspended_ms();
    // Ticks often enough to notice `byomd pause` quickly; pings less often.
    let mut tick = tokio::time::interval(PAUSE_POLL);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now_suspended = crate::power::suspended_ms();
                if now_suspended.saturating_sub(suspended) > crate::power::SLEPT_AFTER_MS {
                    // The connection went stale while asleep: a new one
                    // now beats waiting for the heartbeat to say so.
                    reader.abort();
                    return format!(
                        "woke from sleep (suspended {}s): reconnecting",
                        (now_suspended - suspended) / 1000
                    );
                }
                suspended = now_suspended;
                if last_heard.elapsed() >= dead_after {
                    reader.abort();
                    return format!("heartbeat lost: no answer from the server for {}s", dead_after.as_secs());
                }
                let now_paused = runner.is_paused();
                if now_paused != paused {
                    paused = now_paused;
                    tracing::info!("{}", if paused { "paused by the owner: no new commands" } else { "resumed by the owner" });
                    let st = ToServer { msg: Some(to_server::Msg::Status(pb::DaemonStatus { paused, sleeping: false })) };
                    if let Err(e) = write_frame(send, &st).await {
                        reader.abort();
                        return format!("control stream failed: {e}");
                    }
                }
                if last_ping.elapsed() >= limits::HEARTBEAT_INTERVAL {
                    last_ping = Instant::now();
                    seq += 1;
                    let ping = ToServer { msg: Some(to_server::Msg::Ping(pb::Ping { seq })) };
                    if let Err(e) = write_frame(send, &ping).await {
                        reader.abort();
                        return format!("heartbeat failed: {e}");
                    }
                }
            }
            Some(()) = rx.recv() => last_heard = Instant::now(),
            Ok(()) = sleep.changed() => {
                let going = *sleep.borrow_and_update();
                if !going {
                    reader.abort();
                    return "woke from sleep: reconnecting".into();
                }
                // Said before the machine sleeps, so the server shows it
                // asleep, not gone, when it falls silent.
                let st = ToServer { msg: Some(to_server::Msg::Status(pb::DaemonStatus { paused, sleeping: true })) };
                if let Err(e) = write_frame(send, &st).await {
                    reader.abort();
                    return format!("control stream failed: {e}");
                }
            }
            r = &mut reader => return r.unwrap_or_else(|e| e.to_string()),
        }
    }
}

/// Deregisters this machine (the server revokes it) over a one-off
/// connection.
pub async fn unpair(dir: &Path, ident: &Identity) -> anyhow::Result<()> {
    let key = ident.load_key(dir)?;
    let addr = crate::pair::resolve(&ident.server_addr).await?;
    let endpoint = crate::pair::client_endpoint(addr)?;
    let cfg = crate::tls::machine_config(&ident.ca_pem, &ident.cert_pem, &key)?;
    let conn = tokio::time::timeout(
        CONNECT_TIMEOUT,
        endpoint.connect_with(cfg, addr, byom_protocol::SERVER_NAME)?,
    )
    .await
    .context("no answer from the server")?
    // A refusal during the handshake proves nothing (anyone on the path
    // can forge one): as text, so it never reads as the server's word.
    .map_err(|e| anyhow::anyhow!("the QUIC handshake with the server failed: {e}"))?;
    let (mut send, mut recv) = conn.open_bi().await?;
    write_frame(
        &mut send,
        &ToServer {
            msg: Some(to_server::Msg::Unpair(pb::UnpairRequest {})),
        },
    )
    .await?;
    send.finish()?;
    let resp: Option<ToDaemon> =
        tokio::time::timeout(CONNECT_TIMEOUT, read_frame(&mut recv)).await??;
    conn.close(0u32.into(), b"unpaired");
    endpoint.wait_idle().await;
    match resp.and_then(|r| r.msg) {
        Some(to_daemon::Msg::Unpair(_)) => Ok(()),
        Some(to_daemon::Msg::Error(e)) => bail!("{}", e.message),
        _ => bail!("unexpected reply"),
    }
}
