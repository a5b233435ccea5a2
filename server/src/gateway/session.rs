//! An authenticated machine's connection: Hello (what it runs and holds,
//! its policy digest, whether its owner paused it), re-attaching to or
//! losing its unfinished commands, the heartbeat on the control stream,
//! one-off requests (renew, unpair, ping) and the dispatcher for its queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use byom_protocol::pb::{self, to_daemon, to_server, ToDaemon, ToServer};
use byom_protocol::{close, limits, names};
use byom_wire::{read_frame, write_frame, WireError};

use super::streams::{self, Mode};
use super::{error_frame, Gateway, Transport, FIRST_FRAME_TIMEOUT};
use crate::commands::queue::Action;
use crate::live::LiveMachine;

/// `last_seen` is written to the store at most this often per machine.
const LAST_SEEN_WRITE_EVERY: Duration = Duration::from_secs(30);

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Most read-only programs (and scrub patterns) a daemon may declare.
const MAX_READ_ONLY: usize = 64;

/// What a daemon says about itself, without control characters and cut to
/// `max` characters: it is shown to people.
fn printable(s: &str, max: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// A daemon's list of programs or patterns, bounded and printable.
fn printable_list(l: &[String]) -> Vec<String> {
    l.iter()
        .take(MAX_READ_ONLY)
        .map(|p| printable(p, 64))
        .filter(|p| !p.is_empty())
        .collect()
}

/// An authenticated machine's connection: Hello, then the control stream,
/// request streams and its commands until it ends.
pub(super) async fn serve(
    gw: Gateway,
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
        respond(&gw, &machine.id, send, first, true).await?;
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
                &gw,
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
            let _ = ctl_send.finish();
            let _ = tokio::time::timeout(Duration::from_secs(1), ctl_send.stopped()).await;
            conn.close(close::PROTOCOL.into(), b"expected Hello");
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
    let now = byom_wire::now_ms();
    let live = Arc::new(LiveMachine::new(
        machine.id.clone(),
        conn.clone(),
        hello.instance_id.clone(),
        GENERATION.fetch_add(1, Ordering::Relaxed),
        (hello.max_concurrency as usize).clamp(1, limits::MAX_CONCURRENT_COMMANDS),
        hello.paused,
    ));
    let m = gw.store.update_machine(&machine.id, |m| {
        m.last_seen_ms = now;
        m.version = printable(&hello.version, 64);
        m.os = printable(&hello.os, 32);
        m.arch = printable(&hello.arch, 32);
        m.hostname = printable(&hello.hostname, 255);
        m.instance_id = hello.instance_id.clone();
        m.remote_addr = remote.clone();
        m.offline_reason.clear();
        m.asleep_since_ms = 0;
        m.policy_digest = printable(&hello.policy_digest, 64);
        m.policy_summary = printable(&hello.policy_summary, 256);
        m.paused = hello.paused;
        m.read_only = printable_list(&hello.read_only);
        m.env_scrub = printable_list(&hello.env_scrub);
        m.sandbox = printable(&hello.sandbox, 512);
        m.transport = transport.name.to_string();
        // The machine's own labels fill in; an admin's win.
        for (k, v) in hello.labels.iter().take(limits::MAX_LABELS) {
            if let Err(e) = names::check_label(k, v) {
                tracing::warn!(machine = %machine.id, "label from the daemon ignored: {e}");
                continue;
            }
            if m.labels.len() < limits::MAX_LABELS {
                m.labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        Ok(())
    })?;
    if let Some(prev) = gw.live.insert(live.clone()) {
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
                dist_version: gw.identity.site.shipped_version().to_string(),
                server_addrs: gw.live.cluster.addrs(),
            })),
        },
    )
    .await?;

    for (c, action) in gw.commands.reconcile(&live, &hello).await {
        let mode = match action {
            Action::Attach => Mode::Attach,
            _ => Mode::Exec,
        };
        streams::spawn_drive(&gw, &live, c, mode, false);
    }

    let reason = tokio::select! {
        r = control_loop(&gw, &live, &mut ctl_send, &mut ctl_recv) => r,
        r = accept_requests(&gw, &live) => r,
        r = streams::dispatch_loop(&gw, &live) => r,
        _ = gw.shutdown.cancelled() => "server shutting down".to_string(),
    };
    tracing::info!(machine = %live.machine_id, "machine disconnected: {reason}");
    conn.close(close::NORMAL.into(), reason.as_bytes());
    if gw.live.remove_if(&live.machine_id, live.generation) {
        let _ = gw.store.update_machine(&live.machine_id, |m| {
            m.last_seen_ms = byom_wire::now_ms();
            m.offline_reason = if m.asleep_since_ms != 0 {
                "asleep (it said it was going to sleep)".into()
            } else {
                reason.clone()
            };
            Ok(())
        });
    }
    Ok(())
}

