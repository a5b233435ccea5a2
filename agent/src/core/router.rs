//! The Router: one long-lived session that takes every queued item at once
//! each turn, talks to people (replies shaped by their channel's norms),
//! hands out work and routes threads. It has no tool that runs anything:
//! [`Core::router_tool`] dispatches only its own names, whatever the model
//! asks for.

use serde_json::Value;

use super::ROUTER_FAILURES_BEFORE_NOTICE;
use super::{backoff, markup, push_bounded, Core, MAX_ACTIVE_WORKERS};
use super::{MAX_OBSERVED, MAX_REPLY_CHARS, MAX_TOOL_CALLS_PER_REPLY};
use crate::approval;
use crate::budgets::ROUTER_TURN_STRIDE;
use crate::event::{Effect, Reply, RouterItem, SessionKind, TriggerInfo};
use crate::llm::{Message, Request, Response, Role, ToolCall};
use crate::prompt::{self, compact};
use crate::state::{ApprovalState, WorkerStatus};
use crate::storage::keys::ROUTER;
use crate::world::World;
use byom_protocol::id::Kind;

impl Core {
    pub(super) fn on_trigger(&mut self, world: &mut dyn World, t: TriggerInfo) {
        // An answer to a request (`approve CODE`) is the core's to take,
        // never the Router's or a worker's: it goes no further.
        if let Some(ans) = approval::parse_answer(&t.text) {
            self.records.router_mut().stats.events += 1;
            self.answer_by_code(world, &t, ans);
            return;
        }
        self.hint_answer(world, &t);
        let subs: Vec<String> = self
            .records
            .router()
            .subs
            .get(&t.thread)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let pass_through = self.pass_through;
        let r = self.records.router_mut();
        r.stats.events += 1;
        // A subscribed thread goes straight to its workers.
        if subs.is_empty() || !pass_through {
            push_bounded(r, RouterItem::Trigger(t));
            return;
        }
        r.stats.passed_through += 1;
        // The Router reads this line next turn: its taint goes with it.
        if !t.trusted {
            r.observed_flags
                .add_untrusted(&t.id, &format!("seen on a subscribed thread: {}", t.trust));
        }
        r.observed.push_back(markup::observed(&t, &subs));
        while r.observed.len() > MAX_OBSERVED {
            r.observed.pop_front();
        }
        let line = markup::trigger(&t, self.budgets.trigger_chars);
        // The owner's policies reach the worker too: the Router does not
        // see this trigger before it acts.
        let Some(policies) = self.got(world.policies()) else {
            return;
        };
        for w in &subs {
            let changed = self
                .records
                .worker(w)
                .is_some_and(|ws| ws.policies_shown != policies);
            if changed {
                self.worker_input(w, markup::policies(&policies));
                if let Some(ws) = self.records.live_worker_mut(w) {
                    ws.policies_shown = policies.clone();
                }
            }
            self.worker_input(w, line.clone());
            self.take_in(w, &t, "a message passed through on its thread");
        }
        self.fate(
            &t.id,
            format!(
                "passed through to {} (already working on its thread)",
                subs.join(", ")
            ),
        );
    }

