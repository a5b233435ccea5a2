//! The fast path: code, per source, no model. Every stored trigger is
//! decided here first: `ignored` (with the reason) or `candidate` for the
//! agents. Rules come from `<data-dir>/sources.toml` or `byom sources set`,
//! per source (a connector's name) and per channel in it (a Matrix room, a
//! Slack channel, a GitHub repository):
//!
//! ```toml
//! [sources.chat]
//! mode = "addressed_only"   # ignore | addressed_only | candidate
//! users = ["ada", "bob"]    # allow-list (empty: anyone)
//! bots = []                 # bot allow-list (bots are ignored unless listed)
//!
//! [sources.team.channels."!ops:example.org"]
//! mode = "candidate"        # what a channel sets overrides its source
//! ```
//!
//! `addressed_only` counts mentions, direct messages and replies to the
//! bot (connectors set `mention` for all three). A source without rules is
//! `candidate`, bots excepted. [`decide`] is a pure function of the rules
//! and the trigger.
//!
//! The owner's natural-language policies (`byom policy add`) that need no
//! judgement ("ignore messages from bob", "ignore the thread deploys",
//! "ignore messages containing \"lgtm\"") are compiled here into
//! [`CodeRule`]s and apply to every trigger, those passed straight to a
//! subscribed worker included; the others are the model's to follow.

use std::collections::HashMap;

use byom_protocol::pb::{self, TriggerDecision};
use serde::Deserialize;

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
    /// Per channel: what is set here replaces the source's.
    pub channels: HashMap<String, ChannelRules>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChannelRules {
    pub mode: Option<Mode>,
    pub users: Option<Vec<String>>,
    pub bots: Option<Vec<String>>,
}

impl SourceRules {
    /// The rules in force for `channel`.
    fn for_channel(&self, channel: &str) -> (Mode, &[String], &[String]) {
        match self.channels.get(channel) {
            Some(c) => (
                c.mode.unwrap_or(self.mode),
                c.users.as_deref().unwrap_or(&self.users),
                c.bots.as_deref().unwrap_or(&self.bots),
            ),
            None => (self.mode, &self.users, &self.bots),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rules {
    pub sources: HashMap<String, SourceRules>,
}

impl Rules {
    /// Parses a `sources.toml` text; the error says what is wrong where.
    pub fn parse(text: &str) -> Result<Rules, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim().to_string())
    }
}

/// A policy that needs no judgement, enforced in code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodeRule {
    IgnoreUser(String),
    IgnoreSource(String),
    /// A thread by its channel name or its `thr_…` ID.
    IgnoreThread(String),
    /// Messages containing this text (case-insensitive).
    IgnoreText(String),
}

