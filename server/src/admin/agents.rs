//! The agents from the API: tasks, workers (with transcripts), approvals,
//! threads and the Router, read from the store (the truth; the loop may be
//! mid-step), and the two things people tell the agents from outside a
//! chat: cancel a task, answer an approval. Both go through the durable
//! inbox. Records become messages in [`super::views`].

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

use super::{store_err, views, Api};
use crate::idempotency::Pending;

/// Rows kept in one listing.
const MAX_ROWS: usize = 1000;
/// Messages of a thread shown at once.
const THREAD_MESSAGES: usize = 200;
/// Agent records read at once (the whole keyspace's records).
const MAX_RECORDS: usize = 1_000_000;

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

    pub(crate) fn list_workers(&self, subagents: bool) -> Result<pb::WorkerList, Status> {
        Ok(pb::WorkerList {
            workers: self
                .workers()?
                .iter()
                .filter(|w| subagents || w.parent.is_none())
                .take(MAX_ROWS)
                .map(views::summary)
                .collect(),
        })
    }

    pub(crate) async fn cancel_task(
        &self,
        r: pb::CancelTaskRequest,
        by: &str,
    ) -> Result<pb::CancelTaskResponse, Status> {
        let key = r.idempotency_key.clone();
        let fp = super::fingerprint(
            &pb::CancelTaskRequest {
                idempotency_key: String::new(),
                ..r.clone()
            },
            &[],
        );
        // A retry of the same request (the key's record checks that)
        // gets the reply the first call got, which the request decides.
        let Ok(claim) = self.claim("agent-cancel", by, &key, &fp).await? else {
            return Ok(pb::CancelTaskResponse {
                id: r.id,
                cancelling: true,
            });
        };
        let id = r.id.as_str();
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
        self.enqueue(&ev, id, &reply, &claim).await?;
        Ok(pb::CancelTaskResponse {
            id: id.to_string(),
            cancelling: true,
        })
    }

    pub(crate) fn list_approvals(&self, all: bool) -> Result<pb::ApprovalList, Status> {
        Ok(pb::ApprovalList {
            approvals: self
                .approvals()?
                .iter()
                .filter(|a| all || a.state == ApprovalState::Open)
                .take(MAX_ROWS)
                .map(views::approval)
                .collect(),
        })
    }

    pub(super) fn router(&self) -> Result<pb::RouterView, Status> {
        Ok(views::router(
            &self.router_record()?,
            self.model_of("router"),
        ))
    }

    pub(crate) fn get_trust(&self) -> Result<pb::TrustConfig, Status> {
        Ok(views::trust(
            &crate::trust::load(&self.store).map_err(store_err)?,
        ))
    }

    pub(super) fn check_trust(&self, r: pb::CheckTrustRequest) -> Result<pb::TrustVerdict, Status> {
        let t = crate::trust::load(&self.store).map_err(store_err)?;
        let labels: Option<BTreeMap<String, String>> = r
            .label
            .split_once('=')
            .map(|(k, v)| [(k.to_string(), v.to_string())].into());
        let v = t.judge(&r.principal, &r.association);
        Ok(pb::TrustVerdict {
            may_approve: t.may_approve(&r.principal, labels.as_ref()),
            principal: r.principal,
            trusted: v.trusted,
            why: v.why,
        })
    }

    /// What became of a trigger after the fast path: the agents' record of
    /// it, with the policy named by ID when the Router cited one.
    pub(crate) fn fate(&self, trigger: &str) -> Result<pb::Fate, Status> {
        let Some(b) = self
            .store
            .get_raw(Space::Agents, &keys::fate(trigger))
            .map_err(store_err)?
        else {
            return Ok(pb::Fate {
                trigger: trigger.to_string(),
                fate: None,
            });
        };
        let mut fate = String::from_utf8_lossy(&b).into_owned();
        if let Some(i) = fate.find("policy: ") {
            let cited = fate[i + 8..].trim().to_string();
            let policies = self.store.list_policies().map_err(store_err)?;
            if let Some(p) = policies.iter().find(|p| p.text.trim() == cited) {
                fate = format!("{} ({})", fate, p.id);
            }
        }
        Ok(pb::Fate {
            trigger: trigger.to_string(),
            fate: Some(fate),
        })
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

    /// The workers `keep` picks, newest first, as messages without their
    /// transcripts or subagents (the console's timelines and Needs you;
    /// [`Api::worker`] gives one whole).
    pub(crate) fn workers_where(
        &self,
        keep: impl Fn(&WorkerState) -> bool,
    ) -> Result<Vec<pb::Worker>, Status> {
        Ok(self
            .workers()?
            .iter()
            .filter(|w| keep(w))
            .take(MAX_ROWS)
            .map(|w| views::worker(w, Vec::new(), String::new(), Vec::new()))
            .collect())
    }

    /// A worker with its transcript and subagents.
    pub(crate) fn worker(&self, id: &str) -> Result<pb::Worker, Status> {
        let all = self.workers()?;
        let w = all
            .iter()
            .find(|w| w.id == id)
            .ok_or_else(|| Status::not_found(format!("no worker {id}: see `byom workers ls`")))?;
        let children = all
            .iter()
            .filter(|c| c.parent.as_deref() == Some(id))
            .map(views::summary)
            .collect();
        // The transcript: the stored messages, in the record's order.
        let stored: BTreeMap<u64, byom_agent::llm::Message> = self
            .store
            .scan_prefix(Space::Agents, &keys::messages_of(id), MAX_RECORDS)
            .map_err(store_err)?
            .into_iter()
            .filter_map(|(n, b)| Some((n.parse().ok()?, serde_json::from_slice(&b).ok()?)))
            .collect();
        let transcript = w
            .conversation
            .seqs()
            .iter()
            .filter_map(|n| stored.get(n).map(views::message))
            .collect();
        Ok(views::worker(
            w,
            transcript,
            self.model_of("worker"),
            children,
        ))
    }

    pub(crate) async fn answer(
        &self,
        r: pb::AnswerApprovalRequest,
        by: &str,
    ) -> Result<pb::AnswerApprovalResponse, Status> {
        let key = r.idempotency_key.clone();
        let fp = super::fingerprint(
            &pb::AnswerApprovalRequest {
                idempotency_key: String::new(),
                ..r.clone()
            },
            &[],
        );
        let Ok(claim) = self.claim("agent-answer", by, &key, &fp).await? else {
            return Ok(pb::AnswerApprovalResponse {
                id: r.id,
                approved: r.approved,
            });
        };
        let id = r.id.as_str();
        let answer: Value = if r.answer_json.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&r.answer_json)
                .map_err(|e| invalid(format!("the answer must be JSON: {e}")))?
        };
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
        let approved = r.approved;
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
            answer,
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
        if let Err(e) = self.enqueue(&ev, id, &reply, &claim).await {
            let _ = self.store.delete_raw(Space::Leases, &once);
            return Err(e);
        }
        Ok(pb::AnswerApprovalResponse {
            id: id.to_string(),
            approved,
        })
    }

    /// Replaces the trust configuration. Only an approver for every
    /// machine may change who approves and who is trusted, and nobody can
    /// leave it with no approver at all.
    pub(super) fn set_trust(
        &self,
        new: pb::TrustConfig,
        by: &str,
    ) -> Result<pb::TrustConfig, Status> {
        let current = crate::trust::load(&self.store).map_err(store_err)?;
        if !current.may_approve(by, None) {
            return Err(Status::permission_denied(format!(
                "{by} may not change trust: only an approver for every machine may ({})",
                current.approvers_for(None).join(", ")
            )));
        }
        let new: Trust = views::trust_from(new);
        new.validate().map_err(invalid)?;
        if !new.may_approve(by, None) {
            return Err(invalid(format!(
                "{by} would no longer be an approver for every machine; keep yourself (or add another) first"
            )));
        }
        crate::trust::save(&self.store, &new).map_err(store_err)?;
        tracing::info!(by, "trust configuration changed");
        Ok(views::trust(&new))
    }

    /// Puts a person's word in the agents' inbox, with the idempotency
    /// record of the call that carried it.
    async fn enqueue(
        &self,
        ev: &Event,
        id: &str,
        reply: &Value,
        claim: &Pending,
    ) -> Result<(), Status> {
        let extra = claim.ops(id, &reply.to_string());
        self.agents.enqueue(ev, &extra).await.map_err(store_err)
    }

    pub(crate) fn threads(&self) -> Result<pb::ThreadList, Status> {
        let r = self.router_record()?;
        Ok(pb::ThreadList {
            threads: self
                .store
                .list_threads(MAX_ROWS)
                .map_err(store_err)?
                .iter()
                .map(|t| views::thread_row(t, &r.subs))
                .collect(),
        })
    }

    /// A thread by `thr_…` ID or by the channel's own name for it.
    pub(super) fn thread(&self, id: &str) -> Result<pb::ThreadView, Status> {
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
        Ok(pb::ThreadView {
            messages: triggers.iter().map(views::thread_message).collect(),
            workers: self
                .workers()?
                .iter()
                .filter(|w| w.threads.contains(&t.id))
                .map(views::summary)
                .collect(),
            id: t.id,
            source: t.source,
            external: t.external,
        })
    }

    /// An approval by ID (for `show`): its one record.
    pub(super) fn approval(&self, id: &str) -> Result<Option<pb::Approval>, Status> {
        let Some(b) = self
            .store
            .get_raw(Space::Agents, &keys::record(id))
            .map_err(store_err)?
        else {
            return Ok(None);
        };
        let a: Approval = serde_json::from_slice(&b)
            .map_err(|e| Status::internal(format!("approval record {id} unreadable: {e}")))?;
        Ok(Some(views::approval(&a)))
    }
}

fn invalid(m: impl Into<String>) -> Status {
    Status::invalid_argument(m.into())
}
