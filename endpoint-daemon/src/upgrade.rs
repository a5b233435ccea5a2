//! Upgrading byomd from the server it is paired with. The server ships a
//! release (its manifest signed with the CA key); the daemon fetches the
//! manifest over TLS to the pinned CA, checks the signature against that
//! CA, downloads its own platform's binary and checks its SHA-256, then:
//!
//! 1. drains: reports itself paused so nothing new is sent, and waits for
//!    its running commands to finish and their results to be taken (or
//!    not, with `--now`);
//! 2. tries the new binary: `NEW --version` must name the manifest's
//!    version, then `NEW run --upgrade-trial` must connect to the server
//!    (paused, so nothing is dispatched to it) within the deadline;
//! 3. swaps the file atomically, keeping the old one as `byomd.prev`, and
//!    execs the new binary in place (same PID, so a service manager sees
//!    one process throughout).
//!
//! If the trial fails nothing is swapped and the old daemon reconnects. If
//! the swapped daemon then does not reconnect within the deadline after
//! all, it puts `byomd.prev` back and execs it. The steps are written to
//! `upgrade.json` in the config dir, which `byomd upgrade` follows.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use byom_protocol::manifest::{self, Artifact, Manifest};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::identity::Identity;

/// How long a new daemon has to reconnect before it is rolled back.
pub const UPGRADE_DEADLINE: Duration = Duration::from_secs(60);
/// With `--now`, how long cancelled commands get to deliver their results.
pub const NOW_GRACE: Duration = Duration::from_secs(5);
/// After a failed automatic upgrade, the next try waits at least this.
pub const AUTO_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// Largest binary accepted from the server.
pub const MAX_ARTIFACT_BYTES: u64 = 256 << 20;
/// One download (manifest, signature or binary) must finish in this time.
const HTTP_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_HEADER_BYTES: usize = 16 << 10;
const MAX_SIGNATURE_BYTES: usize = 1024;
const VERSION_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_FILE: &str = "upgrade.request";
const STATE_FILE: &str = "upgrade.json";

/// `byomd upgrade` asks the running daemon through this file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Request {
    /// Do not wait for running commands (they are cancelled).
    pub now: bool,
    /// The new daemon's deadline to reconnect (0: [`UPGRADE_DEADLINE`]).
    pub within_ms: u64,
    pub at_ms: u64,
}

impl Request {
    pub fn deadline(&self) -> Duration {
        if self.within_ms == 0 {
            UPGRADE_DEADLINE
        } else {
            Duration::from_millis(self.within_ms)
        }
    }
}

/// Where an upgrade stands, for `byomd upgrade` and the next process.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct State {
    /// draining, downloading, trial, swapped, done, rolled_back, failed,
    /// up_to_date.
    pub state: String,
    pub from: String,
    pub to: String,
    pub detail: String,
    pub at_ms: u64,
    /// The request this answers (its `at_ms`), so a waiting CLI knows.
    pub request_at_ms: u64,
    /// Deadline of a swapped daemon to reconnect (ms since epoch).
    #[serde(default)]
    pub deadline_ms: u64,
    /// The previous binary, kept for a rollback.
    #[serde(default)]
    pub prev: String,
}

impl State {
    pub fn finished(&self) -> bool {
        matches!(
            self.state.as_str(),
            "done" | "rolled_back" | "failed" | "up_to_date"
        )
    }
}

pub fn request(dir: &Path, req: &Request) -> anyhow::Result<()> {
    byom_wire::write_atomic(&dir.join(REQUEST_FILE), &serde_json::to_vec(req)?, 0o600)?;
    Ok(())
}

/// The pending request, if any, removed so it is acted on once.
pub fn take_request(dir: &Path) -> Option<Request> {
    let p = dir.join(REQUEST_FILE);
    let bytes = std::fs::read(&p).ok()?;
    let _ = std::fs::remove_file(&p);
    serde_json::from_slice(&bytes).ok()
}

pub fn state(dir: &Path) -> Option<State> {
    serde_json::from_slice(&std::fs::read(dir.join(STATE_FILE)).ok()?).ok()
}

