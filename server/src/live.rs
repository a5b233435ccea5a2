//! Daemons connected to this server right now. Nothing here is durable: a
//! restarted server rebuilds it from daemons reconnecting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::MutexGuard;
use std::sync::{Arc, Mutex};

use byom_protocol::pb::{self, CommandState};
use byom_store::Store;
use tokio::sync::{mpsc, Notify};

use crate::cluster::{Cluster, Note};

/// A connected daemon.
pub struct LiveMachine {
    pub machine_id: String,
    pub conn: quinn::Connection,
    /// The daemon process's ID: a different one means it restarted.
    pub instance_id: String,
    /// Tells this connection from a newer one of the same machine.
    pub generation: u64,
    pub max_concurrency: usize,
    /// The owner paused the daemon: dispatch nothing.
    pub paused: AtomicBool,
    slots: Mutex<Slots>,
    /// The dispatcher should read the machine's queue in the store.
    look: AtomicBool,
    /// The queue may hold commands the dispatcher has not taken: a freed
    /// slot is then a reason to look again. Without it, a command's end
    /// costs no read of the queue.
    backlog: AtomicBool,
    /// Rung whenever the dispatcher has something to do.
    work: Notify,
    /// Held by a command's creation from counting the machine's queue to
    /// storing the command, so concurrent creations each count the others
    /// and can all go straight to a free slot.
    pub admission: tokio::sync::Mutex<()>,
}

/// The connection's command slots (at most `max_concurrency` in use).
#[derive(Default)]
struct Slots {
    /// Commands with an open stream on this connection → their cancel bell.
    active: HashMap<String, mpsc::Sender<String>>,
    /// Slots promised to commands stored `dispatched` whose stream is not
    /// open yet.
    reserved: usize,
    /// Commands whose end is stored while their stream closes.
    ended: std::collections::HashSet<String>,
    /// Commands created straight into a reserved slot, for the dispatcher
    /// to send.
    handed: Vec<pb::Command>,
}

impl LiveMachine {
    pub fn new(
        machine_id: String,
        conn: quinn::Connection,
        instance_id: String,
        generation: u64,
        max_concurrency: usize,
        paused: bool,
    ) -> LiveMachine {
        LiveMachine {
            machine_id,
            conn,
            instance_id,
            generation,
            max_concurrency,
            paused: AtomicBool::new(paused),
            slots: Mutex::default(),
            // A new connection reads its queue once.
            look: AtomicBool::new(true),
            backlog: AtomicBool::new(true),
            work: Notify::new(),
            admission: tokio::sync::Mutex::new(()),
        }
    }

    pub fn online(&self) -> bool {
        self.conn.close_reason().is_none()
    }

    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
        if !paused {
            self.wake();
        }
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        // The bookkeeping stays consistent under each lock: a panic
        // elsewhere does not make it wrong.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Commands with a stream open now.
    pub fn active_count(&self) -> usize {
        self.slots().active.len()
    }

    /// Commands this connection holds that are unfinished in the store:
    /// streams open and not ended, and slots promised to stored ones.
    pub fn unfinished(&self) -> usize {
        let s = self.slots();
        s.active.len().saturating_sub(s.ended.len()) + s.reserved
    }

    /// The command's end is stored; its stream is closing.
    pub fn ended(&self, cmd: &str) {
        let mut s = self.slots();
        if s.active.contains_key(cmd) {
            s.ended.insert(cmd.to_string());
        }
    }

    /// Promises up to `n` free slots; returns how many.
    pub fn reserve(&self, n: usize) -> usize {
        let mut s = self.slots();
        let free = self
            .max_concurrency
            .saturating_sub(s.active.len() + s.reserved);
        let k = n.min(free);
        s.reserved += k;
        k
    }

    /// Gives back `n` promised slots that were not used.
    pub fn release(&self, n: usize) {
        let mut s = self.slots();
        s.reserved = s.reserved.saturating_sub(n);
    }

    /// A command's stream opened: `tx` reaches it with cancel reasons.
    /// `reserved`: it takes a slot promised by [`LiveMachine::reserve`].
    pub fn track(&self, cmd: &str, tx: mpsc::Sender<String>, reserved: bool) {
        let mut s = self.slots();
        s.active.insert(cmd.to_string(), tx);
        if reserved {
            s.reserved = s.reserved.saturating_sub(1);
        }
    }

