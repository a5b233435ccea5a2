//! GitHub: webhooks in (`POST /github/NAME` on the webhook port), the REST
//! API out (issue and PR comments), with a token or as a GitHub App.
//!
//! In: `X-Hub-Signature-256` is checked over the raw body, deliveries are
//! recognised by `X-GitHub-Delivery`, `ping` is answered. One thread per
//! issue or PR (`owner/repo#N`); a failed CI run (`check_run`,
//! `check_suite`, `workflow_run`) lands on its PR's thread, else on its
//! branch's (`owner/repo@branch`). Every other event is stored, ignored,
//! with the reason.
//!
//! Out: `POST /repos/{owner}/{repo}/issues/{n}/comments`. A GitHub App
//! signs a JWT (RS256) with its key, trades it for the repository's
//! installation token and renews that before it expires. Rate limits
//! (`retry-after`, `x-ratelimit-remaining: 0` with `x-ratelimit-reset`)
//! pause the connector's outbox until GitHub says.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use byom_protocol::pb;
use byom_store::Store;
use serde_json::{json, Value};

use super::{Provider, Sent, PROVIDER_TIMEOUT};
use crate::http::{self, HttpError};

pub const DEFAULT_API: &str = "https://api.github.com";
/// Installation tokens are renewed this long before they expire.
const RENEW_BEFORE: Duration = Duration::from_secs(300);
/// CI conclusions that need someone's attention.
const FAILED: [&str; 5] = [
    "failure",
    "timed_out",
    "cancelled",
    "action_required",
    "startup_failure",
];

/// An event as a trigger, and why it is only stored when it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped {
    pub ev: pb::SendEventRequest,
    pub ignore: Option<String>,
    /// The comment it carries (`comment/ID`), for replies pointing at it.
    pub comment: Option<String>,
}

fn login_is(login: &str, bot: &str) -> bool {
    !bot.is_empty()
        && (login.eq_ignore_ascii_case(bot)
            || login
                .strip_suffix("[bot]")
                .is_some_and(|l| l.eq_ignore_ascii_case(bot)))
}

/// `@LOGIN` as a whole word in `text`.
pub fn mentions(text: &str, login: &str) -> bool {
    if login.is_empty() {
        return false;
    }
    let needle = format!("@{}", login.to_lowercase());
    let lower = text.to_lowercase();
    lower.match_indices(&needle).any(|(i, _)| {
        let after = lower[i + needle.len()..].chars().next();
        let before = lower[..i].chars().next_back();
        !after.is_some_and(|c| c.is_alphanumeric() || c == '-')
            && !before.is_some_and(|c| c.is_alphanumeric())
    })
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or_default()
}

/// Records whether the payload's repository is public (`private: false`
/// or `visibility: public`): anyone reads its issues and pull requests.
/// A payload that does not say changes nothing.
pub fn note_visibility(
    store: &byom_store::Store,
    connector: &str,
    p: &Value,
) -> Result<(), byom_store::StoreError> {
    let r = &p["repository"];
    let Some(repo) = r["full_name"].as_str() else {
        return Ok(());
    };
    let public = match (r["private"].as_bool(), r["visibility"].as_str()) {
        (_, Some(v)) => v == "public",
        (Some(private), None) => !private,
        (None, None) => return Ok(()),
    };
    super::note_public(store, connector, repo, public)
}

