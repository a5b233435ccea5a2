//! Channels: the connectors that put the agent where the team talks
//! (Matrix, Slack, GitHub) and the durable way out.
//!
//! Connectors are records in the store, managed at runtime
//! ([`admin::op`]); [`Channels::supervise`] keeps one set of tasks per
//! connector running (Matrix's `/sync` long-poll, every connector's
//! outbox delivery) and restarts them when a record changes. Inbound
//! webhooks (Slack's Events API, GitHub's webhooks) arrive on the webhook
//! port ([`crate::webhook`]) and end in [`crate::triggers::Triggers`]. Each
//! provider maps its messages to triggers (thread, `kind:id` user with a
//! display name, mention, the message replied to, text, a link back) and
//! sends outbox items ([`Provider`]).

pub mod admin;
pub mod github;
pub mod inbound;
pub mod markdown;
pub mod matrix;
pub mod outbox;
pub mod readers;
pub mod slack;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use byom_protocol::pb;
use byom_store::Store;
use prost::Message;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::triggers::Triggers;

/// How often the supervisor looks for added, changed or removed
/// connectors (an admin change also wakes it at once).
const SUPERVISE_EVERY: Duration = Duration::from_secs(2);
/// Longest a provider call may take.
pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest connector name.
pub const MAX_CONNECTOR_NAME: usize = 64;

/// The kinds of connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Matrix,
    Slack,
    Github,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "matrix" => Some(Kind::Matrix),
            "slack" => Some(Kind::Slack),
            "github" => Some(Kind::Github),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Kind::Matrix => "matrix",
            Kind::Slack => "slack",
            Kind::Github => "github",
        }
    }
}

/// Connector names are URL path segments and thread sources.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_CONNECTOR_NAME
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_".contains(&b))
}

/// The channel a thread is in: the room, Slack channel or repository its
/// external name starts with.
pub fn thread_channel<'a>(kind: &str, external: &'a str) -> &'a str {
    let cut = match kind {
        "github" => external.find(['#', '@']),
        "matrix" | "slack" => external.find('/'),
        _ => None,
    };
    cut.map_or(external, |i| &external[..i])
}

/// The channel state under which a connector's channel (a GitHub
/// repository, a Slack channel) is kept as read by anyone outside the
/// team: a public repository, a channel shared with another organisation.
pub fn public_key(channel: &str) -> String {
    format!("public/{channel}")
}

/// Records whether `channel` of `connector` is read by people outside the
/// team, as the provider's payload said (written only when it changes).
pub fn note_public(
    store: &byom_store::Store,
    connector: &str,
    channel: &str,
    public: bool,
) -> Result<(), byom_store::StoreError> {
    let key = public_key(channel);
    let now: &[u8] = if public { b"1" } else { b"0" };
    if store.channel_state(connector, &key)?.as_deref() != Some(now) {
        store.batch(&[byom_store::Op::channel_state(connector, &key, now)])?;
    }
    Ok(())
}

/// Whether `channel` of `connector` was last said to be read by people
/// outside the team.
pub fn is_public(
    store: &byom_store::Store,
    connector: &str,
    channel: &str,
) -> Result<bool, byom_store::StoreError> {
    Ok(store
        .channel_state(connector, &public_key(channel))?
        .as_deref()
        == Some(b"1"))
}

/// What a send came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Sent {
    /// Posted; the provider's message ID.
    Ok(String),
    /// Try again (after the provider's pause, if it named one).
    Retry {
        error: String,
        after: Option<Duration>,
    },
    /// Will never work as it is (the error says why).
    Fail(String),
}

/// One provider's way out, and its credential check.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// A retried send never posts twice (Matrix transaction IDs).
    fn idempotent(&self) -> bool;
    async fn send(&self, item: &pb::OutboxItem) -> Sent;
    /// Checks the credentials; says who they are.
    async fn test(&self) -> Result<String, String>;
}

pub fn provider(c: &pb::Connector, store: &Store) -> Option<Arc<dyn Provider>> {
    Some(match Kind::parse(&c.kind)? {
        Kind::Matrix => Arc::new(matrix::Matrix::new(c)),
        Kind::Slack => Arc::new(slack::SlackApi::new(c)),
        Kind::Github => Arc::new(github::GithubApi::new(c, store.clone())),
    })
}

/// The connectors' running tasks.
pub struct Channels {
    pub store: Store,
    pub triggers: Triggers,
    pub shutdown: CancellationToken,
    /// Connector → (its record's bytes when started, its tasks' token, its
    /// outbox's wake-up).
    running: Mutex<HashMap<String, Running>>,
    changed: Notify,
    /// Whether this server runs the connectors: always alone; with
    /// replicas, only the one that holds the agents' lease, so no message
    /// is fetched or sent by two.
    active: std::sync::atomic::AtomicBool,
    /// Where peers reach the webhook port (`https://HOST:PORT`), and what
    /// stands in their way (empty: nothing): what `connectors add` tells
    /// the operator to register.
    pub webhook_base: (String, String),
}

struct Running {
    record: Vec<u8>,
    stop: CancellationToken,
    outbox: Arc<Notify>,
}

