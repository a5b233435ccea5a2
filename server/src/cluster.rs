//! Several servers on one shared store: each is a replica with an ID, says
//! it is alive (a heartbeat with an expiry), records which machines it
//! holds the connections of (presence), and tells the others what they
//! must act on now through the store's notices: new work or a cancel for a
//! machine connected elsewhere, a changed command someone there watches, a
//! revocation, work for the agents. A periodic look (the backstop) covers
//! a notice lost with a connection.
//!
//! With the embedded store there is one server: nothing is told and
//! presence is only what [`crate::live::LiveMachines`] holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use byom_store::{Space, Store, StoreError};

/// How often a replica says it is alive, and how long that holds.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
pub const ALIVE_FOR: Duration = Duration::from_secs(5);
/// How often a replica looks for what a lost notice would have told it.
pub const BACKSTOP: Duration = Duration::from_secs(2);

/// Replicas looked at per heartbeat (more are assumed alive).
const MAX_REPLICAS: usize = 1024;
/// A dead replica's heartbeat is deleted this long after it expired.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// What one replica tells the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Machine has new work (or a freed slot).
    Wake(String),
    /// Stop command (2nd) on machine (1st), for reason (3rd).
    Cancel(String, String, String),
    /// A command changed: wake whoever watches it.
    Command(String),
    /// Machine revoked, for reason.
    Revoke(String, String),
    /// Machine connected to the replica that says so: any older
    /// connection of it elsewhere is stale.
    Connected(String),
    /// The agents' inbox has work.
    Agents,
    /// The admin list changed.
    Admins,
    /// Some notes may have been missed: look at everything.
    Resync,
}

impl Note {
    fn encode(&self, replica: &str) -> String {
        match self {
            Note::Wake(m) => format!("{replica} wake {m}"),
            Note::Cancel(m, c, why) => format!("{replica} cancel {m} {c} {why}"),
            Note::Command(c) => format!("{replica} cmd {c}"),
            Note::Revoke(m, why) => format!("{replica} revoke {m} {why}"),
            Note::Connected(m) => format!("{replica} conn {m}"),
            Note::Agents => format!("{replica} agents"),
            Note::Admins => format!("{replica} admins"),
            Note::Resync => "*".into(),
        }
    }

    /// The sender and the note; None for what this build does not know.
    pub fn decode(s: &str) -> Option<(String, Note)> {
        if s == "*" {
            return Some((String::new(), Note::Resync));
        }
        let mut it = s.splitn(3, ' ');
        let (from, kind, rest) = (it.next()?, it.next()?, it.next().unwrap_or(""));
        let word = |s: &str| -> Option<(String, String)> {
            let (a, b) = s.split_once(' ').unwrap_or((s, ""));
            (!a.is_empty()).then(|| (a.to_string(), b.to_string()))
        };
        let note = match kind {
            "wake" => Note::Wake(word(rest)?.0),
            "cancel" => {
                let (m, rest) = word(rest)?;
                let (c, why) = word(&rest)?;
                Note::Cancel(m, c, why)
            }
            "cmd" => Note::Command(word(rest)?.0),
            "revoke" => {
                let (m, why) = word(rest)?;
                Note::Revoke(m, why)
            }
            "conn" => Note::Connected(word(rest)?.0),
            "agents" => Note::Agents,
            "admins" => Note::Admins,
            _ => return None,
        };
        Some((from.to_string(), note))
    }
}

pub struct Cluster {
    /// This process's ID among the replicas.
    pub replica: String,
    /// The address daemons dial for this replica (said in its heartbeat,
    /// so every replica can tell daemons all of them).
    addr: std::sync::Mutex<String>,
    store: Option<Store>,
    /// Whether another replica was alive at the last heartbeat: alone, a
    /// replica tells no one (a statement per change saved). One that
    /// starts is heard of within a heartbeat, and its backstop looks
    /// cover what it was not told meanwhile.
    others: AtomicBool,
}

