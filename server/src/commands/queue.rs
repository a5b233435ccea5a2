//! The command queue's decisions, pure: the commands service feeds them
//! the store's view and live facts, and carries them out.
//!
//! - [`plan`]: what to do with a machine's unfinished commands when its
//!   daemon says Hello. The rule that keeps "at most once per daemon
//!   process": a command the daemon does not list is re-sent only to the
//!   same daemon process it was dispatched to (which refuses IDs it has
//!   seen); a different process means the daemon restarted, so the command
//!   is `lost`, never run again.
//! - [`pick`]: which machine a label selector means (one picker for people
//!   and agents).
//! - [`expired`], [`lost_offline`]: when a waiting command gives up (a
//!   queued one at its queue TTL; one a machine had, only when that machine
//!   stays away past the offline allowance).

use std::collections::{BTreeMap, HashSet};

use byom_protocol::pb::{self, CommandState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The daemon still runs or holds it: re-attach from the stored offsets.
    Attach,
    /// Same daemon process, never received it: send the ExecRequest again.
    Resend,
    /// Dispatched to a daemon process that is gone.
    Lost,
}

pub const LOST_REASON: &str =
    "the daemon restarted while the command was dispatched or running; it was not run again";

/// Plans the fate of every dispatched or running command. Queued commands
/// are left to the dispatcher.
pub fn plan(pending: &[pb::Command], hello: &pb::Hello) -> Vec<(String, Action)> {
    let known: HashSet<&str> = hello
        .running
        .iter()
        .chain(hello.held.iter())
        .map(String::as_str)
        .collect();
    pending
        .iter()
        .filter(|c| {
            matches!(
                c.state(),
                CommandState::Dispatched
                    | CommandState::Running
                    | CommandState::AwaitingLocalApproval
            )
        })
        .map(|c| {
            let action = if known.contains(c.id.as_str()) {
                Action::Attach
            } else if !c.instance_id.is_empty() && c.instance_id == hello.instance_id {
                Action::Resend
            } else {
                Action::Lost
            };
            (c.id.clone(), action)
        })
        .collect()
}

/// Commands the daemon says it runs or holds that are not unfinished here:
/// they ended on the server while the daemon was away (cancelled, lost).
pub fn strays(pending: &[pb::Command], hello: &pb::Hello) -> Vec<String> {
    let ours: HashSet<&str> = pending.iter().map(|c| c.id.as_str()).collect();
    hello
        .running
        .iter()
        .chain(hello.held.iter())
        .filter(|id| !ours.contains(id.as_str()))
        .cloned()
        .collect()
}

/// A machine a label selector may pick, with its live facts.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub machine: pb::Machine,
    pub online: bool,
    pub paused: bool,
    /// Commands running or queued on it.
    pub load: u32,
}

/// Why no machine was picked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    #[error("no machine has the labels {0}: see `byom machines ls`")]
    NoMatch(String),
    #[error("no online machine has the labels {selector}; matching but unavailable: {}", unavailable.join(", "))]
    Unavailable {
        selector: String,
        unavailable: Vec<String>,
    },
}

/// The least busy online, unpaused, unrevoked machine with every label in
/// `want` (ties: by name).
pub fn pick(
    candidates: &[Candidate],
    want: &BTreeMap<String, String>,
) -> Result<pb::Machine, PickError> {
    let matching: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| !c.machine.revoked && c.machine.has_labels(want))
        .collect();
    let selector = want
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let best = matching
        .iter()
        .filter(|c| c.online && !c.paused)
        .min_by_key(|c| (c.load, c.machine.name.clone()));
    match best {
        Some(c) => Ok(c.machine.clone()),
        None if matching.is_empty() => Err(PickError::NoMatch(selector)),
        None => Err(PickError::Unavailable {
            selector,
            unavailable: matching
                .iter()
                .map(|c| {
                    let why = if c.online && c.paused {
                        "paused"
                    } else {
                        "offline"
                    };
                    format!("{} ({why})", c.machine.name)
                })
                .collect(),
        }),
    }
}

/// A queued command whose queue TTL ran out before its machine took it.
pub fn expired(c: &pb::Command, now_ms: u64) -> bool {
    c.state() == CommandState::Queued && c.queue_deadline_ms != 0 && now_ms >= c.queue_deadline_ms
}

/// When a command on a machine that is offline is given up as `lost`: the
/// offline allowance after the later of the machine's last sign of life
/// and the command's own deadline (dispatch + timeout). A sleeping laptop
/// keeps its commands until then; when it wakes, they are re-attached.
pub fn offline_deadline(c: &pb::Command, last_seen_ms: u64, allowance_ms: u64) -> u64 {
    let own = if c.timeout_ms == 0 {
        0
    } else {
        c.dispatched_at_ms
            .max(c.created_at_ms)
            .saturating_add(c.timeout_ms)
    };
    own.max(last_seen_ms).saturating_add(allowance_ms)
}

