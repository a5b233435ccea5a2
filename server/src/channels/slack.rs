//! Slack: the Events API in (`POST /slack/NAME/events` on the webhook
//! port), the Web API out (`chat.postMessage`).
//!
//! In: `X-Slack-Signature` is `v0=` + HMAC-SHA256 of `v0:TIMESTAMP:BODY`
//! with the signing secret, and requests older than five minutes are
//! refused (replays). The message is stored before the 200 (Slack waits
//! three seconds, then retries; retries and the `message`/`app_mention`
//! pair Slack sends for one message are recognised by the message's
//! channel and `ts`). A top-level message starts a thread; replies carry
//! its `thread_ts`.
//!
//! Out: `chat.postMessage` with `thread_ts` and mrkdwn; `429` waits for
//! `Retry-After`; `ok:false` fails with Slack's error name (those Slack
//! documents as temporary are retried).

use std::time::Duration;

use byom_protocol::pb;
use ring::hmac;
use serde_json::{json, Value};

use super::readers::{self, Readers};
use super::{Channels, Provider, Sent, PROVIDER_TIMEOUT};
use crate::http::{self, HttpError};
use crate::triggers::{Ingest, Ingested};

/// Oldest request accepted (Slack's own advice: five minutes).
pub const MAX_REQUEST_AGE: Duration = Duration::from_secs(300);
pub const DEFAULT_API: &str = "https://slack.com/api";
const BOT_USER: &str = "bot_user_id";

/// Slack's error names that mean "try again later".
const TEMPORARY: [&str; 5] = [
    "ratelimited",
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
];

/// Checks a request's signature and age; the error is what to answer.
pub fn verify(
    secret: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_s: u64,
) -> Result<(), &'static str> {
    let ts = timestamp.ok_or("missing X-Slack-Request-Timestamp")?;
    let t: u64 = ts
        .trim()
        .parse()
        .map_err(|_| "bad X-Slack-Request-Timestamp")?;
    if now_s.abs_diff(t) > MAX_REQUEST_AGE.as_secs() {
        return Err("request older than five minutes (or from the future): refused");
    }
    let hexsig = signature
        .and_then(|s| s.trim().strip_prefix("v0="))
        .ok_or("missing or malformed X-Slack-Signature")?;
    let sig = crate::http_in::unhex(hexsig).ok_or("malformed X-Slack-Signature")?;
    let mut msg = format!("v0:{ts}:").into_bytes();
    msg.extend_from_slice(body);
    hmac::verify(
        &hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()),
        &msg,
        &sig,
    )
    .map_err(|_| "bad X-Slack-Signature")
}

/// Most characters of a section block's text (Slack's limit).
const MAX_SECTION_CHARS: usize = 3000;
/// The buttons' action IDs.
pub const APPROVE_ACTION: &str = "byom_approve";
pub const DENY_ACTION: &str = "byom_deny";

/// A request as blocks: its text, then Approve and Deny buttons carrying
/// its code.
fn request_blocks(text: &Value, code: &str) -> Value {
    let text: String = text
        .as_str()
        .unwrap_or_default()
        .chars()
        .take(MAX_SECTION_CHARS)
        .collect();
    json!([
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {"type": "actions", "elements": [
            {"type": "button", "action_id": APPROVE_ACTION, "value": code, "style": "primary",
             "text": {"type": "plain_text", "text": format!("Approve {code}")}},
            {"type": "button", "action_id": DENY_ACTION, "value": code, "style": "danger",
             "text": {"type": "plain_text", "text": format!("Deny {code}")}}
        ]}
    ])
}