pub fn set_state(dir: &Path, st: &State) {
    let mut st = st.clone();
    st.at_ms = crate::now_ms();
    match serde_json::to_vec_pretty(&st) {
        Ok(b) => {
            if let Err(e) = byom_wire::write_atomic(&dir.join(STATE_FILE), &b, 0o644) {
                tracing::warn!("cannot record the upgrade's state: {e}");
            }
        }
        Err(e) => tracing::warn!("cannot record the upgrade's state: {e}"),
    }
    tracing::info!(state = %st.state, from = %st.from, to = %st.to, "upgrade: {}", st.detail);
}

/// The release the server ships, its signature checked.
pub struct Release {
    pub manifest: Manifest,
    /// This machine's binary in it, if the server ships one.
    pub binary: Option<Artifact>,
}

impl Release {
    /// Whether the shipped version is newer than this binary's.
    pub fn newer(&self) -> bool {
        manifest::version_cmp(&self.manifest.version, byom_protocol::version()).is_gt()
    }
}

/// Checks the CA's signature (ECDSA P-256, SHA-256) over the manifest.
pub fn verify_manifest(ca_pem: &str, manifest: &[u8], sig: &[u8]) -> anyhow::Result<()> {
    let der = crate::tls::pem_der(ca_pem)?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| anyhow::anyhow!("the CA: {e}"))?;
    let key = cert.public_key().subject_public_key.data.to_vec();
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, key)
        .verify(manifest, sig)
        .map_err(|_| {
            anyhow::anyhow!(
                "the manifest's signature does not verify against the CA this machine paired with: refusing it"
            )
        })
}

/// A GET to the server's HTTPS side (its public address, over TCP), the
/// server verified against the pinned CA. The body goes to `sink`, at most
/// `max` bytes.
async fn get(
    ca_pem: &str,
    server: &str,
    path: &str,
    max: u64,
    sink: &mut (dyn FnMut(&[u8]) -> anyhow::Result<()> + Send),
) -> anyhow::Result<()> {
    let fetch = async {
        let addr = crate::pair::resolve(server).await?;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot reach {server} over TCP"))?;
        let mut tls = crate::tls::tunnel_client_config(ca_pem)?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = rustls::pki_types::ServerName::try_from(byom_protocol::SERVER_NAME)?;
        let mut s = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
            .connect(name, tcp)
            .await
            .context("TLS to the server")?;
        s.write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: byomd/{}\r\nConnection: close\r\n\r\n",
                byom_protocol::SERVER_NAME,
                byom_protocol::version()
            )
            .as_bytes(),
        )
        .await?;
        // Headers, then a Content-Length body (what the server sends).
        let mut head = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let body_start = loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                bail!("the server closed the connection before answering {path}");
            }
            head.extend_from_slice(&buf[..n]);
            if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if head.len() > MAX_HEADER_BYTES {
                bail!("the server's answer to {path} has oversized headers");
            }
        };
        let text = String::from_utf8_lossy(&head[..body_start]).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or(0);
        let len = text
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<u64>().ok())?
            })
            .unwrap_or(u64::MAX);
        let mut got = (head.len() - body_start) as u64;
        if status != 200 {
            let body = String::from_utf8_lossy(&head[body_start..])
                .trim()
                .to_string();
            bail!("the server answered {path} with {status}: {body}");
        }
        if len > max {
            bail!("{path} is larger than the {max} bytes accepted");
        }
        sink(&head[body_start..])?;
        while got < len {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n as u64;
            if got > max {
                bail!("{path} is larger than the {max} bytes accepted");
            }
            sink(&buf[..n])?;
        }
        if len != u64::MAX && got != len {
            bail!("{path} was cut short ({got} of {len} bytes)");
        }
        Ok(())
    };
    tokio::time::timeout(HTTP_TIMEOUT, fetch)
        .await
        .with_context(|| format!("fetching {path} timed out"))?
}

async fn get_bytes(ca_pem: &str, server: &str, path: &str, max: usize) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    get(ca_pem, server, path, max as u64, &mut |b| {
        out.extend_from_slice(b);
        Ok(())
    })
    .await?;
    Ok(out)
}