impl Channels {
    pub fn new(
        store: Store,
        triggers: Triggers,
        shutdown: CancellationToken,
        webhook_base: (String, String),
    ) -> Arc<Channels> {
        Arc::new(Channels {
            store,
            triggers,
            shutdown,
            webhook_base,
            running: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            active: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Runs (or stops) this server's connectors.
    pub fn set_active(&self, active: bool) {
        self.active
            .store(active, std::sync::atomic::Ordering::SeqCst);
        self.changed();
    }

    /// Connectors were added, changed or removed: look now.
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    /// New outbox items for `connector`.
    pub fn outbox_ready(&self, connector: &str) {
        if let Ok(r) = self.running.lock() {
            if let Some(r) = r.get(connector) {
                r.outbox.notify_one();
            }
        }
    }

    /// Keeps each stored connector's tasks running, until shutdown.
    pub async fn supervise(self: Arc<Self>) {
        loop {
            self.reconcile();
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(SUPERVISE_EVERY) => {}
            }
        }
        if let Ok(r) = self.running.lock() {
            for run in r.values() {
                run.stop.cancel();
            }
        }
    }

    fn reconcile(self: &Arc<Self>) {
        if !self.active.load(std::sync::atomic::Ordering::SeqCst) {
            if let Ok(mut r) = self.running.lock() {
                for (_, run) in r.drain() {
                    run.stop.cancel();
                }
            }
            return;
        }
        let connectors = match self.store.list_connectors() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("cannot read the connectors: {e}");
                return;
            }
        };
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        running.retain(|name, run| {
            let keep = connectors
                .iter()
                .any(|c| &c.name == name && c.encode_to_vec() == run.record);
            if !keep {
                run.stop.cancel();
            }
            keep
        });
        for c in connectors {
            if running.contains_key(&c.name) {
                continue;
            }
            let Some(p) = provider(&c, &self.store) else {
                tracing::warn!(connector = c.name, kind = c.kind, "unknown connector kind");
                continue;
            };
            let stop = self.shutdown.child_token();
            let wake = Arc::new(Notify::new());
            tracing::info!(connector = c.name, kind = c.kind, "connector started");
            tokio::spawn(outbox::deliver(
                self.store.clone(),
                c.name.clone(),
                p,
                wake.clone(),
                stop.clone(),
            ));
            if c.kind == Kind::Matrix.name() {
                tokio::spawn(matrix::sync(self.clone(), c.clone(), stop.clone()));
            }
            running.insert(
                c.name.clone(),
                Running {
                    record: c.encode_to_vec(),
                    stop,
                    outbox: wake,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// JSON trees built from the keys the providers' payloads use, so the
    /// mappers meet near-misses of real payloads, not only noise.
    fn payload() -> impl Strategy<Value = Value> {
        let keys = prop::sample::select(vec![
            "type",
            "event",
            "subtype",
            "channel",
            "ts",
            "thread_ts",
            "user",
            "bot_id",
            "text",
            "channel_type",
            "user_profile",
            "sender",
            "event_id",
            "content",
            "body",
            "msgtype",
            "m.relates_to",
            "rel_type",
            "m.in_reply_to",
            "m.mentions",
            "user_ids",
            "action",
            "repository",
            "full_name",
            "issue",
            "number",
            "comment",
            "login",
            "pull_request",
            "review",
            "state",
            "check_run",
            "workflow_run",
            "pull_requests",
            "head_branch",
            "conclusion",
            "id",
            "in_reply_to_id",
            "organization",
            "is_falling_back",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z@!$#:./ ]{0,12}".prop_map(Value::from),
            prop::sample::select(vec![
                "message",
                "m.room.message",
                "m.thread",
                "created",
                "completed",
                "failure",
                "app_mention"
            ])
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 64, 8, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(keys.clone(), inner, 0..6).prop_map(|m| {
                    Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                }),
            ]
        })
    }

    proptest! {
        /// Whatever a provider (or an attacker with a valid signature)
        /// sends: a trigger or nothing, never a panic.
        #[test]
        fn any_payload_maps_or_is_dropped(p in payload(), event in "[a-z_]{0,20}") {
            let _ = matrix::event_to_trigger("m", "!r:hs", &p, "@bot:hs", &Default::default());
            let _ = matrix::event_to_trigger("m", "!r:hs", &p["event"], "@bot:hs", &Default::default());
            let _ = slack::event_to_trigger("s", "T1", "UBOT", &p);
            let _ = slack::event_to_trigger("s", "T1", "UBOT", &p["event"]);
            for e in [event.as_str(), "issue_comment", "issues", "pull_request", "pull_request_review",
                      "pull_request_review_comment", "check_run", "check_suite", "workflow_run"] {
                let _ = github::event_to_trigger("g", e, "d1", &p, "bot");
            }
        }

        /// A Slack signature verifies only for its body, secret and time.
        #[test]
        fn slack_signatures_bind_body_and_time(body in prop::collection::vec(any::<u8>(), 0..200),
                                               other in prop::collection::vec(any::<u8>(), 0..200),
                                               skew in 0u64..1000) {
            use ring::hmac;
            let ts = 1_700_000_000u64;
            let mut msg = format!("v0:{ts}:").into_bytes();
            msg.extend_from_slice(&body);
            let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, b"sec"), &msg);
            let sig = format!("v0={}", byom_wire::hex(tag.as_ref()));
            let r = slack::verify("sec", Some(&ts.to_string()), Some(&sig), &other, ts + skew);
            prop_assert_eq!(r.is_ok(), other == body && skew <= 300);
        }
    }

    #[test]
    fn names_and_channels() {
        assert!(valid_name("team") && valid_name("gh-main_2"));
        for bad in ["", "Team", "1x", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert_eq!(thread_channel("github", "acme/app#12"), "acme/app");
        assert_eq!(thread_channel("github", "acme/app@main"), "acme/app");
        assert_eq!(thread_channel("matrix", "!r:hs/$ev"), "!r:hs");
        assert_eq!(thread_channel("matrix", "!r:hs"), "!r:hs");
        assert_eq!(thread_channel("slack", "C1/1700.1"), "C1");
        assert_eq!(thread_channel("cli", "x/y"), "x/y");
    }
}