/// `application/x-www-form-urlencoded` value of `key` in `body`.
fn form_value(body: &[u8], key: &str) -> Option<String> {
    let body = std::str::from_utf8(body).ok()?;
    let raw = body
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?;
    let mut out = Vec::with_capacity(raw.len());
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// A button press on one of byom's requests (Slack's `block_actions`
/// interactivity payload, signature already checked) as the answer it
/// stands for, from whoever pressed it (`user.team_id`/`user.id`), on
/// the request's thread. `None`: not such a press.
pub fn action_to_trigger(connector: &str, body: &[u8]) -> Option<pb::SendEventRequest> {
    let payload: Value = serde_json::from_str(&form_value(body, "payload")?).ok()?;
    if payload["type"] != "block_actions" {
        return None;
    }
    let action = payload["actions"].as_array()?.first()?;
    let verb = match action["action_id"].as_str()? {
        APPROVE_ACTION => "approve",
        DENY_ACTION => "deny",
        _ => return None,
    };
    let code = action["value"].as_str()?;
    if code.len() != byom_agent::approval::CODE_LEN
        || !code.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return None;
    }
    let user = payload["user"]["id"].as_str()?;
    let team = payload["user"]["team_id"]
        .as_str()
        .or(payload["team"]["id"].as_str())?;
    let channel = payload["channel"]["id"]
        .as_str()
        .or(payload["container"]["channel_id"].as_str())?;
    let msg = &payload["message"];
    let ts = msg["ts"]
        .as_str()
        .or(payload["container"]["message_ts"].as_str())?;
    let thread_ts = msg["thread_ts"].as_str().unwrap_or(ts);
    let pressed = action["action_ts"].as_str().unwrap_or(ts);
    let external = if payload["team"]["id"].as_str().is_some_and(|t| t != team) {
        "external"
    } else {
        ""
    };
    Some(pb::SendEventRequest {
        source: connector.to_string(),
        thread: format!("{channel}/{thread_ts}"),
        user: format!("slack:{team}/{user}"),
        user_name: payload["user"]["username"]
            .as_str()
            .or(payload["user"]["name"].as_str())
            .unwrap_or_default()
            .to_string(),
        text: format!("{verb} {code}"),
        channel: channel.to_string(),
        external_id: format!("action/{user}/{pressed}"),
        author_association: external.into(),
        kind: "slack".into(),
        ..Default::default()
    })
}

/// What an event callback's event becomes (`None`: not a person's new
/// message, or the bot's own).
pub fn event_to_trigger(
    connector: &str,
    team: &str,
    bot_user: &str,
    ev: &Value,
) -> Option<pb::SendEventRequest> {
    let kind = ev["type"].as_str()?;
    if kind != "message" && kind != "app_mention" {
        return None;
    }
    let subtype = ev["subtype"].as_str().unwrap_or("");
    if !matches!(
        subtype,
        "" | "thread_broadcast" | "file_share" | "bot_message"
    ) {
        return None;
    }
    let channel = ev["channel"].as_str()?;
    let ts = ev["ts"].as_str()?;
    let bot_id = ev["bot_id"].as_str();
    let who = ev["user"].as_str().or(bot_id)?;
    if !bot_user.is_empty() && who == bot_user {
        return None;
    }
    let thread_ts = ev["thread_ts"].as_str().unwrap_or(ts);
    // The principal names the author's own organisation: a Slack Connect
    // user from elsewhere carries their team (`user_team`), so a pattern
    // for this workspace (`slack:T1/*`) never covers them.
    let user_team = ev["user_team"]
        .as_str()
        .or(ev["user_profile"]["team"].as_str())
        .filter(|t| !t.is_empty())
        .unwrap_or(team);
    let text = ev["text"].as_str().unwrap_or_default();
    let mention_tag = format!("<@{bot_user}>");
    let dm = ev["channel_type"] == "im";
    let profile = &ev["user_profile"];
    let name = ["display_name", "real_name", "name"]
        .iter()
        .find_map(|k| profile[k].as_str().filter(|s| !s.is_empty()))
        .unwrap_or(who);
    Some(pb::SendEventRequest {
        source: connector.to_string(),
        thread: format!("{channel}/{thread_ts}"),
        user: format!("slack:{user_team}/{who}"),
        user_name: name.to_string(),
        text: text.to_string(),
        mention: kind == "app_mention"
            || dm
            || (!bot_user.is_empty() && text.contains(&mention_tag)),
        from_bot: bot_id.is_some() || subtype == "bot_message",
        channel: channel.to_string(),
        external_id: format!("{channel}/{ts}"),
        reply_to: if thread_ts != ts {
            format!("{channel}/{thread_ts}")
        } else {
            String::new()
        },
        link: format!(
            "https://slack.com/archives/{channel}/p{}",
            ts.replace('.', "")
        ),
        kind: "slack".into(),
        ..Default::default()
    })
}

