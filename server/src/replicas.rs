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
    async fn act(&self, note: Note) {
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
            Note::Revoke(m, why) => self.revoke(&m, &why),
            Note::Connected(m) => {
                // The daemon is on another replica now: what is held here
                // is a connection it gave up.
                if let Some(l) = self.live.remove(&m) {
                    l.conn
                        .close(close::REPLACED.into(), b"replaced by a newer connection");
                }
            }
            Note::Agents => self.inbox.wake_here(),
            Note::Admins => crate::admins::changed(),
            Note::Resync => {
                crate::admins::changed();
                self.look().await
            }
        }
    }

    fn revoke(&self, machine: &str, why: &str) {
        self.identity.revoked.insert(machine);
        if let Some(l) = self.live.remove(machine) {
            l.conn.close(close::REVOKED.into(), why.as_bytes());
        }
    }

    /// Everything a missed note could have said, from the store in one
    /// look: the machines held here with queued work or revoked, the
    /// commands watched here, the agents' inbox.
    async fn look(&self) {
        let live: Vec<String> = self
            .live
            .all()
            .iter()
            .map(|l| l.machine_id.clone())
            .collect();
        let store = self.commands.store().clone();
        let found = tokio::task::spawn_blocking(move || {
            let queued: std::collections::HashSet<String> = store
                .all_pending()
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c.state() == byom_protocol::pb::CommandState::Queued)
                .map(|c| c.machine_id)
                .collect();
            let revoked: Vec<String> = live
                .into_iter()
                .filter(|m| {
                    store
                        .get_machine(m)
                        .ok()
                        .flatten()
                        .is_some_and(|m| m.revoked)
                })
                .collect();
            (queued, revoked)
        })
        .await;
        if let Ok((queued, revoked)) = found {
            for m in revoked {
                self.revoke(&m, "revoked");
            }
            for l in self.live.all() {
                if queued.contains(&l.machine_id) {
                    l.wake();
                }
            }
        }
        for c in self.commands.watched() {
            self.commands.notify_here(&c);
        }
        self.inbox.wake_here();
    }
}

/// Follows the other replicas until shutdown (nothing to follow with an
/// embedded store).
pub async fn follow(f: Followers, shutdown: CancellationToken) {
    let cluster = f.live.cluster.clone();
    let Some(mut notes) = f.commands.store().notices() else {
        return;
    };
    let mut backstop = tokio::time::interval(BACKSTOP);
    backstop.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = backstop.tick() => f.look().await,
            n = notes.recv() => match n {
                Ok(text) => match Note::decode(&text) {
                    Some((from, note)) if from != cluster.replica => f.act(note).await,
                    Some(_) => {}
                    None => tracing::debug!("unknown note from a replica: {text}"),
                },
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "fell behind the other replicas' notes: looking again");
                    f.look().await;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}
