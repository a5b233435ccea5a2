//! The API's view of the agents: tasks, workers, approvals, threads and the
//! Router, read from the store (the truth; the loop may be mid-step), and
//! the two commands people give the agents from outside a chat: cancel a
//! task and answer an approval. Both go through the durable inbox.

use serde_json::{json, Value};

use super::core::{Approval, Event, RouterState, WorkerState};
use crate::server::Shared;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Rows kept in one listing.
const MAX_ROWS: usize = 1000;

fn workers(shared: &Shared) -> Result<Vec<WorkerState>, QueryError> {
    let mut v: Vec<WorkerState> = shared
        .store
        .agent_records()?
        .into_iter()
        .filter(|(k, _)| k.starts_with("wrk_"))
        .filter_map(|(k, b)| match serde_json::from_slice(&b) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!("worker record {k} unreadable: {e}");
                None
            }
        })
        .collect();
    v.sort_by_key(|w| std::cmp::Reverse(w.created_ms));
    Ok(v)
}

fn approvals(shared: &Shared) -> Result<Vec<Approval>, QueryError> {
    let mut v: Vec<Approval> = shared
        .store
        .agent_records()?
        .into_iter()
        .filter(|(k, _)| k.starts_with("apr_"))
        .filter_map(|(_, b)| serde_json::from_slice(&b).ok())
        .collect();
    v.sort_by_key(|w| std::cmp::Reverse(w.created_ms));
    Ok(v)
}

fn router(shared: &Shared) -> Result<RouterState, QueryError> {
    Ok(match shared.store.agent_record(super::core::ROUTER)? {
        Some(b) => serde_json::from_slice(&b)
            .map_err(|e| QueryError::Invalid(format!("router record unreadable: {e}")))?,
        None => RouterState::default(),
    })
}

/// A worker in one row.
pub fn summary(w: &WorkerState) -> Value {
    let running = w.commands.values().filter(|c| !c.done).count();
    json!({
        "id": w.id, "parent": w.parent, "status": w.status.name(), "task": w.task,
        "threads": w.threads, "machine": w.machine, "created_ms": w.created_ms,
        "updated_ms": w.updated_ms, "commands": w.commands.len(), "running_commands": running,
        "program": w.js.as_ref().map(|j| format!("{}/js{}", w.id, j.run)),
        "model_calls": w.steps, "usage": w.usage, "last_report": w.last_report,
    })
}

