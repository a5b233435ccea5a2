//! What the core needs from outside ([`World`]), and the one world tests
//! and the simulator use ([`TestWorld`]): a settable clock, IDs that are
//! deterministic yet, like real ones, unordered within a millisecond, and
//! stored objects the test (or the simulation) puts there.

use std::collections::{BTreeMap, HashMap};

use byom_protocol::id::{encode_body, Kind};

use crate::event::TriggerInfo;
use crate::trust::Trust;
use crate::Ms;

/// A read the world could not make (its store is away). Nothing is
/// decided on a guess: the step that needed it is void (its effects and
/// writes thrown away) and runs again, as after a failed commit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the world could not be read: {0}")]
pub struct Unavailable(pub String);

/// What a read of the world gives.
pub type Read<T> = Result<T, Unavailable>;

/// What the core needs from outside, all of it deterministic in simulation.
/// Every read that can fail says so ([`Unavailable`]).
pub trait World {
    fn now(&self) -> Ms;
    fn new_id(&mut self, kind: Kind) -> String;
    /// The Router's natural-language policies.
    fn policies(&self) -> Read<Vec<String>>;
    /// One line per machine (name, state, labels), for the Router.
    fn machines(&self) -> Read<Vec<String>>;
    /// The full text of a stored object (trigger, thread, command with its
    /// output, snapshot), for recall/read (`None`: no such object).
    fn lookup(&self, id: &str) -> Read<Option<String>>;
    /// Where a thread is, if it exists.
    fn thread(&self, thread: &str) -> Read<Option<ThreadInfo>>;
    /// The thread named `source:external` (e.g. `gh:acme/app#12`) or by a
    /// GitHub pull request or issue URL, made if the source is a connector
    /// and it does not exist yet. `None`: no such source.
    fn find_thread(&mut self, name: &str) -> Read<Option<String>>;
    /// Who is trusted and who may approve (`byom trust`).
    fn trust(&self) -> Read<Trust>;
    /// The machine `machine` names (name or ID), or when it is empty every
    /// machine carrying all of `labels`: what a command there could reach.
    fn machines_for(
        &self,
        machine: &str,
        labels: &BTreeMap<String, String>,
    ) -> Read<Vec<MachineInfo>>;
    /// Why a stored object holds text from someone untrusted (`None`: it
    /// does not, or no such object).
    fn untrusted(&self, id: &str) -> Read<Option<String>>;
    /// Why anyone at all reads `thread`, whoever has spoken there (an
    /// issue on a public repository); `None`: only those who speak there.
    fn public(&self, thread: &str) -> Read<Option<String>>;
}

/// A machine as containment sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Programs its owner declared read-only for agents (`policy.toml`).
    pub read_only: Vec<String>,
}

impl MachineInfo {
    /// Every machine is sensitive (its owner's keys, mail and code) unless
    /// labelled `sensitive=false`.
    pub fn sensitive(&self) -> bool {
        self.labels.get("sensitive").map(String::as_str) != Some("false")
    }
}

/// Where a thread is and what may be said there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadInfo {
    /// The source (a connector's name, `chat`, a webhook source).
    pub source: String,
    /// The kind of channel: `matrix`, `slack`, `chat` (talk: short
    /// replies) or `github`, `webhook`, `cli` (asynchronous: structured).
    pub kind: String,
    /// The Router may post here unprompted (its connector's `post_to`).
    pub open: bool,
}

impl ThreadInfo {
    /// Chat norms (short, with a pointer to the rest) or structured ones.
    pub fn is_chat(&self) -> bool {
        matches!(self.kind.as_str(), "chat" | "matrix" | "slack")
    }
}

/// `owner/repo#N` for a GitHub pull request or issue URL.
pub fn github_thread(url: &str) -> Option<String> {
    let rest = url.trim().strip_prefix("https://github.com/")?;
    match rest.split('/').collect::<Vec<_>>().as_slice() {
        [o, r, "pull" | "issues", n]
            if n.parse::<u64>().is_ok() && !o.is_empty() && !r.is_empty() =>
        {
            Some(format!("{o}/{r}#{n}"))
        }
        _ => None,
    }
}

