//! How the CLI finds and talks to the admin API: credentials discovery
//! (`--creds`, `BYOM_CREDS`, the local data dir), TLS with the admin
//! certificate, and a tonic channel over it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use crate::api::proto::admin_client::AdminClient;

pub type Client = AdminClient<Channel>;

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

pub struct Creds {
    pub dir: PathBuf,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub api_addr: String,
}

fn read(dir: &Path, name: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(dir.join(name)).with_context(|| {
        format!(
            "no admin credentials in {} (missing {name}): run `byom server` on this machine first, \
             or pass --creds DIR (or BYOM_CREDS) pointing to a copy of <data-dir>/admin",
            dir.display()
        )
    })
}

pub fn load_creds(creds: Option<&Path>, api: Option<&str>) -> anyhow::Result<Creds> {
    let dir = match creds {
        Some(d) => d.to_path_buf(),
        None => default_data_dir().join("admin"),
    };
    let api_addr = match api {
        Some(a) => a.to_string(),
        None => {
            let j = read(&dir, "api.json")?;
            let v: serde_json::Value = serde_json::from_str(&j)
                .with_context(|| format!("{} is not valid JSON", dir.join("api.json").display()))?;
            v["api_addr"]
                .as_str()
                .context("api.json has no api_addr; pass --api HOST:PORT")?
                .to_string()
        }
    };
    Ok(Creds {
        ca_pem: read(&dir, "ca.pem")?,
        cert_pem: read(&dir, "admin.pem")?,
        key_pem: read(&dir, "admin.key")?,
        api_addr,
        dir,
    })
}

pub async fn connect(creds: &Creds) -> anyhow::Result<Client> {
    let tls = crate::tls::api_client_config(&creds.ca_pem, &creds.cert_pem, &creds.key_pem)
        .context("bad admin credentials")?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let addr = creds.api_addr.clone();
    let channel = Endpoint::from_shared(format!("http://{}", addr))
        .context("bad API address")?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            let addr = addr.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(&addr).await?;
                tcp.set_nodelay(true)?;
                let name = rustls::pki_types::ServerName::try_from(byom_protocol::SERVER_NAME)
                    .map_err(std::io::Error::other)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .with_context(|| {
            format!(
                "cannot reach the byom server API at {}: is `byom server` running?",
                creds.api_addr
            )
        })?;
    Ok(AdminClient::new(channel)
        .max_decoding_message_size(byom_protocol::limits::MAX_FRAME_BYTES * 4))
}
