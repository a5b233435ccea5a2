//! Matrix: a bot account on a homeserver, through the client-server API.
//!
//! In: one long-poll `/sync` loop per connector. The `since` token is kept
//! in the store after the batch's events are stored, and each event's ID
//! is stored with its trigger, so a restart neither misses nor repeats
//! one. The bot joins the rooms it was given and the rooms allowed users
//! invite it to. A room's main timeline is one thread (`!room:hs`); an
//! `m.thread` relation starts its own (`!room:hs/$root`).
//!
//! Out: `PUT /rooms/{room}/send/m.room.message/{txnId}` with the outbox
//! item's ID as the transaction ID, so a retried send never posts twice;
//! Markdown goes as `formatted_body` HTML.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use byom_protocol::pb;
use byom_store::Op;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::readers::{self, Readers, MAX_READERS};
use super::{Channels, Provider, Sent, PROVIDER_TIMEOUT};
use crate::http::{self, HttpError};
use crate::triggers::Ingest;

/// How long the homeserver may hold a `/sync` open.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait between failed `/sync`s.
const MAX_SYNC_BACKOFF: Duration = Duration::from_secs(30);
/// Messages per room per sync.
const TIMELINE_LIMIT: usize = 50;
/// Display names remembered per connector.
const MAX_NAMES: usize = 10_000;
const SINCE: &str = "since";

/// Percent-encodes one path segment (room IDs carry `!` and `:`).
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub struct Matrix {
    base: String,
    token: String,
    user_id: String,
}

impl Matrix {
    pub fn new(c: &pb::Connector) -> Matrix {
        Matrix {
            base: c.api_url.trim_end_matches('/').to_string(),
            token: c.token.clone(),
            user_id: c.user_id.clone(),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<http::Reply, HttpError> {
        let url = format!("{}/_matrix/client/v3{path}", self.base);
        let body = body.map(|b| b.to_string().into_bytes());
        http::request(
            method,
            &url,
            &[("authorization", format!("Bearer {}", self.token))],
            body,
            timeout,
        )
        .await
    }

    async fn join(&self, room: &str) -> Result<String, String> {
        let r = self
            .call(
                "POST",
                &format!("/join/{}", enc(room)),
                Some(&json!({})),
                PROVIDER_TIMEOUT,
            )
            .await
            .map_err(|e| e.to_string())?;
        if r.status == 200 {
            Ok(r.json()["room_id"].as_str().unwrap_or(room).to_string())
        } else {
            Err(error_text(&r))
        }
    }

    /// One field of `room`'s state event `kind` (with the empty state
    /// key); None when the room has no such event.
    async fn state_field(
        &self,
        room: &str,
        kind: &str,
        field: &str,
    ) -> Result<Option<String>, String> {
        let r = self
            .call(
                "GET",
                &format!("/rooms/{}/state/{kind}/", enc(room)),
                None,
                PROVIDER_TIMEOUT,
            )
            .await
            .map_err(|e| e.to_string())?;
        match r.status {
            200 => Ok(Some(
                r.json()[field].as_str().unwrap_or_default().to_string(),
            )),
            404 if r.json()["errcode"] == "M_NOT_FOUND" => Ok(None),
            _ => Err(error_text(&r)),
        }
    }

    /// Whether people outside the member list read `room` (why): anyone
    /// its join rule lets in without a member's act (only `invite` and
    /// `knock` need one; `restricted` admits another room's members, and
    /// a rule this version does not know counts as open), or anyone at
    /// all when its history is world readable.
    async fn open_to(&self, room: &str) -> Result<Option<String>, String> {
        // No join rule: the room is invite-only.
        let rule = self
            .state_field(room, "m.room.join_rules", "join_rule")
            .await?
            .unwrap_or_else(|| "invite".into());
        if !matches!(rule.as_str(), "invite" | "knock" | "private") {
            return Ok(Some(format!(
                "its join rule is {rule:?}: people join it without a member's invitation"
            )));
        }
        let history = self
            .state_field(room, "m.room.history_visibility", "history_visibility")
            .await?;
        Ok((history.as_deref() == Some("world_readable"))
            .then(|| "its history is world readable: anyone reads it without joining".into()))
    }

    /// Who reads `room`: anyone, when its rules say so; otherwise its
    /// joined and invited members (an invited member reads the room's
    /// history once they join), byom left out.
    async fn readers(&self, room: &str) -> Result<Readers, String> {
        if let Some(why) = self.open_to(room).await? {
            return Ok(Readers::Anyone(why));
        }
        let r = self
            .call(
                "GET",
                &format!("/rooms/{}/members", enc(room)),
                None,
                PROVIDER_TIMEOUT,
            )
            .await
            .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(error_text(&r));
        }
        let v = r.json();
        let Some(chunk) = v["chunk"].as_array() else {
            return Err("the homeserver's member list has no chunk".into());
        };
        let mut people: Vec<String> = chunk
            .iter()
            .filter(|ev| {
                matches!(
                    ev["content"]["membership"].as_str(),
                    Some("join" | "invite")
                )
            })
            .filter_map(|ev| ev["state_key"].as_str())
            .filter(|who| *who != self.user_id)
            .map(|who| format!("matrix:{who}"))
            .collect();
        people.sort();
        people.dedup();
        Ok(if people.len() > MAX_READERS {
            Readers::Many(people.len())
        } else {
            Readers::Members {
                people: people.into_iter().map(|p| (p, String::new())).collect(),
                at_ms: byom_wire::now_ms(),
            }
        })
    }

    async fn display_name(&self, user: &str) -> Option<String> {
        let r = self
            .call(
                "GET",
                &format!("/profile/{}/displayname", enc(user)),
                None,
                Duration::from_secs(5),
            )
            .await
            .ok()?;
        r.json()["displayname"].as_str().map(str::to_string)
    }
}

/// `M_CODE: message` from a Matrix error body.
fn error_text(r: &http::Reply) -> String {
    let v = r.json();
    match (v["errcode"].as_str(), v["error"].as_str()) {
        (Some(c), Some(m)) => format!("HTTP {}: {c}: {m}", r.status),
        _ => format!("HTTP {}: {}", r.status, r.snippet()),
    }
}

/// The message content for an outbox item: its text, its HTML, and its
/// thread relation.
pub fn content(item: &pb::OutboxItem) -> Value {
    let mut c = json!({
        "msgtype": "m.text",
        "body": item.text,
        "format": "org.matrix.custom.html",
        "formatted_body": super::markdown::to_html(&item.text),
    });
    if let Some((_, root)) = item.external.split_once('/') {
        c["m.relates_to"] = json!({
            "rel_type": "m.thread",
            "event_id": root,
            "is_falling_back": true,
            "m.in_reply_to": {"event_id": root},
        });
    }
    c
}

#[async_trait::async_trait]
impl Provider for Matrix {
    fn idempotent(&self) -> bool {
        true
    }

