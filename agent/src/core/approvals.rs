//! Answers to approval requests: who may answer, the one explicit form a
//! message answers in ([`crate::approval`]), settling a request once, and
//! releasing exactly the action it covers.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::containment::taint_of;
use super::Core;
use crate::approval;
use crate::event::{CommandResult, Effect, TriggerInfo};
use crate::state::{Approval, ApprovalKind, ApprovalState};
use crate::trust::{answer_in, Trust};
use crate::world::World;

/// Refused answers kept on an approval.
const MAX_REFUSED: usize = 16;

impl Core {
    /// Whether `by` may answer approval `apr`; the error names who may.
    /// An unreadable trust configuration refuses (fail closed).
    fn check_approver(&self, world: &dyn World, apr: &Approval, by: &str) -> Result<(), String> {
        let trust: Trust = self
            .got(world.trust())
            .ok_or("who may approve cannot be read now")?;
        let labels = if apr.machine.is_empty() {
            None
        } else {
            // Unreadable: the approvers for every machine, the fewest.
            self.read(
                world.machines_for(&apr.machine, &BTreeMap::new()),
                Vec::new(),
            )
            .first()
            .map(|m| m.labels.clone())
        };
        if trust.may_approve(by, labels.as_ref()) {
            return Ok(());
        }
        let how = if apr.code.is_empty() {
            String::new()
        } else {
            format!(" with `approve {}`", apr.code)
        };
        Err(format!(
            "{by} may not approve {}: only {} may{how} (or an admin who is an approver: `byom approvals approve {}`)",
            apr.id,
            trust.approvers_for(labels.as_ref()).join(", "),
            apr.id
        ))
    }

    /// A person's explicit answer: from the CLI or the console (`by` is
    /// their certificate's name) or an `approve CODE` message (`by` is
    /// its author's principal, judged when it arrived). Refused unless
    /// `by` is an approver and the request is still open.
    pub(super) fn answer(
        &mut self,
        world: &mut dyn World,
        apr: &str,
        approved: bool,
        answer: Value,
        by: &str,
    ) -> Result<(), String> {
        let a = self.approval(apr)?;
        if a.state != ApprovalState::Open {
            return Err(format!("{apr} is already {}", a.state.name()));
        }
        if let Err(e) = self.check_approver(world, &a, by) {
            if let Some(x) = self.records.approval_mut(apr) {
                if x.refused.len() < MAX_REFUSED && !x.refused.iter().any(|r| r == by) {
                    x.refused.push(by.to_string());
                }
            }
            return Err(e);
        }
        let state = if approved {
            ApprovalState::Approved
        } else {
            ApprovalState::Denied
        };
        self.settle_approval(&a, state, answer, by);
        Ok(())
    }

    /// Closes an open request with its outcome (single use: only an open
    /// one is settled) and lets its worker go on accordingly.
    fn settle_approval(&mut self, a: &Approval, state: ApprovalState, answer: Value, by: &str) {
        let now = self.now;
        let Some(x) = self
            .records
            .approval_mut(&a.id)
            .filter(|x| x.state == ApprovalState::Open)
        else {
            return;
        };
        x.state = state;
        x.answer = answer.clone();
        x.by = by.to_string();
        x.answered_ms = now;
        let approved = state == ApprovalState::Approved;
        match a.kind {
            ApprovalKind::Question => {
                let v = json!({"approved": approved, "answer": answer, "by": by});
                self.js_settle(&a.worker, a.run, a.call, Ok(v));
            }
            ApprovalKind::Command => self.release_command(a, approved, by),
            ApprovalKind::Message => {
                let same = a.reply.as_ref().is_some_and(|r| {
                    a.digest.is_empty()
                        || approval::digest(
                            approval::kind_name(a.kind),
                            &a.machine,
                            &approval::post_action(r),
                        ) == a.digest
                });
                if let Some(w) = self.records.worker_mut(&a.worker) {
                    w.flags.absorb(&a.flags);
                }
                match (approved && same, &a.reply) {
                    (true, Some(r)) => self.out.push(Effect::Reply(r.clone())),
                    _ => self.worker_input(
                        &a.worker,
                        format!("(your message for another thread was not approved ({}, {by}); it was not posted)", a.id),
                    ),
                }
            }
        }
        self.settle_status(&a.worker);
    }