/// Handles one Events API request (signature already checked): the
/// status and JSON to answer.
pub async fn handle(ch: &Channels, c: &pb::Connector, body: &[u8]) -> (u16, Value) {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return (400, json!({"error": format!("body is not JSON: {e}")})),
    };
    match v["type"].as_str() {
        Some("url_verification") => {
            return (200, json!({"challenge": v["challenge"]}));
        }
        Some("event_callback") => {}
        other => return (200, json!({"ignored": format!("type {other:?}")})),
    }
    let team = v["team_id"].as_str().unwrap_or_default();
    let bot_user = v["authorizations"][0]["user_id"]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            ch.store
                .channel_state(&c.name, BOT_USER)
                .ok()
                .flatten()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })
        .unwrap_or_default();
    // Someone joined a private conversation: from now on they read it,
    // whatever the member list learnt minutes ago says. Slack is asked
    // again at once.
    if let Some(channel) = joined_private(&v["event"]) {
        let who = private_readers(ch, c, channel, team, &bot_user, true)
            .await
            .unwrap_or_else(|| Readers::Unknown("Slack was not asked".into()));
        if let Err(e) = readers::note(&ch.store, &c.name, channel, &who) {
            return (503, json!({"error": e.to_string()}));
        }
        return (
            200,
            json!({"ignored": "a member joined: who reads it was asked again"}),
        );
    }
    let Some(mut ev) = event_to_trigger(&c.name, team, &bot_user, &v["event"]) else {
        return (200, json!({"ignored": "not a new message from a person"}));
    };
    // A channel shared with another organisation (Slack Connect) is read
    // by people outside the team, whoever has spoken in it.
    if let Some(shared) = v["is_ext_shared_channel"].as_bool() {
        if let Err(e) = super::note_public(&ch.store, &c.name, &ev.channel, shared) {
            return (503, json!({"error": e.to_string()}));
        }
    }
    // A public channel is read by anyone in the workspace, whoever spoke.
    // An event that does not say (`app_mention`) keeps what an earlier one
    // said; for a channel never described, Slack is asked what it is
    // (`conversations.info`), and if it cannot say, laptop output is held
    // there.
    let said = match v["event"]["channel_type"].as_str() {
        Some("channel") => Some(Readers::Workspace(team.to_string())),
        // Read by its members, silent ones included: Slack is asked who
        // they are (again after READERS_TTL_MS), and each is judged.
        Some("group" | "mpim") => private_readers(ch, c, &ev.channel, team, &bot_user, false).await,
        Some("im") => Some(Readers::Private),
        _ => None,
    };
    let who = match (said, readers::get(&ch.store, &c.name, &ev.channel)) {
        (Some(w), _) => Some(w),
        (None, Ok(Some(_))) => None,
        (None, Ok(None)) => match channel_kind(c, &ev.channel).await {
            Ok("group" | "mpim") => {
                private_readers(ch, c, &ev.channel, team, &bot_user, true).await
            }
            Ok("im") => Some(Readers::Private),
            Ok(_) => Some(Readers::Workspace(team.to_string())),
            Err(e) => Some(Readers::Unknown(e)),
        },
        (None, Err(e)) => return (503, json!({"error": e.to_string()})),
    };
    if let Some(who) = who {
        if let Err(e) = readers::note(&ch.store, &c.name, &ev.channel, &who) {
            return (503, json!({"error": e.to_string()}));
        }
    }
    if !ev.reply_to.is_empty() {
        ev.mention |= ch
            .store
            .channel_message(&c.name, &ev.reply_to)
            .ok()
            .flatten()
            .and_then(|id| ch.store.get_trigger(&id).ok().flatten())
            .is_some_and(|t| crate::triggers::is_own_reply(&t));
    }
    // Slack Connect users from another organisation carry their own team.
    let user_team = v["event"]["user_team"]
        .as_str()
        .or(v["event"]["user_profile"]["team"].as_str())
        .filter(|t| !t.is_empty())
        .unwrap_or(team);
    if user_team != team || v["event"]["user_profile"]["is_stranger"] == true {
        ev.author_association = "external".into();
    } else if crate::trust::load(&ch.store).is_ok_and(|t| t.slack_members) && !ev.from_bot {
        if let Some(u) = v["event"]["user"].as_str() {
            ev.author_association = membership(ch, c, u).await;
        }
    }
    // Slack's signed payload says it is an IM with the app: where an
    // approver may answer any request.
    let direct = v["event"]["channel_type"] == "im";
    let opts = Ingest {
        direct,
        ..Ingest::default()
    };
    match ch.triggers.ingest_with(ev, opts).await {
        Ok(Ingested::New(t)) => (200, json!({"trigger": t.id})),
        Ok(Ingested::Duplicate(t)) => (200, json!({"trigger": t.id, "duplicate": true})),
        // Slack retries a 5xx: nothing is lost.
        Err(e) => (503, json!({"error": e.to_string()})),
    }
}

