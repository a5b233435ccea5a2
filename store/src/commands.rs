//! Commands: the record, the per-machine queue index of non-terminal
//! commands, and the state machine every change is checked against
//! ([`Store::update_command`]: a transition `CommandState::can_become`
//! refuses is an error, never a write).

use std::ops::Bound;

use byom_protocol::pb::{self, CommandState};
use prost::Message;

use crate::backend::{prefix_end, Guard, Op, Space};
use crate::observe::Commit;
use crate::{Result, Store, StoreError, MAX_LIST};

fn pending_key(machine: &str, cmd: &str) -> Vec<u8> {
    format!("{machine}/{cmd}").into_bytes()
}

/// Larger records (a big stdin) are not remembered as the guess for a
/// command's next update (`Store::recent`).
const MAX_REMEMBERED_RECORD_BYTES: usize = 4096;

impl Store {
    /// The record and its queue entry appear together (a dispatcher that
    /// saw the entry first would take it for a crash's leftover), with
    /// `extra` writes that must not happen without it (an idempotency
    /// record).
    pub fn create_command(&self, c: &pb::Command, extra: &[Op]) -> Result<()> {
        debug_assert!(matches!(
            c.state(),
            CommandState::Queued | CommandState::Dispatched
        ));
        let bytes = c.encode_to_vec();
        let mut ops = vec![
            Op::put(Space::Commands, c.id.as_bytes(), bytes.clone()),
            Op::put(
                Space::Pending,
                pending_key(&c.machine_id, &c.id),
                Vec::new(),
            ),
        ];
        ops.extend_from_slice(extra);
        // Counted under the lock the count is read under, so a count being
        // taken never misses or doubles this one.
        let mut counts = self.lock_counts();
        self.timed(Commit::Write, || self.kv.batch(&ops))?;
        if let Some(n) = counts.get_mut(&c.machine_id) {
            *n += 1;
        }
        drop(counts);
        self.remember(&c.id, c, &bytes);
        self.observed_command(None, c);
        Ok(())
    }

    /// What this process last wrote of an unfinished command.
    fn remember(&self, id: &str, c: &pb::Command, bytes: &[u8]) {
        if c.state().is_terminal() || bytes.len() > MAX_REMEMBERED_RECORD_BYTES {
            self.recent.take(id);
        } else {
            self.recent.set(id, bytes.to_vec());
        }
    }