    pub(super) fn start_router_turn(&mut self, world: &mut dyn World) {
        let (Some(policies), Some(machines)) =
            (self.got(world.policies()), self.got(world.machines()))
        else {
            return;
        };
        let approvals: String = self
            .records
            .approvals()
            .values()
            .filter(|a| a.state == ApprovalState::Open)
            .map(markup::approval)
            .collect();
        let n = self.budgets.max_batch.max(1);
        let budgets = &self.budgets;
        let r = self.records.router_mut();
        let items: Vec<RouterItem> = r.queue.take_front(n);
        let mut text = std::mem::take(&mut r.carry_note);
        if policies != r.policies_shown {
            text.push_str(&markup::policies(&policies));
            text.push('\n');
            r.policies_shown = policies;
        }
        if machines != r.machines_shown {
            text.push_str("Machines:\n");
            for m in &machines {
                text.push_str(&format!("- {m}\n"));
            }
            r.machines_shown = machines;
        }
        if !r.observed.is_empty() {
            text.push_str("Seen on subscribed threads (handled by workers):\n");
            for o in r.observed.drain(..) {
                text.push_str(&format!("- {o}\n"));
            }
        }
        if !approvals.is_empty() {
            text.push_str("Open approvals:\n");
            text.push_str(&approvals);
        }
        let mut shown: Vec<String> = Vec::new();
        for t in items.iter().filter_map(markup::item_thread) {
            if shown.contains(&t) {
                continue;
            }
            if let Some(s) = r.subs.get(&t).filter(|s| !s.is_empty()) {
                let ws: Vec<String> = s.iter().cloned().collect();
                text.push_str(&markup::subs(&t, &ws));
                shown.push(t);
            }
        }
        text.push_str(&format!("New events ({}):\n", items.len()));
        for it in &items {
            text.push_str(&markup::router_item(it, budgets));
            text.push('\n');
        }
        r.conversation.push(Message::user(text));
        r.turn_items = items;
        r.turn_read = std::mem::take(&mut r.observed_flags);
        r.turn += 1;
        r.steps = 0;
        r.stats.turns += 1;
        if let Some(n) = compact(&mut r.conversation, budgets.router_context_tokens) {
            r.dropped_turns += n;
        }
        r.turn_start = r.conversation.len().saturating_sub(1);
        self.issue_router_call();
    }

    pub(super) fn router_call(&self, turn: u64) -> Effect {
        Effect::CallModel {
            session: ROUTER.into(),
            kind: SessionKind::Router,
            turn,
            request: Request {
                system: prompt::ROUTER_SYSTEM.into(),
                messages: self.records.router().conversation.messages().to_vec(),
                tools: prompt::router_tools(),
                max_tokens: self.budgets.max_output_tokens,
            },
        }
    }

    fn issue_router_call(&mut self) {
        let r = self.records.router_mut();
        let turn = r.turn * ROUTER_TURN_STRIDE + u64::from(r.steps);
        r.steps += 1;
        r.stats.model_calls += 1;
        r.in_flight = Some(turn);
        let e = self.router_call(turn);
        self.out.push(e);
    }

