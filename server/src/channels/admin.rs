//! The admin side of channels: connectors (add, list, show, remove, test
//! against the provider), the outbox (list, show, retry) and the routing
//! rules (show, set). JSON in, JSON out; secrets go in and never come back
//! out (`has_token` and friends say whether they are set).

use byom_protocol::pb::{self, OutboxState};
use serde_json::{json, Value};

use super::{provider, valid_name, Channels, Kind, MAX_CONNECTOR_NAME};

/// Rows in one outbox listing.
const MAX_OUTBOX_ROWS: usize = 1000;
/// Longest secret or key accepted.
const MAX_SECRET: usize = 16 * 1024;
/// Rooms, channels or users in one list.
const MAX_LIST: usize = 100;

/// Why an admin call is refused.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Exists(String),
    #[error("{0}")]
    Unavailable(String),
}

fn time(ms: u64) -> Value {
    if ms == 0 {
        Value::Null
    } else {
        json!(byom_protocol::time::rfc3339(ms))
    }
}

/// A connector as people may see it: no secrets.
pub fn view(c: &pb::Connector, pending: usize) -> Value {
    let endpoint = match c.kind.as_str() {
        "slack" => Some(format!("/slack/{}/events", c.name)),
        "github" => Some(format!("/github/{}", c.name)),
        _ => None,
    };
    json!({
        "name": c.name, "kind": c.kind, "api_url": c.api_url, "user_id": c.user_id,
        "rooms": c.rooms, "bot_login": c.bot_login, "app_id": c.app_id,
        "post_to": c.post_to, "invite_from": c.invite_from,
        "has_token": !c.token.is_empty(), "has_secret": !c.secret.is_empty(),
        "has_private_key": !c.private_key.is_empty(),
        "webhook_path": endpoint, "outbox_pending": pending,
        "interactive_path": (c.kind == "slack").then(|| format!("/slack/{}/interactive", c.name)),
        "created_at": time(c.created_at_ms),
    })
}

pub fn outbox_view(it: &pb::OutboxItem) -> Value {
    json!({
        "id": it.id, "connector": it.connector, "kind": it.kind, "thread": it.thread_id,
        "external": it.external, "reply": it.reply_id,
        "state": match it.state() {
            OutboxState::OutboxPending => "pending",
            OutboxState::OutboxSent => "sent",
            OutboxState::OutboxFailed => "failed",
            OutboxState::Unspecified => "unknown",
        },
        "attempts": it.attempts, "last_error": it.last_error, "receipt": it.receipt,
        "maybe_duplicate": it.maybe_duplicate, "created_at": time(it.created_at_ms),
        "next_attempt_at": if it.state() == OutboxState::OutboxPending { time(it.next_attempt_ms) } else { Value::Null },
        "sent_at": time(it.sent_at_ms), "text": it.text,
    })
}

fn strs(v: &Value, k: &str) -> Result<Vec<String>, OpError> {
    let list: Vec<String> = v[k]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if list.len() > MAX_LIST || list.iter().any(|s| s.is_empty() || s.len() > 255) {
        return Err(OpError::Invalid(format!(
            "{k}: at most {MAX_LIST} non-empty entries of at most 255 characters"
        )));
    }
    Ok(list)
}

fn text(v: &Value, k: &str) -> Result<String, OpError> {
    let s = v[k].as_str().unwrap_or_default().trim().to_string();
    if s.len() > MAX_SECRET {
        return Err(OpError::Invalid(format!("{k} is over {MAX_SECRET} bytes")));
    }
    Ok(s)
}

fn url(v: &Value, k: &str) -> Result<String, OpError> {
    let u = text(v, k)?;
    if !(u.is_empty() || u.starts_with("https://") || u.starts_with("http://")) {
        return Err(OpError::Invalid(format!(
            "{k} must be an http:// or https:// URL, not {u:?}"
        )));
    }
    Ok(u.trim_end_matches('/').to_string())
}

