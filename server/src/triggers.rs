//! Trigger ingest: every event from a channel (CLI, gRPC, webhook,
//! connectors) becomes a stored trigger on a thread before anything else
//! happens; the fast path ([`byom_agent::fastpath::decide`], rules kept in
//! the store, changed at runtime) decides `ignored` or `candidate`, and a
//! candidate enters the agents' inbox in the same atomic write, with the
//! thread's nearby messages inlined. A provider's message ID is stored
//! once: a redelivery returns the first trigger. Then, in one place, tails
//! see it and the agents wake.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

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
/// Where the routing rules live in the channel state (server-wide).
pub const RULES_KEY: &str = "sources.toml";
/// The last refused edit of the rules file, shown by `byom sources`.
pub const RULES_ERROR_KEY: &str = "sources.error";
/// Triggers (of all threads, newest first) looked through for a thread's
/// earlier messages: ingest's cost stays bounded as the store grows.
const CONTEXT_SCAN: usize = 2000;
/// Largest context line inlined (one earlier message).
const CONTEXT_LINE_CHARS: usize = 500;
/// How long a redelivery waits for the first delivery's trigger to appear
/// before taking over its message ID (the first crashed mid-ingest).
const DUPLICATE_GRACE: Duration = Duration::from_millis(200);

/// How often the rules file is looked at for changes.
const RULES_FILE_POLL: Duration = Duration::from_secs(1);

/// Reloads `path` whenever its content changes: good rules replace the
/// old ones, a bad edit is refused (the old rules stay, the reason is
/// logged and shown by `byom sources show`).
pub async fn watch_rules_file(
    path: std::path::PathBuf,
    triggers: Triggers,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut last: Option<String> = std::fs::read_to_string(&path).ok();
    if let Some(text) = &last {
        // The file the server started with is in force (load_rules
        // checked it): keep the store in step.
        if let Err(e) = triggers.set_rules(text) {
            triggers.refuse_rules(&format!("{}: {e}", path.display()));
        }
    }
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(RULES_FILE_POLL) => {}
        }
        let now = std::fs::read_to_string(&path).ok();
        if now == last {
            continue;
        }
        if let Some(text) = &now {
            match triggers.set_rules(text) {
                Ok(()) => tracing::info!("routing rules reloaded from {}", path.display()),
                Err(e) => triggers.refuse_rules(&format!("{}: {e}", path.display())),
            }
        }
        last = now;
    }
}

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
    rules: Arc<RwLock<Arc<Rules>>>,
    tail: broadcast::Sender<pb::Trigger>,
    agents: AgentInbox,
    /// Earlier messages of a thread inlined with a trigger, and their
    /// characters in all.
    context_messages: usize,
    context_chars: usize,
}

/// How a trigger comes in besides its event.
#[derive(Default)]
pub struct Ingest<'a> {
    /// An idempotency claim to complete in the same write.
    pub claim: Option<&'a Pending>,
    /// Stored but not for the agents, with this reason (an event type no
    /// rule acts on, a routine CI success).
    pub ignore: Option<String>,
    /// Another provider ID the message is found by (a GitHub comment's,
    /// besides its delivery's).
    pub also_known_as: Option<String>,
    /// The admin who sent it through the API (`admin:NAME`).
    pub admin: Option<String>,
    /// The connector read it in a direct conversation with byom (see
    /// `Trigger.direct`). Only connectors set it: no API field reaches it.
    pub direct: bool,
}

/// What ingest did.
pub enum Ingested {
    New(pb::Trigger),
    /// The provider's message ID was seen before: that trigger.
    Duplicate(pb::Trigger),
}

impl Ingested {
    pub fn trigger(&self) -> &pb::Trigger {
        match self {
            Ingested::New(t) | Ingested::Duplicate(t) => t,
        }
    }
}

/// The kind of a CLI or webhook event without one.
fn default_kind(source: &str, kind: &str) -> String {
    match (kind, source) {
        ("", "chat") => "chat".into(),
        ("", _) => "cli".into(),
        (k, _) => k.to_string(),
    }
}

