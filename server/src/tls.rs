//! TLS configurations: the QUIC gateway (machine certificates, optional so
//! pairing can happen on the same port), the admin API (admin certificates
//! required) and the TCP fallback's outer layer. TLS 1.3 only, ring
//! provider only. (The CLI's side is in `byom-api`.)

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use byom_protocol::limits;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore};

use crate::pki::{self, Pki, Role};

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Machine IDs whose certificates are refused. Loaded from the store at start
/// and updated on revoke; the gateway re-checks the store after the handshake
/// because a resumed TLS session does not run the verifier again.
#[derive(Default, Debug)]
pub struct RevokedSet(RwLock<HashSet<String>>);

impl RevokedSet {
    pub fn insert(&self, id: &str) {
        if let Ok(mut s) = self.0.write() {
            s.insert(id.to_string());
        }
    }
    pub fn contains(&self, id: &str) -> bool {
        self.0.read().map(|s| s.contains(id)).unwrap_or(true)
    }
}

/// Verifies machine certificates against the CA, refuses revoked machines,
/// and accepts a machine certificate up to [`limits::CERT_EXPIRED_GRACE`]
/// past its expiry so a machine back from a long absence can renew with its
/// existing key (the gateway then only lets it renew).
#[derive(Debug)]
struct MachineVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    revoked: Arc<RevokedSet>,
}

impl ClientCertVerifier for MachineVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        // Pairing connections have no certificate yet.
        false
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let info = pki::inspect(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        let Some(Role::Machine(id)) = &info.role else {
            return Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ));
        };
        if self.revoked.contains(id) {
            return Err(rustls::Error::InvalidCertificate(CertificateError::Revoked));
        }
        match self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            )) => {
                let grace_end = info.not_after_ms / 1000 + limits::CERT_EXPIRED_GRACE.as_secs();
                if now.as_secs() > grace_end {
                    return Err(rustls::Error::InvalidCertificate(CertificateError::Expired));
                }
                // Check everything else as of the moment before expiry.
                let at = UnixTime::since_unix_epoch(Duration::from_secs(
                    (info.not_after_ms / 1000).saturating_sub(1),
                ));
                self.inner.verify_client_cert(end_entity, intermediates, at)
            }
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn roots(pki: &Pki) -> Result<Arc<RootCertStore>, rustls::Error> {
    let mut roots = RootCertStore::empty();
    roots.add(pki.ca_der.clone())?;
    Ok(Arc::new(roots))
}

fn server_chain(pki: &Pki) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    (
        // The CA goes along so a pairing daemon can match it to its pin.
        vec![pki.server_cert_der.clone(), pki.ca_der.clone()],
        PrivateKeyDer::Pkcs8(pki.server_key_der.clone_key()),
    )
}

/// rustls config for the daemon gateway (QUIC and its TCP fallback).
pub fn gateway_config(
    pki: &Pki,
    revoked: Arc<RevokedSet>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let provider = provider();
    let inner = WebPkiClientVerifier::builder_with_provider(roots(pki)?, provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    let verifier = Arc::new(MachineVerifier { inner, revoked });
    let (chain, key) = server_chain(pki);
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![byom_protocol::ALPN.to_vec()];
    // Every connection runs the verifier: no session resumption.
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    Ok(cfg)
}

pub fn quic_server_config(
    pki: &Pki,
    revoked: Arc<RevokedSet>,
) -> anyhow::Result<quinn::ServerConfig> {
    let tls = gateway_config(pki, revoked)?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_idle_timeout(Some(limits::QUIC_IDLE_TIMEOUT.try_into()?))
        .keep_alive_interval(Some(limits::QUIC_KEEP_ALIVE))
        .max_concurrent_bidi_streams(limits::MAX_CONCURRENT_STREAMS.into())
        .max_concurrent_uni_streams(0u32.into());
    cfg.transport_config(Arc::new(transport));
    Ok(cfg)
}

/// rustls config for the admin gRPC API: an admin client certificate from
/// our CA is required (the role is checked after the handshake).
pub fn api_server_config(pki: &Pki) -> anyhow::Result<rustls::ServerConfig> {
    let provider = provider();
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots(pki)?, provider.clone()).build()?;
    let (chain, key) = server_chain(pki);
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The verified role of a peer, from its certificate chain.
pub fn peer_role(certs: Option<&[CertificateDer<'_>]>) -> Option<(Role, pki::CertInfo)> {
    let first = certs?.first()?;
    let info = pki::inspect(first).ok()?;
    Some((info.role.clone()?, info))
}

/// rustls config for the webhook port: the operator's certificate and key
/// (PEM files; what GitHub and Slack can verify) or, without them, the
/// server's own. TLS 1.2 too: webhook senders are other people's servers.
pub fn webhook_server_config(
    pki: &Pki,
    cert_key: Option<(&std::path::Path, &std::path::Path)>,
) -> anyhow::Result<rustls::ServerConfig> {
    use anyhow::Context;
    use rustls_pki_types::pem::PemObject;
    let (chain, key) = match cert_key {
        None => server_chain(pki),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("cannot read certificates from {}", cert.display()))?;
            if chain.is_empty() {
                anyhow::bail!("{} holds no certificate", cert.display());
            }
            let key = PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("cannot read a private key from {}", key.display()))?;
            (chain, key)
        }
    };
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the webhook certificate and key do not make a TLS identity")?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// ALPN of the TCP fallback's outer TLS layer.
pub const TUNNEL_ALPN: &[u8] = b"byom-tcp/1";

/// rustls config for the outer TLS of the TCP fallback: the server proves
/// itself with the same certificate; the machine authenticates inside, in
/// the tunnelled QUIC handshake.
pub fn tunnel_server_config(pki: &Pki) -> anyhow::Result<rustls::ServerConfig> {
    let (chain, key) = server_chain(pki);
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    // The tunnel first: rustls picks the first of ours the client offers.
    cfg.alpn_protocols = vec![TUNNEL_ALPN.to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}
