//! Who the server is to daemons: its PKI, the address they dial, the
//! lifetime of the certificates it signs, and the machines it refuses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::pki::Pki;
use crate::tls::RevokedSet;

pub struct ServerIdentity {
    pub pki: Pki,
    /// Machine IDs whose certificates are refused at the TLS layer.
    pub revoked: Arc<RevokedSet>,
    /// HOST:PORT daemons dial (goes into pairing tokens).
    pub public_addr: String,
    pub quic_addr: SocketAddr,
    /// Lifetime of machine certificates.
    pub cert_ttl: Duration,
}
