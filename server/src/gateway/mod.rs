//! The daemon gateway: accepts QUIC connections (directly or through the
//! TCP fallback's tunnel), pairs new machines ([`pairing`]), authenticates
//! paired ones and runs their control stream ([`session`]), and drives one
//! stream per command ([`streams`]).
//!
//! Invariants: a command is written `dispatched` (and flushed) before its
//! ExecRequest is sent; its exit is persisted and flushed before the daemon
//! gets the ResultAck that lets it forget the result. A command dispatched to
//! a daemon process that has since restarted becomes `lost`, never re-run.
//! Command state is written only through [`Commands`]; how the daemon runs
//! a command is its own business.

mod pairing;
mod session;
mod streams;

use std::sync::Arc;
use std::time::Duration;

use byom_protocol::close;
use byom_protocol::pb::{self, to_daemon, ToDaemon};
use byom_store::Store;
use tokio_util::sync::CancellationToken;

use crate::commands::Commands;
use crate::identity::ServerIdentity;
use crate::live::LiveMachines;
use crate::pki::Role;

/// Time a new connection has to send its first frame.
const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a QUIC handshake may take (a daemon's takes milliseconds).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the gateway works with.
#[derive(Clone)]
pub struct Gateway {
    pub store: Store,
    pub identity: Arc<ServerIdentity>,
    pub live: Arc<LiveMachines>,
    pub commands: Commands,
    pub shutdown: CancellationToken,
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
    /// Admission of handshakes (None: admitted before, as tunnels are).
    pub gate: Option<Arc<crate::gate::Gate>>,
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

/// Admits a new QUIC connection, or says no without keeping any state: a
/// stateless Retry (the client must prove its address) once many
/// handshakes are in flight, silence to an address over its share.
fn admit(
    incoming: quinn::Incoming,
    gate: &Arc<crate::gate::Gate>,
) -> Option<(quinn::Incoming, crate::gate::Ticket)> {
    use crate::gate::{Refused, QUIC_RETRY_ABOVE};
    if gate.held() >= QUIC_RETRY_ABOVE
        && !incoming.remote_address_validated()
        && incoming.may_retry()
    {
        let _ = incoming.retry();
        return None;
    }
    match gate.admit(incoming.remote_address().ip()) {
        Ok(t) => Some((incoming, t)),
        Err(Refused::PerAddress) => {
            incoming.ignore();
            None
        }
        Err(Refused::Full) => {
            incoming.refuse();
            None
        }
    }
}

/// Accepts connections on `endpoint` until shutdown.
pub async fn serve(gw: Gateway, endpoint: quinn::Endpoint, transport: Arc<Transport>) {
    loop {
        let incoming = tokio::select! {
            _ = gw.shutdown.cancelled() => return,
            i = endpoint.accept() => match i { Some(i) => i, None => return },
        };
        let (incoming, ticket) = match &transport.gate {
            Some(gate) => match admit(incoming, gate) {
                Some((i, t)) => (i, Some(t)),
                None => continue,
            },
            None => (incoming, None),
        };
        let gw = gw.clone();
        let transport = transport.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_TIMEOUT, incoming) => match r {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, "handshake failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%remote, "handshake timed out");
                        return;
                    }
                },
                _ = crate::gate::evicted(&ticket) => return,
            };
            if let Some(t) = &transport.tunnel {
                t.established(&remote);
            }
            // A machine's certificate passed the verifier: no stranger. A
            // pairing connection stays one until it has paired.
            let ticket = match peer_certs(&conn) {
                Some(c) if !c.is_empty() => None,
                _ => ticket,
            };
            let result = tokio::select! {
                r = handle_connection(gw, conn.clone(), &transport) => r,
                _ = crate::gate::evicted(&ticket) => Err(anyhow::anyhow!("too many connections pairing at once; try again")),
            };
            drop(ticket);
            if let Some(t) = &transport.tunnel {
                t.detach(&remote);
            }
            if let Err(e) = result {
                tracing::debug!(%remote, "connection ended: {e}");
                // Say why, with the code that tells a daemon it sent
                // something wrong (a close with no code reads as normal).
                let why: String = e.to_string().chars().take(200).collect();
                conn.close(close::PROTOCOL.into(), why.as_bytes());
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
    gw: Gateway,
    conn: quinn::Connection,
    transport: &Transport,
) -> anyhow::Result<()> {
    let certs = peer_certs(&conn);
    let Some(certs) = certs.filter(|c| !c.is_empty()) else {
        return pairing::serve(gw, conn, transport).await;
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
    let machine = match gw.store.get_machine(&machine_id)? {
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
    let expired = info.not_after_ms <= byom_wire::now_ms();
    session::serve(gw, conn, machine, expired, transport).await
}
