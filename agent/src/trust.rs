//! Who is trusted and who may approve: the configuration `byom trust`
//! edits, and the pure judgements made from it. Trust is decided when a
//! message arrives (and recorded on its trigger); approval is checked by
//! the core when an answer arrives, whoever carried it.
//!
//! Principals are `kind:id` strings: `admin:NAME` (a CLI certificate),
//! `matrix:@ada:example.org`, `slack:T123/U456`, `github:octocat`,
//! `webhook:SOURCE/USER`, and the agents' own IDs. A pattern is a principal
//! or a prefix ending in `*` (`admin:*`, `github:acme-*`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most entries in each list (a configuration, not a directory).
pub const MAX_ENTRIES: usize = 256;
/// Longest pattern or label.
pub const MAX_ENTRY_CHARS: usize = 200;

/// Someone who may approve: for every machine, or for machines carrying
/// one label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approver {
    pub principal: String,
    /// `key=value`: only for machines with this label (None: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Trust {
    /// Named principals (patterns) who are trusted.
    pub trusted: Vec<String>,
    /// GitHub `author_association` values that make an author trusted.
    pub github_associations: Vec<String>,
    /// Members of a Slack workspace (not guests) are trusted.
    pub slack_members: bool,
    /// Matrix users of these homeservers are trusted.
    pub matrix_homeservers: Vec<String>,
    pub approvers: Vec<Approver>,
}

impl Default for Trust {
    /// A new server's: every CLI admin is trusted and may approve for
    /// every machine; GitHub owners, members and collaborators are
    /// trusted; everyone else is untrusted until configured.
    fn default() -> Trust {
        Trust {
            trusted: vec!["admin:*".into()],
            github_associations: vec!["OWNER".into(), "MEMBER".into(), "COLLABORATOR".into()],
            slack_members: false,
            matrix_homeservers: Vec::new(),
            approvers: vec![Approver {
                principal: "admin:*".into(),
                label: None,
            }],
        }
    }
}

impl Trust {
    /// What holds when the configuration cannot be read: admins are
    /// trusted and approve, nobody else is (no association, workspace or
    /// homeserver vouches for anyone).
    pub fn closed() -> Trust {
        Trust {
            trusted: vec!["admin:*".into()],
            github_associations: Vec::new(),
            slack_members: false,
            matrix_homeservers: Vec::new(),
            approvers: vec![Approver {
                principal: "admin:*".into(),
                label: None,
            }],
        }
    }
}

/// A principal matches a pattern: equal, or the pattern ends in `*` and
/// the principal starts with what comes before it.
pub fn matches(pattern: &str, principal: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => principal.starts_with(prefix),
        None => pattern == principal,
    }
}

/// Whether a trigger's author is trusted, and why (said either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub trusted: bool,
    pub why: String,
}

impl Trust {
    /// Judges `principal` (namespaced as above). `association` is what the
    /// connector vouched for: GitHub's `author_association`, or `member` /
    /// `guest` for Slack; `""` when nothing was.
    pub fn judge(&self, principal: &str, association: &str) -> Verdict {
        self.judge_sender(principal, association, false)
    }

    /// [`Trust::judge`] for a message a bot posted (`bot`): like someone
    /// from outside the organisation (Slack Connect), a bot (an incoming
    /// webhook, a bridge, another app relaying others' words) is trusted
    /// only when named exactly, never by a pattern.
    pub fn judge_sender(&self, principal: &str, association: &str, bot: bool) -> Verdict {
        let yes = |why: String| Verdict { trusted: true, why };
        let exact_only = bot || association == "external";
        if let Some(p) = self
            .trusted
            .iter()
            .find(|p| matches(p, principal) && !(exact_only && p.ends_with('*')))
        {
            return yes(format!("{principal} is trusted (byom trust: {p})"));
        }
        if principal.starts_with("github:")
            && !association.is_empty()
            && self
                .github_associations
                .iter()
                .any(|a| a.eq_ignore_ascii_case(association))
        {
            return yes(format!("{principal} is a GitHub {association}"));
        }
        if principal.starts_with("slack:") && self.slack_members && association == "member" {
            return yes(format!("{principal} is a member of the Slack workspace"));
        }
        if let Some(hs) = principal
            .strip_prefix("matrix:@")
            .and_then(|u| u.split_once(':'))
            .map(|(_, hs)| hs)
        {
            if self.matrix_homeservers.iter().any(|h| h == hs) {
                return yes(format!("{principal} is on trusted homeserver {hs}"));
            }
        }
        let seen = if association.is_empty() {
            String::new()
        } else {
            format!(" ({association})")
        };
        Verdict {
            trusted: false,
            why: format!("{principal}{seen} is not trusted (see `byom trust ls`)"),
        }
    }

    /// Whether `principal` may approve for a machine with `labels` (None:
    /// no machine involved, so only approvers for every machine).
    pub fn may_approve(&self, principal: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.approvers
            .iter()
            .any(|a| matches(&a.principal, principal) && label_fits(a, labels))
    }

    /// Who may approve for such a machine, as configured (patterns).
    pub fn approvers_for(&self, labels: Option<&BTreeMap<String, String>>) -> Vec<String> {
        let mut v: Vec<String> = self
            .approvers
            .iter()
            .filter(|a| label_fits(a, labels))
            .map(|a| a.principal.clone())
            .collect();
        v.dedup();
        v
    }