    pub(super) fn router_model_done(
        &mut self,
        world: &mut dyn World,
        turn: u64,
        result: Result<Response, String>,
    ) {
        if self.records.router().in_flight != Some(turn) {
            return;
        }
        let now = self.now;
        let r = self.records.router_mut();
        r.in_flight = None;
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                // Never drop triggers: put the turn back and try later.
                tracing::warn!("router model call failed: {e}");
                r.failures += 1;
                if r.steps <= 1 {
                    if r.conversation.last().is_some_and(|m| m.role == Role::User) {
                        r.conversation.pop();
                    }
                    for it in std::mem::take(&mut r.turn_items).into_iter().rev() {
                        r.queue.push_front(it);
                    }
                }
                r.retry_at = Some(now + backoff(r.failures));
                // A turn that already acted is not resumed: end it here,
                // so its taint is counted and an untrusted turn leaves the
                // conversation before any other starts.
                if !r.turn_items.is_empty() {
                    self.end_router_turn();
                }
                if self.records.router().failures == ROUTER_FAILURES_BEFORE_NOTICE {
                    self.model_down_notice(world, &e);
                }
                return;
            }
        };
        r.failures = 0;
        r.stats.usage += resp.usage;
        r.conversation.push(Message::assistant(
            resp.text.clone(),
            resp.tool_calls.clone(),
        ));
        if resp.tool_calls.is_empty() {
            self.end_router_turn();
            return;
        }
        for (i, call) in resp.tool_calls.iter().enumerate() {
            self.records.router_mut().stats.decisions += 1;
            let result = if i < MAX_TOOL_CALLS_PER_REPLY {
                self.router_tool(world, call)
            } else {
                Err(format!(
                    "at most {MAX_TOOL_CALLS_PER_REPLY} tool calls per reply are acted on"
                ))
            };
            let out = result.unwrap_or_else(|e| format!("error: {e}"));
            self.records
                .router_mut()
                .conversation
                .push(Message::tool_result(call.id.clone(), out));
        }
        if self.records.router().steps < self.budgets.max_router_steps {
            self.issue_router_call();
        } else {
            self.end_router_turn();
        }
    }

    fn router_tool(&mut self, world: &mut dyn World, call: &ToolCall) -> Result<String, String> {
        let a = &call.arguments;
        match call.name.as_str() {
            "create_worker" => {
                let task = str_arg(a, "task")?;
                let threads: Vec<String> = a
                    .get("threads")
                    .and_then(Value::as_array)
                    .map(|v| {
                        v.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                let machine = opt_str(a, "machine").unwrap_or_default();
                let labels = a
                    .get("labels")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                            .collect()
                    })
                    .unwrap_or_default();
                let subscribe = a.get("subscribe").and_then(Value::as_bool).unwrap_or(true);
                // A task's threads are where its work came from: where its
                // requests and results go without asking anyone.
                let asked = self.asked_threads();
                if let Some(t) = threads.iter().find(|t| !asked.contains(t)) {
                    return Err(format!(
                        "{t} is not a thread someone asked on in this turn; a worker's threads are where its task came from (it may `watch` others)"
                    ));
                }
                self.room_for_worker()?;
                let id = self.new_worker(world, None, task, threads.clone(), machine, labels);
                for trg in self.turn_triggers_on(&threads) {
                    self.fate(&trg, format!("given to a new worker, {id}"));
                }
                if subscribe {
                    for t in &threads {
                        self.subscribe(t, &id);
                    }
                }
                Ok(format!("created {id}"))
            }
            "reply" => {
                let thread = str_arg(a, "thread")?;
                let text = str_arg(a, "text")?;
                let status = a.get("status").and_then(Value::as_str).unwrap_or("");
                self.may_post(world, &thread)?;
                // Requests are byom's own posts: the model cannot write one.
                if text.to_lowercase().contains("approval needed") {
                    return Err("byom posts approval requests itself; do not write one (say that a request is waiting, if you must)".into());
                }
                let mut text = text.replace(STRUCTURE_MARK, "");
                // Asynchronous channels read structured replies: the parts
                // the model gave, each under its heading.
                for (key, heading) in [
                    ("changed", "What changed"),
                    ("verified", "How it was verified"),
                    ("links", "Links"),
                ] {
                    if let Some(part) = opt_str(a, key).filter(|p| !p.trim().is_empty()) {
                        let part = part.replace(STRUCTURE_MARK, "");
                        text.push_str(&format!("\n\n{STRUCTURE_MARK}{heading}\n{}", part.trim()));
                    }
                }
                let mut r = self.reply(world, &thread, &text, status)?;
                r.untrusted = self.turn_taint();
                // Nor tell people what to approve: all of what would be
                // posted (headings, parts, status) is checked, folded the
                // way a reader would read it.
                if let Some(why) = self.forges_a_request(&r.text) {
                    return Err(why);
                }
                let id = r.id.clone();
                if let Some(apr) = self.gate_reply(world, &r)? {
                    return Ok(format!(
                        "held: posting on {thread} needs a person's approval ({apr}), asked on the worker's thread"
                    ));
                }
                for trg in self.turn_triggers_on(std::slice::from_ref(&thread)) {
                    let said: String = text.chars().take(120).collect();
                    self.fate(&trg, format!("answered by the Router on its thread: {said}"));
                }
                self.out.push(Effect::Reply(r));
                Ok(format!("posted {id}"))
            }
            "subscribe" => {
                let w = str_arg(a, "worker")?;
                let t = str_arg(a, "thread")?;
                self.live_worker(&w)?;
                self.subscribe(&t, &w);
                Ok(format!("{w} now receives {t}"))
            }
            "unsubscribe" => {
                let w = str_arg(a, "worker")?;
                let t = str_arg(a, "thread")?;
                self.unsubscribe(&t, &w);
                Ok(format!("{w} no longer receives {t}"))
            }
            "cancel_worker" => {
                let w = str_arg(a, "worker")?;
                self.live_worker(&w)?;
                let reason =
                    opt_str(a, "reason").unwrap_or_else(|| "cancelled by the router".into());
                // The Router decided this itself: no report back to it.
                self.finish_worker(world, &w, WorkerStatus::Cancelled, &reason, false);
                Ok(format!("cancelled {w}"))
            }
            // Only people approve: a request is answered by an approver's
            // own `approve CODE`, never by anything the model says.
            "answer" => Err(
                "only people approve: an approver replies `approve CODE` (the code is in the request byom posted); you cannot answer for them".into(),
            ),
            "ignore" => {
                if let Some(trg) = opt_str(a, "trigger") {
                    let why = opt_str(a, "reason").unwrap_or_else(|| "no reason given".into());
                    self.fate(&trg, format!("ignored by the Router: {why}"));
                }
                Ok("ignored".into())
            }
            "recall" | "read" => {
                let obj = str_arg(a, "id")?;
                let off = a.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
                let text = self.recall(world, &obj, off)?;
                let f = self.object_flags(world, &obj);
                self.records.router_mut().turn_read.absorb(&f);
                Ok(text)
            }
            other => Err(format!(
                "the router has no tool {other:?}; it cannot run commands or code, only hand out work"
            )),
        }
    }

    /// Idle workers (done, listening) do not count: they cost no model
    /// calls and retire on their own.
    pub(super) fn room_for_worker(&self) -> Result<(), String> {
        let active = self
            .records
            .workers()
            .values()
            .filter(|w| matches!(w.status, WorkerStatus::Running | WorkerStatus::Waiting))
            .count();
        if active >= MAX_ACTIVE_WORKERS {
            return Err(format!(
                "{active} workers are busy (limit {MAX_ACTIVE_WORKERS}); wait or cancel some"
            ));
        }
        Ok(())
    }

    fn live_worker(&self, w: &str) -> Result<(), String> {
        match self.records.worker(w) {
            Some(x) if !x.status.is_closed() => Ok(()),
            Some(x) => Err(format!("{w} is {}", x.status.name())),
            None => Err(format!("no worker {w}")),
        }
    }

    /// Triggers of the Router's current turn on any of `threads`.
    fn turn_triggers_on(&self, threads: &[String]) -> Vec<String> {
        self.records
            .router()
            .turn_items
            .iter()
            .filter_map(|it| match it {
                RouterItem::Trigger(t) | RouterItem::Bounced { trigger: t, .. }
                    if threads.contains(&t.thread) =>
                {
                    Some(t.id.clone())
                }
                _ => None,
            })
            .collect()
    }

    pub(super) fn subscribe(&mut self, thread: &str, worker: &str) {
        self.records
            .router_mut()
            .subs
            .entry(thread.to_string())
            .or_default()
            .insert(worker.to_string());
        if let Some(w) = self.records.worker_mut(worker) {
            if !w.threads.iter().any(|t| t == thread) {
                w.threads.push(thread.to_string());
            }
        }
    }

    pub(super) fn unsubscribe(&mut self, thread: &str, worker: &str) {
        let r = self.records.router_mut();
        if let Some(s) = r.subs.get_mut(thread) {
            s.remove(worker);
            if s.is_empty() {
                r.subs.remove(thread);
            }
        }
    }

    /// A reply, shaped by its channel's norms: chat gets at most
    /// `chat_reply_words` words (enforced here, not asked for); other
    /// channels get a structured message.
    pub(super) fn reply(
        &mut self,
        world: &mut dyn World,
        thread: &str,
        text: &str,
        status: &str,
    ) -> Result<Reply, String> {
        let info = self
            .read(world.thread(thread), None)
            .ok_or_else(|| format!("no thread {thread}; reply on a thread from an event"))?;
        let source = info.source.clone();
        let text = prompt::spill(text, MAX_REPLY_CHARS, thread);
        let text = if info.is_chat() {
            // Headings are for asynchronous channels; chat reads one line.
            let flat = text.replace(STRUCTURE_MARK, "");
            prompt::limit_words(
                &flat,
                self.budgets.chat_reply_words,
                &format!("byom threads show {thread}"),
            )
        } else {
            let status = if status.is_empty() { "update" } else { status };
            let workers: Vec<String> = self
                .records
                .router()
                .subs
                .get(thread)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            let body = text.trim().replace(STRUCTURE_MARK, "### ");
            format!(
                "**byom — {status}**\n\n### Summary\n{body}\n\n— thread {thread}{}",
                if workers.is_empty() {
                    String::new()
                } else {
                    format!(", workers {}", workers.join(", "))
                }
            )
        };
        self.records.router_mut().stats.replies += 1;
        Ok(Reply {
            id: world.new_id(Kind::Trigger),
            thread: thread.to_string(),
            source,
            text,
            untrusted: None,
        })
    }
}