/// How long a person's member-or-guest standing is reused.
const MEMBERSHIP_TTL_MS: u64 = 3600 * 1000;
/// Longest the events handler waits for `users.info` (Slack itself waits
/// three seconds for the whole answer).
const MEMBERSHIP_TIMEOUT: Duration = Duration::from_millis(1500);

/// What kind of conversation `channel` is, as Slack's
/// `conversations.info` says: `channel` (public), `group` (private),
/// `mpim` or `im`.
async fn channel_kind(c: &pb::Connector, channel: &str) -> Result<&'static str, String> {
    let api = SlackApi::new(c);
    let r = http::request(
        "GET",
        &format!(
            "{}/conversations.info?channel={}",
            api.base,
            super::matrix::enc(channel)
        ),
        &[("authorization", format!("Bearer {}", api.token))],
        None,
        MEMBERSHIP_TIMEOUT,
    )
    .await
    .map_err(|e| format!("conversations.info: {e}"))?;
    let v = r.json();
    if v["ok"] != true {
        return Err(format!(
            "conversations.info: {} (the app needs channels:read and groups:read)",
            v["error"].as_str().unwrap_or("not ok")
        ));
    }
    let ch = &v["channel"];
    Ok(if ch["is_im"] == true {
        "im"
    } else if ch["is_mpim"] == true {
        "mpim"
    } else if ch["is_private"] == true || ch["is_group"] == true {
        "group"
    } else {
        "channel"
    })
}

/// How long a private channel's member list is taken as current.
const READERS_TTL_MS: u64 = 10 * 60 * 1000;
/// The most members of a private channel judged one by one; more are
/// taken as people nobody vouched for.
const MAX_CHANNEL_MEMBERS: usize = 200;
/// How long learning who is in a channel may hold up an event's answer
/// (Slack wants one within 3 s).
const READERS_TIMEOUT: Duration = Duration::from_millis(2000);

/// The private conversation someone joined, if `ev` says so: Slack's
/// `member_joined_channel` for a private channel (`G`), or the
/// `channel_join`/`group_join` message a private channel or group DM
/// shows.
fn joined_private(ev: &Value) -> Option<&str> {
    let private = match ev["type"].as_str()? {
        "member_joined_channel" => ev["channel_type"] == "G",
        "message" => {
            matches!(ev["subtype"].as_str(), Some("channel_join" | "group_join"))
                && matches!(ev["channel_type"].as_str(), Some("group" | "mpim"))
        }
        _ => false,
    };
    private.then(|| ev["channel"].as_str()).flatten()
}

