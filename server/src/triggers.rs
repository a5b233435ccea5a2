//! Trigger ingest: every event from a channel (CLI, gRPC, webhook) becomes
//! a stored trigger on a thread before anything else happens; the fast
//! path ([`byom_agent::fastpath::decide`], rules from
//! `<data-dir>/sources.toml`) decides `ignored` or `candidate`, and a
//! candidate enters the agents' inbox in the same atomic write. Then, in
//! one place, tails see it and the agents wake.

use std::path::Path;
use std::sync::Arc;

use byom_agent::event::{Event, TriggerInfo};
use byom_agent::fastpath::{self, Rules};
use byom_protocol::id::{ThreadId, TriggerId};
use byom_protocol::pb::{self, TriggerDecision};
use byom_store::{Op, Store, StoreError};
use tokio::sync::broadcast;

use crate::agents::AgentInbox;
use crate::idempotency::Pending;

/// Longest event text stored; longer text is cut (the cut is said).
pub const MAX_TRIGGER_TEXT: usize = 64 * 1024;
/// Longest source, thread or user name.
pub const MAX_NAME: usize = 200;
/// Triggers buffered for slow `events tail` watchers (they skip ahead).
const TAIL_BUFFER: usize = 256;

/// The fast-path rules of `<data-dir>/sources.toml` (none: defaults).
pub fn load_rules(data_dir: &Path) -> anyhow::Result<Rules> {
    let p = data_dir.join("sources.toml");
    match std::fs::read_to_string(&p) {
        Ok(t) => Rules::parse(&t).map_err(|e| anyhow::anyhow!("{} is not valid: {e}", p.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Rules::default()),
        Err(e) => Err(e.into()),
    }
}

/// The one way triggers come in.
#[derive(Clone)]
pub struct Triggers {
    store: Store,
    rules: Arc<Rules>,
    tail: broadcast::Sender<pb::Trigger>,
    agents: AgentInbox,
}

fn clean(s: &str, max: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// The agents' view of a stored trigger.
pub fn info(t: &pb::Trigger) -> TriggerInfo {
    TriggerInfo {
        id: t.id.clone(),
        thread: t.thread_id.clone(),
        source: t.source.clone(),
        user: t.user.clone(),
        text: t.text.clone(),
        mention: t.mention,
    }
}

impl Triggers {
    pub fn new(store: Store, rules: Rules, agents: AgentInbox) -> Triggers {
        Triggers {
            store,
            rules: Arc::new(rules),
            tail: broadcast::channel(TAIL_BUFFER).0,
            agents,
        }
    }

    /// Every trigger from now on (people's and the agent's replies).
    pub fn tail(&self) -> broadcast::Receiver<pb::Trigger> {
        self.tail.subscribe()
    }

    /// Tells tails about triggers stored elsewhere (the agent's replies,
    /// committed with the step that made them).
    pub fn published(&self, t: pb::Trigger) {
        let _ = self.store.touch_thread(&t.thread_id, t.created_at_ms);
        let _ = self.tail.send(t);
    }

    /// Stores a new trigger (and its thread if new), flushed, with its
    /// inbox entry if it is a candidate and `claim`'s idempotency record;
    /// then tails see it and the agents wake.
    pub async fn ingest(
        &self,
        ev: pb::SendEventRequest,
        claim: Option<&Pending>,
    ) -> Result<pb::Trigger, StoreError> {
        let store = &self.store;
        let now = byom_wire::now_ms();
        let source = clean(&ev.source, MAX_NAME);
        let external = clean(&ev.thread, MAX_NAME);
        let thread = match store.find_thread(&source, &external)? {
            Some(t) => t,
            None => {
                let t = pb::Thread {
                    id: ThreadId::new(now).to_string(),
                    source: source.clone(),
                    external,
                    created_at_ms: now,
                    last_trigger_ms: now,
                };
                store.create_thread(&t)?
            }
        };
        let mut text = ev.text;
        if text.len() > MAX_TRIGGER_TEXT {
            let mut cut = MAX_TRIGGER_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str(" […cut at 64 KiB]");
        }
        let mut t = pb::Trigger {
            id: TriggerId::new(now).to_string(),
            thread_id: thread.id.clone(),
            source,
            user: clean(&ev.user, MAX_NAME),
            text,
            mention: ev.mention,
            from_bot: ev.from_bot,
            created_at_ms: now,
            ..Default::default()
        };
        // The owner's policies that need no judgement hold for every
        // trigger, those a subscribed worker would get directly included.
        let policies: Vec<(String, String)> = store
            .list_policies()?
            .into_iter()
            .map(|p| (p.id, p.text))
            .collect();
        let (decision, reason) = match fastpath::ignored_by_policy(&policies, &t, &thread.external)
        {
            Some(why) => (TriggerDecision::Ignored, why),
            None => fastpath::decide(&self.rules, &t),
        };
        t.set_decision(decision);
        t.reason = reason;
        // Stored before anything else happens, together with its place in
        // the agents' inbox, so a candidate is never stored but forgotten.
        let mut ops = vec![Op::trigger(&t)];
        if decision == TriggerDecision::Candidate {
            ops.push(AgentInbox::op(&Event::Trigger(info(&t))));
        }
        if let Some(p) = claim {
            ops.extend(p.ops(&t.id, ""));
        }
        store.batch(&ops)?;
        store.flush_async().await?;
        let _ = store.touch_thread(&thread.id, now);
        let _ = self.tail.send(t.clone());
        self.agents.wake();
        Ok(t)
    }
}
