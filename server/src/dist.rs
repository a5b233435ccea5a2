//! The daemon the server hands out. A release directory (`--dist DIR`, or
//! `dist/` next to the `byom` binary) holds the artifacts and their
//! `manifest`; at start the server checks every artifact against it and
//! signs the manifest with its CA key. It then serves, over HTTPS on its
//! public TCP port (ALPN `http/1.1` beside the daemons' tunnel):
//!
//! - `/install.sh` and `/install.ps1`: the installers, rendered with this
//!   server's address, its key pin and the SHA-256 of the manifest it
//!   checked, so a script fetched with the pin needs nothing else;
//! - `/ca.pem`: the CA the token pins;
//! - `/manifest` (read from disk at each request) and `/manifest.sig` (the
//!   CA's signature over the bytes checked at start): a manifest changed
//!   afterwards no longer verifies, and laptops refuse it;
//! - `/dist/FILE` for each artifact the manifest lists.
//!
//! Nothing here needs a credential: what a laptop runs is vouched for by
//! the CA, not by who may download it.

use std::convert::Infallible;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use byom_protocol::manifest::{self, Manifest};
use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;

use crate::pki::Pki;

/// A download connection ends after this, whatever it is doing.
pub const DOWNLOAD_CONNECTION_TIMEOUT: Duration = Duration::from_secs(600);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Read size when streaming an artifact.
const CHUNK: usize = 64 << 10;

const INSTALL_SH: &str = include_str!("../../installers/install.sh");
const INSTALL_PS1: &str = include_str!("../../installers/windows/install.ps1");

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("cannot read {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: {err}")]
    Manifest {
        path: PathBuf,
        err: manifest::ManifestError,
    },
    #[error("{0}")]
    Mismatch(String),
    #[error("cannot sign the manifest: {0}")]
    Sign(String),
}

/// A release this server ships, checked and signed at start.
pub struct Dist {
    dir: PathBuf,
    pub manifest: Manifest,
    /// SHA-256 of the manifest bytes that were checked and signed.
    manifest_sha256: [u8; 32],
    signature: Bytes,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DistError + '_ {
    move |err| DistError::Io {
        path: path.to_path_buf(),
        err,
    }
}

fn file_sha256(path: &Path) -> Result<(u64, [u8; 32]), DistError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; CHUNK];
    let mut n = 0u64;
    loop {
        let got = f.read(&mut buf).map_err(io(path))?;
        if got == 0 {
            break;
        }
        n += got as u64;
        ctx.update(&buf[..got]);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    Ok((n, out))
}

impl Dist {
    /// Where the release is when `--dist` is not given: `dist/` beside the
    /// binary, or `../share/byom/dist` (a package's layout).
    pub fn find_default() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        let bin = exe.parent()?;
        [
            bin.join("dist"),
            bin.join("..").join("share").join("byom").join("dist"),
        ]
        .into_iter()
        .find(|d| d.join("manifest").is_file())
    }

    /// Reads `DIR/manifest`, checks every artifact's size and SHA-256 (a
    /// server never vouches for bytes it has not checked) and signs the
    /// manifest with the CA key.
    pub fn load(dir: &Path, pki: &Pki) -> Result<Dist, DistError> {
        let path = dir.join("manifest");
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let manifest = Manifest::parse(&bytes).map_err(|err| DistError::Manifest {
            path: path.clone(),
            err,
        })?;
        let mut bad = Vec::new();
        for a in &manifest.artifacts {
            let p = dir.join(&a.file);
            match file_sha256(&p) {
                Ok((size, sha)) if size == a.size && sha == a.sha256 => {}
                Ok((_, sha)) => bad.push(format!(
                    "{} has SHA-256 {} but the manifest says {}",
                    a.file,
                    manifest::hex(&sha),
                    manifest::hex(&a.sha256)
                )),
                Err(e) => bad.push(e.to_string()),
            }
        }
        if !bad.is_empty() {
            return Err(DistError::Mismatch(format!(
                "the release in {} does not match its manifest, so it is not served: {}",
                dir.display(),
                bad.join("; ")
            )));
        }
        let signature = pki
            .sign(&bytes)
            .map_err(|e| DistError::Sign(e.to_string()))?;
        Ok(Dist {
            dir: dir.to_path_buf(),
            manifest,
            manifest_sha256: byom_wire::sha256(&bytes),
            signature: signature.into(),
        })
    }
}

