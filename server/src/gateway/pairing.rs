//! Pairing: a connection without a client certificate may send one
//! PairRequest. The token must be one this server made (its CA pin), unused,
//! unexpired and unrevoked; redeeming it is single-use by compare-and-swap.
//! The daemon's key never leaves the machine: the server signs its CSR.

use std::time::Duration;

use byom_protocol::id::MachineId;
use byom_protocol::names;
use byom_protocol::pb::{self, to_daemon, to_server, ToDaemon, ToServer};
use byom_protocol::token::PairingToken;
use byom_wire::{read_frame, write_frame};
use quinn::Connection as QuicConnection;

use super::{error_frame, Gateway, Transport, FIRST_FRAME_TIMEOUT};

/// A connection without a client certificate: it may only pair.
pub(super) async fn serve(
    gw: Gateway,
    conn: QuicConnection,
    transport: &Transport,
) -> anyhow::Result<()> {
    let (mut send, mut recv) =
        tokio::time::timeout(FIRST_FRAME_TIMEOUT, conn.accept_bi()).await??;
    let first: Option<ToServer> =
        tokio::time::timeout(FIRST_FRAME_TIMEOUT, read_frame(&mut recv)).await??;
    let reply = match first.and_then(|f| f.msg) {
        Some(to_server::Msg::Pair(req)) => {
            match pair(&gw, req, transport.peer(conn.remote_address())).await {
                Ok(resp) => ToDaemon {
                    msg: Some(to_daemon::Msg::Pair(resp)),
                },
                Err((code, msg)) => error_frame(code, msg),
            }
        }
        _ => error_frame(
            "unauthenticated",
            "this connection has no client certificate: only pairing is allowed",
        ),
    };
    write_frame(&mut send, &reply).await?;
    send.finish()?;
    // Let the reply drain before the connection goes.
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
    Ok(())
}

async fn pair(
    gw: &Gateway,
    req: pb::PairRequest,
    remote: String,
) -> Result<pb::PairResponse, (&'static str, String)> {
    let internal = |e: &dyn std::fmt::Display| ("internal", format!("server error: {e}"));
    let token = PairingToken::parse(&req.token).map_err(|e| ("bad_token", e.to_string()))?;
    if token.ca_sha256 != gw.identity.pki.ca_sha256 {
        return Err((
            "bad_token",
            "this token was made by a different server".into(),
        ));
    }
    let now = byom_wire::now_ms();
    let machine_id = MachineId::new(now).to_string();
    let secret_hash = byom_wire::hex(&byom_wire::sha256(&token.secret));
    // Sign first so a bad CSR does not burn the token.
    let (cert_pem, spki, not_after) = gw
        .identity
        .pki
        .sign_machine(&req.csr_pem, &machine_id, gw.identity.cert_ttl)
        .map_err(|e| ("bad_csr", e.to_string()))?;
    // Replacing a machine needs a token made for exactly that machine.
    let replaced = if req.replace.is_empty() {
        None
    } else {
        let m = gw
            .store
            .resolve_machine(&req.replace)
            .map_err(|e| internal(&e))?
            .filter(|m| !m.revoked)
            .ok_or_else(|| {
                (
                    "bad_replace",
                    format!("no active machine {:?} to replace", req.replace),
                )
            })?;
        Some(m)
    };
    if let Some(old) = &replaced {
        match gw.store.get_token_by_secret(&secret_hash).map_err(|e| internal(&e))? {
            Some(t) if t.replace_machine == old.id => {}
            _ => {
                return Err((
                    "bad_replace",
                    format!(
                        "this token does not allow replacing {}: create one with `byom token create --replace {}`",
                        old.name, old.name
                    ),
                ))
            }
        }
    }
    let tok = match gw.store.redeem_token(&secret_hash, &machine_id, now) {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err(("token_rejected", e.to_string())),
        Err(e) => return Err(internal(&e)),
    };
    // The admin's choice (the token's name) wins over the machine's; a
    // fleet's token names none (its machines are named from their
    // hostnames, made unique by the store).
    let name = if names::valid_name(&tok.name) && !tok.reusable {
        tok.name.clone()
    } else if names::valid_name(&names::sanitize_name(&req.name)) && !req.name.is_empty() {
        names::sanitize_name(&req.name)
    } else {
        names::sanitize_name(&req.hostname)
    };
    let mut labels = tok.labels.clone();
    let name = match &replaced {
        Some(old) => {
            // Free the old name for the new identity; the old one is revoked below.
            let short: String = old
                .id
                .chars()
                .skip(old.id.len().saturating_sub(6))
                .collect();
            gw.store
                .rename_machine(&old.id, &format!("{}-replaced-{short}", old.name))
                .map_err(|e| internal(&e))?;
            for (k, v) in &old.labels {
                labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
            old.name.clone()
        }
        None => name,
    };
    let mut m = pb::Machine {
        id: machine_id.clone(),
        name,
        labels,
        created_at_ms: now,
        last_seen_ms: now,
        version: req.version.chars().take(64).collect(),
        os: req.os.chars().take(32).collect(),
        arch: req.arch.chars().take(32).collect(),
        hostname: req.hostname.chars().take(255).collect(),
        public_key_sha256: spki,
        cert_not_after_ms: not_after,
        token_id: tok.id.clone(),
        ..Default::default()
    };
    gw.store.create_machine(&mut m).map_err(|e| internal(&e))?;
    gw.store.flush_async().await.map_err(|e| internal(&e))?;
    if let Some(old) = &replaced {
        let why = format!("replaced by {machine_id}");
        crate::machines::revoke(
            &gw.store,
            &gw.identity,
            &gw.live,
            &gw.commands,
            &old.id,
            &why,
        )
        .await
        .map_err(|e| internal(&e))?;
    }
    tracing::info!(machine = %machine_id, name = %m.name, %remote, token = %tok.id, "machine paired");
    Ok(pb::PairResponse {
        machine_id,
        cert_pem,
        ca_pem: gw.identity.pki.ca_pem.clone(),
        name: m.name,
        labels: m.labels,
    })
}