    /// Requests nobody answered in time end as "no".
    pub(super) fn expire_approvals(&mut self) {
        let now = self.now;
        let due: Vec<Approval> = self
            .records
            .approvals()
            .values()
            .filter(|a| a.state == ApprovalState::Open && a.expires_ms != 0 && a.expires_ms <= now)
            .cloned()
            .collect();
        for a in due {
            self.settle_approval(
                &a,
                ApprovalState::Expired,
                Value::Null,
                "nobody (it expired unanswered)",
            );
        }
    }

    /// A held command's answer: start it under the approval, or end it as
    /// denied (it never reached a machine). Only the very command that was
    /// approved starts: its digest must match the request's.
    fn release_command(&mut self, a: &Approval, approved: bool, by: &str) {
        let Some(w) = self.records.live_worker_mut(&a.worker) else {
            return;
        };
        let Some(c) = w.commands.get_mut(&a.cmd).filter(|c| !c.done) else {
            return;
        };
        c.held = None;
        let same = a.digest.is_empty()
            || approval::digest(approval::kind_name(a.kind), &a.machine, &c.command) == a.digest;
        if !approved || !same {
            let reason = if !same {
                format!("not run: it is not the command {} approved", a.id)
            } else {
                format!("not approved: {by} said no ({})", a.id)
            };
            let result = CommandResult {
                state: "denied".into(),
                exit_code: None,
                stdout: String::new(),
                stderr: String::new(),
                duration_ms: 0,
                reason,
                network: false,
            };
            let cmd = a.cmd.clone();
            let worker = a.worker.clone();
            self.command_done(&worker, &cmd, result);
            return;
        }
        c.approval = Some(a.id.clone());
        c.approved_by = by.to_string();
        let (machine, command, timeout_ms) = (c.machine.clone(), c.command.clone(), c.timeout_ms);
        w.flags.absorb(&a.flags);
        let taint = taint_of(&w.flags);
        let labels = w.labels.clone();
        self.out.push(Effect::StartCommand {
            worker: a.worker.clone(),
            cmd: a.cmd.clone(),
            machine,
            labels,
            command,
            timeout_ms,
            taint,
            approved_by: by.to_string(),
        });
    }

    fn approval(&self, apr: &str) -> Result<Approval, String> {
        self.records
            .approvals()
            .get(apr)
            .cloned()
            .ok_or_else(|| format!("no approval {apr}"))
    }

