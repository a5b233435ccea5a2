//! JSON POSTs to model providers over [`crate::http`], with provider
//! statuses mapped to retryable or permanent model errors.

use std::time::Duration;

use super::ModelError;
use crate::http::{request, HttpError, Reply};

fn model_err(e: HttpError) -> ModelError {
    match e {
        HttpError::Transient(m) => ModelError::Transient(m, None),
        HttpError::Permanent(m) => ModelError::Permanent(m),
    }
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
    let r = request("POST", url, headers, Some(bytes), timeout)
        .await
        .map_err(model_err)?;
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