impl Cluster {
    /// The one server of an embedded store.
    pub fn alone() -> Arc<Cluster> {
        Arc::new(Cluster {
            replica: "local".into(),
            addr: std::sync::Mutex::default(),
            store: None,
            others: AtomicBool::new(false),
        })
    }

    /// A replica of `store` (alone if the store is not shared).
    pub fn join(store: &Store) -> Arc<Cluster> {
        if !store.is_shared() {
            return Self::alone();
        }
        let random = crate::vault::random_hex_key()
            .unwrap_or_else(|_| format!("{}{}", std::process::id(), byom_wire::now_ms()));
        let replica = format!("rep_{}", &random[..16.min(random.len())]);
        Arc::new(Cluster {
            replica,
            addr: std::sync::Mutex::default(),
            store: Some(store.clone()),
            // Until the first heartbeat has looked.
            others: AtomicBool::new(true),
        })
    }

    pub fn shared(&self) -> bool {
        self.store.is_some()
    }

    /// Sets the address daemons dial for this replica.
    pub fn set_addr(&self, addr: &str) {
        if let Ok(mut a) = self.addr.lock() {
            *a = addr.to_string();
        }
    }

    fn own_addr(&self) -> String {
        self.addr.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// The addresses daemons may dial: this replica's first, then every
    /// other live one's (for a daemon to keep, and fall back on).
    pub fn addrs(&self) -> Vec<String> {
        let mut out = vec![self.own_addr()];
        if let Some(s) = &self.store {
            let now = byom_wire::now_ms();
            if let Ok(all) = s.scan_prefix(Space::Replicas, "", MAX_REPLICAS) {
                for (_, v) in all {
                    let (until, addr) = beat(&v);
                    if until > now && !addr.is_empty() && !out.contains(&addr) {
                        out.push(addr);
                    }
                }
            }
        }
        out.retain(|a| !a.is_empty());
        out
    }

    /// Tells the other replicas `note`, after the writes made before it.
    pub fn tell(&self, note: Note) {
        if !self.others.load(Ordering::Relaxed) {
            return;
        }
        if let Some(s) = &self.store {
            if let Err(e) = s.notify(&note.encode(&self.replica)) {
                tracing::debug!("cannot tell the other replicas: {e}");
            }
        }
    }

    /// Records that this replica holds machine's connection `generation`.
    pub fn present(&self, machine: &str, generation: u64) {
        if let Some(s) = &self.store {
            let v = format!("{} {generation}", self.replica);
            if let Err(e) = s.put_raw(Space::Presence, machine, v.as_bytes()) {
                tracing::warn!(%machine, "cannot record the machine's presence: {e}");
            }
            self.tell(Note::Connected(machine.to_string()));
        }
    }

    /// The connection `generation` ended: presence goes, unless another
    /// replica (or a newer connection) took it over.
    pub fn absent(&self, machine: &str, generation: u64) {
        if let Some(s) = &self.store {
            let v = format!("{} {generation}", self.replica);
            let _ = s.cas_raw(Space::Presence, machine, Some(v.as_bytes()), None);
        }
    }

    /// Whether another live replica holds the machine's connection.
    pub fn online_elsewhere(&self, machine: &str) -> bool {
        let Some(s) = &self.store else {
            return false;
        };
        let Ok(Some(v)) = s.get_raw(Space::Presence, machine) else {
            return false;
        };
        let v = String::from_utf8_lossy(&v);
        let Some((replica, _)) = v.split_once(' ') else {
            return false;
        };
        replica != self.replica && self.alive(replica)
    }

    /// The machines whose connections other live replicas hold, from two
    /// reads (for metrics: one look per scrape, not one per machine).
    pub fn present_elsewhere(&self) -> Result<std::collections::HashSet<String>, StoreError> {
        let Some(s) = &self.store else {
            return Ok(Default::default());
        };
        let now = byom_wire::now_ms();
        let alive: std::collections::HashSet<String> = s
            .scan_prefix(Space::Replicas, "", MAX_REPLICAS)?
            .into_iter()
            .filter(|(r, v)| *r != self.replica && beat(v).0 > now)
            .map(|(r, _)| r)
            .collect();
        Ok(s.scan_prefix(Space::Presence, "", byom_store::MAX_LIST)?
            .into_iter()
            .filter(|(_, v)| {
                let v = String::from_utf8_lossy(v);
                v.split_once(' ').is_some_and(|(r, _)| alive.contains(r))
            })
            .map(|(m, _)| m)
            .collect())
    }

    /// Whether `replica`'s heartbeat has not expired.
    pub fn alive(&self, replica: &str) -> bool {
        let Some(s) = &self.store else {
            return replica == self.replica;
        };
        match s.get_raw(Space::Replicas, replica) {
            Ok(Some(v)) => beat(&v).0 > byom_wire::now_ms(),
            _ => false,
        }
    }

    /// Says this replica is alive until shutdown, then that it is gone.
    pub async fn heartbeat(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let Some(s) = self.store.clone() else {
            return;
        };
        let mut tick = tokio::time::interval(HEARTBEAT);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let now = byom_wire::now_ms();
            let until = now + ALIVE_FOR.as_millis() as u64;
            let (s2, me) = (s.clone(), self.replica.clone());
            let mut value = until.to_be_bytes().to_vec();
            value.extend_from_slice(self.own_addr().as_bytes());
            let r = tokio::task::spawn_blocking(move || {
                s2.put_raw(Space::Replicas, &me, &value)?;
                s2.scan_prefix(Space::Replicas, "", MAX_REPLICAS)
            })
            .await;
            match r {
                Ok(Ok(all)) => {
                    let mut others = all.len() >= MAX_REPLICAS;
                    for (r, v) in &all {
                        let until = beat(v).0;
                        if *r == self.replica {
                            continue;
                        }
                        others |= until > now;
                        // A replica killed without saying goodbye.
                        if until + FORGET_AFTER.as_millis() as u64 <= now {
                            let _ = s.delete_raw(Space::Replicas, r);
                        }
                    }
                    if others != self.others.swap(others, Ordering::Relaxed) {
                        tracing::info!(
                            "{}",
                            if others {
                                "other replicas are alive: telling them of changes"
                            } else {
                                "no other replica is alive: telling no one"
                            }
                        );
                    }
                }
                Ok(Err(e)) => tracing::warn!("cannot say this replica is alive: {e}"),
                Err(_) => {}
            }
        }
        let _ = s.delete_raw(Space::Replicas, &self.replica);
    }
}

/// A replica's heartbeat record: alive until (ms), then the address
/// daemons dial for it (empty from a replica that says none).
fn beat(v: &[u8]) -> (u64, String) {
    let until = v
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_be_bytes);
    let addr = v
        .get(8..)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .unwrap_or_default();
    (until, addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip() {
        for n in [
            Note::Wake("mch_1".into()),
            Note::Cancel(
                "mch_1".into(),
                "cmd_2".into(),
                "asked by ada: too slow".into(),
            ),
            Note::Cancel("mch_1".into(), "cmd_2".into(), String::new()),
            Note::Command("cmd_3".into()),
            Note::Revoke("mch_1".into(), "stolen laptop".into()),
            Note::Connected("mch_1".into()),
            Note::Agents,
            Note::Admins,
        ] {
            let (from, back) = Note::decode(&n.encode("rep_1")).unwrap();
            assert_eq!((from.as_str(), &back), ("rep_1", &n));
        }
        assert_eq!(Note::decode("*").unwrap().1, Note::Resync);
        assert!(Note::decode("rep_1 nonsense x").is_none());
        assert!(Note::decode("rep_1 wake").is_none());
    }
}