/// Who reads a private channel (`conversations.members`, each judged as
/// `users.info` says when members are trusted as such), or None to keep a
/// list learnt less than [`READERS_TTL_MS`] ago (unless `fresh`: someone
/// joined). Anything that fails is noted as unknown: the gate holds
/// laptop output there until Slack says.
async fn private_readers(
    ch: &Channels,
    c: &pb::Connector,
    channel: &str,
    team: &str,
    bot_user: &str,
    fresh: bool,
) -> Option<Readers> {
    let now = byom_wire::now_ms();
    if let Ok(Some(Readers::Members { at_ms, .. })) = readers::get(&ch.store, &c.name, channel) {
        if !fresh && at_ms + READERS_TTL_MS > now {
            return None;
        }
    }
    let ask = async {
        let api = SlackApi::new(c);
        let r = http::request(
            "GET",
            &format!(
                "{}/conversations.members?channel={}&limit={}",
                api.base,
                super::matrix::enc(channel),
                MAX_CHANNEL_MEMBERS
            ),
            &[("authorization", format!("Bearer {}", api.token))],
            None,
            MEMBERSHIP_TIMEOUT,
        )
        .await
        .map_err(|e| e.to_string())?;
        let v = r.json();
        if v["ok"] != true {
            return Err(format!(
                "conversations.members: {} (the app needs groups:read and mpim:read)",
                v["error"].as_str().unwrap_or("not ok")
            ));
        }
        let ids: Vec<&str> = v["members"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let more = v["response_metadata"]["next_cursor"]
            .as_str()
            .is_some_and(|c| !c.is_empty());
        if more || ids.len() > MAX_CHANNEL_MEMBERS {
            return Ok(Readers::Many(ids.len()));
        }
        let by_membership = crate::trust::load(&ch.store).is_ok_and(|t| t.slack_members);
        let mut people = Vec::new();
        for id in ids.into_iter().filter(|id| *id != bot_user) {
            let vouched = if by_membership {
                membership(ch, c, id).await
            } else {
                String::new()
            };
            people.push((format!("slack:{team}/{id}"), vouched));
        }
        Ok(Readers::Members {
            people,
            at_ms: byom_wire::now_ms(),
        })
    };
    Some(match tokio::time::timeout(READERS_TIMEOUT, ask).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!(connector = %c.name, channel, "cannot learn who reads it: {e}");
            Readers::Unknown(e)
        }
        Err(_) => Readers::Unknown("Slack did not say who is in it in time".into()),
    })
}

/// `member` or `guest` (single- or multi-channel) for a user of the
/// workspace, from `users.info`, remembered for an hour; `""` when Slack
/// cannot say, which leaves them untrusted.
async fn membership(ch: &Channels, c: &pb::Connector, user: &str) -> String {
    let key = format!("member:{user}");
    let now = byom_wire::now_ms();
    if let Ok(Some(b)) = ch.store.channel_state(&c.name, &key) {
        let cached: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
        if cached["at"].as_u64().unwrap_or(0) + MEMBERSHIP_TTL_MS > now {
            return cached["is"].as_str().unwrap_or("").to_string();
        }
    }
    // Slack's user IDs are letters and digits; anything else is not asked.
    if user.is_empty() || user.len() > 32 || !user.chars().all(|c| c.is_ascii_alphanumeric()) {
        return String::new();
    }
    let api = SlackApi::new(c);
    let r = http::request(
        "GET",
        &format!("{}/users.info?user={user}", api.base),
        &[("authorization", format!("Bearer {}", api.token))],
        None,
        MEMBERSHIP_TIMEOUT,
    )
    .await;
    let v = match r {
        Ok(r) => r.json(),
        Err(e) => {
            tracing::warn!(connector = %c.name, user, "users.info failed ({e}); treating them as untrusted");
            return String::new();
        }
    };
    if v["ok"] != true {
        tracing::warn!(connector = %c.name, user, error = %v["error"], "users.info refused; treating them as untrusted (the app needs users:read)");
        return String::new();
    }
    let u = &v["user"];
    let guest = u["is_restricted"] == true || u["is_ultra_restricted"] == true;
    let is = if u["deleted"] == true {
        ""
    } else if guest {
        "guest"
    } else {
        "member"
    };
    let rec = json!({"at": now, "is": is}).to_string();
    let _ = ch.store.put_channel_state(&c.name, &key, rec.as_bytes());
    is.to_string()
}

pub struct SlackApi {
    base: String,
    token: String,
}

impl SlackApi {
    pub fn new(c: &pb::Connector) -> SlackApi {
        let base = if c.api_url.is_empty() {
            DEFAULT_API
        } else {
            c.api_url.as_str()
        };
        SlackApi {
            base: base.trim_end_matches('/').to_string(),
            token: c.token.clone(),
        }
    }

