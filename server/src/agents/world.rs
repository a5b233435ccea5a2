//! The world the agents see in the server: the wall clock, fresh random
//! IDs, the Router's policies, the machines with their live state, and any
//! stored object by ID ([`lookup`], also what `byom show` prints for agent
//! objects).

use std::sync::Arc;

use byom_agent::storage::keys;
use std::collections::BTreeMap;

use byom_agent::trust::Trust;
use byom_agent::world::{MachineInfo, Read, ThreadInfo, Unavailable};
use byom_agent::World;
use byom_protocol::id::{encode_body, Kind};
use byom_protocol::pb;
use byom_store::{Space, Store, StoreError};
use serde_json::json;

use crate::live::LiveMachines;

/// Bytes of a command's output `recall` can see.
const RECALL_OUTPUT: usize = 1 << 20;
/// Messages of a thread `recall` shows.
const RECALL_THREAD: usize = 50;
/// Agent records read at once.
const MAX_RECORDS: usize = 1_000_000;

pub struct LiveWorld {
    pub store: Store,
    pub live: Arc<LiveMachines>,
}

/// A fresh ID of `kind`: time-ordered, random within a millisecond.
pub fn new_id(kind: Kind) -> String {
    let r = byom_protocol::random::bytes::<10>();
    format!("{}{}", kind.prefix(), encode_body(byom_wire::now_ms(), r))
}

impl World for LiveWorld {
    fn now(&self) -> u64 {
        byom_wire::now_ms()
    }

    fn new_id(&mut self, kind: Kind) -> String {
        new_id(kind)
    }

    fn policies(&self) -> Read<Vec<String>> {
        Ok(self
            .store
            .list_policies()
            .map_err(away)?
            .into_iter()
            .map(|p| format!("{} ({})", p.text, p.id))
            .collect())
    }

    fn machines(&self) -> Read<Vec<String>> {
        let mut v: Vec<String> = self
            .store
            .list_machines()
            .map_err(away)?
            .into_iter()
            .filter(|m| !m.revoked)
            .map(|m| {
                let mut labels: Vec<String> =
                    m.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.sort();
                format!(
                    "{} ({}, {}{}{})",
                    m.name,
                    m.id,
                    if self.live.online(&m.id) {
                        "online"
                    } else {
                        "offline"
                    },
                    if labels.is_empty() { "" } else { ", " },
                    labels.join(",")
                )
            })
            .collect();
        v.sort();
        Ok(v)
    }

    fn lookup(&self, id: &str) -> Read<Option<String>> {
        lookup(&self.store, id).map_err(away)
    }

    fn thread(&self, thread: &str) -> Read<Option<ThreadInfo>> {
        let Some(t) = self.store.get_thread(thread).map_err(away)? else {
            return Ok(None);
        };
        let kind = match t.kind.as_str() {
            // Threads stored before kinds existed.
            "" if t.source == "chat" => "chat".to_string(),
            "" => "cli".to_string(),
            k => k.to_string(),
        };
        let open = match self.store.get_connector(&t.source).map_err(away)? {
            Some(c) => {
                let channel = crate::channels::thread_channel(&kind, &t.external);
                c.post_to.iter().any(|p| p == "*" || p == channel)
            }
            // byom's own threads (CLI, chat, webhooks) reach no one else.
            None => true,
        };
        Ok(Some(ThreadInfo {
            source: t.source,
            kind,
            open,
        }))
    }

    fn find_thread(&mut self, name: &str) -> Read<Option<String>> {
        let (c, external) = match byom_agent::world::github_thread(name) {
            // A link: the (first) GitHub connector's thread for it.
            Some(t) => {
                let gh = self
                    .store
                    .list_connectors()
                    .map_err(away)?
                    .into_iter()
                    .find(|c| c.kind == "github");
                let Some(gh) = gh else {
                    return Ok(None);
                };
                (gh, t)
            }
            None => {
                let Some((source, external)) = name.split_once(':') else {
                    return Ok(None);
                };
                let Some(c) = self.store.get_connector(source).map_err(away)? else {
                    return Ok(None);
                };
                (c, external.to_string())
            }
        };
        let source = c.name.as_str();
        let external: String = external
            .trim()
            .chars()
            .take(crate::triggers::MAX_NAME)
            .collect();
        if external.is_empty() {
            return Ok(None);
        }
        let now = byom_wire::now_ms();
        if let Some(t) = self.store.find_thread(source, &external).map_err(away)? {
            return Ok(Some(t.id));
        }
        let t = self
            .store
            .create_thread(&pb::Thread {
                id: new_id(Kind::Thread),
                source: source.to_string(),
                external,
                created_at_ms: now,
                last_trigger_ms: now,
                kind: c.kind,
            })
            .map_err(away)?;
        Ok(Some(t.id))
    }

