//! The server's private PKI: one CA that signs the server certificate, the
//! admin client certificate and every machine's client certificate.
//!
//! Roles are carried in a URI SAN (`byom:machine:mch_…`, `byom:admin:NAME`),
//! never inferred from names. The CA key stays in `<data-dir>/pki/` (0600);
//! machine keys never leave the machines (the server only signs CSRs).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
    SanType, SerialNumber,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::vault::{Vault, CA, SERVER};

pub use byom_wire::{hex, now_ms, sha256, write_atomic};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate error: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("bad certificate signing request: {0}")]
    BadCsr(String),
    #[error("bad certificate: {0}")]
    BadCert(String),
    #[error(transparent)]
    Vault(#[from] crate::vault::VaultError),
}

type Result<T> = std::result::Result<T, PkiError>;

const CA_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
const SERVER_CERT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
const ADMIN_CERT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// Server and admin certificates are re-issued at start when they have less
/// than this left.
const REISSUE_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Back-date certificates a little so small clock skew does not reject them.
const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Who a client certificate says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Machine(String),
    Admin(String),
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|err| PkiError::Io {
        path: path.to_path_buf(),
        err,
    })
}

fn write(path: &Path, contents: &str, mode: u32) -> Result<()> {
    write_atomic(path, contents.as_bytes(), mode).map_err(|err| PkiError::Io {
        path: path.to_path_buf(),
        err,
    })
}

fn validity(params: &mut CertificateParams, ttl: Duration) {
    let now = time::OffsetDateTime::now_utc();
    // Short test lifetimes must not be dominated by the back-dating.
    params.not_before = now - CLOCK_SKEW.min(ttl / 10);
    params.not_after = now + ttl;
}

fn random_serial() -> SerialNumber {
    let mut b = byom_protocol::random::bytes::<16>();
    b[0] &= 0x7f;
    SerialNumber::from_slice(&b)
}

fn uri(s: String) -> Result<SanType> {
    Ok(SanType::URI(s.try_into()?))
}

/// Parsed facts about a certificate the server cares about.
#[derive(Debug, Clone)]
pub struct CertInfo {
    pub role: Option<Role>,
    pub not_after_ms: u64,
    pub spki_sha256: String,
}

pub fn inspect(der: &[u8]) -> Result<CertInfo> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::BadCert(e.to_string()))?;
    let mut role = None;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(u) = name {
                if let Some(id) = u.strip_prefix("byom:machine:") {
                    role = Some(Role::Machine(id.to_string()));
                } else if let Some(n) = u.strip_prefix("byom:admin:") {
                    role = Some(Role::Admin(n.to_string()));
                }
            }
        }
    }
    let not_after = cert.validity().not_after.timestamp().max(0) as u64 * 1000;
    Ok(CertInfo {
        role,
        not_after_ms: not_after,
        spki_sha256: hex(&sha256(cert.public_key().raw)),
    })
}

pub fn pem_to_der(pem: &str) -> Result<CertificateDer<'static>> {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| PkiError::BadCert(e.to_string()))
}

pub fn key_from_pem(pem: &str) -> Result<PrivateKeyDer<'static>> {
    use rustls_pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| PkiError::BadCert(e.to_string()))
}

/// The CA plus the server's own credentials, loaded or created at start.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    pub ca_pem: String,
    pub ca_der: CertificateDer<'static>,
    pub ca_sha256: [u8; 32],
    pub server_cert_der: CertificateDer<'static>,
    pub server_key_der: PrivatePkcs8KeyDer<'static>,
}

