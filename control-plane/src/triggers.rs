//! Triggers in: every event from a channel (CLI, gRPC, webhook) becomes a
//! stored trigger on a thread before anything else happens; the fast path
//! (code, per source, no model) decides `ignored` or `candidate`, and a
//! candidate enters the agents' inbox in the same atomic write.
//!
//! Fast-path rules live in `<data-dir>/sources.toml`:
//!
//! ```toml
//! [sources.chat]
//! mode = "addressed_only"   # ignore | addressed_only | candidate
//! users = ["ada", "bob"]    # allow-list (empty: anyone)
//! bots = []                 # bot allow-list (bots are ignored unless listed)
//! ```
//!
//! A source without rules is `candidate`, bots excepted. The decision is a
//! pure function of the rules and the event ([`decide`]).

use std::collections::HashMap;
use std::path::Path;

use byom_protocol::id::{ThreadId, TriggerId};
use byom_protocol::pb::{self, TriggerDecision};
use serde::Deserialize;

use crate::agent::core::{Event, TriggerInfo};
use crate::pki::now_ms;
use crate::store::{Op, Store};

/// Longest event text stored; longer text is cut (the cut is said).
pub const MAX_TRIGGER_TEXT: usize = 64 * 1024;
/// Longest source, thread or user name.
pub const MAX_NAME: usize = 200;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Ignore,
    AddressedOnly,
    #[default]
    Candidate,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceRules {
    pub mode: Mode,
    pub users: Vec<String>,
    pub bots: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rules {
    pub sources: HashMap<String, SourceRules>,
}

impl Rules {
    pub fn parse(text: &str) -> Result<Rules, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn load(data_dir: &Path) -> anyhow::Result<Rules> {
        let p = data_dir.join("sources.toml");
        match std::fs::read_to_string(&p) {
            Ok(t) => Ok(toml::from_str(&t)
                .map_err(|e| anyhow::anyhow!("{} is not valid: {e}", p.display()))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Rules::default()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The fast path: (decision, reason).
pub fn decide(rules: &Rules, t: &pb::Trigger) -> (TriggerDecision, String) {
    let default = SourceRules::default();
    let r = rules.sources.get(&t.source).unwrap_or(&default);
    if r.mode == Mode::Ignore {
        return (
            TriggerDecision::Ignored,
            format!("source {} is ignored", t.source),
        );
    }
    if t.from_bot && !r.bots.iter().any(|b| b == &t.user) {
        return (
            TriggerDecision::Ignored,
            format!("bot {} is not in the bot allow-list", t.user),
        );
    }
    if !t.from_bot && !r.users.is_empty() && !r.users.iter().any(|u| u == &t.user) {
        return (
            TriggerDecision::Ignored,
            format!("user {} is not in the allow-list of {}", t.user, t.source),
        );
    }
    if r.mode == Mode::AddressedOnly && !t.mention {
        return (
            TriggerDecision::Ignored,
            format!("{} acts only when addressed", t.source),
        );
    }
    (TriggerDecision::Candidate, "passes the fast path".into())
}

fn clean(s: &str, max: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// Stores a new trigger (and its thread if new), flushed, then decides.
pub async fn ingest(
    store: &Store,
    rules: &Rules,
    ev: pb::SendEventRequest,
) -> Result<pb::Trigger, crate::store::StoreError> {
    let now = now_ms();
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
    let (decision, reason) = decide(rules, &t);
    t.set_decision(decision);
    t.reason = reason;
    // Stored before anything else happens, together with its place in the
    // agents' inbox, so a candidate is never stored but forgotten.
    let mut ops = vec![Op::trigger(&t)];
    if decision == TriggerDecision::Candidate {
        ops.push(crate::agent::driver::inbox_op(&Event::Trigger(
            TriggerInfo {
                id: t.id.clone(),
                thread: t.thread_id.clone(),
                source: t.source.clone(),
                user: t.user.clone(),
                text: t.text.clone(),
                mention: t.mention,
            },
        )));
    }
    store.batch(&ops)?;
    store.flush_async().await?;
    let _ = store.touch_thread(&thread.id, now);
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(source: &str, user: &str, mention: bool, bot: bool) -> pb::Trigger {
        pb::Trigger {
            source: source.into(),
            user: user.into(),
            mention,
            from_bot: bot,
            ..Default::default()
        }
    }

    #[test]
    fn fast_path_rules() {
        let rules: Rules = toml::from_str(
            "[sources.chat]\nmode = \"addressed_only\"\nusers = [\"ada\"]\n[sources.ci]\nmode = \"ignore\"\n[sources.github]\nbots = [\"dependabot\"]\n",
        )
        .unwrap();
        let d = |t: pb::Trigger| decide(&rules, &t).0;
        assert_eq!(
            d(ev("chat", "ada", true, false)),
            TriggerDecision::Candidate
        );
        assert_eq!(d(ev("chat", "ada", false, false)), TriggerDecision::Ignored);
        assert_eq!(d(ev("chat", "eve", true, false)), TriggerDecision::Ignored);
        assert_eq!(d(ev("ci", "ada", true, false)), TriggerDecision::Ignored);
        assert_eq!(
            d(ev("github", "dependabot", false, true)),
            TriggerDecision::Candidate
        );
        assert_eq!(
            d(ev("github", "renovate", false, true)),
            TriggerDecision::Ignored
        );
        assert_eq!(
            d(ev("other", "anyone", false, false)),
            TriggerDecision::Candidate
        );
        assert!(toml::from_str::<Rules>("[sources.x]\nmode = \"sometimes\"").is_err());
    }
}