impl Core {
    /// A reply goes where the work came from: a thread of this turn's
    /// items (a trigger, a reporting worker's threads, a question) or one
    /// its connector opens to unprompted posts.
    fn may_post(&self, world: &dyn World, thread: &str) -> Result<(), String> {
        let info = self
            .read(world.thread(thread), None)
            .ok_or_else(|| format!("no thread {thread}; reply on a thread from an event"))?;
        let in_turn = self.records.router().turn_items.iter().any(|it| match it {
            RouterItem::Trigger(t) => t.thread == thread,
            RouterItem::Bounced { trigger, .. } => trigger.thread == thread,
            RouterItem::Report { threads, .. } => threads.iter().any(|t| t == thread),
            RouterItem::Question { thread: t, .. } => t == thread,
        });
        if in_turn || info.open {
            return Ok(());
        }
        Err(format!(
            "{thread} ({}) is not a thread of this turn and its connector does not allow unprompted posts there; reply where the work came from",
            info.source
        ))
    }

    /// Threads someone asked on in this turn: a new worker's may only be
    /// these (where its task came from, not what it watched).
    pub(super) fn asked_threads(&self) -> Vec<String> {
        self.records
            .router()
            .turn_items
            .iter()
            .flat_map(|it| match it {
                RouterItem::Trigger(t) | RouterItem::Bounced { trigger: t, .. } => {
                    vec![t.thread.clone()]
                }
                RouterItem::Question { thread, .. } => vec![thread.clone()],
                RouterItem::Report { own_threads, .. } => own_threads.clone(),
            })
            .collect()
    }

