//! The daemon gateway: accepts QUIC connections, pairs new machines,
//! authenticates paired ones, runs the control stream (Hello, heartbeat,
//! renewal), and drives one stream per command.
//!
//! Invariants: a command is written `dispatched` (and flushed) before its
//! ExecRequest is sent; its exit is persisted and flushed before the daemon
//! gets the ResultAck that lets it forget the result. A command dispatched to
//! a daemon process that has since restarted becomes `lost`, never re-run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use byom_protocol::id::MachineId;
use byom_protocol::pb::{self, to_daemon, to_server, CommandState, ToDaemon, ToServer};
use byom_protocol::token::PairingToken;
use byom_protocol::{close, limits};
use tokio::sync::mpsc;

use crate::pki::{hex, now_ms, sha256, Role};
use crate::reconcile::Action;
use crate::server::Shared;
use byom_wire::{read_frame, write_frame, WireError};

/// States of a command the daemon has (or may have) received.
const ACTIVE: &[CommandState] = &[
    CommandState::Dispatched,
    CommandState::Running,
    CommandState::AwaitingLocalApproval,
];

/// Time a new connection has to send its first frame.
const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections being handshaken or paired at once.
const MAX_CONNECTING: usize = 1024;
/// `last_seen` is written to the store at most this often per machine.
const LAST_SEEN_WRITE_EVERY: Duration = Duration::from_secs(30);

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// A connected daemon.
pub struct LiveMachine {
    pub machine_id: String,
    pub conn: quinn::Connection,
    pub instance_id: String,
    pub generation: u64,
    pub max_concurrency: usize,
    pub connected_at_ms: u64,
    /// Commands with an open stream on this connection → their cancel sender.
    pub active: Mutex<HashMap<String, mpsc::Sender<String>>>,
    /// Serializes dispatch decisions for this machine.
    pub dispatch_lock: tokio::sync::Mutex<()>,
    /// The owner paused the daemon: dispatch nothing.
    pub paused: std::sync::atomic::AtomicBool,
}

impl LiveMachine {
    pub fn active_count(&self) -> usize {
        self.active.lock().map(|a| a.len()).unwrap_or(0)
    }
    pub fn cancel(&self, cmd: &str, reason: &str) -> bool {
        let tx = self.active.lock().ok().and_then(|a| a.get(cmd).cloned());
        match tx {
            Some(tx) => tx.try_send(reason.to_string()).is_ok(),
            None => false,
        }
    }
}

fn error_frame(code: &str, message: impl Into<String>) -> ToDaemon {
    ToDaemon {
        msg: Some(to_daemon::Msg::Error(pb::ErrorReply {
            code: code.into(),
            message: message.into(),
        })),
    }
}

/// Which listener a connection came through.
pub struct Transport {
    pub name: &'static str,
    /// The TCP fallback's tunnel, which knows the real peer addresses.
    pub tunnel: Option<Arc<byom_wire::tunnel::StreamSocket>>,
}

impl Transport {
    /// The peer's real address (not the tunnel's synthetic one).
    fn peer(&self, addr: std::net::SocketAddr) -> String {
        self.tunnel
            .as_ref()
            .and_then(|t| t.real_addr(&addr))
            .unwrap_or_else(|| addr.to_string())
    }
}

pub async fn serve(shared: Arc<Shared>, endpoint: quinn::Endpoint, transport: Arc<Transport>) {
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTING));
    loop {
        let incoming = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            i = endpoint.accept() => match i { Some(i) => i, None => return },
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            incoming.refuse();
            continue;
        };
        let shared = shared.clone();
        let transport = transport.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(%remote, "handshake failed: {e}");
                    return;
                }
            };
            drop(permit);
            if let Err(e) = handle_connection(shared, conn.clone(), &transport).await {
                tracing::debug!(%remote, "connection ended: {e}");
            }
        });
    }
}

fn peer_certs(conn: &quinn::Connection) -> Option<Vec<rustls::pki_types::CertificateDer<'static>>> {
    conn.peer_identity()?
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()
        .map(|b| *b)
}

