//! Who reads a channel, beyond those who spoke there. A post is read by
//! everyone who can see the channel: the people in a Matrix room (someone
//! from another homeserver who never said a word included), everyone in a
//! Slack workspace for a public channel. Containment's gate on posts
//! (`World::public`) asks [`untrusted_reader`] before laptop output or a
//! secret goes there; connectors note what their provider says.

use byom_agent::trust::Trust;
use byom_store::{Op, Store, StoreError};
use serde::{Deserialize, Serialize};

/// The most people a room's list keeps: a bigger room is taken as read by
/// people nobody vouched for (the list would cost more than it tells).
pub const MAX_READERS: usize = 1000;

/// Who can read a channel, as its provider last said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Readers {
    /// More than [`MAX_READERS`] people.
    Many(usize),
    /// Everyone in this Slack workspace (a public channel).
    Workspace(String),
    /// Only the people added to it, whom the provider does not list (a
    /// Slack private channel or direct message).
    Private,
    /// Anyone the room's rules let in without a member's act, or anyone at
    /// all (why): a Matrix room whose join rule is not `invite`/`knock`
    /// (`public`, `restricted` to another room's members, a rule this
    /// version does not know) or whose history is `world_readable`.
    Anyone(String),
    /// Asking the provider failed (why): held like a stranger's room.
    Unknown(String),
    /// These principals (byom's own account left out), each with what the
    /// provider vouched for them (Slack's `member`/`guest`, see
    /// `Trust::judge`; empty for Matrix), as learnt at `at_ms`: a Matrix
    /// room's joined and invited members, a Slack private channel's.
    Members {
        people: Vec<(String, String)>,
        at_ms: u64,
    },
}

fn key(channel: &str) -> String {
    format!("readers/{channel}")
}

/// Records who reads `channel` of `connector` (written only on a change).
pub fn note(
    store: &Store,
    connector: &str,
    channel: &str,
    readers: &Readers,
) -> Result<(), StoreError> {
    let now = serde_json::to_vec(readers).unwrap_or_default();
    if store.channel_state(connector, &key(channel))?.as_deref() != Some(&now[..]) {
        store.batch(&[Op::channel_state(connector, &key(channel), &now)])?;
    }
    Ok(())
}

/// Who reads `channel`, if a provider ever said. A record this version
/// cannot read counts as never said (the caller decides what unknown
/// means; for a room it means "hold").
pub fn get(store: &Store, connector: &str, channel: &str) -> Result<Option<Readers>, StoreError> {
    Ok(store
        .channel_state(connector, &key(channel))?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

/// Someone among `readers` whom `trust` does not trust, said as a reason.
pub fn untrusted_reader(trust: &Trust, readers: &Readers) -> Option<String> {
    match readers {
        Readers::Many(n) => Some(format!(
            "{n} people are in it (more than byom lists: {MAX_READERS})"
        )),
        // Every member of the workspace is trusted only by a pattern for
        // all of it (`slack:T1/*`, `slack:*`) or by `--slack-members`: a
        // probe no narrower pattern matches asks exactly that.
        Readers::Workspace(team) => {
            let everyone = format!("slack:{team}/*");
            (!trust.judge(&everyone, "member").trusted).then(|| {
                format!("it is a public channel: anyone in workspace {team} can read it, and not all of them are trusted")
            })
        }
        Readers::Private => None,
        Readers::Anyone(why) => Some(why.clone()),
        Readers::Unknown(e) => Some(format!("who is in it could not be learnt ({e})")),
        Readers::Members { people, .. } => people
            .iter()
            .find(|(p, vouched)| !trust.judge(p, vouched).trusted)
            .map(|(p, _)| format!("{p}, whom the server does not trust, is in it")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Members nobody vouched for, as a Matrix room's are.
    fn people(p: Vec<&str>) -> Readers {
        Readers::Members {
            people: p
                .into_iter()
                .map(|p| (p.to_string(), String::new()))
                .collect(),
            at_ms: 1,
        }
    }

    fn trust(patterns: &[&str], slack_members: bool) -> Trust {
        Trust {
            trusted: patterns.iter().map(|p| p.to_string()).collect(),
            slack_members,
            ..Trust::default()
        }
    }

    #[test]
    fn a_room_is_as_trusted_as_its_least_trusted_reader() {
        let room = people(vec!["matrix:@ada:hs", "matrix:@eve:elsewhere.org"]);
        let t = trust(&["matrix:@ada:hs"], false);
        let why = untrusted_reader(&t, &room).unwrap();
        assert!(why.contains("@eve:elsewhere.org"), "{why}");
        assert_eq!(untrusted_reader(&trust(&["matrix:*"], false), &room), None);
        assert!(untrusted_reader(&trust(&["matrix:*"], false), &Readers::Many(5000)).is_some());
        assert_eq!(untrusted_reader(&t, &Readers::Private), None);
        assert!(untrusted_reader(
            &trust(&["matrix:*"], false),
            &Readers::Anyone("its history is world readable".into())
        )
        .is_some());
        assert!(untrusted_reader(&t, &Readers::Unknown("HTTP 500".into())).is_some());
        let members = |v: &[(&str, &str)]| Readers::Members {
            people: v
                .iter()
                .map(|(p, a)| (p.to_string(), a.to_string()))
                .collect(),
            at_ms: 1,
        };
        let ws = trust(&[], true);
        assert_eq!(
            untrusted_reader(&ws, &members(&[("slack:T1/U1", "member")])),
            None
        );
        assert!(untrusted_reader(
            &ws,
            &members(&[("slack:T1/U1", "member"), ("slack:T1/U2", "guest")])
        )
        .is_some());
        assert_eq!(untrusted_reader(&t, &people(vec![])), None);
    }

    #[test]
    fn a_public_channel_needs_the_whole_workspace_trusted() {
        let w = Readers::Workspace("T1".into());
        for (patterns, members, ok) in [
            (&["slack:T1/*"][..], false, true),
            (&["slack:*"][..], false, true),
            (&["*"][..], false, true),
            (&[][..], true, true),
            (&["slack:T1/U0ADA"][..], false, false),
            (&["slack:T1/U*"][..], false, false),
            (&["slack:T2/*"][..], false, false),
            (&[][..], false, false),
        ] {
            assert_eq!(
                untrusted_reader(&trust(patterns, members), &w).is_none(),
                ok,
                "{patterns:?} members={members}"
            );
        }
    }

    #[test]
    fn notes_round_trip_and_unreadable_is_unknown() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open_sled(d.path()).unwrap();
        assert_eq!(get(&store, "team", "!r:hs").unwrap(), None);
        let r = people(vec!["matrix:@ada:hs"]);
        note(&store, "team", "!r:hs", &r).unwrap();
        assert_eq!(get(&store, "team", "!r:hs").unwrap(), Some(r));
        store
            .batch(&[Op::channel_state("team", &key("!x:hs"), b"{nope")])
            .unwrap();
        assert_eq!(get(&store, "team", "!x:hs").unwrap(), None);
    }
}