impl Pki {
    /// Loads the CA and the server's credentials from `vault` (files under
    /// `<data>/pki`, or sealed in a shared store), creating them on first
    /// start, and (re)writes the admin credentials to `admin_dir` if
    /// missing or near expiry.
    pub fn load_or_create(
        vault: &Vault,
        admin_dir: &Path,
        server_names: &[String],
    ) -> Result<Self> {
        let ca = match vault.load(CA.0, &CA.1)? {
            Some(v) => v,
            None => {
                let key = KeyPair::generate()?;
                let mut params = CertificateParams::default();
                let mut dn = DistinguishedName::new();
                dn.push(DnType::CommonName, "byom CA");
                params.distinguished_name = dn;
                params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
                params.key_usages = vec![
                    KeyUsagePurpose::KeyCertSign,
                    KeyUsagePurpose::CrlSign,
                    KeyUsagePurpose::DigitalSignature,
                ];
                params.serial_number = Some(random_serial());
                validity(&mut params, CA_TTL);
                let cert = params.self_signed(&key)?;
                // Read back only when every file of it is there: a crash
                // between the two writes makes a new CA, never half of one.
                vault.create(
                    CA.0,
                    &[
                        (CA.1[0], key.serialize_pem(), 0o600),
                        (CA.1[1], cert.pem(), 0o644),
                    ],
                )?
            }
        };
        let [ca_key, ca_pem] = <[String; 2]>::try_from(ca)
            .map_err(|_| PkiError::BadCert("the CA is incomplete".into()))?;
        let ca_key = KeyPair::from_pem(&ca_key)?;
        let ca_der = pem_to_der(&ca_pem)?;
        let issuer = Issuer::from_ca_cert_der(&ca_der, ca_key)?;
        let ca_sha256 = sha256(&ca_der);

        let mut pki = Pki {
            issuer,
            ca_pem,
            ca_der,
            ca_sha256,
            server_cert_der: CertificateDer::from(Vec::new()),
            server_key_der: PrivatePkcs8KeyDer::from(Vec::new()),
        };

        let wanted_names = server_names.join(",");
        let mut server = vault.load(SERVER.0, &SERVER.1)?;
        let reuse = match &server {
            Some(v) => v[2] == wanted_names && fresh(&v[1]),
            None => false,
        };
        if !reuse {
            // A renewed certificate keeps the key: install lines pin it
            // (curl's --pinnedpubkey), and must survive a restart.
            let old_key = server.as_ref().map(|v| KeyPair::from_pem(&v[0]));
            let key = match old_key {
                Some(Ok(k)) => k,
                _ => KeyPair::generate()?,
            };
            let mut names: Vec<String> = vec![byom_protocol::SERVER_NAME.to_string()];
            names.extend(server_names.iter().cloned());
            names.dedup();
            let mut params = CertificateParams::new(names)?;
            params.distinguished_name = dn("byom server");
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            params.serial_number = Some(random_serial());
            validity(&mut params, SERVER_CERT_TTL);
            let cert = params.signed_by(&key, pki.issuer()?)?;
            let items = [
                (SERVER.1[0], key.serialize_pem(), 0o600),
                (SERVER.1[1], cert.pem(), 0o644),
                (SERVER.1[2], wanted_names, 0o644),
            ];
            server = Some(if server.is_some() {
                vault.replace(SERVER.0, &items)?;
                items.into_iter().map(|i| i.1).collect()
            } else {
                // Replicas starting together must end up with one key.
                vault.create(SERVER.0, &items)?
            });
        }
        let server = server.unwrap_or_default();
        pki.server_cert_der = pem_to_der(&server[1])?;
        pki.server_key_der = match key_from_pem(&server[0])? {
            PrivateKeyDer::Pkcs8(k) => k,
            _ => return Err(PkiError::BadCert("server key is not PKCS#8".into())),
        };

        let admin_pem = admin_dir.join("admin.pem");
        if !(admin_pem.exists() && fresh(&read(&admin_pem)?) && admin_dir.join("ca.pem").exists()) {
            let (cert, key) = pki.issue_admin("admin")?;
            write(&admin_dir.join("admin.key"), &key, 0o600)?;
            write(&admin_pem, &cert, 0o644)?;
            write(&admin_dir.join("ca.pem"), &pki.ca_pem, 0o644)?;
        }
        Ok(pki)
    }

    /// Signs `msg` with the CA key (ECDSA P-256 with SHA-256, ASN.1 DER):
    /// what the server vouches for (its release manifest) can be checked by
    /// anyone holding the CA certificate a token pinned.
    pub fn sign(&self, msg: &[u8]) -> Result<Vec<u8>> {
        use rcgen::SigningKey as _;
        Ok(self.issuer.key().sign(msg)?)
    }

    /// SHA-256 of the server certificate's public key (SPKI), as curl's
    /// `--pinnedpubkey sha256//…` wants it before any CA is trusted.
    pub fn server_spki_sha256(&self) -> Result<[u8; 32]> {
        let (_, cert) = x509_parser::parse_x509_certificate(&self.server_cert_der)
            .map_err(|e| PkiError::BadCert(e.to_string()))?;
        Ok(sha256(cert.public_key().raw))
    }