async fn handle_connection(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    transport: &Transport,
) -> anyhow::Result<()> {
    let certs = peer_certs(&conn);
    let Some(certs) = certs.filter(|c| !c.is_empty()) else {
        return serve_pairing(shared, conn, transport).await;
    };
    let Some((role, info)) = crate::tls::peer_role(Some(&certs)) else {
        conn.close(close::PROTOCOL.into(), b"unknown certificate role");
        return Ok(());
    };
    let Role::Machine(machine_id) = role else {
        conn.close(close::PROTOCOL.into(), b"not a machine certificate");
        return Ok(());
    };
    // Re-check against the store: resumed sessions skip the verifier, and the
    // store is the truth about revocation and the machine's key.
    let machine = match shared.store.get_machine(&machine_id)? {
        Some(m) if !m.revoked && m.public_key_sha256 == info.spki_sha256 => m,
        Some(m) if m.revoked => {
            conn.close(
                close::REVOKED.into(),
                b"machine revoked: pair again with a new token",
            );
            return Ok(());
        }
        _ => {
            conn.close(
                close::UNKNOWN_MACHINE.into(),
                b"unknown machine: pair again with a new token",
            );
            return Ok(());
        }
    };
    let expired = info.not_after_ms <= now_ms();
    serve_machine(shared, conn, machine, expired, transport).await
}

// ───────────────────────── pairing ─────────────────────────

async fn serve_pairing(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    transport: &Transport,
) -> anyhow::Result<()> {
    let (mut send, mut recv) =
        tokio::time::timeout(FIRST_FRAME_TIMEOUT, conn.accept_bi()).await??;
    let first: Option<ToServer> =
        tokio::time::timeout(FIRST_FRAME_TIMEOUT, read_frame(&mut recv)).await??;
    let reply = match first.and_then(|f| f.msg) {
        Some(to_server::Msg::Pair(req)) => {
            match pair(&shared, req, transport.peer(conn.remote_address())).await {
                Ok(resp) => ToDaemon {
                    msg: Some(to_daemon::Msg::Pair(resp)),
                },
                Err((code, msg)) => error_frame(code, msg),
            }
        }
        _ => error_frame(
            "unauthenticated",
            "this connection has no client certificate: only pairing is allowed",
        ),
    };
    write_frame(&mut send, &reply).await?;
    send.finish()?;
    // Let the reply drain before the connection goes.
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
    Ok(())
}

/// Names are lower-case ASCII words that cannot be mistaken for IDs.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= limits::MAX_NAME_LEN
        && sanitize_name(s) == s
        && byom_protocol::id::Kind::of(s).is_none()
}

/// Turns any hostname into a valid machine name.
pub fn sanitize_name(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(limits::MAX_NAME_LEN - 4)
        .collect();
    if out.is_empty() {
        out = "machine".into();
    }
    out
}

