//! Durable pauses: the interpreter's whole state as bytes.
//!
//! Between guest calls the wasm stack is empty, so linear memory, the
//! `__stack_pointer` global and the host's table of pending calls are the
//! whole state. Memory is stored as the 4 KiB chunks that differ from the
//! module's initial image (so untouched and zero pages cost nothing),
//! zstd-compressed.
//!
//! Layout: `BYOMSNP\0` | version (u32 LE) | module SHA-256 (32) |
//! header length (u32 LE) | header JSON | payload length (u32 LE) |
//! zstd(chunk index u32 LE + 4096 bytes, …) | HMAC-SHA256 over everything
//! before it. Restore refuses a wrong magic, version, module hash or HMAC.

use ring::hmac;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capability::PendingCall;

pub const SNAPSHOT_VERSION: u32 = 1;

/// Changed memory chunks as (byte offset, bytes).
pub(crate) type Chunks = Vec<(usize, Vec<u8>)>;
const MAGIC: &[u8; 8] = b"BYOMSNP\0";
const CHUNK: usize = 4096;
const ZSTD_LEVEL: i32 = 3;
/// Largest header or memory a snapshot may describe.
const MAX_HEADER_BYTES: usize = 16 << 20;
const MAX_MEMORY_BYTES: u64 = crate::limits::MAX_MEMORY_BYTES as u64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a byom snapshot")]
    BadMagic,
    #[error("snapshot format version {0} is not supported (expected {SNAPSHOT_VERSION})")]
    Version(u32),
    #[error("snapshot was made by a different interpreter module")]
    Module,
    #[error("snapshot signature does not match: it was altered or signed with another key")]
    Signature,
    #[error("snapshot is damaged: {0}")]
    Damaged(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SavedCall {
    pub id: u32,
    pub capability: String,
    pub args: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SnapshotBody {
    pub memory_len: u64,
    pub stack_pointer: u32,
    pub pending: Vec<SavedCall>,
    pub next_id: u32,
    pub clock_us: u64,
    pub capabilities: Vec<String>,
    pub calls_made: Vec<(String, usize)>,
}

/// A signed, self-describing interpreter state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    bytes: Vec<u8>,
}

fn module_hash() -> [u8; 32] {
    let mut out = [0u8; 32];
    let hex = crate::engine::MODULE_SHA256.trim();
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0);
    }
    out
}

struct Parts<'a> {
    header: &'a [u8],
    payload: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, SnapshotError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| SnapshotError::Damaged("truncated".into()))
}

