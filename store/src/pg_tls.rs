//! TLS to PostgreSQL, as `libpq` reads it from the URL: `sslmode`
//! (`disable`, `prefer` — the default —, `require`, `verify-ca`,
//! `verify-full`) and `sslrootcert` (a PEM file of CA certificates, or
//! `system` for the usual public CAs). Managed databases mostly require
//! TLS, and a replica's store traffic carries every command and secret
//! reference, so a plain connection is only made where the URL allows it.
//!
//! `tokio-postgres` knows only `disable`/`prefer`/`require` and no
//! `sslrootcert`: [`parse`] takes those options out of the URL and keeps
//! the verification here, in a rustls connector. The connection offers
//! SCRAM channel binding (`tls-server-end-point`), so a password login
//! over TLS cannot be relayed by a man in the middle.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::{Result, StoreError};

/// What the URL asks of the server's certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    /// TLS if the server offers it, without checking who it is.
    Prefer,
    /// TLS always, without checking who it is (unless a CA is given, as
    /// `libpq` does: then as `VerifyCa`).
    Require,
    /// TLS, the certificate signed by a trusted CA, any name.
    VerifyCa,
    /// TLS, the certificate signed by a trusted CA and naming the host.
    VerifyFull,
}

/// A URL made ready for `tokio-postgres`, and the connector its TLS
/// options call for.
pub(crate) struct Target {
    pub config: tokio_postgres::Config,
    pub tls: MakeRustls,
    pub mode: Mode,
}

fn bad(msg: impl std::fmt::Display) -> StoreError {
    StoreError::Database(format!("not a PostgreSQL URL: {msg}"))
}

/// Parses `url`, taking out the TLS options `tokio-postgres` does not
/// know and building the connector they describe.
pub(crate) fn parse(url: &str) -> Result<Target> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut mode = None;
    let mut root = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sslmode" => {
                mode = Some(match decode(v)?.as_str() {
                    "disable" => Mode::Disable,
                    "prefer" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    other => {
                        return Err(bad(format!(
                        "sslmode={other}: use disable, prefer, require, verify-ca or verify-full"
                    )))
                    }
                })
            }
            "sslrootcert" => root = Some(decode(v)?),
            _ => rest.push(pair),
        }
    }
    // As libpq 16: the public CAs mean the name is checked too.
    let mode = match (mode, root.as_deref()) {
        (None, Some("system")) => Mode::VerifyFull,
        (Some(m), Some("system")) if m != Mode::VerifyFull => {
            return Err(bad("sslrootcert=system needs sslmode=verify-full"))
        }
        (Some(Mode::Require), Some(_)) => Mode::VerifyCa,
        (m, _) => m.unwrap_or(Mode::Prefer),
    };
    rest.push(match mode {
        Mode::Disable => "sslmode=disable",
        Mode::Prefer => "sslmode=prefer",
        _ => "sslmode=require",
    });
    let rebuilt = format!("{base}?{}", rest.join("&"));
    let mut config: tokio_postgres::Config = rebuilt.parse().map_err(bad)?;
    // As libpq: TLS is never asked for over a local socket (PostgreSQL
    // would refuse it), whatever sslmode says.
    let hosts = config.get_hosts();
    if !hosts.is_empty()
        && config.get_hostaddrs().is_empty()
        && hosts
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)))
    {
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        Mode::Disable | Mode::Prefer | Mode::Require => Arc::new(Lenient {
            provider: provider.clone(),
            chain: None,
        }),
        Mode::VerifyCa | Mode::VerifyFull => {
            let roots = roots(root.as_deref(), mode)?;
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| bad(format!("sslrootcert: {e}")))?;
            if mode == Mode::VerifyCa {
                Arc::new(Lenient {
                    provider: provider.clone(),
                    chain: Some(webpki),
                })
            } else {
                webpki
            }
        }
    };
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Target {
        config,
        tls: MakeRustls(Arc::new(tls)),
        mode,
    })
}

impl Target {
    /// What a replica should warn of at start: a database over the
    /// network reached in the clear, or without checking who it is (a
    /// local socket or loopback address needs neither).
    pub fn risk(&self) -> Option<&'static str> {
        use tokio_postgres::config::Host;
        let local = |h: &str| {
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        };
        let remote = self.config.get_hosts().iter().any(|h| match h {
            Host::Tcp(name) => !local(name),
            Host::Unix(_) => false,
        }) || self.config.get_hostaddrs().iter().any(|a| !a.is_loopback());
        match self.mode {
            _ if !remote => None,
            Mode::Disable => Some(
                "the connection to the database is not encrypted (sslmode=disable): \
                 anyone on the network path can read and change what replicas store",
            ),
            Mode::Prefer | Mode::Require => Some(
                "the database's certificate is not checked: add \
                 sslmode=verify-full&sslrootcert=CA.pem to the store URL",
            ),
            Mode::VerifyCa | Mode::VerifyFull => None,
        }
    }
}