/// Serves one request; `by` is the caller (`admin:NAME`), recorded on
/// cancels and answers.
pub async fn handle(
    shared: &Shared,
    op: &str,
    id: &str,
    body: &str,
    by: &str,
) -> Result<Value, QueryError> {
    let args: Value = if body.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body)
            .map_err(|e| QueryError::Invalid(format!("the request's json is not JSON: {e}")))?
    };
    match op {
        "tasks" | "workers" => {
            let all = op == "workers";
            let rows: Vec<Value> = workers(shared)?
                .iter()
                .filter(|w| all || w.parent.is_none())
                .take(MAX_ROWS)
                .map(summary)
                .collect();
            Ok(Value::Array(rows))
        }
        "worker" => {
            let w = workers(shared)?
                .into_iter()
                .find(|w| w.id == id)
                .ok_or_else(|| {
                    QueryError::NotFound(format!("no worker {id}: see `byom workers ls`"))
                })?;
            let children: Vec<Value> = workers(shared)?
                .iter()
                .filter(|c| c.parent.as_deref() == Some(id))
                .map(summary)
                .collect();
            let mut v = serde_json::to_value(&w).unwrap_or(Value::Null);
            // The transcript: the stored messages, in the record's order.
            let stored: std::collections::BTreeMap<u64, Value> = shared
                .store
                .agent_messages(id)?
                .into_iter()
                .filter_map(|(n, b)| Some((n, serde_json::from_slice(&b).ok()?)))
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
            v["summary"] = summary(&w);
            v["children"] = Value::Array(children);
            Ok(v)
        }
        "cancel" => {
            let w = workers(shared)?
                .into_iter()
                .find(|w| w.id == id)
                .ok_or_else(|| {
                    QueryError::NotFound(format!("no task {id}: see `byom tasks ls`"))
                })?;
            if w.status.is_closed() {
                return Err(QueryError::Conflict(format!(
                    "{id} already ended ({})",
                    w.status.name()
                )));
            }
            super::driver::enqueue(
                shared,
                &Event::Cancel {
                    worker: id.to_string(),
                    by: by.to_string(),
                },
            )
            .await?;
            Ok(json!({"id": id, "cancelling": true}))
        }
        "approvals" => {
            let all = args.get("all").and_then(Value::as_bool).unwrap_or(false);
            let rows: Vec<Value> = approvals(shared)?
                .into_iter()
                .filter(|a| all || a.state == "open")
                .take(MAX_ROWS)
                .map(|a| serde_json::to_value(a).unwrap_or(Value::Null))
                .collect();
            Ok(Value::Array(rows))
        }
        "answer" => {
            let a = approvals(shared)?
                .into_iter()
                .find(|a| a.id == id)
                .ok_or_else(|| {
                    QueryError::NotFound(format!("no approval {id}: see `byom approvals ls`"))
                })?;
            if a.state != "open" {
                return Err(QueryError::Conflict(format!("{id} is already {}", a.state)));
            }
            let approved = args
                .get("approved")
                .and_then(Value::as_bool)
                .ok_or_else(|| QueryError::Invalid("say approved: true or false".into()))?;
            let answer = args.get("answer").cloned().unwrap_or(Value::Null);
            super::driver::enqueue(
                shared,
                &Event::Answer {
                    approval: id.to_string(),
                    approved,
                    answer,
                    by: by.to_string(),
                },
            )
            .await?;
            Ok(json!({"id": id, "approved": approved}))
        }
        "threads" => {
            let r = router(shared)?;
            let rows: Vec<Value> = shared
                .store
                .list_threads(MAX_ROWS)?
                .into_iter()
                .map(|t| {
                    let subs: Vec<String> = r
                        .subs
                        .get(&t.id)
                        .map(|s| s.iter().cloned().collect())
                        .unwrap_or_default();
                    json!({"id": t.id, "source": t.source, "external": t.external,
                           "created_ms": t.created_at_ms, "last_trigger_ms": t.last_trigger_ms,
                           "workers": subs})
                })
                .collect();
            Ok(Value::Array(rows))
        }
        "thread" => {
            let t = match shared.store.get_thread(id)? {
                Some(t) => t,
                None => shared
                    .store
                    .list_threads(MAX_ROWS)?
                    .into_iter()
                    .find(|t| t.external == id)
                    .ok_or_else(|| {
                        QueryError::NotFound(format!("no thread {id}: see `byom threads ls`"))
                    })?,
            };
            let mut triggers = shared.store.list_triggers(Some(&t.id), 200)?;
            triggers.reverse();
            let msgs: Vec<Value> = triggers
                .iter()
                .map(|x| json!({"id": x.id, "user": x.user, "text": x.text, "from_bot": x.from_bot,
                               "created_ms": x.created_at_ms, "decision": x.decision().as_str_name()}))
                .collect();
            let ws: Vec<Value> = workers(shared)?
                .iter()
                .filter(|w| w.threads.contains(&t.id))
                .map(summary)
                .collect();
            Ok(
                json!({"id": t.id, "source": t.source, "external": t.external,
                      "messages": msgs, "workers": ws}),
            )
        }
        "router" => {
            let r = router(shared)?;
            Ok(
                json!({"stats": r.stats, "queued": r.queue.len(), "in_flight": r.in_flight.is_some(),
                      "conversation_messages": r.conversation.len(), "dropped_turns": r.dropped_turns,
                      "subscriptions": r.subs}),
            )
        }
        other => Err(QueryError::Invalid(format!("unknown agent op {other:?}"))),
    }
}