/// Fetches and checks the manifest the server ships.
pub async fn fetch_release(ident: &Identity, server: &str) -> anyhow::Result<Release> {
    let bytes = get_bytes(
        &ident.ca_pem,
        server,
        "/manifest",
        manifest::MAX_MANIFEST_BYTES,
    )
    .await?;
    let sig = get_bytes(&ident.ca_pem, server, "/manifest.sig", MAX_SIGNATURE_BYTES).await?;
    verify_manifest(&ident.ca_pem, &bytes, &sig)?;
    let manifest = Manifest::parse(&bytes).context("the server's manifest")?;
    let (os, arch) = manifest::this_platform();
    let binary = manifest.binary("byomd", os, arch).cloned();
    Ok(Release { manifest, binary })
}

/// Creates `path` anew: never through a link someone left there, never
/// into a file someone else holds open.
fn create_fresh(path: &Path) -> anyhow::Result<std::fs::File> {
    let _ = std::fs::remove_file(path);
    let mut o = std::fs::OpenOptions::new();
    // create_new is O_EXCL: it follows no symlink and fails on any file.
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        o.mode(0o700);
    }
    o.open(path)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Downloads `a` into `stage` (byomd's config dir: out of every command's
/// reach, so nothing can swap the checked file before it is installed) as
/// `.byomd.new`, checking size and SHA-256.
pub async fn download(
    ident: &Identity,
    server: &str,
    a: &Artifact,
    stage: &Path,
) -> anyhow::Result<PathBuf> {
    if a.size > MAX_ARTIFACT_BYTES {
        bail!("{} is larger than {MAX_ARTIFACT_BYTES} bytes", a.file);
    }
    let dest = stage.join(".byomd.new");
    let mut f = create_fresh(&dest)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let r = get(
        &ident.ca_pem,
        server,
        &format!("/dist/{}", a.file),
        a.size,
        &mut |b| {
            use std::io::Write as _;
            ctx.update(b);
            f.write_all(b).context("writing the new binary")
        },
    )
    .await;
    let checked = r.and_then(|()| {
        let got = ctx.finish();
        if got.as_ref() != a.sha256 {
            bail!(
                "refusing {}: its SHA-256 is {} but the signed manifest says {}",
                a.file,
                manifest::hex(got.as_ref()),
                manifest::hex(&a.sha256)
            );
        }
        f.sync_all()?;
        Ok(())
    });
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&dest);
        return Err(e);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(dest)
}

