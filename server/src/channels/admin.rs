//! The admin side of channels: connectors (add, list, show, remove, test
//! against the provider), the outbox (list, show, retry) and the routing
//! rules (show, set). Secrets go in and never come back out (`has_token`
//! and friends say whether they are set).

use byom_protocol::pb;

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

/// A connector as people may see it: no secrets.
pub fn view(c: &pb::Connector, pending: usize) -> pb::ConnectorView {
    let webhook_path = match c.kind.as_str() {
        "slack" => Some(format!("/slack/{}/events", c.name)),
        "github" => Some(format!("/github/{}", c.name)),
        _ => None,
    };
    pb::ConnectorView {
        name: c.name.clone(),
        kind: c.kind.clone(),
        api_url: c.api_url.clone(),
        user_id: c.user_id.clone(),
        rooms: c.rooms.clone(),
        bot_login: c.bot_login.clone(),
        app_id: c.app_id,
        post_to: c.post_to.clone(),
        invite_from: c.invite_from.clone(),
        has_token: !c.token.is_empty(),
        has_secret: !c.secret.is_empty(),
        has_private_key: !c.private_key.is_empty(),
        webhook_path,
        interactive_path: (c.kind == "slack").then(|| format!("/slack/{}/interactive", c.name)),
        outbox_pending: pending as u64,
        created_at_ms: c.created_at_ms,
        ..Default::default()
    }
}

fn strs(k: &str, list: Vec<String>) -> Result<Vec<String>, OpError> {
    let list: Vec<String> = list.into_iter().map(|s| s.trim().to_string()).collect();
    if list.len() > MAX_LIST || list.iter().any(|s| s.is_empty() || s.len() > 255) {
        return Err(OpError::Invalid(format!(
            "{k}: at most {MAX_LIST} non-empty entries of at most 255 characters"
        )));
    }
    Ok(list)
}

fn text(k: &str, s: String) -> Result<String, OpError> {
    let s = s.trim().to_string();
    if s.len() > MAX_SECRET {
        return Err(OpError::Invalid(format!("{k} is over {MAX_SECRET} bytes")));
    }
    Ok(s)
}

fn url(k: &str, u: String) -> Result<String, OpError> {
    let u = text(k, u)?;
    if !(u.is_empty() || u.starts_with("https://") || u.starts_with("http://")) {
        return Err(OpError::Invalid(format!(
            "{k} must be an http:// or https:// URL, not {u:?}"
        )));
    }
    Ok(u.trim_end_matches('/').to_string())
}