    async fn call(&self, method: &str, body: &Value) -> Result<http::Reply, HttpError> {
        http::request(
            "POST",
            &format!("{}/{method}", self.base),
            &[
                ("authorization", format!("Bearer {}", self.token)),
                ("content-type", "application/json; charset=utf-8".into()),
            ],
            Some(body.to_string().into_bytes()),
            PROVIDER_TIMEOUT,
        )
        .await
    }
}

#[async_trait::async_trait]
impl Provider for SlackApi {
    fn idempotent(&self) -> bool {
        false
    }

    async fn send(&self, item: &pb::OutboxItem) -> Sent {
        let (channel, thread_ts) = item
            .external
            .split_once('/')
            .unwrap_or((item.external.as_str(), ""));
        let mut body = json!({
            "channel": channel,
            "text": super::markdown::to_mrkdwn(&item.text),
            "mrkdwn": true,
            "unfurl_links": false,
        });
        if !thread_ts.is_empty() {
            body["thread_ts"] = json!(thread_ts);
        }
        // byom's own approval request: its answer is a button away (the
        // press comes back signed, as the person who pressed it).
        if let Some(code) = byom_agent::approval::code_of_request(&item.text) {
            body["blocks"] = request_blocks(&body["text"], &code);
        }
        let r = match self.call("chat.postMessage", &body).await {
            Ok(r) => r,
            Err(HttpError::Transient(e)) => {
                return Sent::Retry {
                    error: e,
                    after: None,
                }
            }
            Err(HttpError::Permanent(e)) => return Sent::Fail(e),
        };
        if r.status == 429 || r.status >= 500 {
            return Sent::Retry {
                error: format!("HTTP {}", r.status),
                after: r.retry_after,
            };
        }
        let v = r.json();
        if v["ok"] == true {
            let ts = v["ts"].as_str().unwrap_or_default();
            return Sent::Ok(format!("{}/{ts}", v["channel"].as_str().unwrap_or(channel)));
        }
        let err = v["error"].as_str().unwrap_or("no error name").to_string();
        if TEMPORARY.contains(&err.as_str()) {
            Sent::Retry {
                error: format!("Slack: {err}"),
                after: r.retry_after,
            }
        } else {
            Sent::Fail(format!("Slack: {err} (HTTP {})", r.status))
        }
    }

    async fn test(&self) -> Result<String, String> {
        let r = self
            .call("auth.test", &json!({}))
            .await
            .map_err(|e| e.to_string())?;
        let v = r.json();
        if v["ok"] != true {
            return Err(format!(
                "Slack: {} (HTTP {})",
                v["error"].as_str().unwrap_or("no answer"),
                r.status
            ));
        }
        Ok(format!(
            "slack bot {} ({}) in {}",
            v["user"].as_str().unwrap_or("?"),
            v["user_id"].as_str().unwrap_or("?"),
            v["team"].as_str().unwrap_or("?")
        ))
    }
}

