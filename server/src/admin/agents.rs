//! The agents from the API: tasks, workers (with transcripts), approvals,
//! threads and the Router, read from the store (the truth; the loop may be
//! mid-step), and the two things people tell the agents from outside a
//! chat: cancel a task, answer an approval. Both go through the durable
//! inbox. Replies are JSON (the agents' own records, versioned with the
//! server), with times as RFC 3339.

use std::collections::BTreeMap;

use byom_agent::event::Event;
use byom_agent::state::{Approval, ApprovalState, RouterState, WorkerState};
use byom_agent::storage::keys;
use byom_agent::trust::Trust;
use byom_protocol::id::Kind;
use byom_protocol::pb;
use byom_store::{Space, StoreError};
use serde_json::{json, Value};
use tonic::Status;

use super::{store_err, Api};
use crate::idempotency::Pending;

/// Rows kept in one listing.
const MAX_ROWS: usize = 1000;
/// Messages of a thread shown at once.
const THREAD_MESSAGES: usize = 200;
/// Agent records read at once (the whole keyspace's records).
const MAX_RECORDS: usize = 1_000_000;

/// Timestamps (ms since the epoch) in the agents' records, shown as
/// RFC 3339 under their `_at` name. Durations keep their `_ms`.
const TIMES: [(&str, &str); 7] = [
    ("created_ms", "created_at"),
    ("revoked_ms", "revoked_at"),
    ("updated_ms", "updated_at"),
    ("answered_ms", "answered_at"),
    ("started_ms", "started_at"),
    ("last_trigger_ms", "last_trigger_at"),
    ("retry_at", "retry_at"),
];

fn time(ms: u64) -> Value {
    if ms == 0 {
        Value::Null
    } else {
        Value::String(byom_protocol::time::rfc3339(ms))
    }
}

/// Rewrites every timestamp in `v` (at any depth) as RFC 3339.
pub(super) fn times(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (from, to) in TIMES {
                if let Some(t) = m.remove(from) {
                    let t = t.as_u64().map(time).unwrap_or(Value::Null);
                    m.insert(to.to_string(), t);
                }
            }
            m.values_mut().for_each(times);
        }
        Value::Array(a) => a.iter_mut().for_each(times),
        _ => {}
    }
}

fn invalid(m: impl Into<String>) -> Status {
    Status::invalid_argument(m.into())
}

/// A worker in one row.
fn summary(w: &WorkerState) -> Value {
    let running = w.commands.values().filter(|c| !c.done).count();
    json!({
        "id": w.id, "parent": w.parent, "status": w.status.name(), "task": w.task,
        "threads": w.threads, "machine": w.machine, "created_at": time(w.created_ms),
        "updated_at": time(w.updated_ms), "commands": w.commands.len(), "running_commands": running,
        "program": w.js.as_ref().map(|j| format!("{}/js{}", w.id, j.run)),
        "model_calls": w.steps, "usage": w.usage, "last_report": w.last_report,
        "rule_of_two": w.flags.letters(), "containment": w.flags.explain(),
    })
}