    fn trust(&self) -> Read<Trust> {
        crate::trust::load(&self.store).map_err(away)
    }

    fn machines_for(
        &self,
        machine: &str,
        labels: &BTreeMap<String, String>,
    ) -> Read<Vec<MachineInfo>> {
        let info = |m: pb::Machine| MachineInfo {
            name: m.name,
            labels: m.labels.into_iter().collect(),
            read_only: m.read_only,
        };
        if !machine.is_empty() {
            return Ok(self
                .store
                .resolve_machine(machine)
                .map_err(away)?
                .map(info)
                .into_iter()
                .collect());
        }
        Ok(self
            .store
            .list_machines()
            .map_err(away)?
            .into_iter()
            .filter(|m| !m.revoked && m.has_labels(labels))
            .map(info)
            .collect())
    }

    fn public(&self, thread: &str) -> Read<Option<String>> {
        self.public_thread(thread)
    }

    fn untrusted(&self, id: &str) -> Read<Option<String>> {
        let why = |t: &pb::Trigger| {
            if t.trusted || crate::triggers::is_clean_reply(t) {
                return None;
            }
            Some(if t.trust.is_empty() {
                format!("{} from {}, not judged trusted", t.id, t.user)
            } else {
                format!("{}: {}", t.id, t.trust)
            })
        };
        Ok(match Kind::of(id) {
            Some(Kind::Trigger) => self
                .store
                .get_trigger(id)
                .map_err(away)?
                .and_then(|t| why(&t)),
            // What `recall` shows of a thread: its latest messages.
            Some(Kind::Thread) => self
                .store
                .list_triggers(Some(id), RECALL_THREAD)
                .map_err(away)?
                .iter()
                .find_map(why),
            // A command a tainted worker ran: its output may be what the
            // untrusted text asked for.
            Some(Kind::Command) => self
                .store
                .get_command(id)
                .map_err(away)?
                .filter(|c| c.tainted)
                .map(|c| {
                    format!(
                        "{id} ran for a worker that read untrusted input: {}",
                        c.taint
                    )
                }),
            _ => None,
        })
    }
}

impl LiveWorld {
    fn public_thread(&self, id: &str) -> Read<Option<String>> {
        let Some(t) = self.store.get_thread(id).map_err(away)? else {
            return Ok(None);
        };
        let why = match t.kind.as_str() {
            "github" => "a public repository",
            "slack" => "a channel shared with another organisation",
            "matrix" => "a public room",
            _ => return Ok(None),
        };
        let channel = crate::channels::thread_channel(&t.kind, &t.external);
        let public = crate::channels::is_public(&self.store, &t.source, channel).map_err(away)?;
        if public {
            return Ok(Some(format!(
                "{channel} is {why}: people outside the team read {}",
                t.external
            )));
        }
        // Those who can read it without a word said: a room's people, a
        // public channel's workspace. A room whose people byom has not
        // learnt yet is held like one with a stranger in it.
        use crate::channels::readers;
        let who = readers::get(&self.store, &t.source, channel).map_err(away)?;
        Ok(match who {
            Some(r) => readers::untrusted_reader(&self.trust()?, &r)
                .map(|why| format!("{channel} is read by more than the team: {why}")),
            None if t.kind == "matrix" => Some(format!(
                "who reads {channel} is not known yet (byom asks the homeserver as it syncs)"
            )),
            None => None,
        })
    }
}

/// A store error as the core sees it: the step waits for the store.
fn away(e: StoreError) -> Unavailable {
    Unavailable(e.to_string())
}

