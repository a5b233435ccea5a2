//! The Rule of Two, in code: each worker carries [A] untrusted input, [B]
//! sensitive access and [C] the power to act, each with its causes
//! ([`Flags`]); before an effect happens the core adds what the effect
//! would bring, and one that would complete all three is held for a
//! person's approval instead. Flags only grow, pass to subagents (and back
//! with their results) and to the programs a worker runs (their calls are
//! its effects).
//!
//! Only people approve: an answer counts when its author is an approver
//! for the machine involved, whoever carried it. The Router may carry one
//! from a thread, naming the trigger it came in; the core reads that
//! trigger's author and words itself.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{push_bounded, Core};
use crate::approval;
use crate::event::{Effect, Reply, RouterItem, TriggerInfo};
use crate::state::{Approval, ApprovalKind, ApprovalState, Flags};
use crate::world::{MachineInfo, World};
use byom_protocol::id::Kind;

/// Characters that make a command more than one program with plain
/// arguments. Only such a plain command can be read-only here; the
/// daemon checks every command again with a real shell parser.
fn plain(command: &str) -> bool {
    command
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " -_./,:@+".contains(c))
}

/// Whether `command` runs only programs its machine's owner declared
/// read-only: a plain command whose words start with a declared entry
/// (`ls`, `git status`).
pub fn read_only(command: &str, declared: &[String]) -> bool {
    if !plain(command) {
        return false;
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    declared.iter().any(|d| {
        let want: Vec<&str> = d.split_whitespace().collect();
        !want.is_empty() && words.len() >= want.len() && words[..want.len()] == want[..]
    })
}

/// What running `command` on these machines adds: B when one of them is
/// sensitive or a secret is used, C unless every one declares it read-only.
pub fn command_flags(cmd: &str, command: &str, machines: &[MachineInfo], target: &str) -> Flags {
    let mut f = Flags::default();
    if machines.is_empty() {
        f.add_sensitive(
            target,
            "no such machine is known, so it counts as sensitive",
        );
    }
    for m in machines.iter().filter(|m| m.sensitive()) {
        f.add_sensitive(&m.name, "a personal machine (not labelled sensitive=false)");
    }
    if command.contains("{{secret:") {
        f.add_sensitive(cmd, "uses a {{secret:…}} handle");
    }
    if machines.is_empty() || machines.iter().any(|m| !read_only(command, &m.read_only)) {
        f.add_acts(cmd, "runs a command that is not declared read-only");
    }
    f
}

impl Core {
    /// The worker took in a message: untrusted text taints it.
    pub(super) fn take_in(&mut self, worker: &str, t: &TriggerInfo, how: &str) {
        if t.trusted {
            return;
        }
        if let Some(w) = self.records.live_worker_mut(worker) {
            w.flags.add_untrusted(&t.id, &format!("{how}: {}", t.trust));
        }
    }

    /// A worker read a stored object: text from someone untrusted gives
    /// it A; another worker's record gives it that worker's A and B; a
    /// command's output is a machine's data (B).
    pub(super) fn read_object(&mut self, world: &dyn World, worker: &str, obj: &str) {
        let f = self.object_flags(world, obj);
        if let Some(w) = self.records.live_worker_mut(worker) {
            w.flags.absorb(&f);
        }
    }

    /// What reading `obj` brings (see [`Core::read_object`]).
    pub(super) fn object_flags(&self, world: &dyn World, obj: &str) -> Flags {
        let mut f = Flags::default();
        if let Some(why) = world.untrusted(obj) {
            f.add_untrusted(obj, &format!("recalled: {why}"));
        }
        if let Some(o) = self.records.worker(obj) {
            inherit(&mut f, &o.flags, obj, "the record of");
        }
        // A request's text is its worker's words.
        if let Some(a) = self.records.approvals().get(obj) {
            inherit(&mut f, &a.flags, obj, "the request");
        }
        if obj.starts_with(Kind::Command.prefix()) {
            f.add_sensitive(obj, "recalled a command's output");
        }
        f
    }

    /// A and B of the Router's current turn: untrusted messages in it, and
    /// reports of workers that hold them. A worker made in this turn
    /// starts with them (the Router's words to it may carry either).
    pub(super) fn turn_flags(&self) -> Flags {
        let mut f = self.records.router().turn_read.clone();
        for it in &self.records.router().turn_items {
            match it {
                RouterItem::Trigger(t) if !t.trusted => {
                    f.add_untrusted(&t.id, &format!("in the Router's turn: {}", t.trust));
                }
                // A bounced message brings whoever bounced it: a tainted
                // worker choosing which old message the Router acts on
                // taints that choice.
                RouterItem::Bounced {
                    trigger: t,
                    worker,
                    flags,
                } => {
                    if !t.trusted {
                        f.add_untrusted(&t.id, &format!("in the Router's turn: {}", t.trust));
                    }
                    inherit(&mut f, flags, worker, "bounced by");
                    if let Some(w) = self.records.worker(worker) {
                        inherit(&mut f, &w.flags, worker, "bounced by");
                    }
                }
                // The flags it reported with, which outlive the worker;
                // and its current ones while it is still in memory.
                RouterItem::Report { worker, flags, .. } => {
                    inherit(&mut f, flags, worker, "a report of");
                    if let Some(w) = self.records.worker(worker) {
                        inherit(&mut f, &w.flags, worker, "a report of");
                    }
                }
                // A request's text holds the action of a tainted worker.
                RouterItem::Question {
                    approval, flags, ..
                } => {
                    inherit(&mut f, flags, approval, "the approval request");
                    if let Some(a) = self.records.approvals().get(approval) {
                        inherit(&mut f, &a.flags, approval, "the approval request");
                    }
                }
                _ => {}
            }
        }
        f
    }

    /// The machines a command of `worker` on `machine` (or its labels)
    /// could reach.
    fn reach(
        world: &dyn World,
        machine: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<MachineInfo> {
        world.machines_for(machine, labels)
    }

    /// Gate for a command: `None` when it may start now (its flags are
    /// added to the worker's), or the approval it now waits for.
    pub(super) fn gate_command(
        &mut self,
        world: &mut dyn World,
        id: &str,
        cmd: &str,
        machine: &str,
        command: &str,
    ) -> Option<String> {
        let w = self.records.worker(id)?;
        let reach = Core::reach(world, machine, &w.labels);
        let target = if machine.is_empty() {
            label_text(&w.labels)
        } else {
            machine.to_string()
        };
        let mut after = w.flags.clone();
        after.absorb(&command_flags(cmd, command, &reach, &target));
        if !after.all_three() {
            if let Some(w) = self.records.worker_mut(id) {
                w.flags = after;
            }
            return None;
        }
        let labels = reach.first().map(|m| m.labels.clone());
        Some(self.ask(
            world,
            id,
            ApprovalKind::Command,
            &target,
            labels.as_ref(),
            "run a command",
            command,
            after,
            cmd,
            None,
        ))
    }

    /// Gate for a reply on `r.thread`. A worker that reported in this turn
    /// and whose task did not come from that thread speaks there when its
    /// report names the thread, when it bounced a message there, or when
    /// someone untrusted spoke there this turn: that is communicating
    /// elsewhere (C), so a worker holding A and B needs an approver's yes,
    /// whether or not someone also spoke on that thread (a stranger's
    /// message, or a trigger a worker bounced there, must not open a way
    /// out). Workers that ended before the Router acted speak
    /// through the flags their report carried. `Ok(None)`: post now;
    /// `Ok(Some(apr))`: held.
    pub(super) fn gate_reply(
        &mut self,
        world: &mut dyn World,
        r: &Reply,
    ) -> Result<Option<String>, String> {
        let items = self.records.router().turn_items.clone();
        let conversation = items.iter().any(|it| match it {
            RouterItem::Trigger(t) | RouterItem::Bounced { trigger: t, .. } => t.thread == r.thread,
            RouterItem::Question { thread, .. } => thread == &r.thread,
            RouterItem::Report { .. } => false,
        });
        // (worker, flags it reported with, its task's own threads, whether
        // its report names this thread).
        let mut reporters: Vec<(String, Flags, Vec<String>, bool)> = Vec::new();
        for it in &items {
            if let RouterItem::Report {
                worker,
                threads,
                flags,
                own_threads,
                ..
            } = it
            {
                let here = threads.contains(&r.thread);
                match reporters.iter_mut().find(|(w, ..)| w == worker) {
                    Some(x) => {
                        x.1.absorb(flags);
                        x.3 |= here;
                    }
                    None => {
                        reporters.push((worker.clone(), flags.clone(), own_threads.clone(), here))
                    }
                }
            }
        }
        let mut speakers = Vec::new();
        let mut answers_here = false;
        for (w, reported, own, here) in reporters {
            let (mut flags, machine, wlabels, own) = match self.records.worker(&w) {
                Some(ws) => (
                    ws.flags.clone(),
                    ws.machine.clone(),
                    ws.labels.clone(),
                    ws.own_threads.clone(),
                ),
                // Ended: no machine known, so only approvers for every
                // machine may let it post.
                None => (Flags::default(), String::new(), BTreeMap::new(), own),
            };
            flags.absorb(&reported);
            if own.contains(&r.thread) {
                // Its report, on its task's own thread: the answer to the
                // people who asked.
                answers_here |= here;
                continue;
            }
            // What it reported may go where its report names, where it
            // bounced a message to, or to people on a thread with someone
            // untrusted in this turn.
            let bounced_here = items.iter().any(|it| {
                matches!(it, RouterItem::Bounced { worker, trigger, .. }
                    if *worker == w && trigger.thread == r.thread)
            });
            let strangers_here = items.iter().any(|it| {
                matches!(it, RouterItem::Trigger(t) | RouterItem::Bounced { trigger: t, .. }
                    if t.thread == r.thread && !t.trusted)
            });
            if here || bounced_here || strangers_here {
                speakers.push((w, flags, machine, wlabels, here));
            }
        }
        if speakers.is_empty() {
            if conversation || answers_here {
                return Ok(None);
            }
            // Only the Router's own unprompted post (an open thread).
            let f = self.turn_flags();
            if f.a() && f.b() {
                return Err(format!(
                    "posting on {} unprompted while this turn holds untrusted input and private data needs a person ({}); reply where the work came from",
                    r.thread,
                    f.explain()
                ));
            }
            return Ok(None);
        }
        for (w, flags, machine, wlabels, here) in speakers {
            let mut after = flags;
            after.add_acts(&r.thread, "posts on a thread that is not its task's own");
            if after.all_three() {
                let labels = Core::reach(world, &machine, &wlabels)
                    .first()
                    .map(|m| m.labels.clone());
                let apr = self.ask(
                    world,
                    &w,
                    ApprovalKind::Message,
                    &machine,
                    labels.as_ref(),
                    &format!("post on {} (not its task's own thread)", r.thread),
                    &approval::post_action(r),
                    after,
                    "",
                    Some(r.clone()),
                );
                return Ok(Some(apr));
            }
            if here {
                if let Some(ws) = self.records.worker_mut(&w) {
                    ws.flags = after;
                }
            }
        }
        Ok(None)
    }

    /// Opens an approval request, written here and never by the Router:
    /// the exact `action`, where, why, who may answer and the code an
    /// answer must name. The core posts it on the worker's thread itself
    /// (the approver reads the action, not the Router's wording of it),
    /// and the Router hears of it as a question it may relay, never
    /// answer.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ask(
        &mut self,
        world: &mut dyn World,
        worker: &str,
        kind: ApprovalKind,
        machine: &str,
        labels: Option<&BTreeMap<String, String>>,
        what: &str,
        action: &str,
        flags: Flags,
        cmd: &str,
        reply: Option<Reply>,
    ) -> String {
        let apr = world.new_id(Kind::Approval);
        // Unique among open requests: an answer names exactly one.
        let mut code = approval::code_from(&apr);
        for i in 0..8 {
            let taken = self
                .records
                .approvals()
                .values()
                .any(|a| a.state == ApprovalState::Open && a.code == code);
            if !taken {
                break;
            }
            code = approval::code_from(&format!("{apr}/{i}"));
        }
        // A worker that has ended is asked for where its task came from,
        // as its report says.
        let thread = self
            .root_thread(worker)
            .or_else(|| {
                self.records
                    .router()
                    .turn_items
                    .iter()
                    .find_map(|it| match it {
                        RouterItem::Report {
                            worker: w,
                            own_threads,
                            ..
                        } if w == worker => own_threads.first().cloned(),
                        _ => None,
                    })
            })
            .unwrap_or_default();
        let approvers = world.trust().approvers_for(labels);
        let why = if flags.all_three() {
            flags.explain()
        } else {
            "a program asks a person".to_string()
        };
        let question =
            approval::request_text(&apr, &code, worker, what, action, machine, &why, &approvers);
        let digest = approval::digest(approval::kind_name(kind), machine, action);
        self.records.insert_approval(Approval {
            id: apr.clone(),
            worker: worker.to_string(),
            thread: thread.clone(),
            question: question.clone(),
            run: 0,
            call: 0,
            state: ApprovalState::Open,
            answer: Value::Null,
            by: String::new(),
            created_ms: self.now,
            answered_ms: 0,
            kind,
            machine: machine.to_string(),
            cmd: cmd.to_string(),
            reply,
            flags: flags.clone(),
            approvers: approvers.clone(),
            refused: Vec::new(),
            code: code.clone(),
            action: action.to_string(),
            digest,
            expires_ms: self.now.saturating_add(approval::APPROVAL_TTL_MS),
        });
        let flags = Flags {
            acts: Vec::new(),
            ..flags
        };
        if let Some(info) = world.thread(&thread) {
            self.out.push(Effect::Reply(Reply {
                id: world.new_id(Kind::Trigger),
                thread: thread.clone(),
                source: info.source,
                text: question.clone(),
            }));
        }
        push_bounded(
            self.records.router_mut(),
            RouterItem::Question {
                approval: apr.clone(),
                worker: worker.to_string(),
                thread,
                question: format!(
                    "{}\n(byom posted this request on the thread itself. Only an approver's `approve CODE` answers it; you cannot.)",
                    question.replace(&code, "[code]")
                ),
                flags,
            },
        );
        self.settle_status(worker);
        apr
    }
}

/// `f`'s A and B, each under one cause naming where they came from.
pub(super) fn inherit(into: &mut Flags, f: &Flags, from: &str, how: &str) {
    if let Some(c) = f.untrusted.first() {
        into.add_untrusted(from, &format!("{how} {from}, which read {}", c.object));
    }
    if let Some(c) = f.sensitive.first() {
        into.add_sensitive(from, &format!("{how} {from}, which reached {}", c.object));
    }
}

/// What the daemon is told about a command's worker's taint ("" when
/// clean).
pub(super) fn taint_of(f: &Flags) -> String {
    f.untrusted
        .iter()
        .map(|c| format!("{} ({})", c.object, c.why))
        .collect::<Vec<_>>()
        .join("; ")
}

fn label_text(labels: &BTreeMap<String, String>) -> String {
    let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("machines labelled {}", l.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_needs_a_plain_declared_command() {
        let d = vec!["ls".to_string(), "git status".to_string()];
        assert!(read_only("ls -la /tmp", &d));
        assert!(read_only("git status --short", &d));
        assert!(!read_only("git push", &d));
        assert!(!read_only("ls; rm -rf ~", &d));
        assert!(!read_only("ls $(rm x)", &d));
        assert!(!read_only("ls 'a b'", &d));
        assert!(!read_only("lsblk", &d));
        assert!(!read_only("ls > /etc/x", &d));
        assert!(!read_only("ls", &[]));
    }

    #[test]
    fn command_flags_follow_labels_secrets_and_read_only() {
        let lap = MachineInfo {
            name: "lap".into(),
            ..Default::default()
        };
        let ci = MachineInfo {
            name: "ci".into(),
            labels: [("sensitive".to_string(), "false".to_string())].into(),
            read_only: vec!["ls".into()],
        };
        let f = command_flags("cmd_1", "uname", std::slice::from_ref(&lap), "lap");
        assert!(f.b() && f.c());
        let f = command_flags("cmd_1", "ls", std::slice::from_ref(&ci), "ci");
        assert!(!f.b() && !f.c());
        let f = command_flags("cmd_1", "echo {{secret:TOKEN}}", &[ci], "ci");
        assert!(f.b() && f.c());
        let f = command_flags("cmd_1", "ls", &[], "ghost");
        assert!(f.b() && f.c());
    }
}