impl Api {
    fn records<T: serde::de::DeserializeOwned>(&self, kind: Kind) -> Result<Vec<T>, StoreError> {
        let prefix = keys::record(kind.prefix());
        Ok(self
            .store
            .scan_prefix(Space::Agents, &prefix, MAX_RECORDS)?
            .into_iter()
            .filter_map(|(k, b)| match serde_json::from_slice(&b) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!("agent record {}{k} unreadable: {e}", kind.prefix());
                    None
                }
            })
            .collect())
    }

    fn workers(&self) -> Result<Vec<WorkerState>, Status> {
        let mut v: Vec<WorkerState> = self.records(Kind::Worker).map_err(store_err)?;
        v.sort_by_key(|w| std::cmp::Reverse(w.created_ms));
        Ok(v)
    }

    fn approvals(&self) -> Result<Vec<Approval>, Status> {
        let mut v: Vec<Approval> = self.records(Kind::Approval).map_err(store_err)?;
        v.sort_by_key(|a| std::cmp::Reverse(a.created_ms));
        Ok(v)
    }

    fn router_record(&self) -> Result<RouterState, Status> {
        match self
            .store
            .get_raw(Space::Agents, &keys::record(keys::ROUTER))
            .map_err(store_err)?
        {
            Some(b) => serde_json::from_slice(&b)
                .map_err(|e| Status::internal(format!("router record unreadable: {e}"))),
            None => Ok(RouterState::default()),
        }
    }

    /// Serves one agents request; `by` (the caller) is recorded on cancels
    /// and answers.
    pub(super) async fn agent(
        &self,
        mut r: pb::AgentRequest,
        by: &str,
    ) -> Result<pb::AgentResponse, Status> {
        // The two ops that change something take an idempotency key.
        let key = std::mem::take(&mut r.idempotency_key);
        let claim = if matches!(r.op.as_str(), "cancel" | "answer") {
            let scope = format!("agent-{}", r.op);
            match self
                .claim(&scope, by, &key, &super::fingerprint(&r, &[]))
                .await?
            {
                Ok(p) => Some(p),
                Err(done) => {
                    return Ok(pb::AgentResponse {
                        json: done.reply_json,
                    })
                }
            }
        } else {
            None
        };
        let args: Value = if r.json.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&r.json)
                .map_err(|e| invalid(format!("the request's json is not JSON: {e}")))?
        };
        let id = r.id.as_str();
        let v = match r.op.as_str() {
            // Times are converted where the records are read (a transcript
            // holds models' free-form arguments, left as they are).
            "tasks" | "workers" => {
                let all = r.op == "workers";
                let rows: Vec<Value> = self
                    .workers()?
                    .iter()
                    .filter(|w| all || w.parent.is_none())
                    .take(MAX_ROWS)
                    .map(summary)
                    .collect();
                Value::Array(rows)
            }
            "worker" => self.worker(id)?,
            "cancel" => self.cancel_task(id, by, claim.as_ref()).await?,
            "approvals" => {
                let all = args.get("all").and_then(Value::as_bool).unwrap_or(false);
                let rows: Vec<Value> = self
                    .approvals()?
                    .into_iter()
                    .filter(|a| all || a.state == ApprovalState::Open)
                    .take(MAX_ROWS)
                    .map(|a| {
                        let mut v = serde_json::to_value(a).unwrap_or(Value::Null);
                        times(&mut v);
                        v
                    })
                    .collect();
                Value::Array(rows)
            }
            "answer" => self.answer(id, &args, by, claim.as_ref()).await?,
            "threads" => self.threads()?,
            "thread" => self.thread(id)?,
            "router" => {
                let r = self.router_record()?;
                json!({"model": self.model_of("router"), "stats": r.stats, "queued": r.queue.len(), "in_flight": r.in_flight.is_some(),
                       "conversation_messages": r.conversation.len(), "dropped_turns": r.dropped_turns,
                       "subscriptions": r.subs})
            }
            "trust" => serde_json::to_value(crate::trust::load(&self.store).map_err(store_err)?)
                .unwrap_or(Value::Null),
            "set_trust" => self.set_trust(args, by)?,
            "trust_check" => {
                let t = crate::trust::load(&self.store).map_err(store_err)?;
                let who = args.get("principal").and_then(Value::as_str).unwrap_or("");
                let assoc = args
                    .get("association")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let label = args.get("label").and_then(Value::as_str).unwrap_or("");
                let labels: Option<BTreeMap<String, String>> = label
                    .split_once('=')
                    .map(|(k, v)| [(k.to_string(), v.to_string())].into());
                let v = t.judge(who, assoc);
                json!({"principal": who, "trusted": v.trusted, "why": v.why,
                       "may_approve": t.may_approve(who, labels.as_ref())})
            }
            "admins" | "admins_add" | "admins_revoke" => self.admins_op(&r.op, &args, by)?,
            "fate" => self.fate(id)?,
            other => return Err(invalid(format!("unknown agent op {other:?}"))),
        };
        Ok(pb::AgentResponse {
            json: v.to_string(),
        })
    }

    /// What became of a trigger after the fast path: the agents' record of
    /// it, with the policy named by ID when the Router cited one.
    fn fate(&self, trigger: &str) -> Result<Value, Status> {
        let Some(b) = self
            .store
            .get_raw(Space::Agents, &keys::fate(trigger))
            .map_err(store_err)?
        else {
            return Ok(json!({"trigger": trigger, "fate": null}));
        };
        let mut fate = String::from_utf8_lossy(&b).into_owned();
        if let Some(i) = fate.find("policy: ") {
            let cited = fate[i + 8..].trim().to_string();
            let policies = self.store.list_policies().map_err(store_err)?;
            if let Some(p) = policies.iter().find(|p| p.text.trim() == cited) {
                fate = format!("{} ({})", fate, p.id);
            }
        }
        Ok(json!({"trigger": trigger, "fate": fate}))
    }

    /// The model a role uses, described for people (the scripted
    /// stand-in says what it is); as the running server recorded it.
    fn model_of(&self, role: &str) -> String {
        self.store
            .channel_state("", crate::startup::MODELS_KEY)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v[role].as_str().map(crate::model::describe))
            .unwrap_or_default()
    }

    /// A worker with its transcript and subagents.
    fn worker(&self, id: &str) -> Result<Value, Status> {
        let all = self.workers()?;
        let w = all
            .iter()
            .find(|w| w.id == id)
            .ok_or_else(|| Status::not_found(format!("no worker {id}: see `byom workers ls`")))?;
        let children: Vec<Value> = all
            .iter()
            .filter(|c| c.parent.as_deref() == Some(id))
            .map(summary)
            .collect();
        let mut v = serde_json::to_value(w).unwrap_or(Value::Null);
        times(&mut v);
        // The transcript: the stored messages, in the record's order.
        let stored: BTreeMap<u64, Value> = self
            .store
            .scan_prefix(Space::Agents, &keys::messages_of(id), MAX_RECORDS)
            .map_err(store_err)?
            .into_iter()
            .filter_map(|(n, b)| Some((n.parse().ok()?, serde_json::from_slice(&b).ok()?)))
            .collect();
        let order: Vec<u64> = v["conversation"]["seqs"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        v["conversation"] = Value::Array(
            order
                .iter()
                .filter_map(|n| stored.get(n).cloned())
                .collect(),
        );
        v["summary"] = summary(w);
        v["model"] = json!(self.model_of("worker"));
        v["children"] = Value::Array(children);
        Ok(v)
    }

    async fn cancel_task(
        &self,
        id: &str,
        by: &str,
        claim: Option<&Pending>,
    ) -> Result<Value, Status> {
        let w = self
            .workers()?
            .into_iter()
            .find(|w| w.id == id)
            .ok_or_else(|| Status::not_found(format!("no task {id}: see `byom tasks ls`")))?;
        if w.status.is_closed() {
            return Err(Status::failed_precondition(format!(
                "{id} already ended ({})",
                w.status.name()
            )));
        }
        let ev = Event::Cancel {
            worker: id.to_string(),
            by: by.to_string(),
        };
        let reply = json!({"id": id, "cancelling": true});
        self.enqueue(&ev, id, &reply, claim).await?;
        Ok(reply)
    }

    async fn answer(
        &self,
        id: &str,
        args: &Value,
        by: &str,
        claim: Option<&Pending>,
    ) -> Result<Value, Status> {
        let a = self
            .approvals()?
            .into_iter()
            .find(|a| a.id == id)
            .ok_or_else(|| {
                Status::not_found(format!("no approval {id}: see `byom approvals ls`"))
            })?;
        if a.state != ApprovalState::Open {
            return Err(Status::failed_precondition(format!(
                "{id} is already {}",
                a.state.name()
            )));
        }
        let approved = args
            .get("approved")
            .and_then(Value::as_bool)
            .ok_or_else(|| invalid("say approved: true or false"))?;
        // The core decides (and records a refusal); said here too so the
        // person at the CLI learns it at once.
        let trust = crate::trust::load(&self.store).map_err(store_err)?;
        let labels: Option<std::collections::BTreeMap<String, String>> = if a.machine.is_empty() {
            None
        } else {
            self.store
                .resolve_machine(&a.machine)
                .map_err(store_err)?
                .map(|m| m.labels.into_iter().collect())
        };
        if !trust.may_approve(by, labels.as_ref()) {
            return Err(Status::permission_denied(format!(
                "{by} may not approve {id}: only {} may (`byom trust approvers add {by}` by an approver lets you)",
                trust.approvers_for(labels.as_ref()).join(", ")
            )));
        }
        let ev = Event::Answer {
            approval: id.to_string(),
            approved,
            answer: args.get("answer").cloned().unwrap_or(Value::Null),
            by: by.to_string(),
        };
        // Answered once: the core takes the answer only later (on whichever
        // replica runs it, perhaps after a takeover), so the approval still
        // reads open to a second answer until then.
        let once = format!("answer/{id}");
        if !self
            .store
            .create_raw(Space::Leases, &once, by.as_bytes())
            .map_err(store_err)?
        {
            return Err(Status::failed_precondition(format!(
                "{id} was already answered"
            )));
        }
        let reply = json!({"id": id, "approved": approved});
        if let Err(e) = self.enqueue(&ev, id, &reply, claim).await {
            let _ = self.store.delete_raw(Space::Leases, &once);
            return Err(e);
        }
        Ok(reply)
    }

    /// Replaces the trust configuration. Only an approver for every
    /// machine may change who approves and who is trusted, and nobody can
    /// leave it with no approver at all.
    fn set_trust(&self, args: Value, by: &str) -> Result<Value, Status> {
        let current = crate::trust::load(&self.store).map_err(store_err)?;
        if !current.may_approve(by, None) {
            return Err(Status::permission_denied(format!(
                "{by} may not change trust: only an approver for every machine may ({})",
                current.approvers_for(None).join(", ")
            )));
        }
        let new: Trust = serde_json::from_value(args)
            .map_err(|e| invalid(format!("not a trust configuration: {e}")))?;
        new.validate().map_err(invalid)?;
        if !new.may_approve(by, None) {
            return Err(invalid(format!(
                "{by} would no longer be an approver for every machine; keep yourself (or add another) first"
            )));
        }
        crate::trust::save(&self.store, &new).map_err(store_err)?;
        tracing::info!(by, "trust configuration changed");
        Ok(serde_json::to_value(&new).unwrap_or(Value::Null))
    }

    /// Puts a person's word in the agents' inbox, with the idempotency
    /// record of the call that carried it.
    async fn enqueue(
        &self,
        ev: &Event,
        id: &str,
        reply: &Value,
        claim: Option<&Pending>,
    ) -> Result<(), Status> {
        let extra = claim
            .map(|p| p.ops(id, &reply.to_string()))
            .unwrap_or_default();
        self.agents.enqueue(ev, &extra).await.map_err(store_err)
    }

    fn threads(&self) -> Result<Value, Status> {
        let r = self.router_record()?;
        let rows: Vec<Value> = self
            .store
            .list_threads(MAX_ROWS)
            .map_err(store_err)?
            .into_iter()
            .map(|t| {
                let subs: Vec<String> = r
                    .subs
                    .get(&t.id)
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default();
                json!({"id": t.id, "source": t.source, "external": t.external, "kind": t.kind,
                       "created_at": time(t.created_at_ms), "last_trigger_at": time(t.last_trigger_ms),
                       "workers": subs})
            })
            .collect();
        Ok(Value::Array(rows))
    }

    /// A thread by `thr_…` ID or by the channel's own name for it.
    fn thread(&self, id: &str) -> Result<Value, Status> {
        let t = match self.store.get_thread(id).map_err(store_err)? {
            Some(t) => t,
            None => self
                .store
                .list_threads(MAX_ROWS)
                .map_err(store_err)?
                .into_iter()
                .find(|t| t.external == id)
                .ok_or_else(|| {
                    Status::not_found(format!("no thread {id}: see `byom threads ls`"))
                })?,
        };
        let mut triggers = self
            .store
            .list_triggers(Some(&t.id), THREAD_MESSAGES)
            .map_err(store_err)?;
        triggers.reverse();
        let msgs: Vec<Value> = triggers
            .iter()
            .map(|x| {
                json!({"id": x.id, "user": x.user, "text": x.text, "from_bot": x.from_bot,
                       "created_at": time(x.created_at_ms), "decision": x.decision().name()})
            })
            .collect();
        let ws: Vec<Value> = self
            .workers()?
            .iter()
            .filter(|w| w.threads.contains(&t.id))
            .map(summary)
            .collect();
        Ok(
            json!({"id": t.id, "source": t.source, "external": t.external,
                  "messages": msgs, "workers": ws}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_become_rfc3339_and_durations_stay() {
        let mut v = json!({"created_ms": 1_796_107_970_123u64, "answered_ms": 0,
                           "js": {"started_ms": 1000, "timeout_ms": 5},
                           "rows": [{"updated_ms": 1}], "retry_at": null});
        times(&mut v);
        assert_eq!(v["created_at"], "2026-12-01T06:52:50.123Z");
        assert_eq!(v["answered_at"], Value::Null);
        assert_eq!(v["js"]["started_at"], "1970-01-01T00:00:01.000Z");
        assert_eq!(v["js"]["timeout_ms"], 5);
        assert_eq!(v["rows"][0]["updated_at"], "1970-01-01T00:00:00.001Z");
        assert!(v.get("created_ms").is_none());
        assert_eq!(v["retry_at"], Value::Null);
    }
}