impl Snapshot {
    pub fn from_bytes(bytes: Vec<u8>) -> Snapshot {
        Snapshot { bytes }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub(crate) fn capture(
        body: SnapshotBody,
        mem: &[u8],
        initial: &[u8],
        key: &[u8],
    ) -> anyhow::Result<Snapshot> {
        let mut raw = Vec::new();
        for (i, chunk) in mem.chunks(CHUNK).enumerate() {
            let start = i * CHUNK;
            let same = match initial.get(start..start + chunk.len()) {
                Some(init) => init == chunk,
                None => {
                    // Past the initial image the baseline is zero.
                    let tail = initial.get(start..).unwrap_or(&[]);
                    chunk
                        .iter()
                        .enumerate()
                        .all(|(j, b)| *b == tail.get(j).copied().unwrap_or(0))
                }
            };
            if !same {
                raw.extend_from_slice(&(i as u32).to_le_bytes());
                raw.extend_from_slice(chunk);
                raw.resize(raw.len() + (CHUNK - chunk.len()), 0);
            }
        }
        let payload = zstd::bulk::compress(&raw, ZSTD_LEVEL)?;
        let header = serde_json::to_vec(&body)?;
        let mut out = Vec::with_capacity(header.len() + payload.len() + 96);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&module_hash());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&payload);
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), &out);
        out.extend_from_slice(tag.as_ref());
        Ok(Snapshot { bytes: out })
    }

    fn parts(&self) -> Result<Parts<'_>, SnapshotError> {
        let b = &self.bytes;
        if b.len() < 8 || &b[..8] != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let v = u32_at(b, 8)?;
        if v != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version(v));
        }
        if b.get(12..44) != Some(&module_hash()[..]) {
            return Err(SnapshotError::Module);
        }
        let hl = u32_at(b, 44)? as usize;
        if hl > MAX_HEADER_BYTES {
            return Err(SnapshotError::Damaged("header too large".into()));
        }
        let header = b
            .get(48..48 + hl)
            .ok_or_else(|| SnapshotError::Damaged("truncated header".into()))?;
        let pl = u32_at(b, 48 + hl)? as usize;
        let start = 52 + hl;
        let payload = b
            .get(start..start + pl)
            .ok_or_else(|| SnapshotError::Damaged("truncated payload".into()))?;
        if b.len() != start + pl + 32 {
            return Err(SnapshotError::Damaged("wrong length".into()));
        }
        Ok(Parts { header, payload })
    }

    pub(crate) fn verify(&self, key: &[u8]) -> Result<SnapshotBody, SnapshotError> {
        let p = self.parts()?;
        let n = self.bytes.len();
        hmac::verify(
            &hmac::Key::new(hmac::HMAC_SHA256, key),
            &self.bytes[..n - 32],
            &self.bytes[n - 32..],
        )
        .map_err(|_| SnapshotError::Signature)?;
        let body: SnapshotBody =
            serde_json::from_slice(p.header).map_err(|e| SnapshotError::Damaged(e.to_string()))?;
        if body.memory_len > MAX_MEMORY_BYTES || !body.memory_len.is_multiple_of(65536) {
            return Err(SnapshotError::Damaged("bad memory size".into()));
        }
        Ok(body)
    }

    /// The memory delta, checked first: (memory length, chunks as (byte
    /// offset, bytes)). Applied onto a fresh instance (whose memory is the
    /// initial image) it reproduces the paused memory exactly.
    pub(crate) fn delta(
        &self,
        initial_len: usize,
        key: &[u8],
    ) -> Result<(usize, Chunks), SnapshotError> {
        let body = self.verify(key)?;
        let p = self.parts()?;
        let len = body.memory_len as usize;
        let cap = (len / CHUNK + 1) * (CHUNK + 4);
        let raw = zstd::bulk::decompress(p.payload, cap)
            .map_err(|e| SnapshotError::Damaged(e.to_string()))?;
        if raw.len() % (CHUNK + 4) != 0 {
            return Err(SnapshotError::Damaged("bad chunk list".into()));
        }
        if len < initial_len {
            return Err(SnapshotError::Damaged(
                "memory smaller than the module's".into(),
            ));
        }
        let mut out = Vec::with_capacity(raw.len() / (CHUNK + 4));
        for rec in raw.chunks(CHUNK + 4) {
            let idx = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as usize;
            let start = idx * CHUNK;
            if start >= len {
                return Err(SnapshotError::Damaged("chunk outside memory".into()));
            }
            let end = (start + CHUNK).min(len);
            out.push((start, rec[4..4 + (end - start)].to_vec()));
        }
        Ok((len, out))
    }

    /// Pending durable calls, read without checking the signature (for
    /// display, e.g. the question to ask). Never act on them unverified.
    pub fn pending_unverified(&self) -> Result<Vec<PendingCall>, SnapshotError> {
        let p = self.parts()?;
        let body: SnapshotBody =
            serde_json::from_slice(p.header).map_err(|e| SnapshotError::Damaged(e.to_string()))?;
        Ok(body
            .pending
            .into_iter()
            .map(|c| PendingCall {
                id: c.id,
                capability: c.capability,
                args: c.args,
            })
            .collect())
    }

    /// (memory bytes described, compressed payload bytes, total bytes).
    pub fn sizes(&self) -> (u64, usize, usize) {
        match self.parts() {
            Ok(p) => {
                let mem = serde_json::from_slice::<SnapshotBody>(p.header)
                    .map(|b| b.memory_len)
                    .unwrap_or(0);
                (mem, p.payload.len(), self.bytes.len())
            }
            Err(_) => (0, 0, self.bytes.len()),
        }
    }
}