    /// Checks sizes and shapes; the reason says what to fix.
    pub fn validate(&self) -> Result<(), String> {
        let lists = [
            ("trusted", &self.trusted),
            ("github_associations", &self.github_associations),
            ("matrix_homeservers", &self.matrix_homeservers),
        ];
        for (name, l) in lists {
            if l.len() > MAX_ENTRIES {
                return Err(format!("{name} holds more than {MAX_ENTRIES} entries"));
            }
            if let Some(e) = l
                .iter()
                .find(|e| e.trim().is_empty() || e.chars().count() > MAX_ENTRY_CHARS)
            {
                return Err(format!(
                    "{name}: {e:?} is empty or longer than {MAX_ENTRY_CHARS} characters"
                ));
            }
        }
        if self.approvers.len() > MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} approvers"));
        }
        for a in &self.approvers {
            if a.principal.trim().is_empty() || a.principal.chars().count() > MAX_ENTRY_CHARS {
                return Err(format!("approver {:?} is empty or too long", a.principal));
            }
            if let Some(l) = &a.label {
                if !l.contains('=') || l.chars().count() > MAX_ENTRY_CHARS {
                    return Err(format!("approver label {l:?} must be key=value"));
                }
            }
        }
        Ok(())
    }
}

fn label_fits(a: &Approver, labels: Option<&BTreeMap<String, String>>) -> bool {
    match (&a.label, labels) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(l), Some(m)) => l
            .split_once('=')
            .is_some_and(|(k, v)| m.get(k).is_some_and(|x| x == v)),
    }
}

/// Words that mean yes and no in an answer to an approval.
pub const YES: &[&str] = &[
    "yes", "y", "approve", "approved", "ok", "okay", "lgtm", "go", "sure", "yep", "yeah",
];
pub const NO: &[&str] = &[
    "no", "n", "deny", "denied", "stop", "don't", "dont", "nope", "reject", "cancel",
];

/// Whether `text` holds one of `words` as a whole word.
pub fn has_word(text: &str, words: &[&str]) -> bool {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .any(|w| words.contains(&w))
}

/// What a person's message says to an approval: `Some(true)` yes,
/// `Some(false)` no, `None` neither (or both).
pub fn answer_in(text: &str) -> Option<bool> {
    match (has_word(text, YES), has_word(text, NO)) {
        (true, false) => Some(true),
        (false, true) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_trust_admins_and_github_members_only() {
        let t = Trust::default();
        assert!(t.judge("admin:ada", "").trusted);
        assert!(t.judge("github:octocat", "OWNER").trusted);
        assert!(t.judge("github:octocat", "collaborator").trusted);
        assert!(!t.judge("github:mallory", "NONE").trusted);
        assert!(!t.judge("github:mallory", "CONTRIBUTOR").trusted);
        assert!(!t.judge("slack:T1/U1", "member").trusted);
        assert!(!t.judge("matrix:@ada:example.org", "").trusted);
        // An association means nothing outside GitHub.
        assert!(!t.judge("webhook:ci/x", "OWNER").trusted);
        let mut t2 = Trust::default();
        t2.trusted.push("slack:T1/*".into());
        assert!(t2.judge("slack:T1/U1", "").trusted);
        assert!(!t2.judge("slack:T1/U1", "external").trusted);
        t2.trusted.push("slack:T2/UX".into());
        assert!(t2.judge("slack:T2/UX", "external").trusted);
        // A bot relaying others' words (an incoming webhook, a bridge):
        // only by its exact name.
        assert!(!t2.judge_sender("slack:T1/B42", "", true).trusted);
        t2.trusted.push("slack:T1/B42".into());
        assert!(t2.judge_sender("slack:T1/B42", "", true).trusted);
        assert!(t.may_approve("admin:bob", None));
        assert!(!t.may_approve("github:octocat", None));
    }

    #[test]
    fn configured_sources_of_trust() {
        let mut t = Trust {
            slack_members: true,
            matrix_homeservers: vec!["example.org".into()],
            ..Trust::default()
        };
        t.trusted.push("github:acme-*".into());
        assert!(t.judge("slack:T1/U1", "member").trusted);
        assert!(!t.judge("slack:T1/U2", "guest").trusted);
        assert!(t.judge("matrix:@ada:example.org", "").trusted);
        assert!(!t.judge("matrix:@eve:evil.org", "").trusted);
        assert!(t.judge("github:acme-bot", "NONE").trusted);
        let v = t.judge("github:mallory", "NONE");
        assert!(v.why.contains("NONE") && v.why.contains("not trusted"));
    }

    #[test]
    fn approvers_per_label() {
        let t = Trust {
            approvers: vec![
                Approver {
                    principal: "admin:*".into(),
                    label: None,
                },
                Approver {
                    principal: "github:octocat".into(),
                    label: Some("team=ci".into()),
                },
            ],
            ..Trust::default()
        };
        let ci: BTreeMap<String, String> = [("team".to_string(), "ci".to_string())].into();
        let lap = BTreeMap::new();
        assert!(t.may_approve("github:octocat", Some(&ci)));
        assert!(!t.may_approve("github:octocat", Some(&lap)));
        assert!(!t.may_approve("github:octocat", None));
        assert_eq!(
            t.approvers_for(Some(&ci)),
            vec!["admin:*", "github:octocat"]
        );
        assert_eq!(t.approvers_for(Some(&lap)), vec!["admin:*"]);
    }

    #[test]
    fn answers() {
        assert_eq!(answer_in("yes, go ahead"), Some(true));
        assert_eq!(answer_in("LGTM"), Some(true));
        assert_eq!(answer_in("no, don't"), Some(false));
        assert_eq!(answer_in("yes and no"), None);
        assert_eq!(answer_in("what is this?"), None);
    }
}