    /// A message that is an answer (`approve CODE`): applied when the
    /// request with that code is open, was asked on this message's thread
    /// before the message arrived, and its author (judged at ingest) is an
    /// approver for it. The outcome, either way, is said on the thread.
    pub(super) fn answer_by_code(
        &mut self,
        world: &mut dyn World,
        t: &TriggerInfo,
        ans: approval::Answer,
    ) {
        let all = self.records.approvals();
        let a = all
            .values()
            .find(|a| a.code == ans.code && a.state == ApprovalState::Open)
            .or_else(|| all.values().find(|a| a.code == ans.code))
            .cloned();
        let who = if t.user_name.is_empty() {
            t.user.clone()
        } else {
            t.user_name.clone()
        };
        let verb = if ans.approve { "approved" } else { "denied" };
        let kind = a.as_ref().map(|a| a.kind).unwrap_or_default();
        // Where the request was asked, when the answer came from elsewhere
        // (a direct message): told there too.
        let asked_on = a
            .as_ref()
            .map(|a| a.thread.clone())
            .filter(|th| !th.is_empty() && *th != t.thread);
        let outcome = match a {
            None => Err(format!(
                "there is no request with code {}; nothing was approved or denied",
                ans.code
            )),
            Some(a) if a.state != ApprovalState::Open => Err(format!(
                "{} (code {}) is already {}; an answer counts once",
                a.id,
                a.code,
                a.state.name()
            )),
            // The code binds the answer to its request; the thread only
            // keeps answers where the approver saw the question, or in
            // their own direct conversation with byom (the channel says
            // which: never a claim in the text).
            Some(a) if !t.direct && (a.thread.is_empty() || a.thread != t.thread) => Err(format!(
                "{} was not asked on this thread; answer it where it was asked, in a direct message to byom, or with `byom approvals approve {}`",
                a.id, a.id
            )),
            Some(a) if t.claimed => Err(format!(
                "{} is a name an admin gave this message, not its verified author; an approver answers in their own name (or `byom approvals approve {}`)",
                t.user, a.id
            )),
            Some(a) if t.at_ms == 0 || t.at_ms < a.created_ms => Err(format!(
                "this message is older than {}; only an answer written after the request counts",
                a.id
            )),
            Some(a) => self
                .answer(
                    world,
                    &a.id,
                    ans.approve,
                    Value::String(t.text.clone()),
                    &t.user,
                )
                .map(|()| a.id.clone()),
        };
        let answered = outcome.is_ok();
        let (fate, text) = match outcome {
            Ok(apr) => (
                format!("{verb} {apr} (by {})", t.user),
                match (ans.approve, kind) {
                    (true, ApprovalKind::Message) => {
                        format!("Approved by {who} ({apr}); posting exactly what was shown.")
                    }
                    (false, ApprovalKind::Message) => {
                        format!("Denied by {who} ({apr}); it will not be posted.")
                    }
                    (true, _) => {
                        format!("Approved by {who} ({apr}); running exactly what was asked.")
                    }
                    (false, _) => format!("Denied by {who} ({apr}); that step will not run."),
                },
            ),
            Err(e) => (
                format!("not an answer that counts: {e}"),
                format!("{who}: {e}."),
            ),
        };
        self.fate(&t.id, fate);
        let mut threads = vec![(t.thread.clone(), text.clone())];
        if let (true, Some(th)) = (answered, asked_on) {
            threads.push((th, format!("{text} (answered in a direct message)")));
        }
        for (thread, text) in threads {
            if let Ok(mut r) = self.reply(world, &thread, &text, "approval") {
                // It names its author (a display name they chose).
                if !t.trusted {
                    r.untrusted = Some(format!("answers {}: {}", t.id, t.trust));
                }
                self.out.push(Effect::Reply(r));
            }
        }
    }

    /// A message on a thread with an open request that reads like an
    /// answer but is not one: it is told what an answer looks like. (The
    /// words decide nothing: the message goes on as any other.)
    pub(super) fn hint_answer(&mut self, world: &mut dyn World, t: &TriggerInfo) {
        let open: Vec<(String, String)> = self
            .records
            .approvals()
            .values()
            .filter(|a| {
                a.thread == t.thread && a.state == ApprovalState::Open && !a.code.is_empty()
            })
            .map(|a| (a.id.clone(), a.code.clone()))
            .collect();
        if open.is_empty() {
            return;
        }
        let lower = t.text.to_lowercase();
        if answer_in(&t.text).is_none() && !lower.contains("approv") && !lower.contains("deny") {
            return;
        }
        let each: Vec<String> = open
            .iter()
            .map(|(apr, code)| format!("{apr}: `approve {code}` or `deny {code}`"))
            .collect();
        let text = format!(
            "That is not an answer. Only an approver's reply of exactly `approve CODE` or `deny CODE` (alone in the message) answers a request; open here: {}.",
            each.join("; ")
        );
        if let Ok(r) = self.reply(world, &t.thread, &text, "approval") {
            self.out.push(Effect::Reply(r));
        }
    }
}
