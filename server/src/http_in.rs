//! Inbound HTTP on the webhook port (byom's webhook, GitHub's, Slack's):
//! what a request must prove (HMAC-SHA256 signatures, checked in constant
//! time), the largest body read, and how it is answered (JSON).

use bytes::Bytes;
use http_body_util::Full;
use ring::hmac;
use serde_json::Value;

/// The body, up to [`MAX_WEBHOOK_BYTES`]; past it, the 413 to answer.
pub async fn read_body(
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<Bytes, hyper::Response<Full<Bytes>>> {
    use http_body_util::{BodyExt, Limited};
    let body = Limited::new(req.into_body(), MAX_WEBHOOK_BYTES).collect();
    match tokio::time::timeout(BODY_TIMEOUT, body).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(_)) => Err(reply(
            413,
            serde_json::json!({"error": format!("body over {MAX_WEBHOOK_BYTES} bytes")}),
        )),
        // A stranger's connection until its signature checks: it may not
        // hold its place by trickling a body.
        Err(_) => Err(reply(
            408,
            serde_json::json!({"error": format!("body not received within {} s", BODY_TIMEOUT.as_secs())}),
        )),
    }
}

/// Longest a client may take to send a request's body once its headers
/// arrived (GitHub and Slack send theirs at once).
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A JSON answer.
pub fn reply(status: u16, body: Value) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_default()
}

/// Largest webhook body accepted.
pub const MAX_WEBHOOK_BYTES: usize = 1 << 20;

/// 32 bytes from 64 hex digits.
pub fn unhex(hexsig: &str) -> Option<[u8; 32]> {
    if hexsig.len() != 64 || !hexsig.is_ascii() {
        return None;
    }
    let mut sig = [0u8; 32];
    for (i, b) in sig.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hexsig[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(sig)
}

/// `sha256=HEX`, the HMAC-SHA256 of `body` with `key` (byom's and
/// GitHub's webhook signature), checked in constant time.
pub fn verify(key: &[u8], body: &[u8], header: Option<&str>) -> bool {
    let Some(sig) = header
        .and_then(|h| h.trim().strip_prefix("sha256="))
        .and_then(unhex)
    else {
        return false;
    };
    hmac::verify(&hmac::Key::new(hmac::HMAC_SHA256, key), body, &sig).is_ok()
}
