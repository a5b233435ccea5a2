//! The agents' API: one `Agent(op, id, json)` call whose answers are the
//! agents' own records as JSON (times in RFC 3339).

use anyhow::Context;
use byom_api::Client;
use byom_protocol::pb;
use serde_json::Value;

/// An `op, id, json` request (the agents' and the channels' calls).
pub fn request(op: &str, id: &str, body: &Value) -> pb::AgentRequest {
    pb::AgentRequest {
        op: op.into(),
        id: id.into(),
        json: if body.is_null() {
            String::new()
        } else {
            body.to_string()
        },
        idempotency_key: byom_api::new_key(),
    }
}

/// The JSON an `op` call answered.
pub fn answer(r: pb::AgentResponse) -> anyhow::Result<Value> {
    serde_json::from_str(&r.json).context("the server sent a reply that is not JSON")
}

/// One agents request. Ops that change something (`cancel`, `answer`)
/// carry an idempotency key and are retried across a server restart.
pub async fn agent(c: &mut Client, op: &str, id: &str, body: Value) -> anyhow::Result<Value> {
    let req = request(op, id, &body);
    let r = byom_api::until_answered(|| {
        let (mut c, req) = (c.clone(), req.clone());
        async move { c.agent(req).await }
    })
    .await?
    .into_inner();
    answer(r)
}

pub fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}