/// Maps a webhook to a trigger. `None`: the bot's own comment echoed back.
/// `digest` is the SHA-256 of the signed body: GitHub signs no timestamp,
/// so a captured delivery replayed under a new `X-GitHub-Delivery` is
/// known by what it says (GitHub's own redelivery says it again too).
pub fn event_to_trigger(
    connector: &str,
    event: &str,
    digest: &str,
    p: &Value,
    bot_login: &str,
) -> Option<Mapped> {
    let repo = match s(p, &["repository", "full_name"]) {
        "" => match s(p, &["organization", "login"]) {
            "" => "github".to_string(),
            org => org.to_string(),
        },
        r => r.to_string(),
    };
    let action = s(p, &["action"]);
    let sender = s(p, &["sender", "login"]);
    let mut ev = pb::SendEventRequest {
        source: connector.to_string(),
        thread: repo.clone(),
        user: format!("github:{sender}"),
        user_name: sender.to_string(),
        from_bot: p["sender"]["type"] == "Bot",
        channel: repo.clone(),
        // The body alone: X-GitHub-Event is not signed, so a delivery
        // replayed under another event name is the same delivery.
        external_id: format!("body/{digest}"),
        kind: "github".into(),
        ..Default::default()
    };
    let mut ignore = None;
    // A comment-like object: its author, text, link and association.
    let comment = |ev: &mut pb::SendEventRequest, c: &Value, number: u64, text: String| {
        let login = s(c, &["user", "login"]);
        ev.thread = format!("{repo}#{number}");
        ev.user = format!("github:{login}");
        ev.user_name = login.to_string();
        ev.from_bot = c["user"]["type"] == "Bot";
        ev.text = text;
        ev.link = s(c, &["html_url"]).to_string();
        ev.author_association = s(c, &["author_association"]).to_string();
        login.to_string()
    };
    let author = match event {
        "issue_comment" => {
            let n = p["issue"]["number"].as_u64().unwrap_or_default();
            let a = comment(&mut ev, &p["comment"], n, s(p, &["comment", "body"]).into());
            if action != "created" {
                ignore = Some(format!("comment {action}"));
            }
            a
        }
        "issues" | "pull_request" => {
            let key = if event == "issues" {
                "issue"
            } else {
                "pull_request"
            };
            let it = &p[key];
            let n = it["number"].as_u64().unwrap_or_default();
            let what = if event == "issues" { "issue" } else { "PR" };
            let title = s(it, &["title"]);
            let text = match action {
                "opened" | "reopened" | "edited" | "ready_for_review" => {
                    format!("{what} #{n} {action}: {title}\n\n{}", s(it, &["body"]))
                }
                "closed" if it["merged"] == true => format!("{what} #{n} merged: {title}"),
                _ => format!("{what} #{n} {action}: {title}"),
            };
            let a = comment(&mut ev, it, n, text.trim_end().to_string());
            if !matches!(
                action,
                "opened" | "reopened" | "edited" | "ready_for_review" | "closed"
            ) {
                ignore = Some(format!("{event} {action} is routine"));
            }
            a
        }
        "pull_request_review" => {
            let n = p["pull_request"]["number"].as_u64().unwrap_or_default();
            let r = &p["review"];
            let text = format!(
                "review {}: {}",
                s(r, &["state"]).to_lowercase(),
                s(r, &["body"])
            );
            let a = comment(&mut ev, r, n, text.trim_end().to_string());
            if action != "submitted" {
                ignore = Some(format!("review {action}"));
            }
            a
        }
        "pull_request_review_comment" => {
            let n = p["pull_request"]["number"].as_u64().unwrap_or_default();
            let c = &p["comment"];
            let text = format!("on {}: {}", s(c, &["path"]), s(c, &["body"]));
            let a = comment(&mut ev, c, n, text);
            if let Some(r) = c["in_reply_to_id"].as_u64() {
                ev.reply_to = format!("comment/{r}");
            }
            if action != "created" {
                ignore = Some(format!("review comment {action}"));
            }
            a
        }
        "check_run" | "check_suite" | "workflow_run" => {
            let run = &p[event];
            let prs = &run["pull_requests"];
            let branch = match s(run, &["head_branch"]) {
                "" => s(run, &["check_suite", "head_branch"]),
                b => b,
            };
            ev.thread = match prs[0]["number"].as_u64() {
                Some(n) => format!("{repo}#{n}"),
                None => format!("{repo}@{branch}"),
            };
            let conclusion = s(run, &["conclusion"]);
            let name = match s(run, &["name"]) {
                "" => s(run, &["app", "name"]),
                n => n,
            };
            let url = match s(run, &["html_url"]) {
                "" => s(run, &["details_url"]),
                u => u,
            };
            let sha: String = s(run, &["head_sha"]).chars().take(7).collect();
            ev.text = format!("CI {event} {name}: {action} {conclusion} on {branch} {sha} {url}")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            ev.link = url.to_string();
            // The CI system speaks for the run: not a chatty bot.
            ev.from_bot = false;
            if !(action == "completed" && FAILED.contains(&conclusion)) {
                ignore = Some(format!("routine CI result ({action} {conclusion})"));
            }
            sender.to_string()
        }
        other => {
            ev.text = format!("GitHub event {other} {action}").trim().to_string();
            ignore = Some(format!("GitHub event {other} is not one byom acts on"));
            sender.to_string()
        }
    };
    if login_is(&author, bot_login) {
        return None;
    }
    // The author is the comment's (issue's, review's) user. GitHub's
    // `sender` is who caused the event: for a new comment the same
    // person. One that differs is not taken on the author's word.
    if ignore.is_none() && !sender.is_empty() && !author.eq_ignore_ascii_case(sender) {
        ignore = Some(format!(
            "refused: the event's sender {sender} is not its author {author}"
        ));
    }
    // A new comment is findable by its ID (a review reply points at it);
    // the delivery is what makes a trigger new.
    let comment = match (event, action) {
        ("issue_comment" | "pull_request_review_comment", "created") => p["comment"]["id"]
            .as_u64()
            .map(|id| format!("comment/{id}")),
        _ => None,
    };
    ev.mention = mentions(&ev.text, bot_login);
    Some(Mapped {
        ev,
        ignore,
        comment,
    })
}