/// What the HTTPS side needs: the release (if any) and who the server is.
pub struct Site {
    pub dist: Option<Arc<Dist>>,
    /// `HOST:PORT` laptops reach (the public address; TCP on its port).
    pub public_addr: String,
    pub ca_pem: String,
    /// `sha256//BASE64` of the server key.
    pub pin: String,
    /// Hex SHA-256 of the server certificate (PowerShell pins that).
    pub cert_sha256: String,
}

impl Site {
    pub fn new(dist: Option<Arc<Dist>>, pki: &Pki, public_addr: &str) -> anyhow::Result<Site> {
        let spki = pki.server_spki_sha256()?;
        // The address goes into a shell line and the script: a host name,
        // an IP or [IPv6], a port, nothing a shell would read otherwise.
        let dist = match dist {
            Some(_) if !addr_ok(public_addr) => {
                tracing::warn!("not handing out byomd: the public address {public_addr:?} is not a plain HOST:PORT");
                None
            }
            d => d,
        };
        Ok(Site {
            dist,
            public_addr: public_addr.to_string(),
            ca_pem: pki.ca_pem.clone(),
            pin: format!(
                "sha256//{}",
                base64::engine::general_purpose::STANDARD.encode(spki)
            ),
            cert_sha256: byom_wire::hex(&byom_wire::sha256(&pki.server_cert_der)),
        })
    }

    /// The daemon version laptops get from us ("" when we ship none).
    pub fn shipped_version(&self) -> &str {
        self.dist
            .as_ref()
            .map_or("", |d| d.manifest.version.as_str())
    }

    fn base_url(&self) -> String {
        format!("https://{}", self.public_addr)
    }

    /// The one line that installs, pairs and starts byomd with `token`.
    /// `-k` only skips the web PKI: `--pinnedpubkey` still refuses any key
    /// but this server's.
    pub fn install_command(&self, token: &str) -> Option<String> {
        self.dist.as_ref()?;
        Some(format!(
            "curl -fsSL --pinnedpubkey '{}' -k {}/install.sh | sh -s -- {token}",
            self.pin,
            self.base_url()
        ))
    }

    /// The line to paste into PowerShell: the script is fetched from a
    /// server whose certificate (SHA-256 of its DER) the line pins, checked
    /// by a validation callback instead of the web PKI.
    pub fn install_command_windows(&self, token: &str) -> Option<String> {
        let d = self.dist.as_ref()?;
        d.manifest.binary("byomd", "windows", "x86_64")?;
        Some(format!(
            "try{{[Net.ServicePointManager]::SecurityProtocol='Tls13'}}catch{{}};$p='{}';[Net.ServicePointManager]::ServerCertificateValidationCallback={{param($s,$c)([BitConverter]::ToString([Security.Cryptography.SHA256]::Create().ComputeHash($c.GetRawCertData())) -replace '-','') -eq $p}};iex (New-Object Net.WebClient).DownloadString('{}/install.ps1');Install-Byomd '{token}'",
            self.cert_sha256.to_uppercase(),
            self.base_url()
        ))
    }