/// The kind a test or simulated thread on `source` has: a connector kind
/// when the source is named like one, else `cli`.
fn test_kind(source: &str) -> String {
    match source {
        "chat" | "matrix" | "slack" | "github" | "webhook" => source.to_string(),
        _ => "cli".into(),
    }
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
    /// Sources the Router may post on unprompted.
    pub open_sources: Vec<String>,
    /// `source:external` → thread, for threads found by name.
    pub named_threads: HashMap<String, String>,
    pub trust: Trust,
    /// Labels per machine name (machines not listed have none).
    pub labels: HashMap<String, BTreeMap<String, String>>,
    /// Read-only programs per machine name.
    pub read_only: HashMap<String, Vec<String>>,
    /// Every read fails (the store is away).
    pub unavailable: bool,
    /// Threads anyone reads (issues on a public repository).
    pub public: std::collections::HashSet<String>,
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

    fn up(&self) -> Read<()> {
        if self.unavailable {
            Err(Unavailable("the test store is away".into()))
        } else {
            Ok(())
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

    fn policies(&self) -> Read<Vec<String>> {
        self.up()?;
        Ok(self.policies.clone())
    }

    fn machines(&self) -> Read<Vec<String>> {
        self.up()?;
        Ok(self
            .machines
            .iter()
            .map(|m| format!("{m} (online)"))
            .collect())
    }

    fn lookup(&self, id: &str) -> Read<Option<String>> {
        self.up()?;
        if let Some(t) = self.triggers.get(id) {
            return Ok(serde_json::to_string(&serde_json::json!({
                "thread_id": t.thread, "source": t.source, "user": t.user, "principal": t.user,
                "created_at_ms": t.at_ms,
                "text": t.text, "mention": t.mention, "trusted": t.trusted, "trust": t.trust
            }))
            .ok());
        }
        Ok(self.objects.get(id).cloned())
    }

    fn thread(&self, thread: &str) -> Read<Option<ThreadInfo>> {
        self.up()?;
        let Some(source) = self
            .threads
            .get(thread)
            .cloned()
            .or_else(|| self.default_source.clone())
        else {
            return Ok(None);
        };
        Ok(Some(ThreadInfo {
            kind: test_kind(&source),
            open: self.open_sources.contains(&source),
            source,
        }))
    }

    fn find_thread(&mut self, name: &str) -> Read<Option<String>> {
        self.up()?;
        Ok(self.find_thread_now(name))
    }

    fn trust(&self) -> Read<Trust> {
        self.up()?;
        Ok(self.trust.clone())
    }

    fn machines_for(
        &self,
        machine: &str,
        labels: &BTreeMap<String, String>,
    ) -> Read<Vec<MachineInfo>> {
        self.up()?;
        Ok(self.machines_now(machine, labels))
    }

    fn public(&self, thread: &str) -> Read<Option<String>> {
        self.up()?;
        Ok(self
            .public
            .contains(thread)
            .then(|| format!("{thread} is public: anyone reads it")))
    }

    fn untrusted(&self, id: &str) -> Read<Option<String>> {
        self.up()?;
        if let Some(t) = self.triggers.get(id) {
            return Ok((!t.trusted).then(|| t.trust.clone()));
        }
        // A thread: someone untrusted said something there.
        let mut on: Vec<&TriggerInfo> = self
            .triggers
            .values()
            .filter(|t| t.thread == id && !t.trusted)
            .collect();
        on.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(on.first().map(|t| format!("{}: {}", t.id, t.trust)))
    }
}

impl TestWorld {
    fn find_thread_now(&mut self, name: &str) -> Option<String> {
        let name = match github_thread(name) {
            Some(t) => format!("github:{t}"),
            None => name.to_string(),
        };
        let name = name.as_str();
        let (source, external) = name.split_once(':')?;
        if let Some(id) = self.named_threads.get(name) {
            return Some(id.clone());
        }
        if source.is_empty() || external.is_empty() {
            return None;
        }
        let id = self.new_id(Kind::Thread);
        self.named_threads.insert(name.to_string(), id.clone());
        self.threads.insert(id.clone(), source.to_string());
        Some(id)
    }

    fn machines_now(&self, machine: &str, labels: &BTreeMap<String, String>) -> Vec<MachineInfo> {
        self.machines
            .iter()
            .filter(|m| {
                let have = self.labels.get(*m);
                if machine.is_empty() {
                    labels
                        .iter()
                        .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
                } else {
                    *m == machine
                }
            })
            .map(|m| MachineInfo {
                name: m.clone(),
                labels: self.labels.get(m).cloned().unwrap_or_default(),
                read_only: self.read_only.get(m).cloned().unwrap_or_default(),
            })
            .collect()
    }
}