    fn lock_counts(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, usize>> {
        self.pending_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Commands in a machine's queue (not yet ended), without reading them:
    /// counted once from the queue index, then kept as commands come and go.
    ///
    /// On a store shared by replicas the others' creates and ends are not
    /// seen here, so it is counted each time.
    pub fn pending_count(&self, machine: &str) -> Result<usize> {
        let mut counts = self.lock_counts();
        if let Some(n) = counts.get(machine) {
            return Ok(*n);
        }
        let prefix = format!("{machine}/").into_bytes();
        let end = prefix_end(&prefix);
        let n = self
            .kv
            .range(
                Space::Pending,
                Bound::Included(&prefix),
                end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
                false,
                usize::MAX,
            )?
            .len();
        if !self.kv.is_shared() {
            counts.insert(machine.to_string(), n);
        }
        Ok(n)
    }

    /// Removes a queue entry (the command ended), keeping the count.
    fn unqueue(&self, machine: &str, cmd: &str) -> Result<()> {
        let mut counts = self.lock_counts();
        self.kv.delete(Space::Pending, &pending_key(machine, cmd))?;
        if let Some(n) = counts.get_mut(machine) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }

    pub fn get_command(&self, id: &str) -> Result<Option<pb::Command>> {
        self.get_msg(Space::Commands, id)
    }

    /// Commands by ID, in order, read together (one statement on a shared
    /// store, however long the queue).
    fn get_commands(&self, ids: &[String]) -> Result<Vec<Option<pb::Command>>> {
        let keys: Vec<Vec<u8>> = ids.iter().map(|id| id.as_bytes().to_vec()).collect();
        ids.iter()
            .zip(self.kv.get_many(Space::Commands, &keys)?)
            .map(|(id, v)| v.map(|b| crate::decode(id, &b)).transpose())
            .collect()
    }

    /// Updates a command. `f` returns the new state (or the same state to
    /// change only fields); illegal transitions are refused. A command that
    /// ends leaves its machine's queue: on a shared store in the same
    /// statement; on sled just after, because a sled transaction excludes
    /// every other operation while it runs (a crash in between leaves an
    /// entry [`Store::pending_commands`] cleans up).
    pub fn update_command<F>(&self, id: &str, mut f: F) -> Result<pb::Command>
    where
        F: FnMut(&mut pb::Command) -> Result<()>,
    {
        // Set by the read-modify step, read by the write step.
        let ended = std::cell::Cell::new(false);
        // The state the written record came from (the last attempt's).
        let was = std::cell::Cell::new(CommandState::Unspecified);
        let shared = self.kv.is_shared();
        let check = |c: &mut pb::Command| {
            let from = c.state();
            was.set(from);
            f(c)?;
            let to = c.state();
            ended.set(!from.is_terminal() && to.is_terminal());
            if from != to && !from.can_become(to) {
                return Err(StoreError::IllegalTransition {
                    id: c.id.clone(),
                    from: from.name(),
                    to: to.name(),
                });
            }
            Ok(())
        };
        let guess = self.recent.take(id);
        let c = self.update_msg_by(
            Space::Commands,
            id,
            guess,
            check,
            |c: &pb::Command, old, new| {
                let done = if shared && ended.get() {
                    let guard = Guard {
                        space: Space::Commands,
                        key: id.as_bytes().to_vec(),
                        value: old.to_vec(),
                    };
                    // It ended: nothing to remember (its entry was taken).
                    let ops = [
                        Op::put(Space::Commands, id.as_bytes(), new),
                        Op::delete(Space::Pending, pending_key(&c.machine_id, id)),
                    ];
                    self.timed(Commit::Write, || self.kv.batch_if(&guard, &ops))?
                } else {
                    let done = self.timed(Commit::Write, || {
                        self.kv.compare_and_swap(
                            Space::Commands,
                            id.as_bytes(),
                            Some(old),
                            Some(&new),
                        )
                    })?;
                    if done {
                        self.remember(id, c, &new);
                    }
                    done
                };
                Ok(done)
            },
        )?;
        if ended.get() && !shared {
            self.unqueue(&c.machine_id, &c.id)?;
        }
        self.observed_command(Some(was.get()), &c);
        Ok(c)
    }

    /// Moves a command to `to` only if it is in `from` now. Returns the new
    /// record, or `None` if it was not in `from` (another task won).
    pub fn transition(
        &self,
        id: &str,
        from: &[CommandState],
        to: CommandState,
        mut f: impl FnMut(&mut pb::Command),
    ) -> Result<Option<pb::Command>> {
        let mut skipped = false;
        let c = self.update_command(id, |c| {
            skipped = !from.contains(&c.state());
            if !skipped {
                c.set_state(to);
                f(c);
            }
            Ok(())
        })?;
        Ok(if skipped { None } else { Some(c) })
    }

    /// Non-terminal commands of a machine, oldest first.
    pub fn pending_commands(&self, machine: &str) -> Result<Vec<pb::Command>> {
        let prefix = format!("{machine}/").into_bytes();
        let end = prefix_end(&prefix);
        let keys = self.kv.range(
            Space::Pending,
            Bound::Included(&prefix),
            end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
            false,
            MAX_LIST,
        )?;
        let ids: Vec<String> = keys
            .iter()
            .map(|(k, _)| String::from_utf8_lossy(&k[prefix.len()..]).into_owned())
            .collect();
        let mut out = Vec::new();
        for (id, c) in ids.iter().zip(self.get_commands(&ids)?) {
            match c {
                Some(c) if !c.state().is_terminal() => out.push(c),
                // A crash between the terminal write and the index delete
                // leaves a stale entry: clean it now.
                Some(c) => self.unqueue(machine, &c.id)?,
                // Never deleted here: only a command's end removes it.
                None => tracing::warn!(cmd = %id, "queue entry without a command record"),
            }
        }
        Ok(out)
    }

    /// Every non-terminal command (for the queue sweeper).
    pub fn all_pending(&self) -> Result<Vec<pb::Command>> {
        let keys = self.kv.range(
            Space::Pending,
            Bound::Unbounded,
            Bound::Unbounded,
            false,
            MAX_LIST,
        )?;
        let ids: Vec<String> = keys
            .iter()
            .filter_map(|(k, _)| {
                let key = String::from_utf8_lossy(k);
                key.split_once('/').map(|(_, id)| id.to_string())
            })
            .collect();
        Ok(self
            .get_commands(&ids)?
            .into_iter()
            .flatten()
            .filter(|c| !c.state().is_terminal())
            .collect())
    }

    /// Newest first, stopping at commands created before `since_ms`.
    pub fn list_commands(
        &self,
        machine: Option<&str>,
        state: Option<CommandState>,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<pb::Command>> {
        self.scan_newest(Space::Commands, limit, |c: &pb::Command| {
            if c.created_at_ms < since_ms {
                return None;
            }
            Some(machine.is_none_or(|m| c.machine_id == m) && state.is_none_or(|s| c.state() == s))
        })
    }

    /// A page of the audit trail: up to `limit` commands (at most
    /// [`MAX_LIST`]), newest first, all older than the command `before`
    /// (`None`: from the newest). IDs sort by creation time, so the page's
    /// last ID is the next page's `before`.
    pub fn commands_before(&self, before: Option<&str>, limit: usize) -> Result<Vec<pb::Command>> {
        let rows = self.kv.range(
            Space::Commands,
            Bound::Unbounded,
            before.map_or(Bound::Unbounded, |b| Bound::Excluded(b.as_bytes())),
            true,
            limit.min(MAX_LIST),
        )?;
        rows.into_iter()
            .map(|(k, v)| crate::decode(&String::from_utf8_lossy(&k), &v))
            .collect()
    }
}
