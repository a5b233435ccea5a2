//! What to do with a machine's unfinished commands when its daemon says
//! Hello. Pure: the gateway feeds it the store's view and the Hello, and
//! carries out the plan.
//!
//! The rule that keeps "at most once per daemon process": a command the
//! daemon does not list is re-sent only to the same daemon process it was
//! dispatched to (which refuses IDs it has seen); a different process means
//! the daemon restarted, so the command is `lost`, never run again.

use std::collections::HashSet;

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
    }
}