/// (worker, snapshot) for every stored worker whose program is paused on a
/// snapshot.
pub fn paused_programs(store: &Store) -> Result<Vec<(String, String)>, StoreError> {
    let prefix = keys::record(Kind::Worker.prefix());
    Ok(store
        .scan_prefix(Space::Agents, &prefix, MAX_RECORDS)?
        .into_iter()
        .filter_map(|(k, v)| {
            // Read loosely: a record this version cannot fully parse still
            // names the snapshot it needs kept.
            let w = serde_json::from_slice::<serde_json::Value>(&v).ok()?;
            let snapshot = w["js"]["snapshot"].as_str()?.to_string();
            Some((format!("{}{k}", Kind::Worker.prefix()), snapshot))
        })
        .collect())
}

/// The worker whose program is paused on snapshot `id`, if it still is.
pub fn paused_program_of(store: &Store, id: &str) -> Result<Option<String>, StoreError> {
    Ok(paused_programs(store)?
        .into_iter()
        .find(|(_, snp)| snp == id)
        .map(|(worker, _)| worker))
}

fn command_line(c: &pb::Command) -> String {
    if c.shell.is_empty() {
        c.argv.join(" ")
    } else {
        c.shell.clone()
    }
}

/// The full text of a stored object, for recall/read and `byom show`
/// (`None`: no such object).
pub fn lookup(store: &Store, id: &str) -> Result<Option<String>, StoreError> {
    let Some(kind) = Kind::of(id) else {
        return Ok(None);
    };
    Ok(match kind {
        Kind::Trigger => store.get_trigger(id)?.and_then(|t| {
            serde_json::to_string_pretty(&json!({
                "id": t.id, "thread_id": t.thread_id, "source": t.source, "user": t.user,
                "principal": t.principal, "trusted": t.trusted, "trust": t.trust,
                "created_at_ms": t.created_at_ms,
                "text": t.text, "mention": t.mention, "from_bot": t.from_bot,
                "user_name": t.user_name, "link": t.link, "kind": t.kind,
                "created_at": byom_protocol::time::rfc3339(t.created_at_ms),
                "decision": t.decision().name(),
            }))
            .ok()
        }),
        Kind::Thread => match store.get_thread(id)? {
            None => None,
            Some(th) => {
                let mut ts = store.list_triggers(Some(id), RECALL_THREAD)?;
                ts.reverse();
                let mut s = format!("thread {} on {} ({})\n", th.id, th.source, th.external);
                for t in ts {
                    s.push_str(&format!("{} {}: {}\n", t.id, t.user, t.text));
                }
                Some(s)
            }
        },
        Kind::Command => match store.get_command(id)? {
            None => None,
            Some(c) => {
                let read = |stream: pb::OutputStream| -> Result<String, StoreError> {
                    let chunks = store.read_output(id, stream as i32, 0, RECALL_OUTPUT)?;
                    let bytes: Vec<u8> = chunks.into_iter().flat_map(|(_, b)| b).collect();
                    Ok(String::from_utf8_lossy(&bytes).into_owned())
                };
                Some(format!(
                    "command {} on {}: {}\nstate: {} exit: {}\nstdout:\n{}\nstderr:\n{}",
                    c.id,
                    c.machine_id,
                    command_line(&c),
                    c.state().name(),
                    c.exit_code
                        .map(|c| c.to_string())
                        .unwrap_or_else(|| "-".into()),
                    read(pb::OutputStream::Stdout)?,
                    read(pb::OutputStream::Stderr)?,
                ))
            }
        },
        Kind::Snapshot => match store.get_snapshot(id)? {
            None => None,
            Some(b) => {
                let owner = paused_program_of(store, id)?;
                Some(
                    json!({"id": id, "bytes": b.len(), "paused_program_of": owner,
                           "what": "a paused interpreter's memory (signed, compressed)"})
                    .to_string(),
                )
            }
        },
        Kind::Worker | Kind::Approval => store
            .get_raw(Space::Agents, &keys::record(id))?
            .and_then(|b| String::from_utf8(b).ok()),
        _ => None,
    })
}
