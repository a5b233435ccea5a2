//! The connectors' endpoints on the webhook port: `POST /slack/NAME/events`
//! (Slack's Events API) and `POST /github/NAME` (GitHub's webhooks). The
//! signature is checked over the raw body before anything is parsed or
//! stored; a request for a connector that does not exist, or of another
//! kind, gets exactly the answer a bad signature gets (after its body is
//! read, like any other), so names cannot be probed.

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{json, Value};

use super::{github, slack, Channels};
use crate::http_in::reply;
use crate::triggers::{Ingest, Ingested};

fn header(req: &hyper::Request<hyper::body::Incoming>, k: &str) -> Option<String> {
    req.headers()
        .get(k)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The one answer to a request that is not provably from the connector's
/// peer: whether the name exists, the signature was wrong or the
/// timestamp stale is the server's to know (its debug log says).
fn bad_signature(kind: &str) -> hyper::Response<Full<Bytes>> {
    let how = if kind == "slack" {
        "X-Slack-Signature and a current X-Slack-Request-Timestamp (v0=HMAC of v0:TS:BODY with the signing secret)"
    } else {
        "X-Hub-Signature-256 (sha256=HMAC of the body with the webhook secret)"
    };
    reply(
        401,
        json!({"error": format!("not verified: this endpoint needs {how}")}),
    )
}

/// Handles one request to a connector endpoint.
pub async fn handle(
    ch: &Channels,
    path: &str,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (kind, name, interactive) = match parts.as_slice() {
        ["slack", name, "events"] => ("slack", *name, false),
        ["slack", name, "interactive"] => ("slack", *name, true),
        ["github", name] => ("github", *name, false),
        _ => {
            return reply(
                404,
                json!({"error": "use POST /slack/NAME/events, POST /slack/NAME/interactive or POST /github/NAME"}),
            )
        }
    };
    let connector = match ch.store.get_connector(name) {
        Ok(Some(c)) if c.kind == kind => Some(c),
        Ok(_) => None,
        Err(e) => return reply(503, json!({"error": e.to_string()})),
    };
    let slack_ts = header(&req, "x-slack-request-timestamp");
    let slack_sig = header(&req, "x-slack-signature");
    let gh_sig = header(&req, "x-hub-signature-256");
    let gh_event = header(&req, "x-github-event").unwrap_or_default();
    let gh_delivery = header(&req, "x-github-delivery").unwrap_or_default();
    let body = match crate::http_in::read_body(req).await {
        Ok(b) => b,
        Err(too_big) => return too_big,
    };
    let Some(connector) = connector else {
        return bad_signature(kind);
    };
    if kind == "slack" {
        let now = byom_wire::now_ms() / 1000;
        if let Err(e) = slack::verify(
            &connector.secret,
            slack_ts.as_deref(),
            slack_sig.as_deref(),
            &body,
            now,
        ) {
            tracing::debug!(connector = %connector.name, "refused a Slack request: {e}");
            return bad_signature(kind);
        }
        if interactive {
            // A button on one of byom's requests; anything else is
            // acknowledged and ignored, as Slack expects.
            let Some(ev) = slack::action_to_trigger(&connector.name, &body) else {
                return reply(200, json!({"ignored": "not a press of byom's buttons"}));
            };
            return match ch.triggers.ingest_with(ev, Ingest::default()).await {
                Ok(Ingested::New(t) | Ingested::Duplicate(t)) => {
                    reply(200, json!({"trigger": t.id}))
                }
                Err(e) => reply(503, json!({"error": e.to_string()})),
            };
        }
        let (status, v) = slack::handle(ch, &connector, &body).await;
        return reply(status, v);
    }
    if !crate::http_in::verify(connector.secret.as_bytes(), &body, gh_sig.as_deref()) {
        return bad_signature(kind);
    }
    if gh_event == "ping" {
        return reply(200, json!({"ok": true, "pong": true}));
    }
    if gh_event.is_empty() || gh_delivery.is_empty() || gh_delivery.len() > 100 {
        return reply(
            400,
            json!({"error": "need X-GitHub-Event and X-GitHub-Delivery"}),
        );
    }
    let payload: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return reply(400, json!({"error": format!("body is not JSON: {e}")})),
    };
    // Who reads the repository: anyone, when it is public, whoever has
    // spoken there (what the agents ask before posting private data).
    if let Err(e) = github::note_visibility(&ch.store, &connector.name, &payload) {
        return reply(503, json!({"error": e.to_string()}));
    }
    let digest = byom_wire::hex(&byom_wire::sha256(&body));
    let Some(m) = github::event_to_trigger(
        &connector.name,
        &gh_event,
        &digest,
        &payload,
        &connector.bot_login,
    ) else {
        return reply(200, json!({"ignored": "the bot's own comment"}));
    };
    let opts = Ingest {
        ignore: m.ignore,
        also_known_as: m.comment,
        ..Default::default()
    };
    match ch.triggers.ingest_with(m.ev, opts).await {
        Ok(Ingested::New(t)) => reply(
            202,
            json!({"trigger": t.id, "thread": t.thread_id, "decision": t.decision().name()}),
        ),
        Ok(Ingested::Duplicate(t)) => reply(200, json!({"trigger": t.id, "duplicate": true})),
        Err(e) => reply(503, json!({"error": e.to_string()})),
    }
}
