//! Who the server is to daemons: its PKI, the address they dial, the
//! lifetime of the certificates it signs, and the machines it refuses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::pki::Pki;
use crate::tls::RevokedSet;

pub struct ServerIdentity {
    pub pki: Pki,
    /// What laptops download from us: the installer and the release.
    pub site: Arc<crate::dist::Site>,
    /// Machine IDs whose certificates are refused at the TLS layer.
    pub revoked: Arc<RevokedSet>,
    /// HOST:PORT daemons dial (goes into pairing tokens).
    pub public_addr: String,
    pub quic_addr: SocketAddr,
    /// Lifetime of machine certificates.
    pub cert_ttl: Duration,
    /// Derives the secret of a token created with an idempotency key, so a
    /// retry can show the same secret without it ever being stored.
    pub token_key: Vec<u8>,
}

impl ServerIdentity {
    /// The secret of the token `caller` creates with idempotency key `key`.
    pub fn token_secret(&self, caller: &str, key: &str) -> [u8; 32] {
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.token_key);
        let tag = ring::hmac::sign(&k, format!("token\0{caller}\0{key}").as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }
}