    /// A command's stream closed: a slot is free, worth a look at the
    /// queue only if it may hold more.
    pub fn untrack(&self, cmd: &str) {
        {
            let mut s = self.slots();
            s.active.remove(cmd);
            s.ended.remove(cmd);
        }
        if self.backlog.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Asks the daemon to stop a command it runs; false if none is open here.
    pub fn cancel(&self, cmd: &str, reason: &str) -> bool {
        let tx = self.slots().active.get(cmd).cloned();
        match tx {
            Some(tx) => tx.try_send(reason.to_string()).is_ok(),
            None => false,
        }
    }

    /// Hands the dispatcher a command stored `dispatched` to this
    /// connection, in a slot reserved for it.
    pub fn hand(&self, c: pb::Command) {
        self.slots().handed.push(c);
        self.work.notify_one();
    }

    /// The commands handed over since the last call.
    pub fn take_handed(&self) -> Vec<pb::Command> {
        std::mem::take(&mut self.slots().handed)
    }

    /// Whether the dispatcher should read the queue (once per request).
    pub fn take_look(&self) -> bool {
        self.look.swap(false, Ordering::SeqCst)
    }

    /// Whether the queue may hold commands not taken yet. The dispatcher
    /// clears it before it reads the queue, so a wake that comes while it
    /// reads is not lost.
    pub fn set_backlog(&self, maybe: bool) {
        self.backlog.store(maybe, Ordering::SeqCst);
    }

    /// There may be work: the machine's dispatcher looks at its queue.
    pub fn wake(&self) {
        self.backlog.store(true, Ordering::SeqCst);
        self.look.store(true, Ordering::SeqCst);
        self.work.notify_one();
    }

    /// Waits until [`LiveMachine::wake`] or [`LiveMachine::hand`] was
    /// called (a call made before anyone waited counts).
    pub async fn woken(&self) {
        self.work.notified().await;
    }
}

/// The map of live connections, one per machine, on this server; with
/// replicas, what the others hold is known through [`Cluster`].
pub struct LiveMachines {
    map: Mutex<HashMap<String, Arc<LiveMachine>>>,
    pub cluster: Arc<Cluster>,
}

impl Default for LiveMachines {
    fn default() -> Self {
        Self::new(Cluster::alone())
    }
}

impl LiveMachines {
    pub fn new(cluster: Arc<Cluster>) -> LiveMachines {
        LiveMachines {
            map: Mutex::new(HashMap::new()),
            cluster,
        }
    }

    pub fn get(&self, machine_id: &str) -> Option<Arc<LiveMachine>> {
        self.map.lock().ok()?.get(machine_id).cloned()
    }

    /// Every machine connected here.
    pub fn all(&self) -> Vec<Arc<LiveMachine>> {
        self.map
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether the machine has an open connection now, here or on another
    /// replica.
    pub fn online(&self, machine_id: &str) -> bool {
        match self.get(machine_id) {
            Some(l) => l.online(),
            None => self.cluster.online_elsewhere(machine_id),
        }
    }

    /// There may be work for the machine: its dispatcher looks, wherever
    /// its connection is.
    pub fn wake(&self, machine_id: &str) {
        match self.get(machine_id) {
            Some(l) => l.wake(),
            None => self.cluster.tell(Note::Wake(machine_id.to_string())),
        }
    }

    /// Asks the machine's daemon to stop `cmd`, wherever its connection is.
    pub fn cancel(&self, machine_id: &str, cmd: &str, reason: &str) {
        match self.get(machine_id) {
            Some(l) => {
                l.cancel(cmd, reason);
            }
            None => self.cluster.tell(Note::Cancel(
                machine_id.to_string(),
                cmd.to_string(),
                reason.to_string(),
            )),
        }
    }

    /// Adds a connection, returning the one it replaces.
    pub fn insert(&self, live: Arc<LiveMachine>) -> Option<Arc<LiveMachine>> {
        self.cluster.present(&live.machine_id, live.generation);
        self.map.lock().ok()?.insert(live.machine_id.clone(), live)
    }

    /// Removes the machine's connection if it is still `generation`.
    pub fn remove_if(&self, machine_id: &str, generation: u64) -> bool {
        let Ok(mut l) = self.map.lock() else {
            return false;
        };
        if l.get(machine_id).map(|x| x.generation) == Some(generation) {
            l.remove(machine_id);
            drop(l);
            self.cluster.absent(machine_id, generation);
            true
        } else {
            false
        }
    }

    pub fn remove(&self, machine_id: &str) -> Option<Arc<LiveMachine>> {
        let l = self.map.lock().ok()?.remove(machine_id)?;
        self.cluster.absent(machine_id, l.generation);
        Some(l)
    }
}

/// A stored machine with what only a live server knows: online, paused,
/// how many commands it runs and has queued.
pub fn decorate(store: &Store, live: &LiveMachines, mut m: pb::Machine) -> pb::Machine {
    if let Some(l) = live.get(&m.id) {
        m.online = l.online();
        m.paused = l.paused();
        m.running_commands = l.active_count() as u32;
    } else if live.cluster.online_elsewhere(&m.id) {
        m.online = true;
    }
    if let Ok(p) = store.pending_commands(&m.id) {
        m.queued_commands = p
            .iter()
            .filter(|c| c.state() == CommandState::Queued)
            .count() as u32;
    }
    m
}