impl CodeRule {
    /// Compiles a policy's text if it says exactly one of the rules above;
    /// anything more ("…unless", "…on weekdays") is left to judgement.
    pub fn compile(text: &str) -> Option<CodeRule> {
        let t = text.trim().trim_end_matches(['.', '!']).trim();
        let lower = t.to_lowercase();
        let rest = lower.strip_prefix("ignore ")?;
        let orig_rest = &t[t.len() - rest.len()..];
        // What is ignored: "messages", "all messages", "everything", …
        let mut words = rest.split_whitespace().peekable();
        let mut taken = 0usize;
        let skip = |w: &str| {
            matches!(
                w,
                "all"
                    | "any"
                    | "every"
                    | "the"
                    | "messages"
                    | "message"
                    | "triggers"
                    | "events"
                    | "everything"
                    | "anything"
                    | "posts"
                    | "comments"
            )
        };
        while let Some(w) = words.peek() {
            if skip(w) {
                taken += 1;
                words.next();
            } else {
                break;
            }
        }
        let all: Vec<&str> = rest.split_whitespace().collect();
        let orig: Vec<&str> = orig_rest.split_whitespace().collect();
        let tail = &all[taken..];
        let orig_tail = &orig[taken.min(orig.len())..];
        let name = |i: usize| -> Option<String> {
            if orig_tail.len() != i + 1 {
                return None;
            }
            let n = orig_tail[i]
                .trim_matches(|c| matches!(c, '"' | '\'' | '`'))
                .trim_start_matches(['@', '#']);
            let ok = !n.is_empty()
                && n.len() <= 200
                && n.chars()
                    .all(|c| c.is_alphanumeric() || "._-:@/".contains(c));
            ok.then(|| n.to_string())
        };
        match tail {
            ["from", "user" | "users", _] => name(2).map(CodeRule::IgnoreUser),
            ["from", "source" | "channel", _] | ["source" | "channel", _] => {
                name(tail.len() - 1).map(CodeRule::IgnoreSource)
            }
            ["from", "thread", _] | ["on", "thread", _] | ["in", "thread", _] | ["thread", _] => {
                name(tail.len() - 1).map(CodeRule::IgnoreThread)
            }
            ["from", _] => name(1).map(CodeRule::IgnoreUser),
            ["containing" | "matching" | "with", ..] | ["that", "contain", ..] => {
                let at = if tail[0] == "that" { 2 } else { 1 };
                let quoted = orig_tail[at..].join(" ");
                let q = quoted.trim();
                let inner = q
                    .strip_prefix('"')
                    .and_then(|x| x.strip_suffix('"'))
                    .or_else(|| q.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
                    .or_else(|| (!q.contains(char::is_whitespace)).then_some(q))?;
                (!inner.is_empty() && inner.len() <= 200 && !inner.contains('"'))
                    .then(|| CodeRule::IgnoreText(inner.to_lowercase()))
            }
            _ => None,
        }
    }

    /// What it does, for `byom policy ls`.
    pub fn describe(&self) -> String {
        match self {
            CodeRule::IgnoreUser(u) => format!(
                "in code: every message whose author is named {u} (on any connector: github:{u}, matrix:@{u}:…, slack:…/{u}, webhook:…/{u}, or shown as {u}) is ignored"
            ),
            CodeRule::IgnoreSource(s) => {
                format!("in code: every message from source {s} is ignored")
            }
            CodeRule::IgnoreThread(t) => format!("in code: every message on thread {t} is ignored"),
            CodeRule::IgnoreText(x) => {
                format!("in code: every message containing {x:?} is ignored")
            }
        }
    }

    /// Whether it ignores `t` (on the thread named `external` in its
    /// channel).
    pub fn ignores(&self, t: &pb::Trigger, external: &str) -> bool {
        match self {
            CodeRule::IgnoreUser(u) => user_match(t, u).is_some(),
            CodeRule::IgnoreSource(s) => t.source.eq_ignore_ascii_case(s),
            CodeRule::IgnoreThread(th) => {
                t.thread_id == *th || external.trim_start_matches('#').eq_ignore_ascii_case(th)
            }
            CodeRule::IgnoreText(x) => t.text.to_lowercase().contains(x.as_str()),
        }
    }
}

/// The name of `t`'s author that `name` matches, if any: its principal
/// (`github:mallory`), the name in it (`mallory`; a Matrix localpart, a
/// Slack user ID, a webhook's user), the name the channel gave, or the
/// user field. So "ignore messages from mallory" holds on every connector.
pub fn user_match(t: &pb::Trigger, name: &str) -> Option<String> {
    let want = name.trim_start_matches('@');
    let mut names: Vec<String> = Vec::new();
    for full in [&t.principal, &t.user] {
        if full.is_empty() {
            continue;
        }
        names.push(full.clone());
        let bare = full.split_once(':').map_or(full.as_str(), |(_, b)| b);
        let bare = bare.rsplit('/').next().unwrap_or(bare);
        let bare = bare.trim_start_matches('@');
        names.push(bare.to_string());
        // Matrix: @local:homeserver.
        if let Some((local, _)) = bare.split_once(':') {
            names.push(local.to_string());
        }
    }
    if !t.user_name.is_empty() {
        names.push(t.user_name.clone());
    }
    names
        .iter()
        .find(|n| n.trim_start_matches('@').eq_ignore_ascii_case(want))
        .map(|_| {
            if t.principal.is_empty() {
                t.user.clone()
            } else {
                t.principal.clone()
            }
        })
}

/// A trigger's reason says an owner's policy ignored it.
pub fn is_policy_reason(reason: &str) -> bool {
    reason.starts_with("policy pol_")
}

/// The first code rule among `policies` (id, text) that ignores `t`:
/// the reason to store.
pub fn ignored_by_policy(
    policies: &[(String, String)],
    t: &pb::Trigger,
    external: &str,
) -> Option<String> {
    policies.iter().find_map(|(id, text)| {
        let rule = CodeRule::compile(text)?;
        let which = match &rule {
            CodeRule::IgnoreUser(u) => user_match(t, u)
                .map(|p| format!(": it matched {p}"))
                .unwrap_or_default(),
            _ => String::new(),
        };
        rule.ignores(t, external)
            .then(|| format!("policy {id} ({text}){which}"))
    })
}

/// The fast path: (decision, reason).
pub fn decide(rules: &Rules, t: &pb::Trigger) -> (TriggerDecision, String) {
    let default = SourceRules::default();
    let src = rules.sources.get(&t.source).unwrap_or(&default);
    let (mode, users, bots) = src.for_channel(&t.channel);
    let r = SourceRules {
        mode,
        users: users.to_vec(),
        bots: bots.to_vec(),
        channels: HashMap::new(),
    };
    let place = if src.channels.contains_key(&t.channel) {
        format!("{} channel {}", t.source, t.channel)
    } else {
        t.source.clone()
    };
    if r.mode == Mode::Ignore {
        return (
            TriggerDecision::Ignored,
            format!("source {place} is ignored"),
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
            format!("user {} is not in the allow-list of {place}", t.user),
        );
    }
    if r.mode == Mode::AddressedOnly && !t.mention {
        return (
            TriggerDecision::Ignored,
            format!("{place} acts only when addressed"),
        );
    }
    (TriggerDecision::Candidate, "passes the fast path".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        let rules = Rules::parse(
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
        assert!(Rules::parse("[sources.x]\nmode = \"sometimes\"").is_err());
        assert!(Rules::parse("[sources.x]\nmod = \"ignore\"").is_err());
    }

    #[test]
    fn channels_override_their_source() {
        let rules = Rules::parse(
            "[sources.team]\nmode = \"addressed_only\"\n[sources.team.channels.\"!ops:hs\"]\nmode = \"candidate\"\n[sources.team.channels.\"!quiet:hs\"]\nmode = \"ignore\"\n",
        )
        .unwrap();
        let at = |channel: &str, mention: bool| {
            let mut t = ev("team", "matrix:@ada:hs", mention, false);
            t.channel = channel.into();
            decide(&rules, &t)
        };
        assert_eq!(at("!ops:hs", false).0, TriggerDecision::Candidate);
        assert_eq!(at("!other:hs", false).0, TriggerDecision::Ignored);
        assert_eq!(at("!other:hs", true).0, TriggerDecision::Candidate);
        let (d, why) = at("!quiet:hs", true);
        assert_eq!(d, TriggerDecision::Ignored);
        assert!(why.contains("channel !quiet:hs"), "{why}");
        assert!(Rules::parse("[sources.team.channels.x]\nmod = \"ignore\"").is_err());
    }

    #[test]
    fn reasons_say_which_rule() {
        let rules = Rules::parse(
            "[sources.chat]\nmode = \"addressed_only\"\nusers = [\"ada\"]\nbots = [\"ci-bot\"]\n",
        )
        .unwrap();
        let why = |t: pb::Trigger| decide(&rules, &t).1;
        assert!(why(ev("chat", "eve", true, false)).contains("allow-list of chat"));
        assert!(why(ev("chat", "ada", false, false)).contains("only when addressed"));
        assert!(why(ev("chat", "other-bot", true, true)).contains("bot allow-list"));
        // A listed bot is not held to the people's allow-list, but still
        // has to address the agent on an addressed-only source.
        assert_eq!(
            decide(&rules, &ev("chat", "ci-bot", true, true)).0,
            TriggerDecision::Candidate
        );
        assert_eq!(
            decide(&rules, &ev("chat", "ci-bot", false, true)).0,
            TriggerDecision::Ignored
        );
    }

    /// "ignore messages from mallory" holds for every principal named
    /// mallory, whichever connector it came from, and says which.
    #[test]
    fn an_owners_block_reaches_every_connector() {
        let policies = vec![(
            "pol_1".to_string(),
            "ignore messages from mallory".to_string(),
        )];
        for principal in [
            "github:mallory",
            "matrix:@mallory:evil.org",
            "webhook:ci/mallory",
            "slack:T1/mallory",
            "mallory",
        ] {
            let mut t = ev("x", "someone", true, false);
            t.principal = principal.into();
            let why = ignored_by_policy(&policies, &t, "").unwrap_or_default();
            assert!(
                why.contains(&format!("matched {principal}")),
                "{principal}: {why:?}"
            );
        }
        let mut t = ev("x", "U1", true, false);
        t.principal = "slack:T1/U1".into();
        t.user_name = "Mallory".into();
        assert!(ignored_by_policy(&policies, &t, "").is_some());
        let mut t = ev("x", "ada", true, false);
        t.principal = "github:mallory-fan".into();
        assert!(ignored_by_policy(&policies, &t, "").is_none());
    }

    #[test]
    fn policies_that_need_no_judgement_compile() {
        use CodeRule::*;
        for (text, want) in [
            ("ignore messages from bob", Some(IgnoreUser("bob".into()))),
            (
                "Ignore all messages from @Bob.",
                Some(IgnoreUser("Bob".into())),
            ),
            ("ignore bob", None),
            (
                "ignore everything from user ci-bot",
                Some(IgnoreUser("ci-bot".into())),
            ),
            ("ignore the source ci", Some(IgnoreSource("ci".into()))),
            (
                "ignore messages from channel slack",
                Some(IgnoreSource("slack".into())),
            ),
            ("ignore thread #random", Some(IgnoreThread("random".into()))),
            (
                "ignore messages in thread thr_01",
                Some(IgnoreThread("thr_01".into())),
            ),
            (
                "ignore messages containing \"LGTM\"",
                Some(IgnoreText("lgtm".into())),
            ),
            (
                "ignore messages that contain 'please ignore'",
                Some(IgnoreText("please ignore".into())),
            ),
            ("ignore messages from bob unless he asks for help", None),
            (
                "Ignore messages in #random unless someone asks for help",
                None,
            ),
            ("reply in French", None),
            ("ignore messages containing two words", None),
        ] {
            assert_eq!(CodeRule::compile(text), want, "{text}");
        }
        let t = pb::Trigger {
            user: "bob".into(),
            source: "chat".into(),
            thread_id: "thr_9".into(),
            text: "Please run hostname".into(),
            ..Default::default()
        };
        let pol = |text: &str| vec![("pol_1".to_string(), text.to_string())];
        assert!(ignored_by_policy(&pol("ignore messages from BOB"), &t, "ops").is_some());
        assert!(ignored_by_policy(&pol("ignore messages from ada"), &t, "ops").is_none());
        assert!(ignored_by_policy(&pol("ignore thread ops"), &t, "#ops").is_some());
        assert!(ignored_by_policy(&pol("ignore messages containing hostname"), &t, "x").is_some());
        assert!(ignored_by_policy(&pol("be polite to bob"), &t, "x").is_none());
    }

    proptest! {
        /// An unknown source never ignores a person; `ignore` ignores
        /// everyone; a decision always comes with a reason.
        #[test]
        fn decisions_follow_the_mode(
            user in "[a-z]{1,8}",
            mention: bool,
            bot: bool,
            mode in prop_oneof![Just("ignore"), Just("addressed_only"), Just("candidate")],
        ) {
            let rules = Rules::parse(&format!("[sources.s]\nmode = \"{mode}\"\n")).unwrap();
            let (d, why) = decide(&rules, &ev("s", &user, mention, bot));
            prop_assert!(!why.is_empty());
            let expect = match mode {
                "ignore" => TriggerDecision::Ignored,
                _ if bot => TriggerDecision::Ignored,
                "addressed_only" if !mention => TriggerDecision::Ignored,
                _ => TriggerDecision::Candidate,
            };
            prop_assert_eq!(d, expect);
            let (d, _) = decide(&Rules::default(), &ev("s", &user, mention, false));
            prop_assert_eq!(d, TriggerDecision::Candidate);
        }
    }
}
