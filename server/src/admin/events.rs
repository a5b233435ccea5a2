//! Events and the Router's policies from the API: send an event (a
//! trigger, through trigger ingest), list and tail triggers, add, list and
//! remove natural-language policies.

use byom_protocol::pb;
use byom_store::MAX_LIST;
use tonic::Status;

use super::{fingerprint, store_err, Api, Stream};

/// Longest natural-language policy, and most of them.
const MAX_POLICY_BYTES: usize = 4096;
const MAX_POLICIES: usize = 256;
/// Triggers listed when the request does not say.
const DEFAULT_LIST: usize = 50;
/// Triggers buffered per tail before the server waits for the client.
const TAIL_BUFFER: usize = 64;

impl Api {
    pub(super) async fn send_event(
        &self,
        mut ev: pb::SendEventRequest,
        by: &str,
    ) -> Result<pb::SendEventResponse, Status> {
        if ev.source.trim().is_empty() || ev.thread.trim().is_empty() || ev.user.trim().is_empty() {
            return Err(Status::invalid_argument(
                "an event needs a source, a thread and a user",
            ));
        }
        let key = std::mem::take(&mut ev.idempotency_key);
        let claim = match self
            .claim("event", by, &key, &fingerprint(&ev, &[]))
            .await?
        {
            Ok(p) => p,
            Err(r) => {
                let t = self
                    .store
                    .get_trigger(&r.object_id)
                    .map_err(store_err)?
                    .ok_or_else(|| Status::not_found(format!("trigger {} is gone", r.object_id)))?;
                return Ok(pb::SendEventResponse { trigger: Some(t) });
            }
        };
        let t = self
            .triggers
            .ingest(ev, Some(&claim), Some(by))
            .await
            .map_err(store_err)?;
        Ok(pb::SendEventResponse { trigger: Some(t) })
    }

    pub(super) fn list_triggers(
        &self,
        req: pb::ListTriggersRequest,
    ) -> Result<pb::ListTriggersResponse, Status> {
        let limit = if req.limit == 0 {
            DEFAULT_LIST
        } else {
            (req.limit as usize).min(MAX_LIST)
        };
        let thread = (!req.thread.is_empty()).then_some(req.thread.as_str());
        let triggers = self.store.list_triggers(thread, limit).map_err(store_err)?;
        Ok(pb::ListTriggersResponse { triggers })
    }

    pub(super) fn tail_triggers(&self) -> Stream<pb::Trigger> {
        let mut rx = self.triggers.tail();
        let (tx, out) = tokio::sync::mpsc::channel(TAIL_BUFFER);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let t = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tx.closed() => return,
                    r = rx.recv() => r,
                };
                match t {
                    Ok(t) => {
                        if tx.send(Ok(t)).await.is_err() {
                            return;
                        }
                    }
                    // A slow reader skips ahead rather than holding memory.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                }
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(out))
    }

    pub(super) async fn add_policy(
        &self,
        mut req: pb::AddPolicyRequest,
        by: String,
    ) -> Result<pb::PolicyResponse, Status> {
        let key = std::mem::take(&mut req.idempotency_key);
        let claim = match self
            .claim("policy", &by, &key, &fingerprint(&req, &[]))
            .await?
        {
            Ok(p) => p,
            Err(r) => {
                let p = self
                    .store
                    .get_policy(&r.object_id)
                    .map_err(store_err)?
                    .ok_or_else(|| {
                        Status::not_found(format!("policy {} was removed", r.object_id))
                    })?;
                return Ok(pb::PolicyResponse { policy: Some(p) });
            }
        };
        let text = req.text.trim().to_string();
        if text.is_empty() || text.len() > MAX_POLICY_BYTES {
            return Err(Status::invalid_argument(format!(
                "a policy is 1 to {MAX_POLICY_BYTES} bytes of text"
            )));
        }
        if self.store.list_policies().map_err(store_err)?.len() >= MAX_POLICIES {
            return Err(Status::resource_exhausted(format!(
                "at most {MAX_POLICIES} policies: remove one first"
            )));
        }
        let now = byom_wire::now_ms();
        let p = pb::RouterPolicy {
            id: byom_protocol::id::PolicyId::new(now).to_string(),
            enforced: super::enforcement(&text),
            text,
            created_at_ms: now,
            created_by: by,
        };
        let mut ops = vec![byom_store::Op::policy(&p)];
        ops.extend(claim.ops(&p.id, ""));
        self.store.batch(&ops).map_err(store_err)?;
        self.store.flush_async().await.map_err(store_err)?;
        Ok(pb::PolicyResponse { policy: Some(p) })
    }

    pub(super) async fn remove_policy(
        &self,
        req: pb::RemovePolicyRequest,
    ) -> Result<pb::PolicyResponse, Status> {
        let id = req.id;
        let p = self
            .store
            .remove_policy(&id)
            .map_err(store_err)?
            .ok_or_else(|| Status::not_found(format!("no policy {id}: see `byom policy ls`")))?;
        self.store.flush_async().await.map_err(store_err)?;
        Ok(pb::PolicyResponse { policy: Some(p) })
    }
}