    fn render(&self, template: &str) -> Option<String> {
        let d = self.dist.as_ref()?;
        Some(
            template
                .replace("@BYOM_BASE_URL@", &self.base_url())
                .replace("@BYOM_HOSTPORT@", &self.public_addr)
                .replace("@BYOM_PIN@", &self.pin)
                .replace("@BYOM_CERT_SHA256@", &self.cert_sha256.to_uppercase())
                .replace("@BYOM_SERVER_NAME@", byom_protocol::SERVER_NAME)
                .replace("@BYOM_VERSION@", &d.manifest.version)
                .replace("@BYOM_MANIFEST_SHA256@", &manifest::hex(&d.manifest_sha256)),
        )
    }
}

fn addr_ok(a: &str) -> bool {
    !a.is_empty()
        && a.len() <= 255
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

fn text(status: u16, body: impl Into<Bytes>) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(
        Full::new(body.into())
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

const NO_DIST: &str = "this byom server ships no daemon: start it with `byom server --dist DIR` (a release directory made by installers/release.sh)\n";

/// Streams a file as it is on disk now (its length too): whatever changed
/// since the server checked it reaches the laptop, which refuses it.
async fn stream_file(path: PathBuf) -> hyper::Response<Body> {
    let opened = match tokio::fs::File::open(&path).await {
        Ok(f) => f.metadata().await.map(|m| (f, m.len())),
        Err(e) => Err(e),
    };
    let (file, size) = match opened {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("cannot serve {}: {e}", path.display());
            return text(404, "this artifact is missing on the server\n");
        }
    };
    let stream = futures_util::stream::unfold(file, |mut f| async move {
        use tokio::io::AsyncReadExt as _;
        let mut buf = vec![0u8; CHUNK];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    let mut r = hyper::Response::new(StreamBody::new(stream).boxed_unsync());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&size.to_string()) {
        r.headers_mut().insert(hyper::header::CONTENT_LENGTH, v);
    }
    r
}

async fn handle(
    site: Arc<Site>,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Body> {
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return text(405, "only GET\n");
    }
    let path = req.uri().path();
    match path {
        "/ca.pem" => text(200, site.ca_pem.clone()),
        "/install.sh" => match site.render(INSTALL_SH) {
            Some(s) => text(200, s),
            None => text(
                404,
                format!("echo 'byom: {}' >&2; exit 1\n", NO_DIST.trim_end()),
            ),
        },
        "/install.ps1" => match site.render(INSTALL_PS1) {
            Some(s) => text(200, s),
            None => text(404, format!("throw 'byom: {}'\n", NO_DIST.trim_end())),
        },
        _ => {
            let Some(d) = site.dist.clone() else {
                return text(404, NO_DIST);
            };
            match path {
                "/manifest" => {
                    let p = d.dir.join("manifest");
                    match tokio::fs::read(&p).await {
                        Ok(b) if b.len() <= manifest::MAX_MANIFEST_BYTES => text(200, b),
                        _ => text(404, "the manifest is missing on the server\n"),
                    }
                }
                "/manifest.sig" => {
                    let mut r = text(200, d.signature.clone());
                    r.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/octet-stream"),
                    );
                    r
                }
                p => match p
                    .strip_prefix("/dist/")
                    .and_then(|f| d.manifest.artifacts.iter().find(|a| a.file == f))
                {
                    Some(a) => stream_file(d.dir.join(&a.file)).await,
                    None => text(404, "no such file: see /manifest\n"),
                },
            }
        }
    }
}

/// Serves one HTTPS connection that chose `http/1.1` on the public port.
pub async fn serve<S>(site: Arc<Site>, io: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let site = site.clone();
        async move { Ok::<_, Infallible>(handle(site, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), svc);
    let _ = tokio::time::timeout(DOWNLOAD_CONNECTION_TIMEOUT, conn).await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_plain_addresses_go_into_the_one_liner() {
        for ok in ["byom.example.com:7443", "127.0.0.1:7443", "[::1]:7443"] {
            assert!(super::addr_ok(ok), "{ok}");
        }
        for bad in ["a'b:1", "host:1;reboot", "$(x):1", "h o:1", ""] {
            assert!(!super::addr_ok(bad), "{bad}");
        }
    }
}
