//! `byomd pair TOKEN`: make a key pair here (the private key never leaves
//! the machine), send a CSR with the one-time token over QUIC to a server
//! whose CA is pinned by the token, and store the identity we get back.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use byom_protocol::pb::{self, to_daemon, to_server, ToDaemon, ToServer};
use byom_protocol::token::PairingToken;

use crate::identity::{self, Identity, KeyStoreChoice};
use byom_wire::{read_frame, write_frame};

const PAIR_TIMEOUT: Duration = Duration::from_secs(15);

pub struct PairOptions {
    pub token: String,
    pub name: Option<String>,
    pub server: Option<String>,
    pub key_store: KeyStoreChoice,
    /// Take over this machine (its name and labels); the token must allow it.
    pub replace: Option<String>,
}

pub async fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    tokio::net::lookup_host(addr)
        .await
        .with_context(|| format!("cannot resolve the server address {addr}"))?
        .next()
        .with_context(|| format!("the server address {addr} resolves to nothing"))
}

pub fn client_endpoint(server: SocketAddr) -> anyhow::Result<quinn::Endpoint> {
    let bind: SocketAddr = if server.is_ipv6() {
        "[::]:0".parse()?
    } else {
        "0.0.0.0:0".parse()?
    };
    quinn::Endpoint::client(bind).context("cannot open a UDP socket")
}

/// A CSR for `key_pem` (only its public key matters to the server).
pub fn csr(key: &rcgen::KeyPair) -> anyhow::Result<String> {
    Ok(rcgen::CertificateParams::default()
        .serialize_request(key)?
        .pem()?)
}

pub async fn pair(dir: &Path, opts: PairOptions) -> anyhow::Result<Identity> {
    if Identity::exists(dir) {
        let id = Identity::load(dir)?;
        bail!(
            "this machine is already paired as {} ({}) in {}; run `byomd unpair` first, or use another --config-dir",
            id.name,
            id.machine_id,
            dir.display()
        );
    }
    let token = PairingToken::parse(&opts.token)?;
    let server_addr = opts
        .server
        .clone()
        .unwrap_or_else(|| token.server_addr.clone());
    let addr = resolve(&server_addr).await?;
    let key = rcgen::KeyPair::generate()?;
    let req = pb::PairRequest {
        token: opts.token.trim().to_string(),
        csr_pem: csr(&key)?,
        name: opts.name.clone().unwrap_or_default(),
        hostname: crate::hostname(),
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        version: byom_protocol::VERSION.into(),
        replace: opts.replace.clone().unwrap_or_default(),
    };
    let endpoint = client_endpoint(addr)?;
    let cfg = crate::tls::pairing_config(token.ca_sha256)?;
    let resp = tokio::time::timeout(PAIR_TIMEOUT, async {
        let conn = endpoint
            .connect_with(cfg, addr, byom_protocol::SERVER_NAME)?
            .await
            .with_context(|| format!("cannot connect to the byom server at {server_addr}"))?;
        let (mut send, mut recv) = conn.open_bi().await?;
        write_frame(&mut send, &ToServer { msg: Some(to_server::Msg::Pair(req)) }).await?;
        send.finish()?;
        let resp: Option<ToDaemon> = read_frame(&mut recv).await?;
        conn.close(0u32.into(), b"paired");
        anyhow::Ok(resp)
    })
    .await
    .with_context(|| format!("no answer from the byom server at {server_addr} within {PAIR_TIMEOUT:?} (is UDP to it allowed?)"))??;
    endpoint.wait_idle().await;
    let resp = match resp.and_then(|r| r.msg) {
        Some(to_daemon::Msg::Pair(p)) => p,
        Some(to_daemon::Msg::Error(e)) => bail!("pairing refused: {}", e.message),
        _ => bail!("the server sent an unexpected reply to the pairing request"),
    };
    if crate::tls::sha256(&crate::tls::pem_der(&resp.ca_pem)?) != token.ca_sha256 {
        bail!("the server sent a CA that does not match the token's fingerprint");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (store, why) =
        identity::store_key(dir, &resp.machine_id, &key.serialize_pem(), opts.key_store)?;
    if let Some(why) = why {
        tracing::info!("OS keyring not usable ({why}); the private key is in a 0600 file");
    }
    let id = Identity {
        machine_id: resp.machine_id,
        name: resp.name,
        server_addr,
        ca_pem: resp.ca_pem,
        cert_pem: resp.cert_pem,
        key_store: store,
        revoked: false,
        paired_at_ms: crate::now_ms(),
    };
    id.save(dir)?;
    crate::policy::Policy::write_default(dir)?;
    Ok(id)
}