/// GitHub's API for one connector: a token, or an App's installation
/// tokens.
pub struct GithubApi {
    base: String,
    token: String,
    app_id: u64,
    key: String,
    /// Repository → (installation token, expiry in epoch s).
    installations: Mutex<HashMap<String, (String, u64)>>,
    /// Kept for symmetry with the other providers' state (the store holds
    /// nothing for GitHub yet).
    _store: Store,
}

/// Decodes a PEM private key (PKCS#1 `RSA PRIVATE KEY`, as GitHub gives
/// it, or PKCS#8) into a signing key.
pub fn rsa_key(pem: &str) -> Result<ring::signature::RsaKeyPair, String> {
    let label = pem
        .lines()
        .find_map(|l| l.trim().strip_prefix("-----BEGIN ")?.strip_suffix("-----"))
        .ok_or("the private key is not PEM")?;
    let body: String = pem
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("-----") && !l.is_empty())
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| format!("the private key's PEM is not base64: {e}"))?;
    match label {
        "RSA PRIVATE KEY" => ring::signature::RsaKeyPair::from_der(&der),
        "PRIVATE KEY" => ring::signature::RsaKeyPair::from_pkcs8(&der),
        other => return Err(format!("a {other} is not an RSA private key")),
    }
    .map_err(|e| format!("the private key is not a usable RSA key: {e}"))
}

/// The App's JWT: RS256 over `{iat, exp, iss}`, valid ten minutes (iat a
/// minute back, for clock drift, as GitHub advises).
pub fn app_jwt(app_id: u64, pem: &str, now_s: u64) -> Result<String, String> {
    let key = rsa_key(pem)?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
    let claims = b64.encode(
        json!({"iat": now_s.saturating_sub(60), "exp": now_s + 540, "iss": app_id.to_string()})
            .to_string(),
    );
    let msg = format!("{header}.{claims}");
    let mut sig = vec![0u8; key.public().modulus_len()];
    key.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        msg.as_bytes(),
        &mut sig,
    )
    .map_err(|_| "cannot sign the App's JWT".to_string())?;
    Ok(format!("{msg}.{}", b64.encode(sig)))
}

fn now_s() -> u64 {
    byom_wire::now_ms() / 1000
}

/// Parses GitHub's RFC 3339 `expires_at` (UTC, `Z`) to epoch seconds.
fn parse_expiry(s: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp()).ok()
}

