//! Bytes by key: paused interpreters' snapshots and command output (each
//! chunk stored at its offset, so a resent chunk overwrites itself).

use std::ops::Bound;

use crate::backend::Space;
use crate::{Result, Store};

fn output_key(cmd: &str, stream: i32, offset: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(cmd.len() + 10);
    k.extend_from_slice(cmd.as_bytes());
    k.push(0);
    k.push(stream as u8);
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

impl Store {
    pub fn put_snapshot(&self, id: &str, bytes: &[u8]) -> Result<()> {
        self.kv.put(Space::Snapshots, id.as_bytes(), bytes)
    }

    pub fn get_snapshot(&self, id: &str) -> Result<Option<Vec<u8>>> {
        self.kv.get(Space::Snapshots, id.as_bytes())
    }

    /// IDs of every stored snapshot (their bytes stay on disk).
    pub fn snapshot_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .kv
            .keys(Space::Snapshots)?
            .into_iter()
            .map(|k| String::from_utf8_lossy(&k).into_owned())
            .collect())
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.kv.delete(Space::Snapshots, id.as_bytes())
    }

    // ── output ──

    /// Stores a chunk at its offset. Idempotent: a resent chunk overwrites
    /// itself.
    pub fn append_output(&self, cmd: &str, stream: i32, offset: u64, data: &[u8]) -> Result<()> {
        self.kv
            .put(Space::Output, &output_key(cmd, stream, offset), data)
    }

    /// Forgets one stored output chunk (the tail moved past it).
    pub fn delete_output(&self, cmd: &str, stream: i32, offset: u64) -> Result<()> {
        self.kv
            .delete(Space::Output, &output_key(cmd, stream, offset))
    }

    /// The stored chunks of a stream starting at or after `from`, as
    /// (offset, length).
    pub fn output_chunks(&self, cmd: &str, stream: i32, from: u64) -> Result<Vec<(u64, u64)>> {
        let start = output_key(cmd, stream, from);
        let end = output_key(cmd, stream, u64::MAX);
        Ok(self
            .kv
            .range(
                Space::Output,
                Bound::Included(&start),
                Bound::Included(&end),
                false,
                4096,
            )?
            .into_iter()
            .map(|(k, v)| (offset_of(&k), v.len() as u64))
            .collect())
    }

    /// End of the last output chunk stored for a stream (the store may
    /// not keep every byte before it: see the server's head and tail).
    pub fn output_len(&self, cmd: &str, stream: i32) -> Result<u64> {
        let start = output_key(cmd, stream, 0);
        let end = output_key(cmd, stream, u64::MAX);
        let last = self.kv.range(
            Space::Output,
            Bound::Included(&start),
            Bound::Included(&end),
            true,
            1,
        )?;
        Ok(match last.first() {
            Some((k, v)) => offset_of(k) + v.len() as u64,
            None => 0,
        })
    }

    /// Output from `from`, at most `max` bytes, as (offset, bytes) chunks.
    pub fn read_output(
        &self,
        cmd: &str,
        stream: i32,
        from: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let at = output_key(cmd, stream, from);
        let start = output_key(cmd, stream, 0);
        // The chunk that contains `from` starts at or before it.
        let first = self
            .kv
            .range(
                Space::Output,
                Bound::Included(&start),
                Bound::Included(&at),
                true,
                1,
            )?
            .into_iter()
            .next()
            .map(|(k, _)| k)
            .unwrap_or(at);
        let end = output_key(cmd, stream, u64::MAX);
        let mut out = Vec::new();
        let mut total = 0usize;
        for (k, v) in self.kv.range(
            Space::Output,
            Bound::Included(&first),
            Bound::Included(&end),
            false,
            4096,
        )? {
            let off = offset_of(&k);
            let end_off = off + v.len() as u64;
            if end_off <= from {
                continue;
            }
            let skip = from.saturating_sub(off) as usize;
            let data = v[skip..].to_vec();
            total += data.len();
            out.push((off + skip as u64, data));
            if total >= max {
                break;
            }
        }
        Ok(out)
    }
}

fn offset_of(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    if key.len() >= 8 {
        b.copy_from_slice(&key[key.len() - 8..]);
    }
    u64::from_be_bytes(b)
}
