//! The durable outbox: every reply the agents make on a connector's thread
//! becomes an item written in the same commit as the step that made it
//! ([`item_for`]); one delivery loop per connector ([`deliver`]) sends
//! items in order per thread, retries with backoff, and keeps the
//! provider's message ID as the receipt.
//!
//! Exactly once where the provider offers idempotency (Matrix: the item ID
//! is the transaction ID). Elsewhere the attempt is recorded (and flushed)
//! before the send and the receipt after; an item found mid-attempt after
//! a crash is sent again and marked `maybe_duplicate`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use byom_protocol::id::Kind;
use byom_protocol::pb::{self, OutboxState};
use byom_store::{Store, StoreError, OUTBOX_QUEUE_LIMIT};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Provider, Sent};

/// First retry delay; doubled per attempt up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Attempts before an item is given up (about a day at [`MAX_BACKOFF`]);
/// `byom outbox retry` sends it again with a fresh allowance.
pub const MAX_ATTEMPTS: u32 = 3000;
/// Longest a provider may ask us to pause (a bad `Retry-After` cannot
/// stall a thread for days).
const MAX_PAUSE: Duration = Duration::from_secs(3600);
/// How often the loop looks even when nothing woke it.
const IDLE_LOOK: Duration = Duration::from_secs(5);
/// Longest reply text sent (providers cap messages; the thread in byom has
/// all of it).
pub const MAX_SEND_CHARS: usize = 30_000;

/// The outbox item for a reply on `thread`, if the thread is on a
/// connector (otherwise the reply stays in byom).
pub fn item_for(
    store: &Store,
    reply_id: &str,
    thread_id: &str,
    text: &str,
    seq: u32,
) -> Result<Option<pb::OutboxItem>, StoreError> {
    let Some(thread) = store.get_thread(thread_id)? else {
        return Ok(None);
    };
    let Some(c) = store.get_connector(&thread.source)? else {
        return Ok(None);
    };
    // A CLI event that borrowed a connector's name made a byom thread,
    // not one on the provider.
    if c.kind != thread.kind {
        return Ok(None);
    }
    let now = byom_wire::now_ms();
    let mut it = pb::OutboxItem {
        id: crate::agents::world::new_id(Kind::Outbox),
        connector: c.name,
        thread_id: thread.id,
        external: thread.external,
        text: text.chars().take(MAX_SEND_CHARS).collect(),
        reply_id: reply_id.to_string(),
        created_at_ms: now,
        next_attempt_ms: now,
        seq,
        kind: c.kind,
        ..Default::default()
    };
    it.set_state(OutboxState::OutboxPending);
    if store.outbox_queue_len(&it.connector, OUTBOX_QUEUE_LIMIT)? >= OUTBOX_QUEUE_LIMIT {
        it.set_state(OutboxState::OutboxFailed);
        it.last_error = format!(
            "the outbox of {} holds {OUTBOX_QUEUE_LIMIT} unsent items; is the provider reachable? (`byom outbox ls`)",
            it.connector
        );
    }
    Ok(Some(it))
}

fn backoff(attempts: u32) -> Duration {
    let exp = BASE_BACKOFF.saturating_mul(1u32 << attempts.saturating_sub(1).min(16));
    exp.min(MAX_BACKOFF)
}

/// Sends `connector`'s items until `stop`.
pub async fn deliver(
    store: Store,
    connector: String,
    provider: Arc<dyn Provider>,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    recover(&store, &connector, provider.idempotent());
    loop {
        let next = match pass(&store, &connector, provider.as_ref(), &stop).await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(connector, "outbox: {e}");
                Some(Duration::from_secs(1))
            }
        };
        let wait = next.unwrap_or(IDLE_LOOK).min(IDLE_LOOK);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Items a crash left mid-attempt: where the provider dedupes, simply