/// Percent-decodes a URL query value.
fn decode(v: &str) -> Result<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(format!("bad percent-encoding in {v:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(format!("{v:?} is not UTF-8")))
}

/// The CAs to trust: the file given, the public ones (`system`), or
/// libpq's default `~/.postgresql/root.crt`.
fn roots(root: Option<&str>, mode: Mode) -> Result<Arc<RootCertStore>> {
    let mut store = RootCertStore::empty();
    if root == Some("system") {
        store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok(Arc::new(store));
    }
    let path = match root {
        Some(p) => PathBuf::from(p),
        None => match std::env::var_os("HOME")
            .map(|h| Path::new(&h).join(".postgresql/root.crt"))
            .filter(|p| p.is_file())
        {
            Some(p) => p,
            None => {
                let m = if mode == Mode::VerifyCa {
                    "verify-ca"
                } else {
                    "verify-full"
                };
                return Err(bad(format!(
                    "sslmode={m} needs the CA that signed the database's certificate: \
                     add sslrootcert=FILE (PEM), or sslrootcert=system for the public CAs"
                )));
            }
        },
    };
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_file_iter(&path)
        .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
    for c in certs {
        let c = c.map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
        store
            .add(c)
            .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
    }
    if store.is_empty() {
        return Err(bad(format!(
            "sslrootcert {}: no certificate in it",
            path.display()
        )));
    }
    Ok(Arc::new(store))
}

/// The checks `prefer`/`require` (no CA: any certificate) and
/// `verify-ca` (a CA's chain, any name) make. Either way the handshake's
/// signatures are checked, so the peer holds the key of the certificate
/// it shows.
#[derive(Debug)]
struct Lenient {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // webpki checks the name only after the chain, so a wrong name
        // means the chain was good.
        match chain.verify_server_cert(end_entity, intermediates, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The connector `tokio-postgres` asks for a TLS session per connection.
#[derive(Clone)]
pub(crate) struct MakeRustls(Arc<rustls::ClientConfig>);

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTls<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<RustlsConnect> {
        // No name: a local socket (PostgreSQL never offers TLS there) or
        // only an address; a name no remote certificate carries fails
        // closed if it is ever checked.
        let host = if host.is_empty() { "localhost" } else { host };
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?}: {e}")))?;
        Ok(RustlsConnect {
            config: self.0.clone(),
            name,
        })
    }
}

pub(crate) struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

type Handshake<S> = Pin<Box<dyn Future<Output = io::Result<PgTls<S>>> + Send>>;

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTls<S>;
    type Error = io::Error;
    type Future = Handshake<S>;

    fn connect(self, stream: S) -> Handshake<S> {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move {
            let tls = connector.connect(self.name, stream).await?;
            Ok(PgTls(tls))
        })
    }
}

/// A TLS session to the database.
pub struct PgTls<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTls<S> {
    fn channel_binding(&self) -> ChannelBinding {
        match self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
        {
            Some(cert) => ChannelBinding::tls_server_end_point(end_point_hash(cert)),
            None => ChannelBinding::none(),
        }
    }
}

/// RFC 5929's `tls-server-end-point`: the certificate hashed with its
/// signature's hash, SHA-256 for MD5 and SHA-1 (and when unknown).
fn end_point_hash(cert: &[u8]) -> Vec<u8> {
    use ring::digest;
    let alg = x509_parser::parse_x509_certificate(cert)
        .ok()
        .map(|(_, c)| c.signature_algorithm.algorithm.to_id_string());
    let hash = match alg.as_deref() {
        // sha384WithRSAEncryption, ecdsa-with-SHA384
        Some("1.2.840.113549.1.1.12" | "1.2.840.10045.4.3.3") => &digest::SHA384,
        // sha512WithRSAEncryption, ecdsa-with-SHA512
        Some("1.2.840.113549.1.1.13" | "1.2.840.10045.4.3.4") => &digest::SHA512,
        _ => &digest::SHA256,
    };
    digest::digest(hash, cert).as_ref().to_vec()
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTls<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTls<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_options_are_read_and_taken_out() {
        let t = parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=system").unwrap();
        assert_eq!(t.mode, Mode::VerifyFull);
        assert_eq!(
            t.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(parse("postgres://u@h/db").unwrap().mode, Mode::Prefer);
        assert_eq!(
            parse("postgres://u@h/db?sslrootcert=system").unwrap().mode,
            Mode::VerifyFull
        );
        let t = parse("postgres://u@h/db?connect_timeout=3&sslmode=disable").unwrap();
        assert_eq!(t.mode, Mode::Disable);
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
        for (url, says) in [
            ("postgres://u@h/db?sslmode=allow", "sslmode=allow"),
            (
                "postgres://u@h/db?sslmode=require&sslrootcert=system",
                "needs sslmode=verify-full",
            ),
            ("postgres://u@h/db?sslmode=verify-ca", "sslrootcert=FILE"),
            (
                "postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
                "/nonexistent/ca.pem",
            ),
            ("postgres://u@h/db?sslrootcert=%zz", "percent-encoding"),
        ] {
            let e = parse(url).err().unwrap().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn a_database_over_the_network_unchecked_is_a_risk() {
        let risk = |u: &str| parse(u).unwrap().risk();
        assert!(risk("postgres://u@db.example/x")
            .unwrap()
            .contains("verify-full"));
        assert!(risk("postgres://u@db.example/x?sslmode=disable")
            .unwrap()
            .contains("not encrypted"));
        for quiet in [
            "postgres://u@localhost/x",
            "postgres://u@127.0.0.1/x?sslmode=disable",
            "postgres://u@[::1]/x",
            "postgres://u@%2Frun%2Fpostgresql/x",
            "postgres://u@db.example/x?sslrootcert=system",
        ] {
            assert_eq!(risk(quiet), None, "{quiet}");
        }
    }

    #[test]
    fn percent_encoded_values_are_decoded() {
        assert_eq!(decode("%2Fetc%2Fca.pem").unwrap(), "/etc/ca.pem");
        assert_eq!(decode("plain").unwrap(), "plain");
        assert!(decode("%4").is_err());
    }
}