async fn pair(
    shared: &Shared,
    req: pb::PairRequest,
    remote: String,
) -> Result<pb::PairResponse, (&'static str, String)> {
    let internal = |e: &dyn std::fmt::Display| ("internal", format!("server error: {e}"));
    let token = PairingToken::parse(&req.token).map_err(|e| ("bad_token", e.to_string()))?;
    if token.ca_sha256 != shared.pki.ca_sha256 {
        return Err((
            "bad_token",
            "this token was made by a different server".into(),
        ));
    }
    let now = now_ms();
    let machine_id = MachineId::new(now).to_string();
    let secret_hash = hex(&sha256(&token.secret));
    // Sign first so a bad CSR does not burn the token.
    let (cert_pem, spki, not_after) = shared
        .pki
        .sign_machine(&req.csr_pem, &machine_id, shared.cert_ttl)
        .map_err(|e| ("bad_csr", e.to_string()))?;
    // Replacing a machine needs a token made for exactly that machine.
    let replaced = if req.replace.is_empty() {
        None
    } else {
        let m = shared
            .store
            .resolve_machine(&req.replace)
            .map_err(|e| internal(&e))?
            .filter(|m| !m.revoked)
            .ok_or_else(|| {
                (
                    "bad_replace",
                    format!("no active machine {:?} to replace", req.replace),
                )
            })?;
        Some(m)
    };
    if let Some(old) = &replaced {
        match shared.store.get_token_by_secret(&secret_hash).map_err(|e| internal(&e))? {
            Some(t) if t.replace_machine == old.id => {}
            _ => {
                return Err((
                    "bad_replace",
                    format!(
                        "this token does not allow replacing {}: create one with `byom token create --replace {}`",
                        old.name, old.name
                    ),
                ))
            }
        }
    }
    let tok = match shared.store.redeem_token(&secret_hash, &machine_id, now) {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err(("token_rejected", e.to_string())),
        Err(e) => return Err(internal(&e)),
    };
    // The admin's choice (the token's name) wins over the machine's.
    let name = if valid_name(&tok.name) {
        tok.name.clone()
    } else if valid_name(&sanitize_name(&req.name)) && !req.name.is_empty() {
        sanitize_name(&req.name)
    } else {
        sanitize_name(&req.hostname)
    };
    let mut labels = tok.labels.clone();
    let name = match &replaced {
        Some(old) => {
            // Free the old name for the new identity; the old one is revoked below.
            let short: String = old
                .id
                .chars()
                .skip(old.id.len().saturating_sub(6))
                .collect();
            shared
                .store
                .rename_machine(&old.id, &format!("{}-replaced-{short}", old.name))
                .map_err(|e| internal(&e))?;
            for (k, v) in &old.labels {
                labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
            old.name.clone()
        }
        None => name,
    };
    let mut m = pb::Machine {
        id: machine_id.clone(),
        name,
        labels,
        created_at_ms: now,
        last_seen_ms: now,
        version: req.version.chars().take(64).collect(),
        os: req.os.chars().take(32).collect(),
        arch: req.arch.chars().take(32).collect(),
        hostname: req.hostname.chars().take(255).collect(),
        public_key_sha256: spki,
        cert_not_after_ms: not_after,
        token_id: tok.id.clone(),
        ..Default::default()
    };
    shared
        .store
        .create_machine(&mut m)
        .map_err(|e| internal(&e))?;
    shared.store.flush_async().await.map_err(|e| internal(&e))?;
    if let Some(old) = &replaced {
        revoke_machine(shared, &old.id, &format!("replaced by {machine_id}"))
            .await
            .map_err(|e| internal(&e))?;
    }
    tracing::info!(machine = %machine_id, name = %m.name, %remote, token = %tok.id, "machine paired");
    Ok(pb::PairResponse {
        machine_id,
        cert_pem,
        ca_pem: shared.pki.ca_pem.clone(),
        name: m.name,
        labels: m.labels,
    })
}

// ───────────────────────── authenticated machines ─────────────────────────

async fn serve_machine(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    machine: pb::Machine,
    expired: bool,
    transport: &Transport,
) -> anyhow::Result<()> {
    let remote = transport.peer(conn.remote_address());
    if expired {
        // Only renewal until it has a valid certificate again.
        let (send, mut recv) =
            tokio::time::timeout(FIRST_FRAME_TIMEOUT, conn.accept_bi()).await??;
        let first = tokio::time::timeout(FIRST_FRAME_TIMEOUT, read_frame(&mut recv)).await??;
        respond(&shared, &machine.id, send, first, true).await?;
        let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
        return Ok(());
    }
    let (mut ctl_send, mut ctl_recv) =
        tokio::time::timeout(FIRST_FRAME_TIMEOUT, conn.accept_bi()).await??;
    let first: Option<ToServer> =
        tokio::time::timeout(FIRST_FRAME_TIMEOUT, read_frame(&mut ctl_recv)).await??;
    let hello = match first.and_then(|f| f.msg) {
        Some(to_server::Msg::Hello(h)) => h,
        Some(
            msg @ (to_server::Msg::Renew(_) | to_server::Msg::Unpair(_) | to_server::Msg::Ping(_)),
        ) => {
            // A one-off request connection (e.g. `byomd unpair`).
            respond(
                &shared,
                &machine.id,
                ctl_send,
                Some(ToServer { msg: Some(msg) }),
                false,
            )
            .await?;
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
            return Ok(());
        }
        _ => {
            write_frame(&mut ctl_send, &error_frame("bad_request", "expected Hello")).await?;
            return Ok(());
        }
    };
    if hello.machine_id != machine.id {
        write_frame(
            &mut ctl_send,
            &error_frame("bad_request", "Hello names another machine"),
        )
        .await?;
        return Ok(());
    }
    if hello.running.len() + hello.held.len() > limits::MAX_HELLO_COMMAND_IDS {
        write_frame(
            &mut ctl_send,
            &error_frame("bad_request", "Hello lists too many commands"),
        )
        .await?;
        return Ok(());
    }
    let now = now_ms();
    let live = Arc::new(LiveMachine {
        machine_id: machine.id.clone(),
        conn: conn.clone(),
        instance_id: hello.instance_id.clone(),
        generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        max_concurrency: (hello.max_concurrency as usize).clamp(1, limits::MAX_CONCURRENT_COMMANDS),
        connected_at_ms: now,
        active: Mutex::new(HashMap::new()),
        dispatch_lock: tokio::sync::Mutex::new(()),
        paused: std::sync::atomic::AtomicBool::new(hello.paused),
    });
    let m = shared.store.update_machine(&machine.id, |m| {
        m.last_seen_ms = now;
        m.version = hello.version.chars().take(64).collect();
        m.os = hello.os.chars().take(32).collect();
        m.arch = hello.arch.chars().take(32).collect();
        m.hostname = hello.hostname.chars().take(255).collect();
        m.instance_id = hello.instance_id.clone();
        m.remote_addr = remote.clone();
        m.offline_reason.clear();
        m.policy_digest = hello.policy_digest.chars().take(64).collect();
        m.policy_summary = hello.policy_summary.chars().take(256).collect();
        m.paused = hello.paused;
        m.transport = transport.name.to_string();
        for (k, v) in hello.labels.iter().take(limits::MAX_LABELS) {
            let ok = |s: &str| s.len() <= limits::MAX_NAME_LEN && !s.chars().any(char::is_control);
            if !k.is_empty() && ok(k) && ok(v) && m.labels.len() < limits::MAX_LABELS {
                m.labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        Ok(())
    })?;
    let previous = shared
        .live
        .lock()
        .ok()
        .and_then(|mut l| l.insert(machine.id.clone(), live.clone()));
    if let Some(prev) = previous {
        prev.conn
            .close(close::REPLACED.into(), b"replaced by a newer connection");
    }
    tracing::info!(machine = %m.id, name = %m.name, %remote, transport = transport.name, instance = %hello.instance_id, "machine connected");
    write_frame(
        &mut ctl_send,
        &ToDaemon {
            msg: Some(to_daemon::Msg::HelloAck(pb::HelloAck {
                server_version: byom_protocol::VERSION.into(),
                server_time_ms: now,
                machine_name: m.name.clone(),
                heartbeat_interval_ms: limits::HEARTBEAT_INTERVAL.as_millis() as u32,
            })),
        },
    )
    .await?;

    reconcile(&shared, &live, &hello).await;

    let reason = tokio::select! {
        r = control_loop(&shared, &live, &mut ctl_send, &mut ctl_recv) => r,
        r = accept_requests(&shared, &live) => r,
        _ = shared.shutdown.cancelled() => "server shutting down".to_string(),
    };
    tracing::info!(machine = %live.machine_id, "machine disconnected: {reason}");
    conn.close(close::NORMAL.into(), reason.as_bytes());
    let ours = {
        let mut l = shared
            .live
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        if l.get(&live.machine_id).map(|x| x.generation) == Some(live.generation) {
            l.remove(&live.machine_id);
            true
        } else {
            false
        }
    };
    if ours {
        let _ = shared.store.update_machine(&live.machine_id, |m| {
            m.last_seen_ms = now_ms();
            m.offline_reason = reason.clone();
            Ok(())
        });
    }
    Ok(())
}

/// Reads the control stream: heartbeats in, pongs out. Returns why it ended.
async fn control_loop(
    shared: &Arc<Shared>,
    live: &LiveMachine,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> String {
    let deadline = limits::HEARTBEAT_INTERVAL * limits::HEARTBEAT_MISSES;
    let mut last_write = std::time::Instant::now();
    loop {
        let frame = match tokio::time::timeout(deadline, read_frame::<ToServer>(recv)).await {
            Err(_) => return format!("heartbeat lost (no frame for {}s)", deadline.as_secs()),
            Ok(Err(e)) => return format!("connection lost: {e}"),
            Ok(Ok(None)) => return "daemon closed the connection".into(),
            Ok(Ok(Some(f))) => f,
        };
        match frame.msg {
            Some(to_server::Msg::Ping(p)) => {
                let pong = ToDaemon {
                    msg: Some(to_daemon::Msg::Pong(pb::Pong {
                        seq: p.seq,
                        server_time_ms: now_ms(),
                    })),
                };
                if let Err(e) = write_frame(send, &pong).await {
                    return format!("connection lost: {e}");
                }
                if last_write.elapsed() >= LAST_SEEN_WRITE_EVERY {
                    last_write = std::time::Instant::now();
                    let _ = shared.store.update_machine(&live.machine_id, |m| {
                        m.last_seen_ms = now_ms();
                        Ok(())
                    });
                }
            }
            Some(to_server::Msg::Status(st)) => {
                live.paused.store(st.paused, Ordering::SeqCst);
                tracing::info!(machine = %live.machine_id, paused = st.paused, "daemon status");
                let _ = shared.store.update_machine(&live.machine_id, |m| {
                    m.paused = st.paused;
                    Ok(())
                });
                if !st.paused {
                    if let Some(l) = shared.live_machine(&live.machine_id) {
                        let shared = shared.clone();
                        tokio::spawn(async move { dispatch_queued(&shared, &l).await });
                    }
                }
            }
            _ => {
                let _ = write_frame(
                    send,
                    &error_frame("bad_request", "unexpected frame on the control stream"),
                )
                .await;
            }
        }
    }
}

/// Serves request streams the daemon opens after Hello (renew, unpair).
async fn accept_requests(shared: &Arc<Shared>, live: &Arc<LiveMachine>) -> String {
    loop {
        let (send, mut recv) = match live.conn.accept_bi().await {
            Ok(s) => s,
            Err(e) => return format!("connection lost: {e}"),
        };
        let shared = shared.clone();
        let id = live.machine_id.clone();
        tokio::spawn(async move {
            let first = match tokio::time::timeout(FIRST_FRAME_TIMEOUT, read_frame(&mut recv)).await
            {
                Ok(Ok(f)) => f,
                _ => return,
            };
            if let Err(e) = respond(&shared, &id, send, first, false).await {
                tracing::debug!(machine = %id, "request failed: {e}");
            }
        });
    }
}

/// Answers a one-off request (renew, unpair) on its stream.
async fn respond(
    shared: &Arc<Shared>,
    machine_id: &str,
    mut send: quinn::SendStream,
    first: Option<ToServer>,
    renew_only: bool,
) -> Result<(), WireError> {
    let reply = match first.and_then(|f| f.msg) {
        Some(to_server::Msg::Renew(r)) => match renew(shared, machine_id, &r.csr_pem).await {
            Ok(cert_pem) => ToDaemon {
                msg: Some(to_daemon::Msg::Renew(pb::RenewResponse { cert_pem })),
            },
            Err(e) => error_frame("renew_failed", e),
        },
        Some(to_server::Msg::Ping(p)) => ToDaemon {
            msg: Some(to_daemon::Msg::Pong(pb::Pong {
                seq: p.seq,
                server_time_ms: now_ms(),
            })),
        },
        Some(to_server::Msg::Unpair(_)) if !renew_only => {
            match revoke_machine(shared, machine_id, "unpaired by the machine").await {
                Ok(_) => ToDaemon {
                    msg: Some(to_daemon::Msg::Unpair(pb::UnpairResponse {})),
                },
                Err(e) => error_frame("internal", e.to_string()),
            }
        }
        _ if renew_only => error_frame(
            "cert_expired",
            "the machine certificate expired: renew it first",
        ),
        _ => error_frame("bad_request", "unexpected request"),
    };
    write_frame(&mut send, &reply).await?;
    send.finish()?;
    Ok(())
}

async fn renew(shared: &Shared, machine_id: &str, csr_pem: &str) -> Result<String, String> {
    let m = shared
        .store
        .get_machine(machine_id)
        .map_err(|e| e.to_string())?
        .ok_or("unknown machine")?;
    let (cert, spki, not_after) = shared
        .pki
        .sign_machine(csr_pem, machine_id, shared.cert_ttl)
        .map_err(|e| e.to_string())?;
    if spki != m.public_key_sha256 {
        return Err("renewal must use the key the machine paired with".into());
    }
    shared
        .store
        .update_machine(machine_id, |m| {
            m.cert_not_after_ms = not_after;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    shared
        .store
        .flush_async()
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(machine = %machine_id, "certificate renewed");
    Ok(cert)
}

/// Revokes a machine: store first (flushed), then the in-memory set, then
/// the live connection, whose daemon kills its running commands when the
/// connection is closed with the revoked code.
pub async fn revoke_machine(
    shared: &Shared,
    machine_id: &str,
    reason: &str,
) -> crate::store::Result<pb::Machine> {
    let m = shared.store.update_machine(machine_id, |m| {
        if !m.revoked {
            m.revoked = true;
            m.revoked_at_ms = now_ms();
        }
        m.offline_reason = reason.to_string();
        Ok(())
    })?;
    shared.store.flush_async().await?;
    shared.revoked.insert(machine_id);
    if let Some(live) = shared
        .live
        .lock()
        .ok()
        .and_then(|mut l| l.remove(machine_id))
    {
        live.conn.close(close::REVOKED.into(), reason.as_bytes());
    }
    // Nothing will ever run on this machine again.
    let now = now_ms();
    for c in shared.store.pending_commands(machine_id)? {
        let to = if c.state() == CommandState::Queued {
            CommandState::Cancelled
        } else {
            CommandState::Lost
        };
        let _ = shared.store.transition(
            &c.id,
            &[
                CommandState::Queued,
                CommandState::Dispatched,
                CommandState::Running,
                CommandState::AwaitingLocalApproval,
            ],
            to,
            |c| {
                c.reason = format!("machine revoked: {reason}");
                c.finished_at_ms = now;
            },
        );
        shared.notify(&c.id);
    }
    shared.store.flush_async().await?;
    tracing::info!(machine = %machine_id, "machine revoked: {reason}");
    Ok(m)
}

// ───────────────────────── commands ─────────────────────────

/// After Hello: re-attach to commands the daemon still has, mark lost those
/// a restarted daemon can no longer have, and dispatch the queue.
async fn reconcile(shared: &Arc<Shared>, live: &Arc<LiveMachine>, hello: &pb::Hello) {
    let pending = match shared.store.pending_commands(&live.machine_id) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(machine = %live.machine_id, "cannot read the queue: {e}");
            return;
        }
    };
    let now = now_ms();
    let mut changed = false;
    for (id, action) in crate::reconcile::plan(&pending, hello) {
        let Some(c) = pending.iter().find(|c| c.id == id) else {
            continue;
        };
        match action {
            Action::Attach => spawn_drive(shared, live, c.clone(), Mode::Attach),
            Action::Resend => spawn_drive(shared, live, c.clone(), Mode::Exec),
            Action::Lost => {
                let r = shared
                    .store
                    .transition(&id, ACTIVE, CommandState::Lost, |c| {
                        c.reason = crate::reconcile::LOST_REASON.into();
                        c.finished_at_ms = now;
                    });
                if let Err(e) = r {
                    tracing::warn!(cmd = %id, "cannot mark lost: {e}");
                }
                changed = true;
                shared.notify(&id);
            }
        }
    }
    if changed {
        let _ = shared.store.flush_async().await;
    }
    dispatch_queued(shared, live).await;
}

/// Dispatches queued commands of a live machine, oldest first, up to its
/// concurrency.
pub async fn dispatch_queued(shared: &Arc<Shared>, live: &Arc<LiveMachine>) {
    let _guard = live.dispatch_lock.lock().await;
    if live.conn.close_reason().is_some() || live.paused.load(Ordering::SeqCst) {
        return;
    }
    let pending = match shared.store.pending_commands(&live.machine_id) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(machine = %live.machine_id, "cannot read the queue: {e}");
            return;
        }
    };
    let now = now_ms();
    for c in pending {
        if c.state() != CommandState::Queued {
            continue;
        }
        if live.active_count() >= live.max_concurrency {
            break;
        }
        if c.queue_deadline_ms != 0 && now >= c.queue_deadline_ms {
            continue; // the sweeper fails it
        }
        let r = shared.store.transition(
            &c.id,
            &[CommandState::Queued],
            CommandState::Dispatched,
            |c| {
                c.dispatched_at_ms = now;
                c.instance_id = live.instance_id.clone();
            },
        );
        let c = match r {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(cmd = %c.id, "cannot dispatch: {e}");
                continue;
            }
        };
        // Durable before the daemon can act on it.
        if let Err(e) = shared.store.flush_async().await {
            tracing::error!("flush failed, not dispatching: {e}");
            return;
        }
        shared.notify(&c.id);
        spawn_drive(shared, live, c, Mode::Exec);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Exec,
    Attach,
}

fn spawn_drive(shared: &Arc<Shared>, live: &Arc<LiveMachine>, cmd: pb::Command, mode: Mode) {
    let (tx, rx) = mpsc::channel(4);
    if let Ok(mut a) = live.active.lock() {
        a.insert(cmd.id.clone(), tx);
    }
    let shared = shared.clone();
    let live = live.clone();
    tokio::spawn(async move {
        let id = cmd.id.clone();
        if let Err(e) = drive(&shared, &live, cmd, mode, rx).await {
            tracing::debug!(cmd = %id, "command stream ended: {e}");
        }
        if let Ok(mut a) = live.active.lock() {
            a.remove(&id);
        }
        // A slot freed up.
        dispatch_queued(&shared, &live).await;
    });
}

/// Runs one command stream to its end: sends Exec (or Attach), persists
/// what comes back, acknowledges the exit.
async fn drive(
    shared: &Arc<Shared>,
    live: &Arc<LiveMachine>,
    cmd: pb::Command,
    mode: Mode,
    mut cancel_rx: mpsc::Receiver<String>,
) -> anyhow::Result<()> {
    let (mut send, mut recv) = live.conn.open_bi().await?;
    let first = match mode {
        Mode::Exec => to_daemon::Msg::Exec(pb::ExecRequest {
            command_id: cmd.id.clone(),
            argv: cmd.argv.clone(),
            shell: cmd.shell.clone(),
            cwd: cmd.cwd.clone(),
            env: cmd.env.clone(),
            stdin: cmd.stdin.clone(),
            timeout_ms: cmd.timeout_ms,
            requested_by: cmd.requested_by.clone(),
        }),
        Mode::Attach => to_daemon::Msg::Attach(pb::AttachRequest {
            command_id: cmd.id.clone(),
            stdout_offset: shared
                .store
                .output_len(&cmd.id, pb::OutputStream::Stdout as i32)?,
            stderr_offset: shared
                .store
                .output_len(&cmd.id, pb::OutputStream::Stderr as i32)?,
        }),
    };
    write_frame(&mut send, &ToDaemon { msg: Some(first) }).await?;
    if cmd.cancel_requested {
        let cancel = ToDaemon {
            msg: Some(to_daemon::Msg::Cancel(pb::Cancel {
                reason: "cancelled".into(),
            })),
        };
        write_frame(&mut send, &cancel).await?;
    }
    let id = cmd.id.clone();
    let mut stored_bytes = cmd.stdout_bytes + cmd.stderr_bytes;
    let mut running = cmd.state() == CommandState::Running;
    loop {
        let frame = tokio::select! {
            f = read_frame::<ToServer>(&mut recv) => f?,
            Some(reason) = cancel_rx.recv() => {
                let cancel = ToDaemon { msg: Some(to_daemon::Msg::Cancel(pb::Cancel { reason })) };
                write_frame(&mut send, &cancel).await?;
                continue;
            }
        };
        let Some(frame) = frame else {
            anyhow::bail!("daemon closed the stream before the exit record");
        };
        match frame.msg {
            Some(to_server::Msg::Started(s)) => {
                shared.store.transition(
                    &id,
                    &[
                        CommandState::Dispatched,
                        CommandState::AwaitingLocalApproval,
                    ],
                    CommandState::Running,
                    |c| {
                        c.pid = s.pid;
                        c.started_at_ms = s.started_at_ms;
                    },
                )?;
                running = true;
                shared.notify(&id);
            }
            Some(to_server::Msg::Output(o)) => {
                if o.data.len() > limits::MAX_OUTPUT_CHUNK_BYTES {
                    anyhow::bail!("output chunk over the limit");
                }
                stored_bytes += o.data.len() as u64;
                if stored_bytes
                    > limits::MAX_COMMAND_OUTPUT_BYTES + limits::MAX_OUTPUT_CHUNK_BYTES as u64
                {
                    anyhow::bail!("daemon sent more output than the per-command limit");
                }
                let stream = if o.stream == pb::OutputStream::Stderr as i32 {
                    2
                } else {
                    1
                };
                shared.store.append_output(&id, stream, o.offset, &o.data)?;
                // Running is implied by output (the Started frame may have
                // gone to a previous connection); checked once per stream.
                if !running {
                    running = true;
                    let _ = shared.store.transition(
                        &id,
                        &[CommandState::Dispatched],
                        CommandState::Running,
                        |_| {},
                    );
                }
                shared.notify(&id);
            }
            Some(to_server::Msg::Exit(x)) => {
                let state = match x.state() {
                    s if s.is_terminal() => s,
                    _ => CommandState::Failed,
                };
                shared.store.transition(&id, ACTIVE, state, |c| {
                    c.exit_code = x.exit_code;
                    c.signal = x.signal;
                    c.duration_ms = x.duration_ms;
                    c.stdout_bytes = x.stdout_bytes;
                    c.stderr_bytes = x.stderr_bytes;
                    c.truncated = x.truncated;
                    c.reason = x.reason.clone();
                    if c.started_at_ms == 0 {
                        c.started_at_ms = x.started_at_ms;
                    }
                    c.finished_at_ms = if x.finished_at_ms != 0 {
                        x.finished_at_ms
                    } else {
                        now_ms()
                    };
                })?;
                // Durable before the daemon may forget the result.
                shared.store.flush_async().await?;
                shared.notify(&id);
                let ack = ToDaemon {
                    msg: Some(to_daemon::Msg::Ack(pb::ResultAck {})),
                };
                write_frame(&mut send, &ack).await?;
                let _ = send.finish();
                return Ok(());
            }
            Some(to_server::Msg::Approval(a)) => {
                shared.store.transition(
                    &id,
                    &[CommandState::Dispatched],
                    CommandState::AwaitingLocalApproval,
                    |c| {
                        c.reason = format!(
                            "waiting for the machine's owner to approve it locally ({})",
                            a.rule
                        );
                    },
                )?;
                shared.notify(&id);
            }
            Some(to_server::Msg::Error(e)) if e.code == "paused" => {
                // Refused before it started: back in the queue until resume.
                live.paused.store(true, Ordering::SeqCst);
                shared.store.transition(
                    &id,
                    &[CommandState::Dispatched],
                    CommandState::Queued,
                    |c| {
                        c.instance_id.clear();
                        c.dispatched_at_ms = 0;
                    },
                )?;
                shared.store.flush_async().await?;
                shared.notify(&id);
                return Ok(());
            }
            Some(to_server::Msg::Error(e)) => {
                // The daemon refused or no longer knows the command.
                let (state, reason) = match e.code.as_str() {
                    "unknown_command" => (CommandState::Lost, format!("the daemon no longer has this command: {}", e.message)),
                    "already_ran" => (CommandState::Lost, format!("the daemon already ran this command and no longer holds its result: {}", e.message)),
                    _ => (CommandState::Failed, format!("{}: {}", e.code, e.message)),
                };
                shared.store.transition(&id, ACTIVE, state, |c| {
                    c.reason = reason.clone();
                    c.finished_at_ms = now_ms();
                })?;
                shared.store.flush_async().await?;
                shared.notify(&id);
                return Ok(());
            }
            _ => anyhow::bail!("unexpected frame on a command stream"),
        }
    }
}
