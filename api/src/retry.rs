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
    let mut b = [0u8; 16];
    // Without randomness the key is still unique enough per process run.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b.copy_from_slice(&t.to_le_bytes());
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("cli-{hex}")
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
