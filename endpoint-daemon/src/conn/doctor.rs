//! `byomd doctor`: every check of what `byomd run` depends on (identity,
//! key, certificate, policy, sandbox, the running daemon, UDP and the TCP
//! fallback, the clock), each with a one-line verdict. It dials with the
//! session's own [`super::transport`] but shares nothing else with it.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use byom_protocol::pb::{self, to_daemon, to_server, ToDaemon, ToServer};
use byom_wire::{read_frame, write_frame};

use super::transport::{connect_quic, connect_tcp, QuicFail};
use super::{RunStatus, CONNECT_TIMEOUT};
use crate::identity::Identity;

/// One line of `byomd doctor`.
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// What was found, and if not ok, what to do.
    pub detail: String,
}

/// Clock skew beyond which TLS validity checks start to fail.
const MAX_SKEW: Duration = Duration::from_secs(60);

/// How long `doctor` waits for a QUIC answer before calling UDP blocked.
const DOCTOR_PROBE: Duration = Duration::from_secs(10);

/// `byomd doctor`: checks everything `byomd run` depends on, each with a
/// one-line verdict that says what to do.
pub async fn doctor(dir: &Path) -> Vec<Check> {
    let mut out = Vec::new();
    let mut check = |name, ok, detail: String| out.push(Check { name, ok, detail });
    let ident = match Identity::load(dir) {
        Ok(i) => {
            check(
                "config",
                true,
                format!("{} as {} ({})", dir.display(), i.name, i.machine_id),
            );
            i
        }
        Err(e) => {
            check("config", false, format!("{e:#}"));
            return out;
        }
    };
    if ident.revoked {
        check(
            "identity",
            false,
            "the server revoked this machine: run `byomd unpair`, then pair again with a new token"
                .into(),
        );
    }
    let key = match ident.load_key(dir) {
        Ok(k) => {
            // Only a Unix file mode can make these worse.
            #[cfg_attr(not(unix), allow(unused_mut))]
            let mut detail = format!("{:?} store readable", ident.key_store).to_lowercase();
            #[cfg_attr(not(unix), allow(unused_mut))]
            let mut ok = true;
            #[cfg(unix)]
            if ident.key_store == crate::identity::KeyStore::File {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(dir.join("key.pem"))
                    .map(|m| m.permissions().mode() & 0o777)
                    .unwrap_or(0);
                if mode & 0o077 != 0 {
                    ok = false;
                    detail = format!(
                        "key.pem is mode {mode:o}: run `chmod 600 {}`",
                        dir.join("key.pem").display()
                    );
                }
            }
            check("key", ok, detail);
            Some(k)
        }
        Err(e) => {
            check(
                "key",
                false,
                format!("{e:#}; pair again if the key is gone"),
            );
            None
        }
    };
    match crate::tls::cert_validity(&ident.cert_pem) {
        Some((na, _)) if na > crate::now_ms() => check("certificate", true, format!("valid for {}h more; renewed automatically", (na - crate::now_ms()) / 3_600_000)),
        Some(_) => check("certificate", false, "expired: `byomd run` renews it with the same key when it connects (if the server still knows this machine)".into()),
        None => check("certificate", false, "unreadable: pair again".into()),
    }
    match crate::policy::Policy::load(dir) {
        Ok(p) => {
            check(
                "policy",
                true,
                format!("{}: {}", p.path.display(), p.summary()),
            );
            let (ok, detail) = crate::sandbox::doctor(&p.file.sandbox);
            check("sandbox", ok, detail);
        }
        Err(e) => check(
            "policy",
            false,
            format!("{e:#}: fix the file; byomd run refuses to start with it"),
        ),
    }
    if crate::is_paused(dir) {
        check(
            "paused",
            false,
            "you paused byomd: it takes no commands until `byomd resume`".into(),
        );
    }
    match RunStatus::load(dir) {
        Some(r) if r.state.starts_with("connected") => check(
            "daemon",
            true,
            format!("byomd run (pid {}) is {}", r.pid, r.state),
        ),
        Some(r) => check(
            "daemon",
            false,
            format!("byomd run (pid {}) is {}: {}", r.pid, r.state, r.last_error),
        ),
        None => check(
            "daemon",
            false,
            "byomd run is not running: start it, or `byomd service install`".into(),
        ),
    }
    let Some(key) = key else { return out };
    let addr = match crate::pair::resolve(&ident.server_addr).await {
        Ok(a) => a,
        Err(e) => {
            check("server", false, format!("{e:#}"));
            return out;
        }
    };
    let Ok(cfg) = crate::tls::machine_config(&ident.ca_pem, &ident.cert_pem, &key) else {
        check(
            "tls",
            false,
            "cannot build TLS settings from the identity: pair again".into(),
        );
        return out;
    };
    let mut conn_for_time = None;
    // Generous: a slow, loaded machine is not a blocked one.
    match connect_quic(addr, cfg.clone(), DOCTOR_PROBE).await {
        Ok((c, e)) => {
            check("udp", true, format!("QUIC handshake with {addr} works"));
            conn_for_time = Some((c, e));
        }
        Err(QuicFail::NoAnswer) => check(
            "udp",
            false,
            format!("no QUIC answer from {addr}: UDP may be blocked; byomd falls back to TCP"),
        ),
        Err(QuicFail::Refused(e)) => check(
            "udp",
            false,
            format!("the server refused this machine: {e}"),
        ),
        Err(QuicFail::Other(e)) => check("udp", false, format!("{e:#}")),
    }
    match connect_tcp(addr, &ident.ca_pem, cfg).await {
        Ok((c, e)) => {
            check("tcp", true, format!("TCP fallback to {addr} works"));
            if conn_for_time.is_none() {
                conn_for_time = Some((c, e));
            } else {
                c.close(0u32.into(), b"doctor");
            }
        }
        Err(e) => check("tcp", false, format!("TCP fallback to {addr} fails: {e:#}")),
    }
    if let Some((c, e)) = conn_for_time {
        match server_time(&c).await {
            Ok(server_ms) => {
                let local = crate::now_ms();
                let skew = Duration::from_millis(local.abs_diff(server_ms));
                if skew > MAX_SKEW {
                    check("clock", false, format!("this clock is {}s off the server's: enable NTP (e.g. timedatectl set-ntp true)", skew.as_secs()));
                } else {
                    check(
                        "clock",
                        true,
                        format!("within {}ms of the server", skew.as_millis()),
                    );
                }
            }
            Err(err) => check(
                "clock",
                false,
                format!("cannot ask the server's time: {err:#}"),
            ),
        }
        c.close(0u32.into(), b"doctor");
        e.wait_idle().await;
    }
    out
}

async fn server_time(conn: &quinn::Connection) -> anyhow::Result<u64> {
    let (mut send, mut recv) = conn.open_bi().await?;
    write_frame(
        &mut send,
        &ToServer {
            msg: Some(to_server::Msg::Ping(pb::Ping { seq: 1 })),
        },
    )
    .await?;
    send.finish()?;
    let r: Option<ToDaemon> =
        tokio::time::timeout(CONNECT_TIMEOUT, read_frame(&mut recv)).await??;
    match r.and_then(|r| r.msg) {
        Some(to_daemon::Msg::Pong(p)) => Ok(p.server_time_ms),
        Some(to_daemon::Msg::Error(e)) => bail!("{}", e.message),
        _ => bail!("unexpected reply"),
    }
}