/// `NEW --version` must run and name `version`.
pub async fn check_version(new: &Path, version: &str) -> anyhow::Result<()> {
    let out = tokio::time::timeout(
        VERSION_CHECK_TIMEOUT,
        tokio::process::Command::new(new)
            .arg("--version")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("the new byomd did not answer --version in time")?
    .context("the new byomd does not run")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.split_whitespace().any(|w| w == version) {
        bail!(
            "the new byomd says {:?} to --version ({}), not version {version}",
            text.trim(),
            out.status
        );
    }
    Ok(())
}

/// Runs the new binary as a trial daemon: it must connect (paused, so
/// nothing is dispatched to it) within `within` and then exits.
pub async fn trial(
    new: &Path,
    dir: &Path,
    server: Option<&str>,
    within: Duration,
) -> anyhow::Result<()> {
    let report = dir.join("upgrade.trial");
    let _ = std::fs::remove_file(&report);
    let mut cmd = tokio::process::Command::new(new);
    cmd.arg("--config-dir").arg(dir).arg("run");
    if let Some(s) = server {
        cmd.arg("--server").arg(s);
    }
    cmd.arg("--upgrade-trial")
        .arg(&report)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd.spawn().context("cannot start the new byomd")?;
    let start = Instant::now();
    let outcome = loop {
        if report.exists() {
            break Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            break Err(anyhow::anyhow!(
                "the new byomd exited ({st}) before connecting"
            ));
        }
        if start.elapsed() >= within {
            break Err(anyhow::anyhow!(
                "the new byomd did not connect within {}s",
                within.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A good trial ends itself once connected; never leave one behind.
    let grace = if outcome.is_ok() {
        Duration::from_secs(5)
    } else {
        Duration::ZERO
    };
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
    let _ = std::fs::remove_file(&report);
    outcome
}

/// Swaps the staged binary in for `exe`, keeping the old one as
/// `byomd.prev` in `keep` (the config dir: commands may write where the
/// binary lives, and a `byomd.prev` they changed would be what a rollback
/// runs). A hard link, so `exe` never goes missing.
pub fn swap(exe: &Path, new: &Path, keep: &Path) -> anyhow::Result<PathBuf> {
    let prev = keep.join("byomd.prev");
    let _ = std::fs::remove_file(&prev);
    if std::fs::hard_link(exe, &prev).is_err() {
        let mut f = create_fresh(&prev)?;
        std::io::copy(
            &mut std::fs::File::open(exe).context("cannot read this binary")?,
            &mut f,
        )
        .context("cannot keep the old binary")?;
    }
    install(new, exe)?;
    Ok(prev)
}

/// Moves `src` to `exe` atomically. Across file systems: a copy next to
/// the binary under a name no one can guess or have planted, then a
/// rename. (A command that may write there could still race that copy:
/// keep byomd's config dir and its binary on one file system.)
fn install(src: &Path, exe: &Path) -> anyhow::Result<()> {
    if std::fs::rename(src, exe).is_ok() {
        return Ok(());
    }
    let r = byom_protocol::random::bytes::<8>();
    let tmp = exe.with_file_name(format!(".byomd.new.{}", byom_wire::hex(&r)));
    let mut f = create_fresh(&tmp)?;
    std::io::copy(&mut std::fs::File::open(src)?, &mut f)
        .context("cannot copy the new binary next to this one")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::rename(&tmp, exe).with_context(|| format!("cannot replace {}", exe.display()))?;
    let _ = std::fs::remove_file(src);
    Ok(())
}

/// Replaces this process with `exe`, same arguments (never returns but on
/// error).
pub fn exec_self(exe: &Path) -> anyhow::Error {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt as _;
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        let e = std::process::Command::new(exe).args(args).exec();
        anyhow::anyhow!("cannot exec {}: {e}", exe.display())
    }
    #[cfg(not(unix))]
    {
        anyhow::anyhow!("cannot restart into {} on this system", exe.display())
    }
}

/// The whole upgrade, from a drained daemon (or with none running):
/// fetch, check, try, swap. Every outcome is written to `upgrade.json`;
/// returns the binary to exec when one was swapped in.
pub async fn stage_and_try(
    dir: &Path,
    server_override: Option<&str>,
    req: &Request,
) -> Option<PathBuf> {
    let mut st = State {
        state: "downloading".into(),
        from: byom_protocol::version().to_string(),
        request_at_ms: req.at_ms,
        ..Default::default()
    };
    match stage(dir, server_override, req, &mut st).await {
        Ok(exe) => exe,
        Err((state, e)) => {
            st.state = state.into();
            st.detail = format!("{e:#}");
            set_state(dir, &st);
            None
        }
    }
}

type Failed = (&'static str, anyhow::Error);

async fn stage(
    dir: &Path,
    server_override: Option<&str>,
    req: &Request,
    st: &mut State,
) -> Result<Option<PathBuf>, Failed> {
    let failed = |e: anyhow::Error| ("failed", e);
    if !cfg!(unix) {
        // A running .exe cannot be replaced and re-exec'd in place.
        return Err(failed(anyhow::anyhow!(
            "byomd upgrades itself only on Linux and macOS: run the install line again"
        )));
    }
    let ident = Identity::load(dir).map_err(failed)?;
    let server = server_override.unwrap_or(&ident.server_addr).to_string();
    st.detail = format!("fetching the manifest from {server}");
    set_state(dir, st);
    let release = fetch_release(&ident, &server).await.map_err(failed)?;
    st.to = release.manifest.version.clone();
    if !release.newer() {
        st.state = "up_to_date".into();
        st.detail = format!("byomd {} is current (the server ships {})", st.from, st.to);
        set_state(dir, st);
        return Ok(None);
    }
    let Some(a) = release.binary else {
        let (os, arch) = manifest::this_platform();
        return Err(failed(anyhow::anyhow!(
            "the server ships byomd {} but not for {os}/{arch}",
            st.to
        )));
    };
    st.detail = format!("fetching {} ({} bytes)", a.file, a.size);
    set_state(dir, st);
    let exe = std::env::current_exe()
        .context("cannot find this binary")
        .map_err(failed)?;
    let new = download(&ident, &server, &a, dir).await.map_err(failed)?;
    // From here a failure means the new binary is no good: roll back.
    let tried = async {
        check_version(&new, &st.to).await?;
        st.state = "trial".into();
        st.detail = format!("trying {} against {server}", st.to);
        set_state(dir, st);
        trial(&new, dir, server_override, req.deadline()).await
    }
    .await;
    if let Err(e) = tried {
        let _ = std::fs::remove_file(&new);
        return Err((
            "rolled_back",
            e.context(format!("kept byomd {}", byom_protocol::version())),
        ));
    }
    let prev = swap(&exe, &new, dir).map_err(failed)?;
    st.state = "swapped".into();
    st.prev = prev.display().to_string();
    st.deadline_ms = crate::now_ms() + req.deadline().as_millis() as u64;
    st.detail = format!("installed {}; restarting", st.to);
    set_state(dir, st);
    Ok(Some(exe))
}

/// In a freshly exec'd daemon: if it was just swapped in and has not
/// connected by the deadline, put the previous binary back and exec it.
pub async fn watch_swap(dir: PathBuf) {
    let Some(st) = state(&dir).filter(|s| s.state == "swapped") else {
        return;
    };
    let wait = Duration::from_millis(st.deadline_ms.saturating_sub(crate::now_ms()));
    tokio::time::sleep(wait).await;
    let Some(now) = state(&dir).filter(|s| s.state == "swapped") else {
        return;
    };
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let prev = PathBuf::from(&now.prev);
    if install(&prev, &exe).is_err() {
        tracing::error!("upgrade: cannot roll back to {}", prev.display());
        return;
    }
    let mut st = now;
    st.state = "rolled_back".into();
    st.detail = format!(
        "byomd {} did not reconnect in time: back to {}",
        st.to, st.from
    );
    set_state(&dir, &st);
    tracing::error!("{}", exec_self(&exe));
}

/// Called on every HelloAck: a swapped-in daemon that connected is done.
pub fn connected(dir: &Path) {
    if let Some(mut st) = state(dir).filter(|s| s.state == "swapped") {
        if st.to == byom_protocol::version() {
            st.state = "done".into();
            st.detail = format!("upgraded from {} to {}; reconnected", st.from, st.to);
            set_state(dir, &st);
        }
    }
}

/// Whether to upgrade on our own to `shipped` (the owner's `auto_upgrade`
/// and no earlier attempt at that version that failed).
pub fn auto_wanted(dir: &Path, shipped: &str) -> bool {
    if shipped.is_empty() || !manifest::version_cmp(shipped, byom_protocol::version()).is_gt() {
        return false;
    }
    // A version that failed is not tried again by itself; any failure
    // waits a while (a server that cannot serve the download must not
    // make the daemon drain and reconnect in a loop).
    !state(dir).is_some_and(|s| {
        matches!(s.state.as_str(), "rolled_back" | "failed")
            && (s.to == shipped
                || crate::now_ms().saturating_sub(s.at_ms) < AUTO_RETRY_AFTER.as_millis() as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_signed_by_another_key_is_refused() {
        let ca = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&ca).unwrap();
        let body = b"byom-manifest 1\nversion 9.9.9\n";
        use rcgen::SigningKey as _;
        let sig = ca.sign(body).unwrap();
        verify_manifest(&cert.pem(), body, &sig).unwrap();
        assert!(verify_manifest(&cert.pem(), b"byom-manifest 1\nversion 9.9.8\n", &sig).is_err());
        let other = rcgen::KeyPair::generate().unwrap();
        let forged = other.sign(body).unwrap();
        let e = verify_manifest(&cert.pem(), body, &forged).unwrap_err();
        assert!(e.to_string().contains("does not verify"), "{e}");
    }
}