/// A new connector from the CLI's JSON, checked as far as can be without
/// asking the provider.
pub fn connector_from(v: &Value) -> Result<pb::Connector, OpError> {
    let name = text(v, "name")?;
    if !valid_name(&name) {
        return Err(OpError::Invalid(format!(
            "bad connector name {name:?}: 1 to {MAX_CONNECTOR_NAME} lower-case letters, digits, '-' or '_', starting with a letter"
        )));
    }
    let kind = Kind::parse(&text(v, "kind")?)
        .ok_or_else(|| OpError::Invalid("kind must be matrix, slack or github".into()))?;
    let c = pb::Connector {
        name,
        kind: kind.name().into(),
        created_at_ms: byom_wire::now_ms(),
        api_url: url(v, "api_url")?,
        user_id: text(v, "user_id")?,
        rooms: strs(v, "rooms")?,
        bot_login: text(v, "bot_login")?.trim_start_matches('@').to_string(),
        app_id: v["app_id"].as_u64().unwrap_or(0),
        token: text(v, "token")?,
        secret: text(v, "secret")?,
        private_key: text(v, "private_key")?,
        post_to: strs(v, "post_to")?,
        invite_from: strs(v, "invite_from")?,
    };
    let need = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(OpError::Invalid(format!(
                "a {} connector needs {what}",
                kind.name()
            )))
        }
    };
    match kind {
        Kind::Matrix => {
            need(!c.api_url.is_empty(), "--homeserver URL")?;
            need(
                c.user_id.starts_with('@') && c.user_id.contains(':'),
                "--user-id @bot:server",
            )?;
            need(!c.token.is_empty(), "--access-token-file F")?;
        }
        Kind::Slack => {
            need(!c.token.is_empty(), "--bot-token-file F")?;
            need(!c.secret.is_empty(), "--signing-secret-file F")?;
        }
        Kind::Github => {
            need(!c.secret.is_empty(), "--webhook-secret-file F")?;
            need(
                !c.token.is_empty() || (c.app_id != 0 && !c.private_key.is_empty()),
                "--token-file F, or --app-id N with --private-key-file F",
            )?;
            if !c.private_key.is_empty() {
                super::github::rsa_key(&c.private_key).map_err(OpError::Invalid)?;
            }
        }
    }
    Ok(c)
}

impl Channels {
    /// A connector as people see it, with the URL its peer posts to.
    fn shown(&self, c: &pb::Connector, pending: usize) -> Value {
        let mut v = view(c, pending);
        if let Some(p) = v["webhook_path"].as_str() {
            let (base, note) = &self.webhook_base;
            v["webhook_url"] = json!(format!("{base}{p}"));
            if let Some(i) = v["interactive_path"].as_str() {
                v["interactive_url"] = json!(format!("{base}{i}"));
            }
            if !note.is_empty() {
                v["webhook_note"] = json!(note);
            }
        }
        v
    }

    fn pending(&self, name: &str) -> usize {
        self.store
            .outbox_queue_len(name, byom_store::OUTBOX_QUEUE_LIMIT)
            .unwrap_or(0)
    }

    fn get(&self, name: &str) -> Result<pb::Connector, OpError> {
        self.store
            .get_connector(name)
            .map_err(|e| OpError::Unavailable(e.to_string()))?
            .ok_or_else(|| {
                OpError::NotFound(format!(
                    "no connector {name:?}; `byom connectors ls` lists them"
                ))
            })
    }

