//! The commands service, its watchers' side: who is woken when a command
//! changes, here and on the other replicas, and with what.

use std::sync::Arc;

use byom_protocol::pb;
use tokio::sync::watch;

use super::Commands;

/// What a command's watchers are woken with (every change wakes them):
/// the record once a change here ended the command (durable by then, and
/// final, so a watcher can show it without reading it back).
#[derive(Clone, Default)]
pub struct Wake {
    pub ended: Option<Arc<pb::Command>>,
}

impl Commands {
    /// Wakes everyone watching a command, on every replica.
    pub(super) fn notify(&self, cmd: &str) {
        self.notify_here(cmd);
        self.inner
            .live
            .cluster
            .tell(crate::cluster::Note::Command(cmd.to_string()));
    }

    /// Wakes everyone watching a command that just ended with record `c`,
    /// written and flushed; watchers here are handed the record (without
    /// its stdin, which no watcher shows and which may be large).
    pub(super) fn notify_ended(&self, mut c: pb::Command) {
        c.stdin = Vec::new();
        let id = c.id.clone();
        self.wake_here(&id, Some(Arc::new(c)));
        self.inner
            .live
            .cluster
            .tell(crate::cluster::Note::Command(id));
    }

    /// Wakes whoever watches a command on this server: another replica
    /// changed it, or may have.
    pub fn notify_here(&self, cmd: &str) {
        self.wake_here(cmd, None);
    }

    fn wake_here(&self, cmd: &str, ended: Option<Arc<pb::Command>>) {
        if let Ok(mut w) = self.inner.watchers.lock() {
            if let Some(tx) = w.get(cmd) {
                if tx.receiver_count() == 0 {
                    w.remove(cmd);
                } else {
                    // Marks the value seen-changed even when it stays.
                    tx.send_modify(|v| {
                        if ended.is_some() {
                            v.ended = ended;
                        }
                    });
                }
            }
        }
    }

    /// Forgets a command's subscription once its last receiver was
    /// dropped (its watch ended, or the command was never created).
    pub fn unsubscribed(&self, cmd: &str) {
        if let Ok(mut w) = self.inner.watchers.lock() {
            if w.get(cmd).is_some_and(|tx| tx.receiver_count() == 0) {
                w.remove(cmd);
            }
        }
    }

    /// The commands someone on this server watches.
    pub fn watched(&self) -> Vec<String> {
        self.inner
            .watchers
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Subscribe before reading the store, so no change is missed.
    pub fn subscribe(&self, cmd: &str) -> watch::Receiver<Wake> {
        match self.inner.watchers.lock() {
            Ok(mut w) => w
                .entry(cmd.to_string())
                .or_insert_with(|| watch::channel(Wake::default()).0)
                .subscribe(),
            // A poisoned lock: watchers fall back to polling.
            Err(_) => watch::channel(Wake::default()).1,
        }
    }
}