    /// Why what the Router writes this turn may carry someone untrusted's
    /// words (`None`: it read none).
    fn turn_taint(&self) -> Option<String> {
        self.turn_flags()
            .untrusted
            .first()
            .map(|c| format!("written in a Router turn that read {}", c.object))
    }

    /// Why `text` may not be posted by the model: it reads as a request
    /// ("Approval needed", whatever the spacing or look-alike letters) or
    /// names the code of an open one (an approver must read that code
    /// only in byom's own request, never in words a model chose).
    fn forges_a_request(&self, text: &str) -> Option<String> {
        let folded: String = text
            .chars()
            .filter_map(|c| {
                let c = crate::approval::fold(c);
                c.is_ascii_alphanumeric().then(|| c.to_ascii_lowercase())
            })
            .collect();
        if folded.contains("approvalneeded") {
            return Some("byom posts approval requests itself; do not write one (say that a request is waiting, if you must)".into());
        }
        let open = self
            .records
            .approvals()
            .values()
            .filter(|a| a.state == ApprovalState::Open && !a.code.is_empty())
            .find(|a| folded.contains(&a.code.to_ascii_lowercase()));
        open.map(|a| {
            format!(
                "that names the code of {} ({}); only byom's own request may show it: say a request is waiting and let people read it there",
                a.id, a.code
            )
        })
    }
}

