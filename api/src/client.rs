//! How a client finds and talks to the admin API: credentials discovery
//! (`--creds`, `BYOM_CREDS`, the local data dir), TLS 1.3 with the admin's
//! certificate against the server's private CA, and a tonic channel.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Channel, Endpoint};

use crate::proto::admin_client::AdminClient;
use crate::proto::{
    admins_client::AdminsClient, approvals_client::ApprovalsClient,
    connectors_client::ConnectorsClient, outbox_client::OutboxClient,
    sources_client::SourcesClient, tasks_client::TasksClient, trust_client::TrustClient,
};

/// Largest reply a client takes (a worker's transcript, a command's
/// output page).
const MAX_REPLY: usize = byom_protocol::limits::MAX_FRAME_BYTES * 4;

/// A connection to the API: the `Admin` service's calls directly (it
/// dereferences to its client), the other services by area through
/// [`Client::tasks`] and friends, all over the one connection.
#[derive(Clone, Debug)]
pub struct Client {
    admin: AdminClient<Channel>,
    channel: Channel,
}

impl std::ops::Deref for Client {
    type Target = AdminClient<Channel>;
    fn deref(&self) -> &Self::Target {
        &self.admin
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.admin
    }
}

impl Client {
    fn new(channel: Channel) -> Client {
        Client {
            admin: AdminClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            channel,
        }
    }
    /// Tasks, workers, threads, the Router.
    pub fn tasks(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel.clone()).max_decoding_message_size(MAX_REPLY)
    }
    pub fn approvals(&self) -> ApprovalsClient<Channel> {
        ApprovalsClient::new(self.channel.clone()).max_decoding_message_size(MAX_REPLY)
    }
    pub fn trust(&self) -> TrustClient<Channel> {
        TrustClient::new(self.channel.clone()).max_decoding_message_size(MAX_REPLY)
    }
    pub fn admins(&self) -> AdminsClient<Channel> {
        AdminsClient::new(self.channel.clone()).max_decoding_message_size(MAX_REPLY)
    }
    pub fn connectors(&self) -> ConnectorsClient<Channel> {
        ConnectorsClient::new(self.channel.clone()).max_decoding_message_size(MAX_REPLY)
    }
    pub fn outbox(&self) -> OutboxClient<Channel> {
        OutboxClient::new(self.channel.clone()).max_decoding_message_size(MAX_REPLY)
    }
    pub fn sources(&self) -> SourcesClient<Channel> {
        SourcesClient::new(self.channel.clone()).max_decoding_message_size(MAX_REPLY)
    }
}

/// How long connecting to the API may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no admin credentials in {} (missing {missing}; {why})", dir.display())]
    NoCredentials {
        dir: PathBuf,
        missing: &'static str,
        /// Why the CLI looked there, and how to point it elsewhere.
        why: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}; pass --api HOST:PORT", path.display())]
    BadApiFile { path: PathBuf, reason: String },
    #[error("bad admin credentials in {}: {reason}", dir.display())]
    BadCredentials { dir: PathBuf, reason: String },
    #[error("bad API address {0:?}: use HOST:PORT")]
    BadAddress(String),
    #[error("cannot reach the byom server API at {addr}: is `byom server` running? (the address comes from --api, BYOM_API or {}/api.json)", dir.display())]
    Unreachable {
        addr: String,
        dir: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the server at {addr} is not the one the credentials in {} are for: its certificate is not signed by their ca.pem (credentials of another byom server, or one whose data dir was recreated); use that server's <data-dir>/admin, or point --api at the right server ({reason})", dir.display())]
    WrongServer {
        addr: String,
        dir: PathBuf,
        reason: String,
    },
    #[error("no answer from the byom server API at {addr} within {}s: is it running, and is the address right? (from --api, BYOM_API or {}/api.json)", CONNECT_TIMEOUT.as_secs(), dir.display())]
    Timeout { addr: String, dir: PathBuf },
}

/// Default data dir: `$BYOM_DATA_DIR`, else `$XDG_DATA_HOME/byom`, else
/// `~/.local/share/byom`.
pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("BYOM_DATA_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(d).join("byom");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".local/share/byom");
    }
    PathBuf::from("byom-data")
}

/// An admin's credentials and where the API listens.
pub struct Creds {
    pub dir: PathBuf,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub api_addr: String,
}