    /// One admin operation.
    pub async fn op(&self, op: &str, name: &str, arg: &Value) -> Result<Value, OpError> {
        let unavailable = |e: byom_store::StoreError| OpError::Unavailable(e.to_string());
        match op {
            "connector_add" => {
                let c = connector_from(arg)?;
                match self.store.create_connector(&c) {
                    Ok(()) => {}
                    // The same add again (a retry after a lost answer):
                    // the first result.
                    Err(byom_store::StoreError::Conflict(m)) => {
                        let old = self.get(&c.name)?;
                        let same = pb::Connector {
                            created_at_ms: old.created_at_ms,
                            ..c.clone()
                        };
                        if old != same {
                            return Err(OpError::Exists(m));
                        }
                        return Ok(self.shown(&old, self.pending(&old.name)));
                    }
                    Err(e) => return Err(unavailable(e)),
                }
                self.store.flush_async().await.map_err(unavailable)?;
                self.changed();
                Ok(self.shown(&c, 0))
            }
            "connector_ls" => Ok(Value::Array(
                self.store
                    .list_connectors()
                    .map_err(unavailable)?
                    .iter()
                    .map(|c| self.shown(c, self.pending(&c.name)))
                    .collect(),
            )),
            "connector_show" => {
                let c = self.get(name)?;
                Ok(self.shown(&c, self.pending(name)))
            }
            "connector_rm" => {
                let c = self.get(name)?;
                self.store.remove_connector(name).map_err(unavailable)?;
                self.store.flush_async().await.map_err(unavailable)?;
                self.changed();
                let pending = self.pending(name);
                let mut v = self.shown(&c, pending);
                v["removed"] = json!(true);
                if pending > 0 {
                    v["note"] = json!(format!(
                        "{pending} replies were still waiting to go out; they stay in the outbox and go if a connector named {name} is added again"
                    ));
                }
                Ok(v)
            }
            "connector_test" => {
                let c = self.get(name)?;
                let p = provider(&c, &self.store)
                    .ok_or_else(|| OpError::Invalid(format!("unknown kind {}", c.kind)))?;
                match p.test().await {
                    Ok(who) => {
                        if c.kind == "slack" {
                            super::slack::learn_bot_user(self, &c).await;
                        }
                        Ok(json!({"name": name, "ok": true, "identity": who}))
                    }
                    Err(e) => Ok(json!({"name": name, "ok": false, "error": e})),
                }
            }
            "outbox_ls" => {
                let failed = arg["failed"].as_bool().unwrap_or(false);
                let limit = arg["limit"]
                    .as_u64()
                    .map_or(100, |l| (l as usize).clamp(1, MAX_OUTBOX_ROWS));
                Ok(Value::Array(
                    self.store
                        .list_outbox(failed, limit)
                        .map_err(unavailable)?
                        .iter()
                        .map(outbox_view)
                        .collect(),
                ))
            }
            "outbox_show" => {
                let it = self
                    .store
                    .get_outbox(name)
                    .map_err(unavailable)?
                    .ok_or_else(|| OpError::NotFound(format!("no outbox item {name}")))?;
                Ok(outbox_view(&it))
            }
            "outbox_retry" => {
                let it = super::outbox::retry(&self.store, name).map_err(OpError::Invalid)?;
                self.store.flush_async().await.map_err(unavailable)?;
                self.outbox_ready(&it.connector);
                Ok(outbox_view(&it))
            }
            "sources_show" => {
                let (rules, error) = self.triggers.rules_text();
                Ok(json!({"rules": rules, "last_refused_edit": error}))
            }
            "sources_check" => {
                let text = arg["rules"].as_str().unwrap_or_default();
                Ok(match byom_agent::fastpath::Rules::parse(text) {
                    Ok(_) => json!({"ok": true}),
                    Err(e) => json!({"ok": false, "error": e}),
                })
            }
            "sources_set" => {
                let text = arg["rules"].as_str().unwrap_or_default();
                self.triggers.set_rules(text).map_err(|e| {
                    OpError::Invalid(format!("rules refused, the previous ones stay: {e}"))
                })?;
                self.store.flush_async().await.map_err(unavailable)?;
                Ok(json!({"rules": text, "ok": true}))
            }
            other => Err(OpError::Invalid(format!(
                "unknown channels operation {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connectors_need_their_credentials() {
        let ok = json!({"name": "team", "kind": "matrix", "api_url": "http://127.0.0.1:8008",
                        "user_id": "@bot:hs", "token": "syt_x", "rooms": ["!r:hs"]});
        let c = connector_from(&ok).unwrap();
        assert_eq!((c.kind.as_str(), c.rooms.len()), ("matrix", 1));
        let v = view(&c, 0);
        assert_eq!(v["has_token"], true);
        assert!(!v.to_string().contains("syt_x"), "secrets never come back");
        let mut bad = ok.clone();
        bad["user_id"] = json!("bot");
        assert!(connector_from(&bad)
            .unwrap_err()
            .to_string()
            .contains("--user-id"));
        let gh = json!({"name": "gh", "kind": "github", "secret": "s"});
        assert!(connector_from(&gh)
            .unwrap_err()
            .to_string()
            .contains("--token-file"));
        let gh = json!({"name": "gh", "kind": "github", "secret": "s", "app_id": 1, "private_key": "nope"});
        assert!(connector_from(&gh).unwrap_err().to_string().contains("PEM"));
        assert!(connector_from(&json!({"name": "Bad Name", "kind": "slack"})).is_err());
        assert!(connector_from(&json!({"name": "x", "kind": "irc"})).is_err());
    }
}
