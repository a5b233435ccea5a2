//! A minimal HTTP/1.1 client for JSON POSTs to model providers: one
//! connection per request (model latency dwarfs connection setup), HTTPS
//! with the web PKI roots, a hard timeout, bounded response bodies.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

use super::ModelError;

/// Largest response body read from a provider.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

pub struct Reply {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

fn transient(e: impl std::fmt::Display) -> ModelError {
    ModelError::Transient(e.to_string(), None)
}

fn tls_config() -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let cfg = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth());
    Arc::new(cfg.unwrap_or_else(|_| {
        rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3 is supported by the ring provider")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
    }))
}

pub async fn post_json(
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Reply, ModelError> {
    tokio::time::timeout(timeout, post(url, headers, body))
        .await
        .map_err(|_| ModelError::Transient(format!("no answer within {timeout:?}"), None))?
}

async fn post(url: &str, headers: &[(&str, String)], body: Vec<u8>) -> Result<Reply, ModelError> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| ModelError::Permanent(format!("bad URL {url}: {e}")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(ModelError::Permanent(format!(
                "bad URL {url}: use http:// or https://"
            )))
        }
    };
    let host = uri
        .host()
        .ok_or_else(|| ModelError::Permanent(format!("no host in {url}")))?
        .to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(transient)?;
    let _ = tcp.set_nodelay(true);
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut req = hyper::Request::post(path)
        .header(
            "host",
            if uri.port_u16().is_some() {
                format!("{host}:{port}")
            } else {
                host.clone()
            },
        )
        .header("content-type", "application/json")
        .header("accept", "application/json");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| ModelError::Permanent(e.to_string()))?;
    let resp = if https {
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| ModelError::Permanent(e.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(tls_config())
            .connect(name, tcp)
            .await
            .map_err(transient)?;
        send(TokioIo::new(tls), req).await?
    } else {
        send(TokioIo::new(tcp), req).await?
    };
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| transient(format!("reading the response: {e}")))?
        .to_bytes();
    Ok(Reply {
        status,
        retry_after,
        body,
    })
}

async fn send<I>(
    io: I,
    req: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, ModelError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(transient)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(transient)
}

/// POSTs a JSON body and returns the JSON reply of a 200; any other status
/// becomes the matching error, a non-JSON reply a permanent one.
pub async fn call_json(
    url: &str,
    headers: &[(&str, String)],
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value, ModelError> {
    let bytes = serde_json::to_vec(body).map_err(|e| ModelError::Permanent(e.to_string()))?;
    let r = post_json(url, headers, bytes, timeout).await?;
    if r.status != 200 {
        return Err(status_error(&r));
    }
    serde_json::from_slice(&r.body)
        .map_err(|e| ModelError::Permanent(format!("reply from {url} is not JSON: {e}")))
}

/// Maps an HTTP status to the right error, with the provider's message.
pub fn status_error(r: &Reply) -> ModelError {
    let text = String::from_utf8_lossy(&r.body);
    let msg: String = text.chars().take(500).collect();
    match r.status {
        429 | 500..=599 | 408 => {
            ModelError::Transient(format!("HTTP {}: {msg}", r.status), r.retry_after)
        }
        _ => ModelError::Permanent(format!("HTTP {}: {msg}", r.status)),
    }
}
