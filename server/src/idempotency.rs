//! Exactly-once creation: a creating call that carries an idempotency key
//! writes, in the same batch as what it creates, a record of what it
//! created. A retry with the same key (from the same caller, within
//! [`limits::IDEMPOTENCY_TTL`]) finds the record and answers with the first
//! result; the same key with a different request is refused. Calls with the
//! same key are serialized, so two retries racing create once.

use std::sync::Arc;

use byom_protocol::{limits, pb};
use byom_store::{Op, Store, StoreError};
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Locks calls with the same key take (striped: equal keys share one).
const STRIPES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum IdemError {
    #[error(
        "bad idempotency key: use 1 to {} printable ASCII characters",
        limits::MAX_IDEMPOTENCY_KEY_LEN
    )]
    BadKey,
    #[error("idempotency key {0:?} was already used for a different request; use a new key")]
    Reused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a claimed key says.
pub enum Claim {
    /// The key was used before: what the first call created.
    Done(pb::IdempotencyRecord),
    /// Go ahead and create; put [`Pending::ops`] in the same batch.
    New(Pending),
}

/// A creation under way for a key (or for no key). Holding it keeps a
/// retry with the same key waiting until the creation is written.
pub struct Pending {
    key: Option<String>,
    request_sha256: String,
    _guard: Option<OwnedMutexGuard<()>>,
}

impl Pending {
    /// The record to write with the object (none without a key).
    pub fn ops(&self, object_id: &str, reply_json: &str) -> Vec<Op> {
        let Some(key) = &self.key else {
            return Vec::new();
        };
        let r = pb::IdempotencyRecord {
            object_id: object_id.to_string(),
            request_sha256: self.request_sha256.clone(),
            created_at_ms: byom_wire::now_ms(),
            reply_json: reply_json.to_string(),
        };
        vec![Op::idempotency(key, &r)]
    }
}

#[derive(Clone)]
pub struct Idempotency {
    store: Store,
    stripes: Arc<Vec<Arc<Mutex<()>>>>,
}

fn valid(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= limits::MAX_IDEMPOTENCY_KEY_LEN
        && key.bytes().all(|b| b.is_ascii_graphic())
}

impl Idempotency {
    pub fn new(store: Store) -> Idempotency {
        Idempotency {
            store,
            stripes: Arc::new((0..STRIPES).map(|_| Arc::new(Mutex::new(()))).collect()),
        }
    }

    /// Claims `key` for a `scope` call (`command`, `event`, …) by `caller`;
    /// `request` is the call's encoding without its key. An empty key
    /// claims nothing: the call creates as usual.
    pub async fn claim(
        &self,
        scope: &str,
        caller: &str,
        key: &str,
        request: &[u8],
    ) -> Result<Claim, IdemError> {
        let request_sha256 = byom_wire::hex(&byom_wire::sha256(request));
        if key.is_empty() {
            return Ok(Claim::New(Pending {
                key: None,
                request_sha256,
                _guard: None,
            }));
        }
        if !valid(key) {
            return Err(IdemError::BadKey);
        }
        let full = format!("{scope}/{caller}/{key}");
        let stripe = byom_wire::sha256(full.as_bytes())[0] as usize % STRIPES;
        let guard = self.stripes[stripe].clone().lock_owned().await;
        if let Some(r) = self.store.get_idempotency(&full)? {
            if r.request_sha256 != request_sha256 {
                return Err(IdemError::Reused(key.to_string()));
            }
            return Ok(Claim::Done(r));
        }
        Ok(Claim::New(Pending {
            key: Some(full),
            request_sha256,
            _guard: Some(guard),
        }))
    }

    /// Forgets keys older than the idempotency window.
    pub fn expire(&self) {
        let ttl = limits::IDEMPOTENCY_TTL.as_millis() as u64;
        let before = byom_wire::now_ms().saturating_sub(ttl);
        match self.store.expire_idempotency(before, usize::MAX) {
            Ok(0) => {}
            Ok(n) => tracing::debug!("forgot {n} idempotency keys"),
            Err(e) => tracing::warn!("cannot expire idempotency keys: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idem() -> (tempfile::TempDir, Idempotency, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open_sled(d.path()).unwrap();
        (d, Idempotency::new(s.clone()), s)
    }

    #[tokio::test]
    async fn a_key_answers_with_its_first_result_and_refuses_another_request() {
        let (_d, idem, store) = idem();
        let Claim::New(p) = idem.claim("command", "admin:a", "k", b"req").await.unwrap() else {
            panic!("new key");
        };
        store.batch(&p.ops("cmd_1", "")).unwrap();
        drop(p);
        let Claim::Done(r) = idem.claim("command", "admin:a", "k", b"req").await.unwrap() else {
            panic!("known key");
        };
        assert_eq!(r.object_id, "cmd_1");
        assert!(matches!(
            idem.claim("command", "admin:a", "k", b"other").await,
            Err(IdemError::Reused(_))
        ));
        // Keys are per caller and per kind of call.
        assert!(matches!(
            idem.claim("command", "admin:b", "k", b"req").await.unwrap(),
            Claim::New(_)
        ));
        assert!(matches!(
            idem.claim("event", "admin:a", "k", b"req").await.unwrap(),
            Claim::New(_)
        ));
        for bad in ["", "a b", "\u{1b}[2J", &"k".repeat(200)] {
            if bad.is_empty() {
                continue;
            }
            assert!(matches!(
                idem.claim("command", "admin:a", bad, b"req").await,
                Err(IdemError::BadKey)
            ));
        }
    }

    #[tokio::test]
    async fn racing_retries_wait_for_the_first() {
        let (_d, idem, store) = idem();
        let Claim::New(p) = idem.claim("command", "admin:a", "k", b"req").await.unwrap() else {
            panic!("new key");
        };
        let second = {
            let idem = idem.clone();
            tokio::spawn(async move { idem.claim("command", "admin:a", "k", b"req").await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "the retry waits for the creation");
        store.batch(&p.ops("cmd_1", "")).unwrap();
        drop(p);
        let Claim::Done(r) = second.await.unwrap().unwrap() else {
            panic!("the retry sees the first result");
        };
        assert_eq!(r.object_id, "cmd_1");
    }
}
