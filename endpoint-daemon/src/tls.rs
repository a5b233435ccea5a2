//! The daemon's TLS: it trusts exactly one CA. At pairing it knows only the
//! CA's SHA-256 (from the token) and accepts a server chain only if it
//! contains a certificate with that hash that signed the server certificate.
//! Afterwards it uses the CA certificate it pinned.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore};

pub use byom_wire::{hex, sha256};

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Verifies the server against a CA known only by its SHA-256.
#[derive(Debug)]
struct PinnedCa {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| sha256(c) == self.pin)
            .ok_or_else(|| {
                rustls::Error::General(
                    "the server's CA does not match the fingerprint in the pairing token".into(),
                )
            })?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let inner =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        inner.verify_server_cert(end_entity, &[], server_name, ocsp, now)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn finish(mut cfg: rustls::ClientConfig) -> anyhow::Result<quinn::ClientConfig> {
    cfg.alpn_protocols = vec![byom_protocol::ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(cfg)?;
    let mut c = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_idle_timeout(Some(byom_protocol::limits::QUIC_IDLE_TIMEOUT.try_into()?))
        .keep_alive_interval(Some(byom_protocol::limits::QUIC_KEEP_ALIVE))
        .max_concurrent_bidi_streams(byom_protocol::limits::MAX_CONCURRENT_STREAMS.into())
        // The server opens one per command with a streamed stdin.
        .max_concurrent_uni_streams(byom_protocol::limits::MAX_CONCURRENT_STREAMS.into());
    c.transport_config(Arc::new(transport));
    Ok(c)
}

/// Client config for pairing: no client certificate, CA pinned by hash.
pub fn pairing_config(ca_sha256: [u8; 32]) -> anyhow::Result<quinn::ClientConfig> {
    let provider = provider();
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCa {
            pin: ca_sha256,
            provider,
        }))
        .with_no_client_auth();
    finish(cfg)
}

/// Client config for a paired machine: pinned CA and its own certificate.
pub fn machine_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> anyhow::Result<quinn::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes())?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert], key)?;
    // Each connection presents the certificate afresh, so a renewed or
    // revoked one takes effect at once.
    cfg.resumption = rustls::client::Resumption::disabled();
    finish(cfg)
}

/// Expiry (ms since epoch) and lifetime of a certificate PEM.
pub fn cert_validity(cert_pem: &str) -> Option<(u64, u64)> {
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let nb = cert.validity().not_before.timestamp().max(0) as u64 * 1000;
    let na = cert.validity().not_after.timestamp().max(0) as u64 * 1000;
    Some((na, na.saturating_sub(nb)))
}

pub fn pem_der(pem: &str) -> anyhow::Result<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    Ok(CertificateDer::from_pem_slice(pem.as_bytes())?)
}

/// Outer TLS of the TCP fallback: server verified against the pinned CA,
/// no client certificate (the machine authenticates in the QUIC inside).
pub fn tunnel_client_config(ca_pem: &str) -> anyhow::Result<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"byom-tcp/1".to_vec()];
    Ok(cfg)
}
