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
use crate::trust::Trust;
use crate::world::{MachineInfo, World};
use byom_protocol::id::Kind;

/// Threads a worker's work may come from (its task's, and those where
/// someone trusted addressed it since).
const MAX_OWN_THREADS: usize = 64;

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

/// Programs whose output is, by their nature, text from elsewhere: what
/// they print may be anyone's words.
const FETCHERS: &[&str] = &[
    "curl", "wget", "gh", "glab", "hub", "http", "https", "xh", "httpie", "aria2c", "lynx", "w3m",
    "links", "elinks", "nc", "ncat", "netcat", "socat", "telnet", "ssh", "ftp", "sftp", "scp",
    "rsync", "dig", "nslookup", "whois", "kubectl", "aws", "gcloud", "gsutil", "az",
];
/// Programs whose subcommands fetch: (program, subcommands).
const SUB_FETCHES: &[(&str, &[&str])] = &[
    ("git", &["fetch", "pull", "clone", "ls-remote", "submodule"]),
    ("npm", &["view", "info", "show"]),
    ("pip", &["download", "index"]),
    ("pip3", &["download", "index"]),
    ("docker", &["pull", "logs"]),
    ("podman", &["pull", "logs"]),
];
/// Words in scripts (`python3 -c …`, `node -e …`, `perl -e …`) that
/// reach the network.
const SCRIPT_FETCHES: &[&str] = &[
    "urllib",
    "urlopen",
    "http.client",
    "requests.get",
    "requests.post",
    "fetch",
    "lwp",
    "net::http",
    "socket",
    "websocket",
];

/// Programs that run another program given after them (and their own
/// options), skipped to find the one that runs.
const WRAPPERS: &[&str] = &[
    "sudo", "env", "xargs", "time", "nice", "nohup", "command", "exec", "stdbuf", "timeout",
    "ionice", "doas", "then", "do", "else", "if", "while", "until", "!",
];
/// Interpreters whose inline scripts are read for [`SCRIPT_FETCHES`].
const INTERPRETERS: &[&str] = &[
    "python", "python3", "node", "perl", "ruby", "php", "deno", "bun", "sh", "bash", "zsh",
];

/// The programs `command` runs, each with the words after it: the first
/// word of every part a shell would run on its own (split at `;`, `|`,
/// `&`, `(`, `)`, `$`, backticks, braces and newlines), past variable
/// assignments and wrappers like `sudo` or `xargs`, as a base name.
fn programs(command: &str) -> Vec<(String, Vec<String>)> {
    let bare: String = command
        .chars()
        .filter(|c| !matches!(c, '"' | '\'' | '\\'))
        .collect();
    let mut out = Vec::new();
    for part in bare.split(|c: char| ";|&()`\n{}$".contains(c)) {
        let words: Vec<&str> = part.split_whitespace().collect();
        let mut i = 0;
        while i < words.len() {
            let w = words[i];
            let base = w.rsplit('/').next().unwrap_or(w);
            let skip = (w.contains('=') && !w.starts_with('-'))
                || WRAPPERS.contains(&base)
                || w.starts_with('-')
                || base
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == '.' || c == 's');
            if !skip {
                let rest = words[i + 1..].iter().map(|x| x.to_string()).collect();
                out.push((base.to_string(), rest));
                break;
            }
            i += 1;
        }
    }
    out
}