/// Reads the control stream: heartbeats in, pongs out. Returns why it ended.
async fn control_loop(
    gw: &Gateway,
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
                let name = gw
                    .store
                    .get_machine(&live.machine_id)
                    .ok()
                    .flatten()
                    .map(|m| m.name)
                    .unwrap_or_default();
                let pong = ToDaemon {
                    msg: Some(to_daemon::Msg::Pong(pb::Pong {
                        seq: p.seq,
                        server_time_ms: byom_wire::now_ms(),
                        machine_name: name,
                    })),
                };
                if let Err(e) = write_frame(send, &pong).await {
                    return format!("connection lost: {e}");
                }
                if last_write.elapsed() >= LAST_SEEN_WRITE_EVERY {
                    last_write = std::time::Instant::now();
                    let _ = gw.store.update_machine(&live.machine_id, |m| {
                        m.last_seen_ms = byom_wire::now_ms();
                        Ok(())
                    });
                }
            }
            Some(to_server::Msg::Status(st)) => {
                tracing::info!(machine = %live.machine_id, paused = st.paused, sleeping = st.sleeping, "daemon status");
                let now = byom_wire::now_ms();
                let _ = gw.store.update_machine(&live.machine_id, |m| {
                    m.paused = st.paused;
                    if st.sleeping {
                        m.asleep_since_ms = now;
                    }
                    Ok(())
                });
                if st.sleeping {
                    // Durable before the machine falls silent.
                    let _ = gw.store.flush_async().await;
                }
                // Resuming wakes the dispatcher.
                live.set_paused(st.paused);
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
async fn accept_requests(gw: &Gateway, live: &Arc<LiveMachine>) -> String {
    loop {
        let (send, mut recv) = match live.conn.accept_bi().await {
            Ok(s) => s,
            Err(e) => return format!("connection lost: {e}"),
        };
        let gw = gw.clone();
        let id = live.machine_id.clone();
        tokio::spawn(async move {
            let first = match tokio::time::timeout(FIRST_FRAME_TIMEOUT, read_frame(&mut recv)).await
            {
                Ok(Ok(f)) => f,
                _ => return,
            };
            if let Err(e) = respond(&gw, &id, send, first, false).await {
                tracing::debug!(machine = %id, "request failed: {e}");
            }
        });
    }
}

/// Answers a one-off request (renew, unpair) on its stream.
async fn respond(
    gw: &Gateway,
    machine_id: &str,
    mut send: quinn::SendStream,
    first: Option<ToServer>,
    renew_only: bool,
) -> Result<(), WireError> {
    let reply = match first.and_then(|f| f.msg) {
        Some(to_server::Msg::Renew(r)) => match renew(gw, machine_id, &r.csr_pem).await {
            Ok(cert_pem) => ToDaemon {
                msg: Some(to_daemon::Msg::Renew(pb::RenewResponse { cert_pem })),
            },
            Err(e) => error_frame("renew_failed", e),
        },
        Some(to_server::Msg::Ping(p)) => ToDaemon {
            msg: Some(to_daemon::Msg::Pong(pb::Pong {
                seq: p.seq,
                server_time_ms: byom_wire::now_ms(),
                machine_name: String::new(),
            })),
        },
        Some(to_server::Msg::Unpair(_)) if !renew_only => {
            let why = "unpaired by the machine";
            match crate::machines::revoke(
                &gw.store,
                &gw.identity,
                &gw.live,
                &gw.commands,
                machine_id,
                why,
            )
            .await
            {
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

async fn renew(gw: &Gateway, machine_id: &str, csr_pem: &str) -> Result<String, String> {
    let m = gw
        .store
        .get_machine(machine_id)
        .map_err(|e| e.to_string())?
        .ok_or("unknown machine")?;
    let (cert, spki, not_after) = gw
        .identity
        .pki
        .sign_machine(csr_pem, machine_id, gw.identity.cert_ttl)
        .map_err(|e| e.to_string())?;
    if spki != m.public_key_sha256 {
        return Err("renewal must use the key the machine paired with".into());
    }
    gw.store
        .update_machine(machine_id, |m| {
            m.cert_not_after_ms = not_after;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    gw.store.flush_async().await.map_err(|e| e.to_string())?;
    tracing::info!(machine = %machine_id, "certificate renewed");
    Ok(cert)
}