/// The end of a Router turn: what it carries into the next.
impl Core {
    /// The watchdog's voice when the Router's model is down: everyone who
    /// addressed the agent hears that their message is queued, once per
    /// outage.
    fn model_down_notice(&mut self, world: &mut dyn World, err: &str) {
        let mut threads: Vec<String> = self
            .records
            .router()
            .queue
            .iter()
            .filter_map(|it| match it {
                RouterItem::Trigger(t) if t.mention => Some(t.thread.clone()),
                _ => None,
            })
            .collect();
        threads.sort();
        threads.dedup();
        let why: String = err.chars().take(120).collect();
        for t in threads {
            let text = format!(
                "I can't reach my model right now ({why}). Your message is queued; I'll answer when it's back."
            );
            if let Ok(r) = self.reply(world, &t, &text, "delayed") {
                self.out.push(Effect::Reply(r));
            }
        }
    }

    /// What the Router carries across turns: nothing untrusted. A turn
    /// that read untrusted input (a stranger's message, a line seen on a
    /// subscribed thread, a tainted worker's report, a request, a recalled
    /// object) is taken out of the conversation when it ends, with its
    /// own words about it, and the next turn is told so. Untrusted text
    /// therefore steers only the turn that read it, and every worker that
    /// turn made starts with its taint ([`Core::turn_flags`]); a later
    /// trusted turn sees it only by recalling it, which taints that turn.
    fn end_router_turn(&mut self) {
        let f = self.turn_flags();
        let r = self.records.router_mut();
        r.turn_items.clear();
        if !f.a() && !f.b() {
            return;
        }
        let (start, len) = (r.turn_start, r.conversation.len());
        if start < len && r.conversation.messages().len() == len {
            r.conversation.drain(start..len);
        }
        let causes = |list: &[crate::flags::Cause]| -> String {
            let mut ids: Vec<String> = list.iter().map(|c| c.object.clone()).collect();
            ids.dedup();
            ids.truncate(5);
            ids.join(", ")
        };
        let what = match (f.a(), f.b()) {
            (true, true) => format!(
                "untrusted input ({}) and a personal machine's data or a secret ({})",
                causes(&f.untrusted),
                causes(&f.sensitive)
            ),
            (true, false) => format!("untrusted input ({})", causes(&f.untrusted)),
            _ => format!(
                "a personal machine's data or a secret ({})",
                causes(&f.sensitive)
            ),
        };
        r.carry_note = format!(
            "(Your previous turn, {}, read {what}; it was taken out of your context so it cannot steer later turns or be posted where it should not go. What you did in it stands. Recall an ID to read it again: that carries its flags.)\n",
            r.turn,
        );
        r.turn_read = Default::default();
    }
}

/// Starts a heading in a reply: `### ` on asynchronous channels, nothing
/// in chat. A control character the model's own text is cleaned of, so
/// only the structured parts make headings.
const STRUCTURE_MARK: &str = "\u{1e}";

pub(super) fn str_arg(a: &Value, k: &str) -> Result<String, String> {
    opt_str(a, k).ok_or_else(|| format!("missing string argument {k:?}"))
}

pub(super) fn opt_str(a: &Value, k: &str) -> Option<String> {
    a.get(k).and_then(Value::as_str).map(str::to_string)
}
