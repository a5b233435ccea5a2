//! A minimal HTTP/1.1 client for the providers byom talks to (model APIs,
//! Matrix, Slack, GitHub): one connection per request (provider latency
//! dwarfs connection setup; no pool to go stale across a homeserver
//! restart), HTTPS with the web PKI roots, a hard timeout, bounded bodies.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

/// Largest response body read from a provider.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, thiserror::Error)]
pub enum HttpError {
    /// Worth retrying: connection failures, timeouts.
    #[error("{0}")]
    Transient(String),
    /// Not worth retrying: a malformed URL or request.
    #[error("{0}")]
    Permanent(String),
}

/// A response: its status, the headers providers use to pace clients, the
/// body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    /// `retry-after` (seconds).
    pub retry_after: Option<Duration>,
    /// GitHub's `x-ratelimit-remaining` and `x-ratelimit-reset` (epoch s).
    pub ratelimit_remaining: Option<u64>,
    pub ratelimit_reset: Option<u64>,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The body's start, for error messages.
    pub fn snippet(&self) -> String {
        String::from_utf8_lossy(&self.body)
            .chars()
            .take(300)
            .collect()
    }
}

fn transient(e: impl std::fmt::Display) -> HttpError {
    HttpError::Transient(e.to_string())
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

/// One request with a JSON (or empty) body; any status is a reply.
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Reply, HttpError> {
    tokio::time::timeout(timeout, send_request(method, url, headers, body))
        .await
        .map_err(|_| HttpError::Transient(format!("no answer from {url} within {timeout:?}")))?
}

fn header_num<T: std::str::FromStr>(
    r: &hyper::Response<hyper::body::Incoming>,
    k: &str,
) -> Option<T> {
    r.headers()
        .get(k)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<T>().ok())
}

async fn send_request(
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    body: Option<Vec<u8>>,
) -> Result<Reply, HttpError> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| HttpError::Permanent(format!("bad URL {url}: {e}")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(HttpError::Permanent(format!(
                "bad URL {url}: use http:// or https://"
            )))
        }
    };
    let host = uri
        .host()
        .ok_or_else(|| HttpError::Permanent(format!("no host in {url}")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| transient(format!("cannot connect to {host}:{port}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let method = hyper::Method::from_bytes(method.as_bytes())
        .map_err(|e| HttpError::Permanent(e.to_string()))?;
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .unwrap_or(host.clone());
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority)
        .header("accept", "application/json")
        .header("user-agent", concat!("byom/", env!("CARGO_PKG_VERSION")));
    if body.is_some()
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| HttpError::Permanent(e.to_string()))?;
    let resp = if https {
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| HttpError::Permanent(e.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(tls_config())
            .connect(name, tcp)
            .await
            .map_err(transient)?;
        send(TokioIo::new(tls), req).await?
    } else {
        send(TokioIo::new(tcp), req).await?
    };
    let status = resp.status().as_u16();
    let retry_after = header_num::<f64>(&resp, "retry-after")
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let ratelimit_remaining = header_num(&resp, "x-ratelimit-remaining");
    let ratelimit_reset = header_num(&resp, "x-ratelimit-reset");
    let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| transient(format!("reading the response: {e}")))?
        .to_bytes();
    Ok(Reply {
        status,
        retry_after,
        ratelimit_remaining,
        ratelimit_reset,
        body,
    })
}

async fn send<I>(
    io: I,
    req: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, HttpError>
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