/// A new connector from the API, checked as far as can be without asking
/// the provider.
pub fn connector_from(v: pb::Connector) -> Result<pb::Connector, OpError> {
    let name = text("name", v.name)?;
    if !valid_name(&name) {
        return Err(OpError::Invalid(format!(
            "bad connector name {name:?}: 1 to {MAX_CONNECTOR_NAME} lower-case letters, digits, '-' or '_', starting with a letter"
        )));
    }
    let kind = Kind::parse(&text("kind", v.kind)?)
        .ok_or_else(|| OpError::Invalid("kind must be matrix, slack or github".into()))?;
    let c = pb::Connector {
        name,
        kind: kind.name().into(),
        created_at_ms: byom_wire::now_ms(),
        api_url: url("api_url", v.api_url)?,
        user_id: text("user_id", v.user_id)?,
        rooms: strs("rooms", v.rooms)?,
        bot_login: text("bot_login", v.bot_login)?
            .trim_start_matches('@')
            .to_string(),
        app_id: v.app_id,
        token: text("token", v.token)?,
        secret: text("secret", v.secret)?,
        private_key: text("private_key", v.private_key)?,
        post_to: strs("post_to", v.post_to)?,
        invite_from: strs("invite_from", v.invite_from)?,
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
    fn shown(&self, c: &pb::Connector, pending: usize) -> pb::ConnectorView {
        let mut v = view(c, pending);
        if let Some(p) = &v.webhook_path {
            let (base, note) = &self.webhook_base;
            v.webhook_url = Some(format!("{base}{p}"));
            v.interactive_url = v.interactive_path.as_ref().map(|i| format!("{base}{i}"));
            if !note.is_empty() {
                v.webhook_note = Some(note.clone());
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
            .map_err(unavailable)?
            .ok_or_else(|| {
                OpError::NotFound(format!(
                    "no connector {name:?}; `byom connectors ls` lists them"
                ))
            })
    }

    pub async fn add_connector(&self, c: pb::Connector) -> Result<pb::ConnectorView, OpError> {
        let c = connector_from(c)?;
        match self.store.create_connector(&c) {
            Ok(()) => {}
            // The same add again (a retry after a lost answer): the first
            // result.
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

    pub fn list_connectors(&self) -> Result<Vec<pb::ConnectorView>, OpError> {
        Ok(self
            .store
            .list_connectors()
            .map_err(unavailable)?
            .iter()
            .map(|c| self.shown(c, self.pending(&c.name)))
            .collect())
    }

    pub fn get_connector(&self, name: &str) -> Result<pb::ConnectorView, OpError> {
        let c = self.get(name)?;
        Ok(self.shown(&c, self.pending(name)))
    }

    pub async fn remove_connector(&self, name: &str) -> Result<pb::ConnectorView, OpError> {
        let c = self.get(name)?;
        self.store.remove_connector(name).map_err(unavailable)?;
        self.store.flush_async().await.map_err(unavailable)?;
        self.changed();
        let pending = self.pending(name);
        let mut v = self.shown(&c, pending);
        v.removed = true;
        if pending > 0 {
            v.note = Some(format!(
                "{pending} replies were still waiting to go out; they stay in the outbox and go if a connector named {name} is added again"
            ));
        }
        Ok(v)
    }

    pub async fn test_connector(&self, name: &str) -> Result<pb::ConnectorTest, OpError> {
        let c = self.get(name)?;
        let p = provider(&c, &self.store)
            .ok_or_else(|| OpError::Invalid(format!("unknown kind {}", c.kind)))?;
        Ok(match p.test().await {
            Ok(who) => {
                if c.kind == "slack" {
                    super::slack::learn_bot_user(self, &c).await;
                }
                pb::ConnectorTest {
                    name: name.to_string(),
                    ok: true,
                    identity: Some(who),
                    error: None,
                }
            }
            Err(e) => pb::ConnectorTest {
                name: name.to_string(),
                ok: false,
                identity: None,
                error: Some(e),
            },
        })
    }

    pub fn list_outbox(&self, failed: bool, limit: u32) -> Result<Vec<pb::OutboxItem>, OpError> {
        let limit = if limit == 0 {
            100
        } else {
            (limit as usize).min(MAX_OUTBOX_ROWS)
        };
        self.store.list_outbox(failed, limit).map_err(unavailable)
    }

    pub fn get_outbox(&self, id: &str) -> Result<pb::OutboxItem, OpError> {
        self.store
            .get_outbox(id)
            .map_err(unavailable)?
            .ok_or_else(|| OpError::NotFound(format!("no outbox item {id}")))
    }

    pub async fn retry_outbox(&self, id: &str) -> Result<pb::OutboxItem, OpError> {
        let it = super::outbox::retry(&self.store, id).map_err(OpError::Invalid)?;
        self.store.flush_async().await.map_err(unavailable)?;
        self.outbox_ready(&it.connector);
        Ok(it)
    }

    pub fn sources(&self) -> pb::Sources {
        let (rules, error) = self.triggers.rules_text();
        pb::Sources {
            rules,
            last_refused_edit: error,
        }
    }

    pub fn check_sources(rules: &str) -> pb::SourcesCheck {
        match byom_agent::fastpath::Rules::parse(rules) {
            Ok(_) => pb::SourcesCheck {
                ok: true,
                error: None,
            },
            Err(e) => pb::SourcesCheck {
                ok: false,
                error: Some(e.to_string()),
            },
        }
    }

    pub async fn set_sources(&self, rules: &str) -> Result<pb::Sources, OpError> {
        self.triggers
            .set_rules(rules)
            .map_err(|e| OpError::Invalid(format!("rules refused, the previous ones stay: {e}")))?;
        self.store.flush_async().await.map_err(unavailable)?;
        Ok(pb::Sources {
            rules: rules.to_string(),
            last_refused_edit: String::new(),
        })
    }
}

fn unavailable(e: byom_store::StoreError) -> OpError {
    OpError::Unavailable(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connectors_need_their_credentials() {
        let s = |x: &str| x.to_string();
        let ok = pb::Connector {
            name: s("team"),
            kind: s("matrix"),
            api_url: s("http://127.0.0.1:8008"),
            user_id: s("@bot:hs"),
            token: s("syt_x"),
            rooms: vec![s("!r:hs")],
            ..Default::default()
        };
        let c = connector_from(ok.clone()).unwrap();
        assert_eq!((c.kind.as_str(), c.rooms.len()), ("matrix", 1));
        let v = view(&c, 0);
        assert!(v.has_token);
        assert!(
            !format!("{v:?}").contains("syt_x"),
            "secrets never come back"
        );
        let bad = pb::Connector {
            user_id: s("bot"),
            ..ok.clone()
        };
        assert!(connector_from(bad)
            .unwrap_err()
            .to_string()
            .contains("--user-id"));
        let gh = pb::Connector {
            name: s("gh"),
            kind: s("github"),
            secret: s("s"),
            ..Default::default()
        };
        assert!(connector_from(gh.clone())
            .unwrap_err()
            .to_string()
            .contains("--token-file"));
        let gh = pb::Connector {
            app_id: 1,
            private_key: s("nope"),
            ..gh
        };
        assert!(connector_from(gh).unwrap_err().to_string().contains("PEM"));
        let named = |name: &str, kind: &str| pb::Connector {
            name: s(name),
            kind: s(kind),
            ..Default::default()
        };
        assert!(connector_from(named("Bad Name", "slack")).is_err());
        assert!(connector_from(named("x", "irc")).is_err());
        let long = pb::Connector {
            rooms: vec![String::new()],
            ..ok
        };
        assert!(connector_from(long).is_err(), "empty entries are refused");
    }
}