    async fn send(&self, item: &pb::OutboxItem) -> Sent {
        let room = item.external.split('/').next().unwrap_or_default();
        let path = format!("/rooms/{}/send/m.room.message/{}", enc(room), enc(&item.id));
        match self
            .call("PUT", &path, Some(&content(item)), PROVIDER_TIMEOUT)
            .await
        {
            Err(HttpError::Transient(e)) => Sent::Retry {
                error: e,
                after: None,
            },
            Err(HttpError::Permanent(e)) => Sent::Fail(e),
            Ok(r) if r.status == 200 => match r.json()["event_id"].as_str() {
                Some(id) => Sent::Ok(id.to_string()),
                None => Sent::Fail(format!("no event_id in the reply: {}", r.snippet())),
            },
            Ok(r) if r.status == 429 || r.status >= 500 => Sent::Retry {
                error: error_text(&r),
                after: r.json()["retry_after_ms"]
                    .as_u64()
                    .map(Duration::from_millis)
                    .or(r.retry_after),
            },
            Ok(r) => Sent::Fail(error_text(&r)),
        }
    }

    async fn test(&self) -> Result<String, String> {
        let r = self
            .call("GET", "/account/whoami", None, PROVIDER_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(error_text(&r));
        }
        let who = r.json()["user_id"].as_str().unwrap_or_default().to_string();
        if !self.user_id.is_empty() && who != self.user_id {
            return Err(format!(
                "the token is {who}'s, not {}'s; fix --user-id or the token",
                self.user_id
            ));
        }
        Ok(format!("matrix user {who} on {}", self.base))
    }
}

/// The sync filter: messages, memberships, reactions (an approver's ✅ on
/// a request) and who may join (a public room is read by anyone) only.
fn filter() -> String {
    json!({
        "presence": {"not_types": ["*"]},
        "account_data": {"not_types": ["*"]},
        "room": {
            "timeline": {"limit": TIMELINE_LIMIT, "types": ["m.room.message", "m.room.member", "m.reaction", "m.room.join_rules", "m.room.history_visibility"]},
            "state": {"types": ["m.room.member", "m.room.join_rules", "m.room.history_visibility"], "lazy_load_members": true},
            "ephemeral": {"not_types": ["*"]},
            "account_data": {"not_types": ["*"]},
        }
    })
    .to_string()
}

/// The text people wrote, without the quoted reply fallback clients add.
fn strip_fallback(body: &str) -> &str {
    if !body.starts_with("> ") {
        return body;
    }
    match body.find("\n\n") {
        Some(i) if body[..i].lines().all(|l| l.starts_with('>')) => &body[i + 2..],
        _ => body,
    }
}

/// What one sync needs to know about the bot.
struct Me {
    user_id: String,
    localpart: String,
    display: String,
}

impl Me {
    fn named_in(&self, body: &str) -> bool {
        let lower = body.to_lowercase();
        [&self.user_id, &self.localpart, &self.display]
            .iter()
            .filter(|n| n.chars().count() >= 3)
            .any(|n| {
                let n = n.to_lowercase();
                lower.match_indices(&n).any(|(i, _)| {
                    let before = lower[..i].chars().next_back();
                    let after = lower[i + n.len()..].chars().next();
                    !before.is_some_and(|c| c.is_alphanumeric())
                        && !after.is_some_and(|c| c.is_alphanumeric())
                })
            })
    }
}

/// A timeline event as the trigger it becomes (`None`: not a person's
/// message: the bot's own, an edit, a redaction, …).
pub fn event_to_trigger(
    connector: &str,
    room: &str,
    ev: &Value,
    me_id: &str,
    names: &HashMap<String, String>,
) -> Option<pb::SendEventRequest> {
    if ev["type"] != "m.room.message" {
        return None;
    }
    let sender = ev["sender"].as_str()?;
    if sender == me_id {
        return None;
    }
    let content = &ev["content"];
    let rel = &content["m.relates_to"];
    if rel["rel_type"] == "m.replace" {
        return None;
    }
    let event_id = ev["event_id"].as_str()?;
    let body = strip_fallback(content["body"].as_str()?);
    let thread = match (rel["rel_type"].as_str(), rel["event_id"].as_str()) {
        (Some("m.thread"), Some(root)) => format!("{room}/{root}"),
        _ => room.to_string(),
    };
    let reply_to = match rel["m.in_reply_to"]["event_id"].as_str() {
        Some(r) if rel["is_falling_back"] != true => r.to_string(),
        _ => String::new(),
    };
    let mentioned = content["m.mentions"]["user_ids"]
        .as_array()
        .is_some_and(|ids| ids.iter().any(|i| i == me_id));
    Some(pb::SendEventRequest {
        source: connector.to_string(),
        thread,
        user: format!("matrix:{sender}"),
        user_name: names.get(sender).cloned().unwrap_or_default(),
        text: body.to_string(),
        mention: mentioned,
        from_bot: content["msgtype"] == "m.notice",
        channel: room.to_string(),
        external_id: event_id.to_string(),
        reply_to,
        link: format!("https://matrix.to/#/{}/{}", enc(room), enc(event_id)),
        kind: "matrix".into(),
        ..Default::default()
    })
}

/// Long-polls `/sync` for `c` until `stop`.
pub async fn sync(ch: Arc<Channels>, c: pb::Connector, stop: CancellationToken) {
    let m = Matrix::new(&c);
    let store = &ch.store;
    let localpart = c
        .user_id
        .trim_start_matches('@')
        .split(':')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut me = Me {
        user_id: c.user_id.clone(),
        display: String::new(),
        localpart,
    };
    let mut joined = false;
    let mut names: HashMap<String, String> = HashMap::new();
    // Rooms whose readers this run has asked the homeserver about.
    let mut asked: HashSet<String> = HashSet::new();
    let mut since = store
        .channel_state(&c.name, SINCE)
        .ok()
        .flatten()
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    let mut failures = 0u32;
    let filter = filter();
    loop {
        if stop.is_cancelled() {
            return;
        }
        if !joined {
            // Until every given room is joined (the homeserver may be down).
            joined = true;
            for room in &c.rooms {
                if let Err(e) = m.join(room).await {
                    tracing::warn!(connector = c.name, room, "cannot join: {e}");
                    joined = false;
                }
            }
            if me.display.is_empty() {
                me.display = m.display_name(&me.user_id).await.unwrap_or_default();
            }
        }
        let mut path = format!(
            "/sync?timeout={}&filter={}",
            SYNC_TIMEOUT.as_millis(),
            enc(&filter)
        );
        if let Some(s) = &since {
            path.push_str(&format!("&since={}", enc(s)));
        }
        let poll = m.call("GET", &path, None, SYNC_TIMEOUT + PROVIDER_TIMEOUT);
        let r = tokio::select! {
            _ = stop.cancelled() => return,
            r = poll => r,
        };
        let body = match r {
            Ok(r) if r.status == 200 => r.json(),
            Ok(r) => {
                failures += 1;
                tracing::warn!(connector = c.name, "sync failed: {}", error_text(&r));
                Value::Null
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(connector = c.name, "sync failed: {e}");
                Value::Null
            }
        };
        let Some(next) = body["next_batch"].as_str().map(str::to_string) else {
            let wait = Duration::from_secs(1 << failures.min(5)).min(MAX_SYNC_BACKOFF);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            joined = false;
            continue;
        };
        failures = 0;
        // The first sync ever brings history: the bot listens from the
        // moment it was connected, it does not answer what came before.
        let first = since.is_none();
        handle_invites(&ch, &c, &m, &body).await;
        let mut stored_all = true;
        if let Some(rooms) = body["rooms"]["join"].as_object() {
            for (room, r) in rooms {
                learn_names(&mut names, &r["state"]["events"]);
                learn_names(&mut names, &r["timeline"]["events"]);
                // Anyone may join (and read) a public room, whoever spoke.
                if let Some(public) = public_room(&r["state"]["events"])
                    .or_else(|| public_room(&r["timeline"]["events"]))
                {
                    if let Err(e) = super::note_public(store, &c.name, room, public) {
                        tracing::warn!(connector = c.name, "cannot note who reads {room}: {e}");
                        stored_all = false;
                    }
                }
                // Who reads the room: asked again whenever its membership
                // or rules move, once by every run of this loop (what an
                // older version noted may not say everything), and until
                // the homeserver has said once (the gate on posts holds a
                // room it knows nothing of).
                let moved = moves_readers(&r["state"]["events"])
                    || moves_readers(&r["timeline"]["events"])
                    || !asked.contains(room.as_str());
                let known = readers::get(store, &c.name, room);
                if moved || !matches!(known, Ok(Some(ref r)) if !matches!(r, Readers::Unknown(_))) {
                    // A failed ask is noted as such (the gate holds the
                    // room) and asked again with the next batch.
                    let who = m.readers(room).await.unwrap_or_else(|e| {
                        tracing::warn!(connector = c.name, "cannot ask who reads {room}: {e}");
                        Readers::Unknown(e)
                    });
                    let failed = matches!(who, Readers::Unknown(_));
                    if let Err(e) = readers::note(store, &c.name, room, &who) {
                        tracing::warn!(connector = c.name, "cannot note who reads {room}: {e}");
                        stored_all = false;
                    } else if !failed && asked.len() < MAX_NAMES {
                        asked.insert(room.clone());
                    }
                }
                // A room made as direct (the inviter's word) is a direct
                // conversation with its author only while the homeserver
                // says nobody else is in it: whoever else is there reads
                // what is said, and may have asked for it.
                let dm_room = store
                    .channel_state(&c.name, &format!("dm/{room}"))
                    .ok()
                    .flatten()
                    .is_some();
                let alone_with = match dm_room.then(|| readers::get(store, &c.name, room)) {
                    Some(Ok(Some(Readers::Members { people, .. }))) if people.len() == 1 => {
                        people.first().map(|(p, _)| p.clone())
                    }
                    _ => None,
                };
                for ev in r["timeline"]["events"].as_array().into_iter().flatten() {
                    if first && ev["origin_server_ts"].as_u64().unwrap_or(0) < c.created_at_ms {
                        continue;
                    }
                    if let Some(sender) = ev["sender"].as_str() {
                        if !names.contains_key(sender) && names.len() < MAX_NAMES {
                            let n = m.display_name(sender).await.unwrap_or_default();
                            names.insert(sender.to_string(), n);
                        }
                    }
                    let t = event_to_trigger(&c.name, room, ev, &me.user_id, &names)
                        .or_else(|| reaction_answer(&ch, &c.name, room, ev, &me.user_id, &names));
                    let Some(mut t) = t else {
                        continue;
                    };
                    let direct = alone_with.as_deref() == Some(t.user.as_str());
                    t.mention |= direct || me.named_in(&t.text) || replies_to_bot(&ch, &c.name, &t);
                    let opts = Ingest {
                        direct,
                        ..Ingest::default()
                    };
                    if let Err(e) = ch.triggers.ingest_with(t, opts).await {
                        // The since token is not advanced: the batch comes
                        // again and what was stored is recognised.
                        tracing::warn!(connector = c.name, "cannot store a message: {e}");
                        stored_all = false;
                    }
                }
            }
        }
        if !stored_all {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        match store.batch(&[Op::channel_state(&c.name, SINCE, next.as_bytes())]) {
            Ok(()) => since = Some(next),
            Err(e) => tracing::warn!(connector = c.name, "cannot keep the sync token: {e}"),
        }
    }
}

/// Reactions that answer a request: ✅ 👍 ✔ ☑ approve, ❌ 👎 🚫 ✖ deny.
const APPROVE_KEYS: [&str; 4] = ["✅", "👍", "✔", "☑"];
const DENY_KEYS: [&str; 4] = ["❌", "👎", "🚫", "✖"];

/// A reaction to one of byom's approval requests, as the answer it stands
/// for (`approve CODE` / `deny CODE`), from whoever reacted (Matrix's
/// verified `sender`), on the request's thread: the core then checks it
/// like any answer (an approver, after the request, once). Any other
/// reaction, or one the store cannot place, is not an answer.
fn reaction_answer(
    ch: &Channels,
    connector: &str,
    room: &str,
    ev: &Value,
    me_id: &str,
    names: &HashMap<String, String>,
) -> Option<pb::SendEventRequest> {
    if ev["type"] != "m.reaction" {
        return None;
    }
    let sender = ev["sender"].as_str()?;
    let event_id = ev["event_id"].as_str()?;
    let rel = &ev["content"]["m.relates_to"];
    if sender == me_id || rel["rel_type"] != "m.annotation" {
        return None;
    }
    let key = rel["key"].as_str()?.trim_end_matches('\u{fe0f}');
    let verb = if APPROVE_KEYS.contains(&key) {
        "approve"
    } else if DENY_KEYS.contains(&key) {
        "deny"
    } else {
        return None;
    };
    let target = rel["event_id"].as_str()?;
    let reply = ch.store.channel_message(connector, target).ok()??;
    let reply = ch.store.get_trigger(&reply).ok()??;
    if !crate::triggers::is_own_reply(&reply) {
        return None;
    }
    let code = byom_agent::approval::code_of_request(&reply.text)?;
    let thread = ch.store.get_thread(&reply.thread_id).ok()??;
    Some(pb::SendEventRequest {
        source: connector.to_string(),
        thread: thread.external,
        user: format!("matrix:{sender}"),
        user_name: names.get(sender).cloned().unwrap_or_default(),
        text: format!("{verb} {code}"),
        channel: room.to_string(),
        external_id: event_id.to_string(),
        link: format!("https://matrix.to/#/{}/{}", enc(room), enc(event_id)),
        kind: "matrix".into(),
        ..Default::default()
    })
}

fn replies_to_bot(ch: &Channels, connector: &str, t: &pb::SendEventRequest) -> bool {
    if t.reply_to.is_empty() {
        return false;
    }
    ch.store
        .channel_message(connector, &t.reply_to)
        .ok()
        .flatten()
        .and_then(|id| ch.store.get_trigger(&id).ok().flatten())
        .is_some_and(|r| crate::triggers::is_own_reply(&r))
}

/// Whether the room's latest join rule in `events` lets anyone in.
fn public_room(events: &Value) -> Option<bool> {
    events
        .as_array()?
        .iter()
        .rev()
        .find(|e| e["type"] == "m.room.join_rules")
        .map(|e| e["content"]["join_rule"] == "public")
}

/// Whether `events` change who may read the room: its members, its join
/// rule or its history's visibility.
fn moves_readers(events: &Value) -> bool {
    events.as_array().is_some_and(|a| {
        a.iter().any(|e| {
            matches!(
                e["type"].as_str(),
                Some("m.room.member" | "m.room.join_rules" | "m.room.history_visibility")
            )
        })
    })
}

fn learn_names(names: &mut HashMap<String, String>, events: &Value) {
    for ev in events.as_array().into_iter().flatten() {
        if ev["type"] != "m.room.member" || names.len() >= MAX_NAMES {
            continue;
        }
        if let (Some(who), Some(n)) = (
            ev["state_key"].as_str(),
            ev["content"]["displayname"].as_str(),
        ) {
            names.insert(who.to_string(), n.to_string());
        }
    }
}

/// Joins rooms allowed users invite the bot to.
async fn handle_invites(ch: &Channels, c: &pb::Connector, m: &Matrix, body: &Value) {
    let Some(invites) = body["rooms"]["invite"].as_object() else {
        return;
    };
    for (room, r) in invites {
        let invite = r["invite_state"]["events"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| {
                e["type"] == "m.room.member"
                    && e["state_key"] == c.user_id.as_str()
                    && e["content"]["membership"] == "invite"
            });
        let Some(invite) = invite else { continue };
        let inviter = invite["sender"].as_str().unwrap_or_default();
        let allowed = c.invite_from.iter().any(|u| u == inviter || u == "*")
            || c.rooms.iter().any(|x| x == room);
        if !allowed {
            tracing::info!(
                connector = c.name,
                room,
                inviter,
                "invitation ignored: inviter not in --invite-from"
            );
            continue;
        }
        match m.join(room).await {
            Ok(_) => {
                tracing::info!(connector = c.name, room, inviter, "joined on invitation");
                if invite["content"]["is_direct"] == true {
                    let _ = ch
                        .store
                        .put_channel_state(&c.name, &format!("dm/{room}"), b"1");
                }
            }
            Err(e) => tracing::warn!(connector = c.name, room, "cannot join on invitation: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(body: &str, rel: Value) -> Value {
        json!({"type": "m.room.message", "sender": "@ada:hs", "event_id": "$e1",
               "content": {"msgtype": "m.text", "body": body, "m.relates_to": rel,
                           "m.mentions": {"user_ids": ["@bot:hs"]}}})
    }

    #[test]
    fn events_map_to_threads_mentions_and_replies() {
        let names = HashMap::from([("@ada:hs".to_string(), "Ada".to_string())]);
        let t =
            event_to_trigger("team", "!r:hs", &msg("hi", Value::Null), "@bot:hs", &names).unwrap();
        assert_eq!(
            (
                t.thread.as_str(),
                t.user.as_str(),
                t.user_name.as_str(),
                t.mention
            ),
            ("!r:hs", "matrix:@ada:hs", "Ada", true)
        );
        assert_eq!(t.link, "https://matrix.to/#/%21r%3Ahs/%24e1");
        let t = event_to_trigger(
            "team",
            "!r:hs",
            &msg(
                "in thread",
                json!({"rel_type": "m.thread", "event_id": "$root",
                "is_falling_back": true, "m.in_reply_to": {"event_id": "$root"}}),
            ),
            "@bot:hs",
            &names,
        )
        .unwrap();
        assert_eq!(
            (t.thread.as_str(), t.reply_to.as_str()),
            ("!r:hs/$root", "")
        );
        let t = event_to_trigger(
            "team",
            "!r:hs",
            &msg(
                "> <@bot:hs> earlier\n\nand now",
                json!({"m.in_reply_to": {"event_id": "$b"}}),
            ),
            "@bot:hs",
            &names,
        )
        .unwrap();
        assert_eq!((t.text.as_str(), t.reply_to.as_str()), ("and now", "$b"));
        // Edits and the bot's own messages are not new messages.
        assert!(event_to_trigger(
            "team",
            "!r:hs",
            &msg("x", json!({"rel_type": "m.replace"})),
            "@bot:hs",
            &names
        )
        .is_none());
        assert!(
            event_to_trigger("team", "!r:hs", &msg("x", Value::Null), "@ada:hs", &names).is_none()
        );
    }

    #[test]
    fn names_match_whole_words() {
        let me = Me {
            user_id: "@byom:hs".into(),
            localpart: "byom".into(),
            display: "Byom Bot".into(),
        };
        assert!(me.named_in("hey byom, check this"));
        assert!(me.named_in("Byom Bot: hi"));
        assert!(!me.named_in("byomd is running"));
    }

    #[test]
    fn thread_replies_carry_the_relation() {
        let it = pb::OutboxItem {
            external: "!r:hs/$root".into(),
            text: "**ok**".into(),
            ..Default::default()
        };
        let c = content(&it);
        assert_eq!(c["m.relates_to"]["rel_type"], "m.thread");
        assert_eq!(c["m.relates_to"]["event_id"], "$root");
        assert_eq!(c["formatted_body"], "<p><strong>ok</strong></p>");
        let it = pb::OutboxItem {
            external: "!r:hs".into(),
            ..it
        };
        assert!(content(&it).get("m.relates_to").is_none());
    }
}
