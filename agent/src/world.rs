//! What the core needs from outside ([`World`]), and the one world tests
//! and the simulator use ([`TestWorld`]): a settable clock, IDs that are
//! deterministic yet, like real ones, unordered within a millisecond, and
//! stored objects the test (or the simulation) puts there.

use std::collections::HashMap;

use byom_protocol::id::{encode_body, Kind};

use crate::event::TriggerInfo;
use crate::Ms;

/// What the core needs from outside, all of it deterministic in simulation.
pub trait World {
    fn now(&self) -> Ms;
    fn new_id(&mut self, kind: Kind) -> String;
    /// The Router's natural-language policies.
    fn policies(&self) -> Vec<String>;
    /// One line per machine (name, state, labels), for the Router.
    fn machines(&self) -> Vec<String>;
    /// The full text of a stored object (trigger, thread, command with its
    /// output, snapshot), for recall/read.
    fn lookup(&self, id: &str) -> Option<String>;
    /// The channel a thread is on (`chat`, `github`, …), if it exists.
    fn thread_source(&self, thread: &str) -> Option<String>;
}

/// A deterministic world for tests and the simulator.
#[derive(Debug, Clone, Default)]
pub struct TestWorld {
    pub now: Ms,
    seq: u64,
    pub policies: Vec<String>,
    /// Machine names, all online.
    pub machines: Vec<String>,
    /// Triggers seen, by ID (recall and bounce read them).
    pub triggers: HashMap<String, TriggerInfo>,
    /// Thread → source. Threads not listed are on `default_source`.
    pub threads: HashMap<String, String>,
    /// Source of threads not in `threads` (`None`: they do not exist).
    pub default_source: Option<String>,
    /// Other objects' full text, by ID.
    pub objects: HashMap<String, String>,
}

impl TestWorld {
    /// A world with one online machine, `lap`, where every thread is chat.
    pub fn new() -> TestWorld {
        TestWorld {
            machines: vec!["lap".into()],
            default_source: Some("chat".into()),
            ..TestWorld::default()
        }
    }

    /// Makes a trigger known (as storing it would).
    pub fn saw(&mut self, t: &TriggerInfo) {
        self.triggers.insert(t.id.clone(), t.clone());
        self.threads.insert(t.thread.clone(), t.source.clone());
    }
}

impl World for TestWorld {
    fn now(&self) -> Ms {
        self.now
    }

    fn new_id(&mut self, kind: Kind) -> String {
        self.seq += 1;
        let mut r = [0u8; 10];
        // Like real IDs, those made in the same millisecond sort in no
        // particular order: the core must not take ID order for age.
        let mut x = self.seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        r[2..].copy_from_slice(&x.to_be_bytes());
        format!("{}{}", kind.prefix(), encode_body(self.now, r))
    }

    fn policies(&self) -> Vec<String> {
        self.policies.clone()
    }

    fn machines(&self) -> Vec<String> {
        self.machines
            .iter()
            .map(|m| format!("{m} (online)"))
            .collect()
    }

    fn lookup(&self, id: &str) -> Option<String> {
        if let Some(t) = self.triggers.get(id) {
            return serde_json::to_string(&serde_json::json!({
                "thread_id": t.thread, "source": t.source, "user": t.user,
                "text": t.text, "mention": t.mention
            }))
            .ok();
        }
        self.objects.get(id).cloned()
    }

    fn thread_source(&self, thread: &str) -> Option<String> {
        self.threads
            .get(thread)
            .cloned()
            .or_else(|| self.default_source.clone())
    }
}
