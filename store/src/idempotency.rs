//! What creating calls with an idempotency key created, so that a retry
//! after a lost answer returns the first result. Records are written in the
//! same batch as the object they name ([`crate::Op::idempotency`]) and
//! forgotten after the idempotency window.

use std::ops::Bound;

use byom_protocol::pb;

use crate::backend::Space;
use crate::{decode, Result, Store};

/// Records read per expiry page.
const EXPIRE_PAGE: usize = 1024;

impl Store {
    pub fn get_idempotency(&self, key: &str) -> Result<Option<pb::IdempotencyRecord>> {
        self.get_msg(Space::Idempotency, key)
    }

    /// Forgets records made before `before_ms`, reading at most `max`
    /// records; returns how many were forgotten.
    pub fn expire_idempotency(&self, before_ms: u64, max: usize) -> Result<usize> {
        let mut forgotten = 0;
        let mut cursor: Option<Vec<u8>> = None;
        let mut read = 0;
        while read < max {
            let page = self.kv.range(
                Space::Idempotency,
                cursor.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
                Bound::Unbounded,
                false,
                EXPIRE_PAGE.min(max - read),
            )?;
            if page.is_empty() {
                break;
            }
            read += page.len();
            for (k, v) in &page {
                let r: pb::IdempotencyRecord = decode(&String::from_utf8_lossy(k), v)?;
                if r.created_at_ms < before_ms {
                    self.kv.delete(Space::Idempotency, k)?;
                    forgotten += 1;
                }
            }
            cursor = page.last().map(|(k, _)| k.clone());
        }
        Ok(forgotten)
    }
}
