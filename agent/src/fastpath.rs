//! The fast path: code, per source, no model. Every stored trigger is
//! decided here first: `ignored` (with the reason) or `candidate` for the
//! agents. Rules come from `<data-dir>/sources.toml`:
//!
//! ```toml
//! [sources.chat]
//! mode = "addressed_only"   # ignore | addressed_only | candidate
//! users = ["ada", "bob"]    # allow-list (empty: anyone)
//! bots = []                 # bot allow-list (bots are ignored unless listed)
//! ```
//!
//! A source without rules is `candidate`, bots excepted. [`decide`] is a
//! pure function of the rules and the trigger.

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