/// A command the daemon has (dispatched, running, or waiting for its
/// owner's approval) on a machine offline past [`offline_deadline`].
pub fn lost_offline(
    c: &pb::Command,
    machine_online: bool,
    last_seen_ms: u64,
    now_ms: u64,
    allowance_ms: u64,
) -> bool {
    matches!(
        c.state(),
        CommandState::Dispatched | CommandState::Running | CommandState::AwaitingLocalApproval
    ) && !machine_online
        && now_ms >= offline_deadline(c, last_seen_ms, allowance_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(id: &str, state: CommandState, instance: &str) -> pb::Command {
        pb::Command {
            id: id.into(),
            state: state as i32,
            instance_id: instance.into(),
            ..Default::default()
        }
    }

    #[test]
    fn plans_attach_resend_lost() {
        let pending = vec![
            cmd("cmd_run", CommandState::Running, "a"),
            cmd("cmd_held", CommandState::Running, "a"),
            cmd("cmd_inflight", CommandState::Dispatched, "a"),
            cmd("cmd_old", CommandState::Running, "old"),
            cmd("cmd_queued", CommandState::Queued, ""),
        ];
        let hello = pb::Hello {
            instance_id: "a".into(),
            running: vec!["cmd_run".into()],
            held: vec!["cmd_held".into()],
            ..Default::default()
        };
        let p = plan(&pending, &hello);
        assert_eq!(
            p,
            vec![
                ("cmd_run".into(), Action::Attach),
                ("cmd_held".into(), Action::Attach),
                ("cmd_inflight".into(), Action::Resend),
                ("cmd_old".into(), Action::Lost),
            ]
        );
        // After a daemon restart nothing is re-sent.
        let restarted = pb::Hello {
            instance_id: "b".into(),
            ..Default::default()
        };
        assert!(plan(&pending, &restarted)
            .iter()
            .all(|(_, a)| *a == Action::Lost));
        // A record without an instance (should not happen) is never re-sent.
        let blank = vec![cmd("cmd_x", CommandState::Dispatched, "")];
        let hello = pb::Hello::default();
        assert_eq!(plan(&blank, &hello), vec![("cmd_x".into(), Action::Lost)]);
        // What the daemon has that ended here while it was away.
        let hello = pb::Hello {
            instance_id: "a".into(),
            running: vec!["cmd_run".into(), "cmd_gone".into()],
            held: vec!["cmd_old_result".into()],
            ..Default::default()
        };
        assert_eq!(strays(&pending, &hello), ["cmd_gone", "cmd_old_result"]);
    }

    fn machine(name: &str, labels: &[(&str, &str)]) -> pb::Machine {
        pb::Machine {
            id: format!("mch_{name}"),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn cand(name: &str, online: bool, paused: bool, load: u32) -> Candidate {
        Candidate {
            machine: machine(name, &[("team", "web")]),
            online,
            paused,
            load,
        }
    }

    fn want(k: &str, v: &str) -> BTreeMap<String, String> {
        [(k.to_string(), v.to_string())].into()
    }

    #[test]
    fn picks_the_least_busy_available_machine() {
        let all = vec![
            cand("a", true, false, 3),
            cand("b", true, false, 1),
            cand("c", true, true, 0),
            cand("d", false, false, 0),
        ];
        assert_eq!(pick(&all, &want("team", "web")).unwrap().name, "b");
        // Ties go by name, so the choice is stable.
        let tie = vec![cand("z", true, false, 1), cand("y", true, false, 1)];
        assert_eq!(pick(&tie, &want("team", "web")).unwrap().name, "y");
    }

    #[test]
    fn a_paused_or_offline_match_is_named_not_picked() {
        let all = vec![cand("c", true, true, 0), cand("d", false, false, 0)];
        let e = pick(&all, &want("team", "web")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no online machine has the labels team=web; matching but unavailable: c (paused), d (offline)"
        );
        assert!(matches!(
            pick(&all, &want("team", "db")),
            Err(PickError::NoMatch(_))
        ));
        let mut revoked = cand("r", true, false, 0);
        revoked.machine.revoked = true;
        assert!(matches!(
            pick(&[revoked], &want("team", "web")),
            Err(PickError::NoMatch(_))
        ));
    }

    #[test]
    fn queued_commands_expire_at_their_deadline() {
        let mut c = cmd("cmd_q", CommandState::Queued, "");
        c.queue_deadline_ms = 1000;
        assert!(!expired(&c, 999));
        assert!(expired(&c, 1000));
        c.queue_deadline_ms = 0;
        assert!(!expired(&c, u64::MAX), "no deadline: waits");
        let mut d = cmd("cmd_d", CommandState::Dispatched, "a");
        d.queue_deadline_ms = 1;
        assert!(!expired(&d, 5), "only queued commands expire");
    }

    #[test]
    fn only_commands_of_machines_gone_past_the_allowance_are_lost() {
        let mut running = cmd("cmd_r", CommandState::Running, "a");
        running.dispatched_at_ms = 1_000;
        assert!(
            !lost_offline(&running, true, 0, u64::MAX, 100),
            "online: never"
        );
        // No timeout: the allowance counts from the machine's last sign of life.
        assert!(!lost_offline(&running, false, 9_950, 10_000, 100));
        assert!(lost_offline(&running, false, 9_900, 10_000, 100));
        // With a timeout: not before the command itself would have ended.
        running.timeout_ms = 50_000;
        assert_eq!(offline_deadline(&running, 9_900, 100), 51_100);
        assert!(!lost_offline(&running, false, 9_900, 51_099, 100));
        assert!(lost_offline(&running, false, 9_900, 51_100, 100));
        let queued = cmd("cmd_q", CommandState::Queued, "");
        assert!(
            !lost_offline(&queued, false, 0, u64::MAX, 100),
            "queued commands wait for their TTL"
        );
        let approval = cmd("cmd_a", CommandState::AwaitingLocalApproval, "a");
        assert!(lost_offline(&approval, false, 0, 10_000, 100));
        let done = cmd("cmd_d", CommandState::Exited, "a");
        assert!(!lost_offline(&done, false, 0, u64::MAX, 100));
    }
}
