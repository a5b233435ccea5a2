//! What a replica does with what the others tell it ([`Note`]), and the
//! periodic look that stands in for any note it missed: its machines' queues
//! and revocations, the commands watched here, the agents' inbox.

use std::sync::Arc;

use byom_protocol::close;
use tokio_util::sync::CancellationToken;

use crate::agents::AgentInbox;
use crate::cluster::{Note, BACKSTOP};
use crate::commands::Commands;
use crate::identity::ServerIdentity;
use crate::live::LiveMachines;

#[derive(Clone)]
pub struct Followers {
    pub live: Arc<LiveMachines>,
    pub commands: Commands,
    pub identity: Arc<ServerIdentity>,
    pub inbox: AgentInbox,
}

impl Followers {
    fn act(&self, note: Note) {
        match note {
            Note::Wake(m) => {
                if let Some(l) = self.live.get(&m) {
                    l.wake();
                }
            }
            Note::Cancel(m, c, why) => {
                if let Some(l) = self.live.get(&m) {
                    l.cancel(&c, &why);
                }
            }
            Note::Command(c) => self.commands.notify_here(&c),
            Note::Revoke(m, why) => {
                self.identity.revoked.insert(&m);
                if let Some(l) = self.live.remove(&m) {
                    l.conn.close(close::REVOKED.into(), why.as_bytes());
                }
            }
            Note::Connected(m) => {
                // The daemon is on another replica now: what is held here
                // is a connection it gave up.
                if let Some(l) = self.live.remove(&m) {
                    l.conn
                        .close(close::REPLACED.into(), b"replaced by a newer connection");
                }
            }
            Note::Agents => self.inbox.wake_here(),
            Note::Resync => self.look(),
        }
    }

    /// Everything a missed note could have said.
    fn look(&self) {
        for l in self.live.all() {
            l.wake();
        }
        for c in self.commands.watched() {
            self.commands.notify_here(&c);
        }
        self.inbox.wake_here();
    }

    /// Machines revoked on another replica whose note was missed: the
    /// store says so.
    async fn revoked_elsewhere(&self) {
        for l in self.live.all() {
            let store = self.commands.store_handle();
            let id = l.machine_id.clone();
            let revoked = tokio::task::spawn_blocking(move || store.get_machine(&id))
                .await
                .ok()
                .and_then(|r| r.ok().flatten())
                .is_some_and(|m| m.revoked);
            if revoked {
                self.act(Note::Revoke(l.machine_id.clone(), "revoked".into()));
            }
        }
    }
}

/// Follows the other replicas until shutdown (nothing to follow with an
/// embedded store).
pub async fn follow(f: Followers, shutdown: CancellationToken) {
    let cluster = f.live.cluster.clone();
    let Some(mut notes) = f.commands.store_handle().notices() else {
        return;
    };
    let mut backstop = tokio::time::interval(BACKSTOP);
    backstop.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = backstop.tick() => {
                f.look();
                f.revoked_elsewhere().await;
            }
            n = notes.recv() => match n {
                Ok(text) => match Note::decode(&text) {
                    Some((from, note)) if from != cluster.replica => f.act(note),
                    Some(_) => {}
                    None => tracing::debug!("unknown note from a replica: {text}"),
                },
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "fell behind the other replicas' notes: looking again");
                    f.look();
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}