fn clean(s: &str, max: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// The agents' view of a stored trigger: its author is the principal
/// containment judged (the name they gave stays as the display name).
pub fn info(t: &pb::Trigger) -> TriggerInfo {
    // The author is the principal judged at ingest, never the name the
    // event claimed: a trigger without one speaks for nobody (it can
    // match no trust or approver pattern).
    let user = if t.principal.is_empty() {
        format!("unjudged:{}", t.user)
    } else {
        t.principal.clone()
    };
    let user_name = if !t.user_name.is_empty() {
        t.user_name.clone()
    } else if t.user != user {
        t.user.clone()
    } else {
        String::new()
    };
    TriggerInfo {
        id: t.id.clone(),
        thread: t.thread_id.clone(),
        source: t.source.clone(),
        user,
        text: t.text.clone(),
        mention: t.mention,
        user_name,
        context: Vec::new(),
        trusted: t.trusted,
        trust: t.trust.clone(),
        at_ms: t.created_at_ms,
        claimed: false,
        direct: t.direct,
    }
}

/// byom's own reply, stored on its thread (no principal: nobody outside
/// can make one).
pub(crate) fn is_own_reply(t: &pb::Trigger) -> bool {
    t.from_bot && t.user == "byom" && t.principal.is_empty()
}

/// byom's own words from trusted input: a reply that carries nobody
/// untrusted's words (one that does says why in `trust`).
pub(crate) fn is_clean_reply(t: &pb::Trigger) -> bool {
    is_own_reply(t) && t.trust.is_empty()
}

impl Triggers {
    pub fn new(store: Store, rules: Rules, agents: AgentInbox) -> Triggers {
        Triggers {
            store,
            rules: Arc::new(RwLock::new(Arc::new(rules))),
            tail: broadcast::channel(TAIL_BUFFER).0,
            agents,
            context_messages: 5,
            context_chars: 2000,
        }
    }

    /// How much of a thread is inlined with each trigger.
    pub fn with_context(mut self, messages: usize, chars: usize) -> Triggers {
        self.context_messages = messages;
        self.context_chars = chars;
        self
    }

    fn rules(&self) -> Arc<Rules> {
        self.rules.read().map(|r| r.clone()).unwrap_or_default()
    }

    /// Replaces the routing rules if `text` parses; the old ones stay
    /// otherwise and the error says why. Stored, so a restart keeps them.
    pub fn set_rules(&self, text: &str) -> Result<(), String> {
        let rules = Rules::parse(text)?;
        self.store
            .batch(&[
                Op::channel_state("", RULES_KEY, text.as_bytes()),
                Op::channel_state("", RULES_ERROR_KEY, b""),
            ])
            .map_err(|e| e.to_string())?;
        if let Ok(mut r) = self.rules.write() {
            *r = Arc::new(rules);
        }
        Ok(())
    }

    /// The rules in force (as text) and the last refused edit's reason.
    pub fn rules_text(&self) -> (String, String) {
        let get = |k| {
            self.store
                .channel_state("", k)
                .ok()
                .flatten()
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default()
        };
        (get(RULES_KEY), get(RULES_ERROR_KEY))
    }

    /// Loads the stored rules (a restart keeps runtime changes).
    pub fn load_stored_rules(&self) {
        let (text, _) = self.rules_text();
        if text.is_empty() {
            return;
        }
        match Rules::parse(&text) {
            Ok(r) => {
                if let Ok(mut cur) = self.rules.write() {
                    *cur = Arc::new(r);
                }
            }
            Err(e) => {
                tracing::error!("the stored routing rules do not parse ({e}); keeping the defaults")
            }
        }
    }

    /// Records why an edit was refused (the old rules stay).
    pub fn refuse_rules(&self, why: &str) {
        tracing::warn!("routing rules edit refused, previous rules stay: {why}");
        let _ = self
            .store
            .put_channel_state("", RULES_ERROR_KEY, why.as_bytes());
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
        admin: Option<&str>,
    ) -> Result<pb::Trigger, StoreError> {
        Ok(self
            .ingest_with(
                ev,
                Ingest {
                    claim,
                    admin: admin.map(str::to_string),
                    ..Default::default()
                },
            )
            .await?
            .trigger()
            .clone())
    }

    /// The thread `source`/`external`, made if new.
    pub fn thread(
        &self,
        source: &str,
        external: &str,
        kind: &str,
    ) -> Result<pb::Thread, StoreError> {
        let now = byom_wire::now_ms();
        match self.store.find_thread(source, external)? {
            Some(t) => Ok(t),
            None => self.store.create_thread(&pb::Thread {
                id: ThreadId::new(now).to_string(),
                source: source.to_string(),
                external: external.to_string(),
                created_at_ms: now,
                last_trigger_ms: now,
                kind: kind.to_string(),
            }),
        }
    }

    /// A provider message ID already stored: its trigger. Claims the ID
    /// for `id` otherwise. A claim whose trigger never appeared (its
    /// ingest died) is taken over after a short wait.
    async fn claim_external(
        &self,
        source: &str,
        external_id: &str,
        id: &str,
    ) -> Result<Option<pb::Trigger>, StoreError> {
        for attempt in 0..2 {
            match self.store.claim_channel_message(source, external_id, id)? {
                None => return Ok(None),
                Some(first) => {
                    if let Some(t) = self.store.get_trigger(&first)? {
                        return Ok(Some(t));
                    }
                    if attempt == 0 {
                        tokio::time::sleep(DUPLICATE_GRACE).await;
                    }
                }
            }
        }
        self.store
            .batch(&[Op::channel_index(source, external_id, id)])?;
        Ok(None)
    }

    /// The thread's messages before this one (and the one it replies to),
    /// oldest first, bounded; and why they make it untrusted, if one of
    /// them came from someone untrusted (whoever reads it reads them too).
    fn context(&self, t: &pb::Trigger) -> (Vec<String>, Option<String>) {
        if self.context_messages == 0 {
            return (Vec::new(), None);
        }
        let mut untrusted: Option<String> = None;
        let mut note = |x: &pb::Trigger| {
            if !x.trusted && !is_clean_reply(x) && untrusted.is_none() {
                let who = if x.principal.is_empty() {
                    &x.user
                } else {
                    &x.principal
                };
                untrusted = Some(format!(
                    "its context includes {} from {who}, who is not trusted",
                    x.id
                ));
            }
        };
        let line = |x: &pb::Trigger| {
            let who = if x.user_name.is_empty() {
                &x.user
            } else {
                &x.user_name
            };
            let text: String = x.text.chars().take(CONTEXT_LINE_CHARS).collect();
            format!("{who}: {text}")
        };
        let mut lines: Vec<String> = self
            .store
            .recent_on_thread(&t.thread_id, self.context_messages + 1, CONTEXT_SCAN)
            .unwrap_or_default()
            .into_iter()
            .filter(|x| x.id != t.id && x.created_at_ms <= t.created_at_ms)
            // What the owner said to ignore stays out of every agent's view.
            .filter(|x| !fastpath::is_policy_reason(&x.reason))
            .take(self.context_messages)
            .map(|x| {
                note(&x);
                line(&x)
            })
            .collect();
        lines.reverse();
        if !t.reply_to.is_empty() {
            let replied = self
                .store
                .channel_message(&t.source, &t.reply_to)
                .ok()
                .flatten()
                .and_then(|id| self.store.get_trigger(&id).ok().flatten());
            if let Some(r) = replied {
                note(&r);
                let l = format!("(replying to) {}", line(&r));
                lines.retain(|x| !l.ends_with(x.as_str()));
                lines.push(l);
            }
        }
        // Newest kept when over budget.
        let mut total = 0;
        let mut keep = Vec::new();
        for l in lines.into_iter().rev() {
            total += l.chars().count();
            if total > self.context_chars {
                break;
            }
            keep.push(l);
        }
        keep.reverse();
        (keep, untrusted)
    }

    /// [`Triggers::ingest`] with the options connectors need.
    pub async fn ingest_with(
        &self,
        ev: pb::SendEventRequest,
        opts: Ingest<'_>,
    ) -> Result<Ingested, StoreError> {
        let store = &self.store;
        let now = byom_wire::now_ms();
        let source = clean(&ev.source, MAX_NAME);
        let external = clean(&ev.thread, MAX_NAME);
        let kind = default_kind(&source, &ev.kind);
        let id = TriggerId::new(now).to_string();
        let external_id = clean(&ev.external_id, MAX_NAME);
        if !external_id.is_empty() {
            if let Some(first) = self.claim_external(&source, &external_id, &id).await? {
                return Ok(Ingested::Duplicate(first));
            }
        }
        let thread = self.thread(&source, &external, &kind)?;
        let mut text = ev.text;
        if text.len() > MAX_TRIGGER_TEXT {
            let mut cut = MAX_TRIGGER_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str(" […cut at 64 KiB]");
        }
        let answer = !ev.from_bot && byom_agent::approval::parse_answer(&text).is_some();
        let mut t = pb::Trigger {
            id,
            thread_id: thread.id.clone(),
            source,
            user: clean(&ev.user, MAX_NAME),
            text,
            // `approve CODE` answers byom's request: addressed by its form,
            // whatever the channel's mention rules (the core decides if it
            // counts).
            mention: ev.mention || answer,
            from_bot: ev.from_bot,
            created_at_ms: now,
            user_name: clean(&ev.user_name, MAX_NAME),
            channel: clean(&ev.channel, MAX_NAME),
            external_id,
            reply_to: clean(&ev.reply_to, MAX_NAME),
            link: clean(&ev.link, 2 * MAX_NAME),
            author_association: clean(&ev.author_association, 40),
            kind,
            direct: opts.direct,
            ..Default::default()
        };
        t.principal = crate::trust::principal(&t.kind, &t.source, &t.user, opts.admin.as_deref());
        let verdict = crate::trust::load(store)?.judge_sender(
            &t.principal,
            &t.author_association,
            t.from_bot,
        );
        t.trusted = verdict.trusted;
        t.trust = verdict.why;
        // The owner's policies that need no judgement hold for every
        // trigger, those a subscribed worker would get directly included.
        let policies: Vec<(String, String)> = store
            .list_policies()?
            .into_iter()
            .map(|p| (p.id, p.text))
            .collect();
        let (decision, reason) = match (
            opts.ignore,
            fastpath::ignored_by_policy(&policies, &t, &thread.external),
        ) {
            (Some(why), _) | (None, Some(why)) => (TriggerDecision::Ignored, why),
            (None, None) => fastpath::decide(&self.rules(), &t),
        };
        t.set_decision(decision);
        t.reason = reason;
        // Stored before anything else happens, together with its place in
        // the agents' inbox, so a candidate is never stored but forgotten.
        let mut ops = vec![Op::trigger(&t)];
        if decision == TriggerDecision::Candidate {
            let mut i = info(&t);
            i.claimed = opts.admin.as_deref().is_some_and(|a| a != t.principal);
            let (context, untrusted) = self.context(&t);
            i.context = context;
            if let (true, Some(why)) = (i.trusted, untrusted) {
                i.trusted = false;
                i.trust = why;
            }
            ops.push(AgentInbox::op(&Event::Trigger(i)));
        }
        if let Some(p) = opts.claim {
            ops.extend(p.ops(&t.id, ""));
        }
        if let Some(aka) = &opts.also_known_as {
            ops.push(Op::channel_index(&t.source, aka, &t.id));
        }
        store.batch(&ops)?;
        store.flush_async().await?;
        let _ = store.touch_thread(&thread.id, now);
        let _ = self.tail.send(t.clone());
        self.agents.wake();
        Ok(Ingested::New(t))
    }
}
