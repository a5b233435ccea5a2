//! Creating calls that survive a server restart: each invocation carries
//! one idempotency key, and a call the server did not answer (it was
//! restarting, the connection broke) is sent again with the same key, so
//! it creates at most once however often it is retried.

use std::future::Future;
use std::time::Duration;

/// Attempts of one creating call while the server is away.
pub const CREATE_ATTEMPTS: u32 = 60;
/// Pause between attempts.
const PAUSE: Duration = Duration::from_millis(500);

/// A fresh idempotency key, for one invocation of a creating call.
pub fn new_key() -> String {
    format!(
        "cli-{}",
        byom_protocol::hex(&byom_protocol::random::bytes::<16>())
    )
}

/// Whether a call may not have reached the server or its answer was lost:
/// worth sending again with the same key.
pub fn unanswered(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

/// Runs `call` until it is answered, at most [`CREATE_ATTEMPTS`] times.
/// Only for calls that carry an idempotency key (or change nothing).
pub async fn until_answered<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Err(e) if unanswered(&e) && attempt < CREATE_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(PAUSE).await;
            }
            r => return r,
        }
    }
}