/// The bot's user ID from `auth.test`, kept for mention detection when an
/// event carries no `authorizations`.
pub async fn learn_bot_user(ch: &Channels, c: &pb::Connector) {
    let api = SlackApi::new(c);
    if let Ok(r) = api.call("auth.test", &json!({})).await {
        if let Some(u) = r.json()["user_id"].as_str() {
            let _ = ch.store.put_channel_state(&c.name, BOT_USER, u.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, ts: &str, body: &[u8]) -> String {
        let mut msg = format!("v0:{ts}:").into_bytes();
        msg.extend_from_slice(body);
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()), &msg);
        format!("v0={}", byom_wire::hex(tag.as_ref()))
    }

    #[test]
    fn signatures_and_age() {
        let body = b"{\"type\":\"event_callback\"}";
        let sig = sign("s3cret", "1700000000", body);
        assert!(verify(
            "s3cret",
            Some("1700000000"),
            Some(&sig),
            body,
            1_700_000_100
        )
        .is_ok());
        assert!(verify("other", Some("1700000000"), Some(&sig), body, 1_700_000_100).is_err());
        assert!(verify(
            "s3cret",
            Some("1700000000"),
            Some(&sig),
            b"x",
            1_700_000_100
        )
        .is_err());
        // Replayed six minutes later.
        assert!(verify(
            "s3cret",
            Some("1700000000"),
            Some(&sig),
            body,
            1_700_000_360
        )
        .is_err());
        assert!(verify("s3cret", None, Some(&sig), body, 1_700_000_000).is_err());
        assert!(verify(
            "s3cret",
            Some("1700000000"),
            Some("v1=00"),
            body,
            1_700_000_000
        )
        .is_err());
    }

    #[test]
    fn a_button_press_is_the_answer_it_stands_for() {
        let payload = json!({"type": "block_actions",
            "user": {"id": "U1", "username": "ada", "team_id": "T1"}, "team": {"id": "T1"},
            "channel": {"id": "C1"}, "message": {"ts": "9.2", "thread_ts": "9.1"},
            "actions": [{"action_id": APPROVE_ACTION, "value": "K7QX9P", "action_ts": "9.3"}]});
        let enc: String = payload
            .to_string()
            .bytes()
            .map(|b| match b {
                b' ' => "+".to_string(),
                b if b.is_ascii_alphanumeric() || b == b'_' => (b as char).to_string(),
                b => format!("%{b:02X}"),
            })
            .collect();
        let body = format!("token=x&payload={enc}");
        let ev = action_to_trigger("acme", body.as_bytes()).unwrap();
        assert_eq!(
            (ev.thread.as_str(), ev.user.as_str(), ev.text.as_str()),
            ("C1/9.1", "slack:T1/U1", "approve K7QX9P")
        );
        // Another workspace's user (Slack Connect) is external.
        let other = body.replace("%22team_id%22%3A%22T1%22", "%22team_id%22%3A%22T2%22");
        let ev = action_to_trigger("acme", other.as_bytes()).unwrap();
        assert_eq!(
            (ev.user.as_str(), ev.author_association.as_str()),
            ("slack:T2/U1", "external")
        );
        // Not a press of byom's buttons, or a code that is not one.
        for bad in [
            body.replace(APPROVE_ACTION, "other_action"),
            body.replace("K7QX9P", "K7%22"),
            body.replace("block_actions", "view_submission"),
            "payload=%7Bnot+json".to_string(),
            "no=payload".to_string(),
        ] {
            assert!(action_to_trigger("acme", bad.as_bytes()).is_none(), "{bad}");
        }
    }

    #[test]
    fn messages_threads_and_mentions() {
        let ev = json!({"type": "message", "channel": "C1", "user": "U2", "text": "hi <@UBOT>",
                        "ts": "1700.0001", "channel_type": "channel"});
        let t = event_to_trigger("team", "T1", "UBOT", &ev).unwrap();
        assert_eq!(
            (
                t.thread.as_str(),
                t.user.as_str(),
                t.mention,
                t.external_id.as_str()
            ),
            ("C1/1700.0001", "slack:T1/U2", true, "C1/1700.0001")
        );
        // A Slack Connect user speaks for their own organisation.
        let ext = json!({"type": "message", "channel": "C1", "user": "UX", "user_team": "TEXT",
                         "text": "hi", "ts": "1700.0009"});
        let t = event_to_trigger("team", "T1", "UBOT", &ext).unwrap();
        assert_eq!(t.user, "slack:TEXT/UX");
        let ev = json!({"type": "message", "channel": "D1", "user": "U2", "text": "hello",
                        "ts": "1700.0003", "thread_ts": "1700.0002", "channel_type": "im"});
        let t = event_to_trigger("team", "T1", "UBOT", &ev).unwrap();
        assert_eq!(
            (t.thread.as_str(), t.reply_to.as_str(), t.mention),
            ("D1/1700.0002", "D1/1700.0002", true)
        );
        let bot = json!({"type": "message", "subtype": "bot_message", "bot_id": "B9", "channel": "C1", "text": "deploy done", "ts": "1.2"});
        assert!(
            event_to_trigger("team", "T1", "UBOT", &bot)
                .unwrap()
                .from_bot
        );
        let own =
            json!({"type": "message", "channel": "C1", "user": "UBOT", "text": "x", "ts": "1.3"});
        assert!(event_to_trigger("team", "T1", "UBOT", &own).is_none());
        let edit =
            json!({"type": "message", "subtype": "message_changed", "channel": "C1", "ts": "1.4"});
        assert!(event_to_trigger("team", "T1", "UBOT", &edit).is_none());
    }
}
