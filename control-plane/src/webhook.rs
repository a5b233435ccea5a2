//! The generic webhook endpoint: `POST /hooks/SOURCE` with a JSON body
//! `{"thread": …, "user": …, "text": …, "mention": bool, "from_bot": bool}`
//! and `X-Byom-Signature: sha256=HEX`, the HMAC-SHA256 of the raw body with
//! the key in `<data-dir>/webhook.key`. A bad or missing signature is 401
//! and nothing is stored; a good one becomes a trigger (202).

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use byom_protocol::pb;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use ring::hmac;
use serde_json::{json, Value};

use crate::server::Shared;

/// Largest webhook body accepted.
pub const MAX_WEBHOOK_BYTES: usize = 1 << 20;
/// Webhook connections served at once.
const MAX_WEBHOOK_CONNECTIONS: usize = 256;
pub const SIGNATURE_HEADER: &str = "x-byom-signature";

/// The HMAC key: created (32 random bytes, hex, 0600) on first start.
pub fn load_or_create_key(data_dir: &Path) -> anyhow::Result<Vec<u8>> {
    let p = data_dir.join("webhook.key");
    if let Ok(k) = std::fs::read_to_string(&p) {
        let k = k.trim().to_string();
        if k.len() >= 32 {
            return Ok(k.into_bytes());
        }
    }
    let mut raw = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
        .map_err(|_| anyhow::anyhow!("no randomness"))?;
    let hex = crate::pki::hex(&raw);
    byom_wire::write_atomic(&p, format!("{hex}\n").as_bytes(), 0o600)
        .with_context(|| format!("cannot write {}", p.display()))?;
    Ok(hex.into_bytes())
}

/// The signature header value for `body` (for clients and tests).
pub fn sign(key: &[u8], body: &[u8]) -> String {
    format!(
        "sha256={}",
        crate::pki::hex(hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), body).as_ref())
    )
}

fn verify(key: &[u8], body: &[u8], header: Option<&str>) -> bool {
    let Some(hexsig) = header.and_then(|h| h.trim().strip_prefix("sha256=")) else {
        return false;
    };
    if hexsig.len() != 64 {
        return false;
    }
    let mut sig = [0u8; 32];
    for (i, b) in sig.iter_mut().enumerate() {
        match u8::from_str_radix(&hexsig[2 * i..2 * i + 2], 16) {
            Ok(v) => *b = v,
            Err(_) => return false,
        }
    }
    // Constant time.
    hmac::verify(&hmac::Key::new(hmac::HMAC_SHA256, key), body, &sig).is_ok()
}

fn reply(status: u16, body: Value) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_default()
}

async fn handle(
    shared: Arc<Shared>,
    key: Arc<Vec<u8>>,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    if req.method() != hyper::Method::POST {
        return reply(405, json!({"error": "use POST /hooks/SOURCE"}));
    }
    let Some(source) = req
        .uri()
        .path()
        .strip_prefix("/hooks/")
        .map(str::to_string)
        .filter(|s| !s.is_empty() && !s.contains('/'))
    else {
        return reply(404, json!({"error": "use POST /hooks/SOURCE"}));
    };
    let sig = req
        .headers()
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match Limited::new(req.into_body(), MAX_WEBHOOK_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return reply(
                413,
                json!({"error": format!("body over {MAX_WEBHOOK_BYTES} bytes")}),
            )
        }
    };
    if !verify(&key, &body, sig.as_deref()) {
        return reply(
            401,
            json!({"error": "bad or missing X-Byom-Signature (sha256=HMAC of the body)"}),
        );
    }
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return reply(400, json!({"error": format!("body is not JSON: {e}")})),
    };
    let (Some(thread), Some(user), Some(text)) =
        (v["thread"].as_str(), v["user"].as_str(), v["text"].as_str())
    else {
        return reply(
            400,
            json!({"error": "need string fields thread, user and text"}),
        );
    };
    let ev = pb::SendEventRequest {
        source,
        thread: thread.into(),
        user: user.into(),
        text: text.into(),
        mention: v["mention"].as_bool().unwrap_or(false),
        from_bot: v["from_bot"].as_bool().unwrap_or(false),
    };
    match crate::triggers::ingest(&shared.store, &shared.rules, ev).await {
        Ok(t) => {
            let _ = shared.triggers_tx.send(t.clone());
            shared.agents.wake.notify_one();
            reply(
                202,
                json!({"trigger": t.id, "thread": t.thread_id, "decision": crate::cli::trigger_json(&t)["decision"]}),
            )
        }
        Err(e) => reply(503, json!({"error": e.to_string()})),
    }
}

pub async fn serve(shared: Arc<Shared>, listener: tokio::net::TcpListener, key: Vec<u8>) {
    let key = Arc::new(key);
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_WEBHOOK_CONNECTIONS));
    loop {
        let (tcp, _) = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let (shared, key) = (shared.clone(), key.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let svc = hyper::service::service_fn(move |req| {
                let (shared, key) = (shared.clone(), key.clone());
                async move { Ok::<_, Infallible>(handle(shared, key, req).await) }
            });
            let conn =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), svc);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(60), conn).await;
        });
    }
}
