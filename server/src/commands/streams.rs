//! Command output and stdin of any length, on this replica.
//!
//! What the store keeps of each output stream is bounded: its head (the
//! first [`OutputKeep::head`] bytes, written as they come) and its tail
//! (the last [`OutputKeep::tail`] bytes, held here and written every
//! [`TAIL_WRITE`] and before the exit is stored); the command's record
//! says how many bytes in between were not kept. The client attached to
//! a command (`RunCommand`, `Exec`) gets every byte instead, through a
//! feed the gateway waits on, so a client that reads slowly slows the
//! command rather than losing output. A streamed stdin (`Exec`) waits here
//! for the machine's connection to start the command.
//!
//! Nothing here is durable: after a restart a watcher reads the store,
//! and a stdin stream in flight is cut (the command's record says so).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use byom_protocol::pb;
use byom_store::{Store, StoreError};
use tokio::sync::mpsc;

/// How often the tail of a long output is written to the store.
pub const TAIL_WRITE: Duration = Duration::from_secs(2);
/// Output chunks buffered for an attached client before the command's
/// stream waits for it.
const FEED_BUFFER: usize = 16;

/// What the store keeps of each output stream of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputKeep {
    pub head: u64,
    pub tail: u64,
}

impl Default for OutputKeep {
    fn default() -> Self {
        OutputKeep {
            head: 4 * 1024 * 1024,
            tail: 4 * 1024 * 1024,
        }
    }
}

/// The stdin an `Exec` call streams in, waiting for its command's start.
pub type StdinSource = tonic::Streaming<pb::ExecInput>;

/// Attached clients' feeds and waiting stdin streams, by command.
#[derive(Default)]
pub(crate) struct Feeds {
    outputs: Mutex<HashMap<String, mpsc::Sender<pb::Output>>>,
    stdins: Mutex<HashMap<String, StdinSource>>,
}

impl Feeds {
    /// The feed of every output chunk of command `id`, from now on.
    pub fn attach(&self, id: &str) -> mpsc::Receiver<pb::Output> {
        let (tx, rx) = mpsc::channel(FEED_BUFFER);
        if let Ok(mut m) = self.outputs.lock() {
            m.insert(id.to_string(), tx);
        }
        rx
    }

    pub fn detach(&self, id: &str) {
        if let Ok(mut m) = self.outputs.lock() {
            m.remove(id);
        }
    }

    /// Hands a chunk to the attached client, waiting while its buffer is
    /// full. A client gone is forgotten.
    pub async fn publish(&self, id: &str, o: &pb::Output) {
        let tx = match self.outputs.lock() {
            Ok(m) => m.get(id).cloned(),
            Err(_) => None,
        };
        let Some(tx) = tx else { return };
        if tx.send(o.clone()).await.is_err() {
            self.detach(id);
        }
    }

    pub fn put_stdin(&self, id: &str, s: StdinSource) {
        if let Ok(mut m) = self.stdins.lock() {
            m.insert(id.to_string(), s);
        }
    }

    pub fn take_stdin(&self, id: &str) -> Option<StdinSource> {
        self.stdins.lock().ok().and_then(|mut m| m.remove(id))
    }
}

/// A tail chunk: its offset, its length, and its bytes until they are
/// written.
struct Chunk {
    offset: u64,
    len: u64,
    unwritten: Option<Vec<u8>>,
}

/// What the store keeps of one command's output, for the stream that
/// receives it: heads written at once, tails held and written now and
/// then.
pub struct Keeper {
    id: String,
    keep: OutputKeep,
    tails: [VecDeque<Chunk>; 2],
    tail_bytes: [u64; 2],
    /// Written tail chunks that fell out of the tail: removed at the next
    /// write.
    gone: Vec<(i32, u64)>,
    last_write: Instant,
}

fn slot(stream: i32) -> usize {
    usize::from(stream == 2)
}

