//! How the daemon reaches the server, for `byomd run` and `byomd doctor`
//! alike: QUIC first, and when UDP gets no answer the same QUIC tunnelled
//! in TLS over TCP; and how to read a close that says the server is done
//! with this machine (revoked, unknown). Kept apart from the session loop
//! in [`super`] so the doctor's probes dial exactly as the daemon does.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use byom_protocol::close;

use super::CONNECT_TIMEOUT;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    Quic,
    Tcp,
}

impl Transport {
    pub(super) fn name(self) -> &'static str {
        match self {
            Transport::Quic => "quic",
            Transport::Tcp => "tcp",
        }
    }
}

/// How long QUIC may stay silent before the daemon tries TCP.
pub(super) const QUIC_FALLBACK_AFTER: Duration = Duration::from_secs(3);
/// How often a daemon on the TCP fallback checks whether QUIC works again.
const QUIC_PROBE_EVERY: Duration = Duration::from_secs(30);

pub(super) fn quic_probe_interval() -> Duration {
    std::env::var("BYOMD_QUIC_PROBE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(QUIC_PROBE_EVERY)
}

pub(super) enum QuicFail {
    /// Nothing answered: UDP may be blocked.
    NoAnswer,
    /// The server answered and refused.
    Refused(quinn::ConnectionError),
    Other(anyhow::Error),
}

pub(super) async fn connect_quic(
    addr: std::net::SocketAddr,
    cfg: quinn::ClientConfig,
    wait: Duration,
) -> Result<(quinn::Connection, quinn::Endpoint), QuicFail> {
    let endpoint = crate::pair::client_endpoint(addr).map_err(QuicFail::Other)?;
    let connecting = endpoint
        .connect_with(cfg, addr, byom_protocol::SERVER_NAME)
        .map_err(|e| QuicFail::Other(e.into()))?;
    match tokio::time::timeout(wait, connecting).await {
        Err(_) => Err(QuicFail::NoAnswer),
        Ok(Err(quinn::ConnectionError::TimedOut)) => Err(QuicFail::NoAnswer),
        Ok(Err(e)) => Err(QuicFail::Refused(e)),
        Ok(Ok(c)) => Ok((c, endpoint)),
    }
}

/// The TCP fallback: TLS 1.3 to the server (CA pinned), then QUIC through
/// it, so everything above the connection stays the same.
pub(super) async fn connect_tcp(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    cfg: quinn::ClientConfig,
) -> anyhow::Result<(quinn::Connection, quinn::Endpoint)> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .context("TCP connect timed out")??;
    tcp.set_nodelay(true)?;
    let tls = crate::tls::tunnel_client_config(ca_pem)?;
    let name = rustls::pki_types::ServerName::try_from(byom_protocol::SERVER_NAME)?;
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_rustls::TlsConnector::from(Arc::new(tls)).connect(name, tcp),
    )
    .await
    .context("TLS handshake timed out")??;
    let socket = Arc::new(byom_wire::tunnel::StreamSocket::new());
    let peer = socket.attach(stream, addr.to_string());
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        None,
        socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    let conn = tokio::time::timeout(
        CONNECT_TIMEOUT,
        endpoint.connect_with(cfg, peer, byom_protocol::SERVER_NAME)?,
    )
    .await
    .context("QUIC handshake over TCP timed out")??;
    Ok((conn, endpoint))
}

/// Whether the server has closed `conn` for good (revoked, unknown). Read
/// it before closing the connection ourselves: quinn then replaces the
/// peer's reason with `LocallyClosed`.
pub(super) fn revoked(conn: &quinn::Connection) -> Option<String> {
    conn.close_reason().as_ref().and_then(closed_for_good)
}

pub(crate) fn closed_for_good(e: &quinn::ConnectionError) -> Option<String> {
    match e {
        quinn::ConnectionError::ApplicationClosed(c) => {
            let reason = String::from_utf8_lossy(&c.reason).into_owned();
            let code = c.error_code.into_inner();
            if code == close::REVOKED as u64 {
                Some(format!("this machine was revoked: {reason}"))
            } else if code == close::UNKNOWN_MACHINE as u64 {
                Some(format!(
                    "the server does not know this machine: {reason}; pair it again"
                ))
            } else {
                None
            }
        }
        // TLS alert certificate_revoked (44) from the server's verifier.
        quinn::ConnectionError::ConnectionClosed(c)
            if c.error_code == quinn::TransportErrorCode::crypto(44) =>
        {
            Some("this machine's certificate was revoked by the server".into())
        }
        _ => None,
    }
}