    fn issuer(&self) -> Result<&Issuer<'static, KeyPair>> {
        Ok(&self.issuer)
    }

    /// Issues an admin client certificate and key (PEM).
    pub fn issue_admin(&self, name: &str) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(&format!("byom admin {name}"));
        params.subject_alt_names = vec![uri(format!("byom:admin:{name}"))?];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(random_serial());
        validity(&mut params, ADMIN_CERT_TTL);
        let cert = params.signed_by(&key, self.issuer()?)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Signs a machine certificate for the public key in `csr_pem`. Nothing
    /// else from the CSR is used: the server decides names and lifetimes.
    /// Returns the certificate PEM and the SHA-256 of the public key.
    pub fn sign_machine(
        &self,
        csr_pem: &str,
        machine_id: &str,
        ttl: Duration,
    ) -> Result<(String, String, u64)> {
        self.sign_client(
            csr_pem,
            machine_id,
            &format!("byom:machine:{machine_id}"),
            ttl,
        )
    }

    /// Signs a personal admin certificate for the key in `csr_pem` (the
    /// key stays with the person's CLI). Returns the certificate PEM and
    /// the SHA-256 of the public key, which the admin list pins.
    pub fn sign_admin(&self, csr_pem: &str, name: &str) -> Result<(String, String)> {
        let (pem, spki, _) = self.sign_client(
            csr_pem,
            &format!("byom admin {name}"),
            &format!("byom:admin:{name}"),
            ADMIN_CERT_TTL,
        )?;
        Ok((pem, spki))
    }

    fn sign_client(
        &self,
        csr_pem: &str,
        cn: &str,
        role_uri: &str,
        ttl: Duration,
    ) -> Result<(String, String, u64)> {
        if csr_pem.len() > byom_protocol::limits::MAX_PEM_BYTES {
            return Err(PkiError::BadCsr("CSR too large".into()));
        }
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::BadCsr(e.to_string()))?;
        let spki = hex(&sha256(&csr.public_key.subject_public_key_info()));
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(cn);
        params.subject_alt_names = vec![uri(role_uri.to_string())?];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(random_serial());
        validity(&mut params, ttl);
        let not_after_ms = (params.not_after.unix_timestamp().max(0) as u64) * 1000;
        let cert = params.signed_by(&csr.public_key, self.issuer()?)?;
        Ok((cert.pem(), spki, not_after_ms))
    }
}

fn dn(cn: &str) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    d.push(DnType::CommonName, cn);
    d
}

/// True if a certificate PEM has more than [`REISSUE_BEFORE`] left.
fn fresh(pem: &str) -> bool {
    let Ok(der) = pem_to_der(pem) else {
        return false;
    };
    let Ok(info) = inspect(&der) else {
        return false;
    };
    now_ms() + (REISSUE_BEFORE.as_millis() as u64) < info.not_after_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_dir(dir: &Path, names: &[String]) -> Result<Pki> {
        Pki::load_or_create(&Vault::Dir(dir.into()), &dir.join("admin"), names)
    }

    #[test]
    fn a_reissued_server_certificate_keeps_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let a = in_dir(dir.path(), &["one.example".into()]).unwrap();
        let b = in_dir(dir.path(), &["two.example".into()]).unwrap();
        assert_ne!(
            a.server_cert_der, b.server_cert_der,
            "new names, new certificate"
        );
        assert_eq!(
            a.server_spki_sha256().unwrap(),
            b.server_spki_sha256().unwrap(),
            "the key an install line pins"
        );
    }

    #[test]
    fn ca_signs_machine_csr_with_role() {
        let dir = tempfile::tempdir().unwrap();
        let pki = in_dir(dir.path(), &["127.0.0.1".into()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let csr = CertificateParams::default()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        let (pem, spki, _) = pki
            .sign_machine(&csr, "mch_x", Duration::from_secs(60))
            .unwrap();
        let info = inspect(&pem_to_der(&pem).unwrap()).unwrap();
        assert_eq!(info.role, Some(Role::Machine("mch_x".into())));
        assert_eq!(info.spki_sha256, spki);
        assert_eq!(spki, hex(&sha256(&key.subject_public_key_info())));
        assert!(pki
            .sign_machine("garbage", "mch_x", Duration::from_secs(60))
            .is_err());
        // Reloading keeps the same CA.
        let again = in_dir(dir.path(), &["127.0.0.1".into()]).unwrap();
        assert_eq!(again.ca_sha256, pki.ca_sha256);
        let admin =
            inspect(&pem_to_der(&read(&dir.path().join("admin/admin.pem")).unwrap()).unwrap())
                .unwrap();
        assert_eq!(admin.role, Some(Role::Admin("admin".into())));
    }
}