/// Whether `command`'s output comes from the network by its nature, and
/// the program that says so. Quotes and escapes are dropped before the
/// command is read, and every program it runs counts (`xargs curl`,
/// `$(curl …)`, `python3 -c '…urlopen…'`): this reads what a trusted
/// model wrote, not an attacker's disguise (whose model is tainted
/// already), and a false positive costs an approval, never a leak.
pub fn fetches(command: &str) -> Option<String> {
    for (program, rest) in programs(command) {
        if FETCHERS.contains(&program.as_str()) {
            return Some(program);
        }
        for (p, subs) in SUB_FETCHES {
            if program == *p {
                if let Some(sub) = rest.iter().find(|w| subs.contains(&w.as_str())) {
                    return Some(format!("{program} {sub}"));
                }
            }
        }
        if INTERPRETERS.contains(&program.as_str()) {
            let script = rest.join(" ").to_lowercase();
            if let Some(w) = SCRIPT_FETCHES.iter().find(|w| script.contains(*w)) {
                return Some(format!("{program} using {w}"));
            }
        }
    }
    None
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
    /// Someone trusted who speaks to it on a thread it watches makes that
    /// thread one its work comes from too: its answer goes back there.
    pub(super) fn take_in(&mut self, worker: &str, t: &TriggerInfo, how: &str) {
        let Some(w) = self.records.live_worker_mut(worker) else {
            return;
        };
        if !t.trusted {
            w.flags.add_untrusted(&t.id, &format!("{how}: {}", t.trust));
        } else if !w.own_threads.contains(&t.thread) && w.own_threads.len() < MAX_OWN_THREADS {
            w.own_threads.push(t.thread.clone());
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
        let unknown = Some(format!("{obj} could not be read"));
        if let Some(why) = self.read(world.untrusted(obj), unknown) {
            f.add_untrusted(obj, &format!("recalled: {why}"));
        }
        let in_memory = if let Some(o) = self.records.worker(obj) {
            inherit(&mut f, &o.flags, obj, "the record of");
            true
        } else if let Some(a) = self.records.approvals().get(obj) {
            // A request's text is its worker's words.
            inherit(&mut f, &a.flags, obj, "the request");
            true
        } else {
            false
        };
        // An ended worker or a settled request lives on in the store only:
        // its flags come with it from there. A record whose flags cannot
        // be read is taken to hold both.
        let recorded = [Kind::Worker, Kind::Approval]
            .iter()
            .any(|k| obj.starts_with(k.prefix()));
        if recorded && !in_memory {
            if let Some(text) = self.read(world.lookup(obj), Some(String::new())) {
                let stored = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| serde_json::from_value::<Flags>(v["flags"].clone()).ok());
                match stored {
                    Some(s) => inherit(&mut f, &s, obj, "the stored record of"),
                    None => {
                        f.add_untrusted(obj, "a stored record whose flags cannot be read");
                        f.add_sensitive(obj, "a stored record whose flags cannot be read");
                    }
                }
            }
        }
        if obj.starts_with(Kind::Command.prefix()) {
            f.add_sensitive(obj, "recalled a command's output");
        }
        // A thread's history may hold byom's own posts of a machine's data.
        if obj.starts_with(Kind::Thread.prefix()) {
            f.add_sensitive(
                obj,
                "recalled a thread, which may hold byom's posts of private data",
            );
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
    /// Unreadable: one unknown machine, which is sensitive.
    fn reach(
        &self,
        world: &dyn World,
        machine: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<MachineInfo> {
        let unknown = MachineInfo {
            name: machine.to_string(),
            ..MachineInfo::default()
        };
        self.read(world.machines_for(machine, labels), vec![unknown])
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
        let reach = self.reach(world, machine, &w.labels);
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

    /// Gate for a reply on `r.thread`, for every worker that reported in
    /// this turn (what the reply may carry):
    /// - on a thread that is not its task's own, when its report names
    ///   the thread, it bounced a message there, someone untrusted spoke
    ///   there this turn, or nobody asked anything there this turn:
    ///   posting is communicating (C). A worker holding A and B, or
    ///   holding either one (a stranger's words; a personal machine's
    ///   data or a secret) where the owner's `post_to` does not open the
    ///   thread, waits for an approver's yes;
    /// - on its task's own thread, holding B where someone untrusted
    ///   speaks (a public issue a stranger commented on): likewise.
    ///
    /// Workers that ended before the Router acted speak through the flags
    /// their report carried. `Ok(None)`: post now; `Ok(Some(apr))`: held.
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
        // Someone untrusted speaks on the thread, or anyone reads it
        // (unreadable: they might).
        let unknown = Some("it could not be read".to_string());
        let strangers = self
            .read(world.untrusted(&r.thread), unknown.clone())
            .or_else(|| self.read(world.public(&r.thread), unknown))
            .or_else(|| {
                items.iter().find_map(|it| match it {
                    RouterItem::Trigger(t) | RouterItem::Bounced { trigger: t, .. }
                        if t.thread == r.thread && !t.trusted =>
                    {
                        Some(format!("{}: {}", t.id, t.trust))
                    }
                    _ => None,
                })
            });
        let open = self
            .read(world.thread(&r.thread), None)
            .is_some_and(|t| t.open);
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
                // people who asked, unless private data would reach
                // someone untrusted there.
                match &strangers {
                    Some(who) if flags.b() => {
                        let why = format!("posts a personal machine's data or a secret where someone untrusted speaks ({who})");
                        speakers.push((w, flags, machine, wlabels, here, true, why));
                    }
                    _ => answers_here |= here,
                }
                continue;
            }
            // What it reported may go where its report names, where it
            // bounced a message to, to people on a thread with someone
            // untrusted in this turn, or where nobody asked for anything.
            let bounced_here = items.iter().any(|it| {
                matches!(it, RouterItem::Bounced { worker, trigger, .. }
                    if *worker == w && trigger.thread == r.thread)
            });
            let strangers_here = items.iter().any(|it| {
                matches!(it, RouterItem::Trigger(t) | RouterItem::Bounced { trigger: t, .. }
                    if t.thread == r.thread && !t.trusted)
            });
            if here || bounced_here || strangers_here || !conversation {
                let why = "posts on a thread that is not its task's own".to_string();
                speakers.push((w, flags, machine, wlabels, here, false, why));
            }
        }
        // What the Router read this turn (a report, a recalled record) may
        // be private: not for a thread where someone untrusted speaks
        // without a yes, whoever asked there and whoever else speaks.
        let f = self.turn_flags();
        if let (true, false, Some(who)) = (f.b(), open, &strangers) {
            let mut after = f.clone();
            after.add_acts(
                &r.thread,
                &format!("the Router posts where someone untrusted speaks ({who}) in a turn that read private data"),
            );
            let worker = after
                .sensitive
                .iter()
                .map(|c| c.object.clone())
                .find(|o| o.starts_with(Kind::Worker.prefix()))
                .unwrap_or_else(|| "router".to_string());
            return Ok(Some(self.hold_post(world, &worker, "", None, after, r)));
        }
        if speakers.is_empty() {
            if conversation || answers_here {
                return Ok(None);
            }
            // Only the Router's own unprompted post (an open thread).
            if f.a() && f.b() {
                return Err(format!(
                    "posting on {} unprompted while this turn holds untrusted input and private data needs a person ({}); reply where the work came from",
                    r.thread,
                    f.explain()
                ));
            }
            return Ok(None);
        }
        for (w, flags, machine, wlabels, here, own_thread, why) in speakers {
            let mut after = flags;
            after.add_acts(&r.thread, &why);
            // Private data leaves without a yes only where the owner's
            // `post_to` opened the thread (that is their yes).
            let private_out = after.b() && !open;
            // Nor do a stranger's words go out as the bot where nobody
            // asked and the owner opened nothing.
            let steered_out = !own_thread && after.a() && !open;
            if after.all_three() || private_out || steered_out {
                let labels = self
                    .reach(world, &machine, &wlabels)
                    .first()
                    .map(|m| m.labels.clone());
                let apr = self.hold_post(world, &w, &machine, labels.as_ref(), after, r);
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
}

/// Requests: written and posted by the core alone.
impl Core {
    /// Holds `r` for an approver's yes, asked for `worker` (its flags
    /// `after` posting): the request that releases exactly that post.
    fn hold_post(
        &mut self,
        world: &mut dyn World,
        worker: &str,
        machine: &str,
        labels: Option<&BTreeMap<String, String>>,
        after: Flags,
        r: &Reply,
    ) -> String {
        self.ask(
            world,
            worker,
            ApprovalKind::Message,
            machine,
            labels,
            &format!("post on {}", r.thread),
            &approval::post_action(r),
            after,
            "",
            Some(r.clone()),
        )
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
            // The Router's own post: asked where it would go if someone
            // asked there this turn (the request there shows no private
            // text), else where someone did; never on a thread nobody
            // asked on.
            .or_else(|| {
                let asked = self.asked_threads();
                reply
                    .as_ref()
                    .map(|r| r.thread.clone())
                    .filter(|t| asked.contains(t))
                    .or_else(|| asked.first().cloned())
            })
            .unwrap_or_default();
        // Unreadable: admins, as the closed configuration has it (the step
        // is void anyway and asks nobody).
        let approvers = self
            .read(world.trust(), Trust::closed())
            .approvers_for(labels);
        let why = if kind == ApprovalKind::Question {
            "a program asks a person".to_string()
        } else {
            // The rest is on the record (`byom show`).
            flags.summary(3)
        };
        // A request is a post too. Where someone untrusted (or someone the
        // core cannot vouch for) reads it, it says how much and where to
        // read it, not what, when what could be private: a held post, or
        // a command or question written by a worker that already held a
        // personal machine's data or a secret (it could spell them out).
        let private = match kind {
            ApprovalKind::Message => true,
            _ => self.records.worker(worker).is_none_or(|w| w.flags.b()),
        };
        let hide = private
            && (self
                .read(world.untrusted(&thread), Some(String::new()))
                .is_some()
                || self
                    .read(world.public(&thread), Some(String::new()))
                    .is_some());
        let shown = match (hide, &reply) {
            (false, _) => action.to_string(),
            (true, Some(r)) => format!(
                "post {} characters on {} (not shown here, where someone untrusted reads: `byom show {apr}` shows them)",
                r.text.chars().count(),
                r.thread
            ),
            (true, None) => format!(
                "{} characters (not shown here, where someone untrusted reads: `byom show {apr}` shows them)",
                action.chars().count()
            ),
        };
        let question =
            approval::request_text(&apr, &code, worker, what, &shown, machine, &why, &approvers);
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
        if let Some(info) = self.read(world.thread(&thread), None) {
            self.out.push(Effect::Reply(Reply {
                id: world.new_id(Kind::Trigger),
                thread: thread.clone(),
                source: info.source,
                text: question.clone(),
                // The action is the worker's words.
                untrusted: flags
                    .untrusted
                    .first()
                    .map(|c| format!("a request from {worker}, which read {}", c.object)),
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
    fn fetching_commands_are_known_by_their_programs() {
        for (cmd, program) in [
            ("curl -s https://example.com", "curl"),
            (
                "cd repo && git fetch fork && git diff fork/main",
                "git fetch",
            ),
            ("git -C repo pull --rebase", "git pull"),
            ("gh pr view 12 --comments", "gh"),
            ("echo x | xargs wget -qO-", "wget"),
            ("echo $(c\"\"url evil)", "curl"),
            ("/usr/bin/curl x", "curl"),
            ("ssh host cat /etc/motd", "ssh"),
            ("npm view left-pad readme", "npm view"),
            (
                "python3 -c 'import urllib.request as u; print(u.urlopen(x).read())'",
                "python3 using urllib",
            ),
            ("kubectl logs deploy/web", "kubectl"),
        ] {
            assert_eq!(fetches(cmd).as_deref(), Some(program), "{cmd}");
        }
        for cmd in [
            "ls -la",
            "git status",
            "cargo test",
            "grep -r curl src",
            "git log",
            "echo opened https://github.com/acme/app/pull/7",
            "cat notes-about-ssh.txt",
        ] {
            assert_eq!(fetches(cmd), None, "{cmd}");
        }
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