fn read(dir: &Path, name: &'static str, given: bool) -> Result<String, ClientError> {
    std::fs::read_to_string(dir.join(name)).map_err(|source| ClientError::NoCredentials {
        dir: dir.to_path_buf(),
        missing: name,
        why: where_from(given),
        source,
    })
}

/// Why credentials were looked for where they were, and the ways to say
/// otherwise.
fn where_from(given: bool) -> String {
    if given {
        return "the directory --creds or BYOM_CREDS names; it should hold a copy of the <data-dir>/admin of a `byom server`, or a bundle from `byom admins add`".into();
    }
    let how = "if `byom server` runs here with --data-dir DIR, set BYOM_DATA_DIR=DIR (or BYOM_CREDS=DIR/admin); if it runs elsewhere, copy its <data-dir>/admin here and pass --creds or BYOM_CREDS; if none runs yet, start one with `byom server`";
    match std::env::var_os("BYOM_DATA_DIR") {
        Some(d) => format!(
            "looked there because BYOM_DATA_DIR is {}; {how}",
            Path::new(&d).display()
        ),
        None => format!("looked in the default data dir, as neither --creds, BYOM_CREDS nor BYOM_DATA_DIR is set; {how}"),
    }
}

/// Credentials from `creds` (else `<default data dir>/admin`); the API
/// address from `api`, else from the credentials' `api.json`.
pub fn load_creds(creds: Option<&Path>, api: Option<&str>) -> Result<Creds, ClientError> {
    let given = creds.is_some();
    let dir = match creds {
        Some(d) => d.to_path_buf(),
        None => default_data_dir().join("admin"),
    };
    let api_addr = match api {
        Some(a) => a.to_string(),
        None => {
            let j = read(&dir, "api.json", given)?;
            let path = dir.join("api.json");
            let v: serde_json::Value =
                serde_json::from_str(&j).map_err(|e| ClientError::BadApiFile {
                    path: path.clone(),
                    reason: format!("not valid JSON ({e})"),
                })?;
            v["api_addr"]
                .as_str()
                .ok_or(ClientError::BadApiFile {
                    path,
                    reason: "no api_addr".into(),
                })?
                .to_string()
        }
    };
    Ok(Creds {
        ca_pem: read(&dir, "ca.pem", given)?,
        cert_pem: read(&dir, "admin.pem", given)?,
        key_pem: read(&dir, "admin.key", given)?,
        api_addr,
        dir,
    })
}

/// TLS 1.3 with the admin certificate, trusting only the server's CA.
fn tls_config(creds: &Creds) -> Result<rustls::ClientConfig, ClientError> {
    let bad = |reason: String| ClientError::BadCredentials {
        dir: creds.dir.clone(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    let ca = CertificateDer::from_pem_slice(creds.ca_pem.as_bytes())
        .map_err(|e| bad(format!("ca.pem: {e}")))?;
    roots.add(ca).map_err(|e| bad(format!("ca.pem: {e}")))?;
    let cert = CertificateDer::from_pem_slice(creds.cert_pem.as_bytes())
        .map_err(|e| bad(format!("admin.pem: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(creds.key_pem.as_bytes())
        .map_err(|e| bad(format!("admin.key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert], key)
        .map_err(|e| bad(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// A client connected to the API (the connection is checked now).
pub async fn connect(creds: &Creds) -> Result<Client, ClientError> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(creds)?));
    let addr = creds.api_addr.clone();
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|_| ClientError::BadAddress(addr.clone()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            let addr = addr.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(&addr).await?;
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from(byom_protocol::SERVER_NAME)
                    .map_err(std::io::Error::other)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|source| classify(creds, source))?;
    Ok(Client::new(channel))
}

/// What a failed connection means to the person running the CLI.
fn classify(creds: &Creds, source: tonic::transport::Error) -> ClientError {
    let (addr, dir) = (creds.api_addr.clone(), creds.dir.clone());
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&source);
    while let Some(e) = cur {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            if matches!(tls, rustls::Error::InvalidCertificate(_)) {
                return ClientError::WrongServer {
                    addr,
                    dir,
                    reason: tls.to_string(),
                };
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return ClientError::Timeout { addr, dir };
            }
            if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                if matches!(tls, rustls::Error::InvalidCertificate(_)) {
                    return ClientError::WrongServer {
                        addr,
                        dir,
                        reason: tls.to_string(),
                    };
                }
            }
        }
        cur = e.source();
    }
    if source.to_string().contains("timed out") {
        return ClientError::Timeout { addr, dir };
    }
    ClientError::Unreachable { addr, dir, source }
}