impl Keeper {
    /// For command `id`; tail chunks an earlier stream wrote (before a
    /// reconnect or a restart) are read back so they age out as well.
    pub fn new(store: &Store, id: &str, keep: OutputKeep) -> Result<Keeper, StoreError> {
        let mut k = Keeper {
            id: id.to_string(),
            keep,
            tails: [VecDeque::new(), VecDeque::new()],
            tail_bytes: [0, 0],
            gone: Vec::new(),
            last_write: Instant::now(),
        };
        for stream in [1, 2] {
            for (offset, len) in store.output_chunks(id, stream, keep.head)? {
                k.tails[slot(stream)].push_back(Chunk {
                    offset,
                    len,
                    unwritten: None,
                });
                k.tail_bytes[slot(stream)] += len;
            }
        }
        Ok(k)
    }

    /// Takes a chunk (stream 1 or 2): written now if it starts in the
    /// head, else held in the tail.
    pub fn take(
        &mut self,
        store: &Store,
        stream: i32,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        if offset < self.keep.head {
            return store.append_output(&self.id, stream, offset, data);
        }
        let i = slot(stream);
        self.tails[i].push_back(Chunk {
            offset,
            len: data.len() as u64,
            unwritten: Some(data.to_vec()),
        });
        self.tail_bytes[i] += data.len() as u64;
        while let Some(front) = self.tails[i].front() {
            if self.tail_bytes[i] - front.len < self.keep.tail {
                break;
            }
            self.tail_bytes[i] -= front.len;
            if let Some(c) = self.tails[i].pop_front() {
                if c.unwritten.is_none() {
                    self.gone.push((stream, c.offset));
                }
            }
        }
        Ok(())
    }

    /// Whether the tail has changed since it was last written, and it is
    /// time to write it.
    pub fn due(&self) -> bool {
        self.last_write.elapsed() >= TAIL_WRITE && self.dirty()
    }

    fn dirty(&self) -> bool {
        !self.gone.is_empty()
            || self
                .tails
                .iter()
                .any(|t| t.iter().any(|c| c.unwritten.is_some()))
    }

    /// Writes the tail as it is now (the caller flushes).
    pub fn write(&mut self, store: &Store) -> Result<(), StoreError> {
        self.last_write = Instant::now();
        for (stream, offset) in std::mem::take(&mut self.gone) {
            store.delete_output(&self.id, stream, offset)?;
        }
        for (i, stream) in [1, 2].into_iter().enumerate() {
            for c in self.tails[i].iter_mut() {
                if let Some(data) = c.unwritten.take() {
                    store.append_output(&self.id, stream, c.offset, &data)?;
                }
            }
        }
        Ok(())
    }
}

/// Bytes of a stream of `total` bytes the store did not keep.
pub fn elided(store: &Store, id: &str, stream: i32, total: u64) -> Result<u64, StoreError> {
    let kept: u64 = store
        .output_chunks(id, stream, 0)?
        .iter()
        .map(|(_, len)| *len)
        .sum();
    Ok(total.saturating_sub(kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_the_head_and_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sled(dir.path()).unwrap();
        let keep = OutputKeep { head: 10, tail: 10 };
        let mut k = Keeper::new(&store, "cmd_a", keep).unwrap();
        let mut at = 0u64;
        for n in 0..20u8 {
            let data = vec![n; 4];
            k.take(&store, 1, at, &data).unwrap();
            at += 4;
            if n % 3 == 0 {
                k.write(&store).unwrap();
            }
        }
        k.write(&store).unwrap();
        let chunks = store.output_chunks("cmd_a", 1, 0).unwrap();
        let offsets: Vec<u64> = chunks.iter().map(|c| c.0).collect();
        // Head: chunks starting before 10; tail: the last 10+ bytes.
        assert_eq!(offsets, vec![0, 4, 8, 68, 72, 76]);
        assert_eq!(elided(&store, "cmd_a", 1, at).unwrap(), 80 - 24);
        // A new keeper (a reconnect) ages out what the old one wrote.
        let mut k = Keeper::new(&store, "cmd_a", keep).unwrap();
        for n in 0..3u8 {
            k.take(&store, 1, at, &[n; 4]).unwrap();
            at += 4;
        }
        k.write(&store).unwrap();
        let offsets: Vec<u64> = store
            .output_chunks("cmd_a", 1, 0)
            .unwrap()
            .iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(offsets, vec![0, 4, 8, 80, 84, 88]);
    }
}