impl GithubApi {
    pub fn new(c: &pb::Connector, store: Store) -> GithubApi {
        let base = if c.api_url.is_empty() {
            DEFAULT_API
        } else {
            c.api_url.as_str()
        };
        GithubApi {
            base: base.trim_end_matches('/').to_string(),
            token: c.token.clone(),
            app_id: c.app_id,
            key: c.private_key.clone(),
            installations: Mutex::new(HashMap::new()),
            _store: store,
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        bearer: &str,
        body: Option<&Value>,
    ) -> Result<http::Reply, HttpError> {
        http::request(
            method,
            &format!("{}{path}", self.base),
            &[
                ("authorization", format!("Bearer {bearer}")),
                ("accept", "application/vnd.github+json".into()),
                ("x-github-api-version", "2022-11-28".into()),
            ],
            body.map(|b| b.to_string().into_bytes()),
            PROVIDER_TIMEOUT,
        )
        .await
    }

    /// The token to act on `repo` with.
    async fn token_for(&self, repo: &str) -> Result<String, Sent> {
        if self.app_id == 0 {
            return Ok(self.token.clone());
        }
        if let Ok(m) = self.installations.lock() {
            if let Some((t, exp)) = m.get(repo) {
                if now_s() + RENEW_BEFORE.as_secs() < *exp {
                    return Ok(t.clone());
                }
            }
        }
        let jwt = app_jwt(self.app_id, &self.key, now_s()).map_err(Sent::Fail)?;
        let r = self
            .call("GET", &format!("/repos/{repo}/installation"), &jwt, None)
            .await
            .map_err(transient)?;
        if r.status != 200 {
            return Err(status(&r, "finding the App's installation"));
        }
        let id = r.json()["id"]
            .as_u64()
            .ok_or_else(|| Sent::Fail(format!("no installation ID for {repo}: {}", r.snippet())))?;
        let r = self
            .call(
                "POST",
                &format!("/app/installations/{id}/access_tokens"),
                &jwt,
                Some(&json!({})),
            )
            .await
            .map_err(transient)?;
        if r.status != 201 && r.status != 200 {
            return Err(status(&r, "getting an installation token"));
        }
        let v = r.json();
        let token = v["token"]
            .as_str()
            .ok_or_else(|| Sent::Fail("no token in GitHub's answer".into()))?
            .to_string();
        let exp = v["expires_at"]
            .as_str()
            .and_then(parse_expiry)
            .unwrap_or(now_s() + 3600);
        if let Ok(mut m) = self.installations.lock() {
            m.insert(repo.to_string(), (token.clone(), exp));
        }
        Ok(token)
    }
}

fn transient(e: HttpError) -> Sent {
    match e {
        HttpError::Transient(e) => Sent::Retry {
            error: e,
            after: None,
        },
        HttpError::Permanent(e) => Sent::Fail(e),
    }
}

/// A non-success status: rate limits wait as GitHub says, 5xx retries,
/// the rest fails with GitHub's message.
fn status(r: &http::Reply, doing: &str) -> Sent {
    let msg = r.json()["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| r.snippet());
    let error = format!("GitHub HTTP {} {doing}: {msg}", r.status);
    let limited = r.status == 429
        || (r.status == 403 && (r.retry_after.is_some() || r.ratelimit_remaining == Some(0)));
    if limited {
        let after = r.retry_after.or_else(|| {
            r.ratelimit_reset
                .map(|reset| Duration::from_secs(reset.saturating_sub(now_s()).max(1)))
        });
        return Sent::Retry { error, after };
    }
    if r.status >= 500 {
        return Sent::Retry { error, after: None };
    }
    Sent::Fail(error)
}

#[async_trait::async_trait]
impl Provider for GithubApi {
    fn idempotent(&self) -> bool {
        false
    }

    async fn send(&self, item: &pb::OutboxItem) -> Sent {
        let Some((repo, number)) = item.external.split_once('#') else {
            return Sent::Fail(format!(
                "{} is a branch, not an issue or PR: GitHub has nowhere to comment (the reply stays in byom)",
                item.external
            ));
        };
        let token = match self.token_for(repo).await {
            Ok(t) => t,
            Err(s) => return s,
        };
        let path = format!("/repos/{repo}/issues/{number}/comments");
        match self
            .call("POST", &path, &token, Some(&json!({"body": item.text})))
            .await
        {
            Err(e) => transient(e),
            Ok(r) if r.status == 201 || r.status == 200 => match r.json()["id"].as_u64() {
                Some(id) => Sent::Ok(format!("comment/{id}")),
                None => Sent::Fail(format!("no comment ID in GitHub's answer: {}", r.snippet())),
            },
            Ok(r) => status(&r, "posting the comment"),
        }
    }

    async fn test(&self) -> Result<String, String> {
        let explain = |s: Sent| match s {
            Sent::Fail(e) | Sent::Retry { error: e, .. } => e,
            Sent::Ok(x) => x,
        };
        if self.app_id != 0 {
            let jwt = app_jwt(self.app_id, &self.key, now_s())?;
            let r = self
                .call("GET", "/app", &jwt, None)
                .await
                .map_err(|e| e.to_string())?;
            if r.status != 200 {
                return Err(explain(status(&r, "checking the App")));
            }
            let v = r.json();
            return Ok(format!(
                "GitHub App {} (ID {})",
                v["slug"].as_str().unwrap_or("?"),
                v["id"]
            ));
        }
        let r = self
            .call("GET", "/user", &self.token, None)
            .await
            .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(explain(status(&r, "checking the token")));
        }
        Ok(format!(
            "GitHub user {}",
            r.json()["login"].as_str().unwrap_or("?")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_are_whole_logins() {
        assert!(mentions("hey @byom-bot can you look", "byom-bot"));
        assert!(mentions("@Byom-Bot: please", "byom-bot"));
        assert!(!mentions("@byom-bots", "byom-bot"));
        assert!(!mentions("mail@byom-bot", "byom-bot"));
        assert!(!mentions("anything", ""));
    }

    #[test]
    fn own_comments_are_not_triggers() {
        let p = json!({"action": "created", "repository": {"full_name": "a/b"},
            "issue": {"number": 3}, "sender": {"login": "byom-bot[bot]", "type": "Bot"},
            "comment": {"id": 9, "body": "done", "user": {"login": "byom-bot[bot]", "type": "Bot"}}});
        assert!(event_to_trigger("gh", "issue_comment", "d1", &p, "byom-bot").is_none());
        let m = event_to_trigger("gh", "issue_comment", "d1", &p, "other").unwrap();
        assert_eq!((m.ev.thread.as_str(), m.ev.from_bot), ("a/b#3", true));
    }

    /// The author is `comment.user`; a `sender` that differs is refused,
    /// never believed in its place.
    #[test]
    fn a_mismatched_sender_is_refused() {
        let p = json!({"action": "created", "repository": {"full_name": "a/b"},
            "issue": {"number": 3}, "sender": {"login": "maint", "type": "User"},
            "comment": {"id": 9, "body": "approve K7QX9P", "author_association": "NONE",
                        "user": {"login": "mallory", "type": "User"}}});
        let m = event_to_trigger("gh", "issue_comment", "d1", &p, "bot").unwrap();
        assert_eq!(m.ev.user, "github:mallory");
        assert!(m.ignore.unwrap().contains("not its author"));
    }

    #[test]
    fn ci_failures_land_on_the_pr_or_branch() {
        let p = json!({"action": "completed", "repository": {"full_name": "a/b"},
            "sender": {"login": "ci", "type": "Bot"},
            "workflow_run": {"conclusion": "failure", "head_branch": "fix", "name": "test",
                             "pull_requests": [], "html_url": "https://x/run/1"}});
        let m = event_to_trigger("gh", "workflow_run", "d1", &p, "bot").unwrap();
        assert_eq!(
            (m.ev.thread.as_str(), m.ignore.is_none(), m.ev.from_bot),
            ("a/b@fix", true, false)
        );
        let mut ok = p.clone();
        ok["workflow_run"]["conclusion"] = json!("success");
        ok["workflow_run"]["pull_requests"] = json!([{"number": 7}]);
        let m = event_to_trigger("gh", "workflow_run", "d2", &ok, "bot").unwrap();
        assert_eq!(m.ev.thread, "a/b#7");
        assert!(m.ignore.unwrap().contains("routine"));
    }

    #[test]
    fn expiry_times_parse() {
        assert_eq!(parse_expiry("2016-07-11T22:14:10Z"), Some(1_468_275_250));
        assert_eq!(parse_expiry("soon"), None);
    }
}