/// sent again; elsewhere marked as possibly sent twice.
fn recover(store: &Store, connector: &str, idempotent: bool) {
    let Ok(queue) = store.outbox_queue(connector, OUTBOX_QUEUE_LIMIT) else {
        return;
    };
    for (_, id) in queue {
        let Ok(Some(mut it)) = store.get_outbox(&id) else {
            continue;
        };
        if it.in_flight {
            it.in_flight = false;
            if !idempotent {
                it.maybe_duplicate = true;
                tracing::warn!(
                    connector,
                    item = it.id,
                    "a send was cut by a restart; sending again (it may appear twice)"
                );
            }
            let _ = store.update_outbox(&it);
        }
    }
}

/// One pass: the head of each thread's queue, if due, is sent. Returns
/// how long until the next item is due.
async fn pass(
    store: &Store,
    connector: &str,
    provider: &dyn Provider,
    stop: &CancellationToken,
) -> Result<Option<Duration>, StoreError> {
    let queue = store.outbox_queue(connector, OUTBOX_QUEUE_LIMIT)?;
    let mut seen = HashSet::new();
    let mut next: Option<Duration> = None;
    for (thread, id) in queue {
        // Only the oldest item of a thread may go: order per thread.
        if !seen.insert(thread) {
            continue;
        }
        if stop.is_cancelled() {
            return Ok(None);
        }
        let Some(mut it) = store.get_outbox(&id)? else {
            continue;
        };
        let now = byom_wire::now_ms();
        if it.next_attempt_ms > now {
            let d = Duration::from_millis(it.next_attempt_ms - now);
            next = Some(next.map_or(d, |n| n.min(d)));
            continue;
        }
        if !provider.idempotent() {
            it.in_flight = true;
            store.update_outbox(&it)?;
            store.flush_async().await?;
        }
        it.attempts += 1;
        let result = provider.send(&it).await;
        it.in_flight = false;
        let now = byom_wire::now_ms();
        match result {
            Sent::Ok(receipt) => {
                it.set_state(OutboxState::OutboxSent);
                it.receipt = receipt;
                it.sent_at_ms = now;
                it.last_error.clear();
                tracing::info!(connector, item = it.id, thread = it.thread_id, "reply sent");
            }
            Sent::Retry { error, after } => {
                crate::metrics::outbox_send_failed(connector, it.attempts >= MAX_ATTEMPTS);
                let wait = after.map_or(backoff(it.attempts), |a| a.min(MAX_PAUSE));
                tracing::warn!(
                    connector,
                    item = it.id,
                    attempts = it.attempts,
                    "send failed, retrying in {wait:?}: {error}"
                );
                it.last_error = error;
                if it.attempts >= MAX_ATTEMPTS {
                    it.set_state(OutboxState::OutboxFailed);
                    it.last_error =
                        format!("gave up after {} attempts: {}", it.attempts, it.last_error);
                } else {
                    it.next_attempt_ms = now + wait.as_millis() as u64;
                    let d = wait;
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
            Sent::Fail(error) => {
                crate::metrics::outbox_send_failed(connector, true);
                tracing::warn!(connector, item = it.id, "send failed for good: {error}");
                it.set_state(OutboxState::OutboxFailed);
                it.last_error = error;
            }
        }
        store.update_outbox(&it)?;
        store.flush_async().await?;
    }
    Ok(next)
}

/// Puts a failed (or stuck) item back at the head of its thread's queue.
pub fn retry(store: &Store, id: &str) -> Result<pb::OutboxItem, String> {
    let mut it = store
        .get_outbox(id)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no outbox item {id}"))?;
    if it.state() == OutboxState::OutboxSent {
        return Err(format!(
            "{id} was sent (receipt {}); nothing to retry",
            it.receipt
        ));
    }
    it.set_state(OutboxState::OutboxPending);
    it.next_attempt_ms = 0;
    it.attempts = 0;
    store.update_outbox(&it).map_err(|e| e.to_string())?;
    Ok(it)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A provider that fails thread `thr_bad` until told otherwise and
    /// records what it sent.
    struct Fake {
        idempotent: bool,
        sent: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl Provider for Fake {
        fn idempotent(&self) -> bool {
            self.idempotent
        }
        async fn send(&self, it: &pb::OutboxItem) -> Sent {
            if it.thread_id == "thr_bad" {
                return Sent::Retry {
                    error: "HTTP 502".into(),
                    after: Some(Duration::from_secs(60)),
                };
            }
            self.sent.lock().unwrap().push(it.text.clone());
            Sent::Ok(format!("r-{}", it.text))
        }
        async fn test(&self) -> Result<String, String> {
            Ok("fake".into())
        }
    }

    fn item(store: &Store, thread: &str, text: &str, seq: u32) -> pb::OutboxItem {
        item_on(store, "c", thread, text, seq)
    }

    fn item_on(
        store: &Store,
        connector: &str,
        thread: &str,
        text: &str,
        seq: u32,
    ) -> pb::OutboxItem {
        let mut it = pb::OutboxItem {
            id: crate::agents::world::new_id(Kind::Outbox),
            connector: connector.into(),
            thread_id: thread.into(),
            text: text.into(),
            created_at_ms: 1000,
            seq,
            ..Default::default()
        };
        it.set_state(OutboxState::OutboxPending);
        store.batch(&byom_store::Op::outbox(&it)).unwrap();
        it
    }

    #[tokio::test]
    async fn in_order_per_thread_and_one_stuck_thread_blocks_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sled(dir.path()).unwrap();
        // Made in one step: the order is seq, not the random IDs.
        for (i, t) in ["one", "two", "three"].iter().enumerate() {
            item(&store, "thr_ok", t, i as u32);
        }
        let stuck = item(&store, "thr_bad", "stuck", 0);
        item(&store, "thr_bad", "after-stuck", 1);
        let fake = Fake {
            idempotent: true,
            sent: Mutex::new(Vec::new()),
        };
        let stop = CancellationToken::new();
        for _ in 0..4 {
            pass(&store, "c", &fake, &stop).await.unwrap();
        }
        assert_eq!(*fake.sent.lock().unwrap(), ["one", "two", "three"]);
        let s = store.get_outbox(&stuck.id).unwrap().unwrap();
        assert_eq!(s.state(), OutboxState::OutboxPending);
        assert_eq!((s.attempts, s.last_error.as_str()), (1, "HTTP 502"));
        assert_eq!(store.outbox_queue_len("c", 100).unwrap(), 2);
        // A failed item comes back with retry, at its thread's head.
        let mut f = s.clone();
        f.set_state(OutboxState::OutboxFailed);
        store.update_outbox(&f).unwrap();
        assert_eq!(store.outbox_queue_len("c", 100).unwrap(), 1);
        assert_eq!(retry(&store, &stuck.id).unwrap().attempts, 0);
        assert_eq!(store.outbox_queue("c", 100).unwrap()[0].1, stuck.id);
    }

    #[test]
    fn a_send_cut_by_a_crash_is_marked_where_the_provider_cannot_dedupe() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sled(dir.path()).unwrap();
        let mut a = item(&store, "thr_1", "a", 0);
        a.in_flight = true;
        store.update_outbox(&a).unwrap();
        let mut b = item_on(&store, "m", "thr_2", "b", 0);
        b.in_flight = true;
        store.update_outbox(&b).unwrap();
        recover(&store, "c", false);
        recover(&store, "m", true);
        let a = store.get_outbox(&a.id).unwrap().unwrap();
        assert!(a.maybe_duplicate && !a.in_flight);
        let b = store.get_outbox(&b.id).unwrap().unwrap();
        assert!(
            !b.maybe_duplicate && !b.in_flight,
            "transaction IDs make a resend safe"
        );
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(6), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
