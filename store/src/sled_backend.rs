//! The embedded backend: sled, one tree per [`Space`], batches as
//! multi-tree transactions.

use std::ops::Bound;
use std::path::Path;

use crate::backend::{Backend, Guard, Kv, Op, Space};
use crate::{Result, StoreError};

pub struct SledBackend {
    db: sled::Db,
    trees: Vec<(Space, sled::Tree)>,
}

fn io(e: sled::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

impl SledBackend {
    pub fn open(dir: &Path) -> Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(ref err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                    StoreError::Io(format!(
                        "{e}: another `byom server` is using {}",
                        dir.display()
                    ))
                }
                other => io(other),
            })?;
        let mut trees = Vec::new();
        for s in Space::ALL {
            trees.push((s, db.open_tree(s.name()).map_err(io)?));
        }
        Ok(Self { db, trees })
    }

    fn tree(&self, space: Space) -> &sled::Tree {
        // Every Space was opened in `open`.
        &self
            .trees
            .iter()
            .find(|(s, _)| *s == space)
            .expect("all spaces are opened at start")
            .1
    }
}

impl Backend for SledBackend {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.tree(space).get(key).map_err(io)?.map(|v| v.to_vec()))
    }
    fn put(&self, space: Space, key: &[u8], value: &[u8]) -> Result<()> {
        self.tree(space).insert(key, value).map_err(io)?;
        Ok(())
    }
    fn delete(&self, space: Space, key: &[u8]) -> Result<()> {
        self.tree(space).remove(key).map_err(io)?;
        Ok(())
    }
    fn compare_and_swap(
        &self,
        space: Space,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        Ok(self
            .tree(space)
            .compare_and_swap(key, old, new)
            .map_err(io)?
            .is_ok())
    }
    fn range(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<Kv>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let iter = self.tree(space).range::<&[u8], _>((start, end));
        let mut out = Vec::new();
        let mut push = |r: sled::Result<(sled::IVec, sled::IVec)>| -> Result<bool> {
            let (k, v) = r.map_err(io)?;
            out.push((k.to_vec(), v.to_vec()));
            Ok(out.len() < limit)
        };
        if reverse {
            for r in iter.rev() {
                if !push(r)? {
                    break;
                }
            }
        } else {
            for r in iter {
                if !push(r)? {
                    break;
                }
            }
        }
        Ok(out)
    }
    fn keys(&self, space: Space) -> Result<Vec<Vec<u8>>> {
        self.tree(space)
            .iter()
            .keys()
            .map(|k| k.map(|k| k.to_vec()).map_err(io))
            .collect()
    }
    fn flush(&self) -> Result<()> {
        self.db.flush().map_err(io)?;
        Ok(())
    }
    fn batch(&self, ops: &[Op]) -> Result<()> {
        // sled panics on a transaction over no trees.
        if ops.is_empty() {
            return Ok(());
        }
        self.transact(None, ops).map(|_| ())
    }
    fn batch_if(&self, guard: &Guard, ops: &[Op]) -> Result<bool> {
        self.transact(Some(guard), ops)
    }
}

impl SledBackend {
    /// `ops` in one transaction, if `guard` holds in it.
    fn transact(&self, guard: Option<&Guard>, ops: &[Op]) -> Result<bool> {
        use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
        let spaces: Vec<Space> = {
            let mut v: Vec<Space> = ops
                .iter()
                .map(|o| o.space)
                .chain(guard.map(|g| g.space))
                .collect();
            v.sort_by_key(|s| s.name());
            v.dedup();
            v
        };
        let trees: Vec<sled::Tree> = spaces.iter().map(|s| self.tree(*s).clone()).collect();
        let at = |space: Space| spaces.iter().position(|s| *s == space);
        let r: std::result::Result<bool, TransactionError<()>> =
            trees.as_slice().transaction(|tx| {
                if let Some(g) = guard {
                    let i = at(g.space).ok_or(ConflictableTransactionError::Abort(()))?;
                    let now = tx[i].get(g.key.as_slice())?;
                    if now.as_deref() != Some(g.value.as_slice()) {
                        return Ok(false);
                    }
                }
                for op in ops {
                    let i = at(op.space).ok_or(ConflictableTransactionError::Abort(()))?;
                    match &op.value {
                        Some(v) => {
                            tx[i].insert(op.key.as_slice(), v.as_slice())?;
                        }
                        None => {
                            tx[i].remove(op.key.as_slice())?;
                        }
                    }
                }
                Ok(true)
            });
        match r {
            Ok(applied) => Ok(applied),
            Err(TransactionError::Storage(e)) => Err(io(e)),
            Err(TransactionError::Abort(())) => Err(StoreError::Io("batch aborted".into())),
        }
    }
}
