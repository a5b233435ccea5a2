//! The agent on GitHub: every example webhook from npm's
//! `@octokit/webhooks-examples` (GitHub's own payloads, not hand-written)
//! is signed and posted; handled types map to the right thread, user, text
//! and mention, all others are stored and ignored without error. Replies
//! are comments through a loopback REST API that checks the method, the
//! token and the body, rate-limits once, and plays a GitHub App's
//! installation-token exchange with a JWT it verifies.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use byom_tests::channels::{connect_github, octokit_examples, post_hook, FakeApi, Seen};
use byom_tests::{stderr, wait_for, webhook_sign, Server};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);
const SECRET: &str = "It's a Secret to Everybody";
const TOKEN: &str = "ghp_test_token_0123456789";
const BOT: &str = "byom-bot";

fn add(server: &Server, dir: &std::path::Path, api: &str, auth: &[&str]) {
    connect_github(server, dir, "gh", SECRET, api, BOT, auth);
}

fn deliver(server: &Server, event: &str, delivery: &str, body: &str) -> (u16, Value) {
    let sig = webhook_sign(SECRET.as_bytes(), body);
    post_hook(
        server.webhook_addr,
        "/github/gh",
        &[
            ("X-GitHub-Event", event),
            ("X-GitHub-Delivery", delivery),
            ("X-Hub-Signature-256", &sig),
        ],
        body,
    )
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

/// What the trigger of a handled example must say: (thread, user, a piece
/// of its text).
fn expected(event: &str, p: &Value) -> Option<(String, String, String)> {
    let repo = s(p, &["repository", "full_name"]);
    let n = |k: &str| p[k]["number"].as_u64().unwrap_or(0);
    match event {
        "issue_comment" => Some((
            format!("{repo}#{}", n("issue")),
            format!("github:{}", s(p, &["comment", "user", "login"])),
            s(p, &["comment", "body"]).into(),
        )),
        "issues" => Some((
            format!("{repo}#{}", n("issue")),
            format!("github:{}", s(p, &["issue", "user", "login"])),
            s(p, &["issue", "title"]).into(),
        )),
        "pull_request" => Some((
            format!("{repo}#{}", n("pull_request")),
            format!("github:{}", s(p, &["pull_request", "user", "login"])),
            s(p, &["pull_request", "title"]).into(),
        )),
        "pull_request_review" => Some((
            format!("{repo}#{}", n("pull_request")),
            format!("github:{}", s(p, &["review", "user", "login"])),
            s(p, &["review", "state"]).to_lowercase(),
        )),
        "pull_request_review_comment" => Some((
            format!("{repo}#{}", n("pull_request")),
            format!("github:{}", s(p, &["comment", "user", "login"])),
            s(p, &["comment", "body"]).into(),
        )),
        "check_run" | "check_suite" | "workflow_run" => {
            let run = &p[event];
            let thread = match run["pull_requests"][0]["number"].as_u64() {
                Some(n) => format!("{repo}#{n}"),
                None => {
                    let b = match s(run, &["head_branch"]) {
                        "" => s(run, &["check_suite", "head_branch"]),
                        b => b,
                    };
                    format!("{repo}@{b}")
                }
            };
            Some((
                thread,
                format!("github:{}", s(p, &["sender", "login"])),
                "CI ".into(),
            ))
        }
        _ => None,
    }
}

/// A GitHub REST API: comments (the first answered with a primary rate
/// limit), `/user`, and a GitHub App's endpoints checking its JWT.
fn github_api(public_der: Option<Vec<u8>>) -> FakeApi {
    let comments = Arc::new(AtomicUsize::new(0));
    FakeApi::start(move |r: &Seen| {
        let auth = r.header("authorization").unwrap_or("").to_string();
        let ok_version = r.header("x-github-api-version") == Some("2022-11-28");
        let jwt_ok = |auth: &str| {
            let Some(jwt) = auth.strip_prefix("Bearer ") else {
                return false;
            };
            let parts: Vec<&str> = jwt.split('.').collect();
            let (Some(der), [h, c, sig]) = (public_der.as_ref(), parts.as_slice()) else {
                return false;
            };
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
            let Ok(sig) = b64.decode(sig) else {
                return false;
            };
            let claims: Value =
                serde_json::from_slice(&b64.decode(c).unwrap_or_default()).unwrap_or_default();
            claims["iss"] == "42"
                && ring::signature::UnparsedPublicKey::new(
                    &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                    der,
                )
                .verify(format!("{h}.{c}").as_bytes(), &sig)
                .is_ok()
        };
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/user") if auth == format!("Bearer {TOKEN}") => (
                200,
                vec![],
                json!({"login": BOT, "id": 1, "type": "User"}).to_string(),
            ),
            ("GET", "/app") if jwt_ok(&auth) => (
                200,
                vec![],
                json!({"id": 42, "slug": "byom-app"}).to_string(),
            ),
            ("GET", "/repos/acme/app/installation") if jwt_ok(&auth) => {
                (200, vec![], json!({"id": 7}).to_string())
            }
            ("POST", "/app/installations/7/access_tokens") if jwt_ok(&auth) => (
                201,
                vec![],
                json!({"token": "ghs_installation_token", "expires_at": "2099-01-01T00:00:00Z"})
                    .to_string(),
            ),
            ("POST", p) if p.starts_with("/repos/") && p.ends_with("/comments") => {
                let authed =
                    auth == format!("Bearer {TOKEN}") || auth == "Bearer ghs_installation_token";
                if !authed || !ok_version || r.json()["body"].as_str().is_none() {
                    return (
                        401,
                        vec![],
                        json!({"message": "Bad credentials"}).to_string(),
                    );
                }
                if comments.fetch_add(1, Ordering::SeqCst) == 0 {
                    let reset = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs()
                        + 2;
                    return (
                        403,
                        vec![
                            ("x-ratelimit-remaining".into(), "0".into()),
                            ("x-ratelimit-reset".into(), reset.to_string()),
                        ],
                        json!({"message": "API rate limit exceeded"}).to_string(),
                    );
                }
                let id = 1000 + comments.load(Ordering::SeqCst);
                (
                    201,
                    vec![],
                    json!({"id": id, "body": r.json()["body"]}).to_string(),
                )
            }
            _ => (404, vec![], json!({"message": "Not Found"}).to_string()),
        }
    })
}

#[test]
fn every_example_webhook_is_mapped_or_stored() {
    let api = github_api(None);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    add(
        &server,
        dir.path(),
        &api.url(),
        &["--token-file", &{
            let f = dir.path().join("gh.token");
            std::fs::write(&f, TOKEN).unwrap();
            f.to_str().unwrap().to_string()
        }],
    );
    // Only mentions go to the agents here (the examples are many): a rule
    // changed at runtime.
    let rules = dir.path().join("rules.toml");
    std::fs::write(&rules, "[sources.gh]\nmode = \"addressed_only\"\n").unwrap();
    let out = server.byom(&["sources", "set", rules.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(&rules, "[sources.gh]\nmode = \"sometimes\"\n").unwrap();
    assert!(!server
        .byom(&["sources", "set", rules.to_str().unwrap()])
        .status
        .success());
    let shown = server.json(&["sources", "show"]);
    assert!(
        shown["rules"].as_str().unwrap().contains("addressed_only"),
        "{shown}"
    );

    // Signatures, ping, redelivery.
    let (st, _) = post_hook(
        server.webhook_addr,
        "/github/gh",
        &[
            ("X-GitHub-Event", "ping"),
            ("X-GitHub-Delivery", "d0"),
            ("X-Hub-Signature-256", "sha256=00"),
        ],
        "{}",
    );
    assert_eq!(st, 401);
    let examples = octokit_examples();
    let mut sent: Vec<(String, Value, String)> = Vec::new();
    let mut mention_done = false;
    for group in examples.as_array().unwrap() {
        let event = group["name"].as_str().unwrap();
        for (i, ex) in group["examples"].as_array().unwrap().iter().enumerate() {
            let mut ex = ex.clone();
            // One real comment addresses the bot.
            if event == "issue_comment" && !mention_done {
                ex["comment"]["body"] = json!(format!("@{BOT} can you take a look?"));
                mention_done = true;
            }
            let body = ex.to_string();
            let delivery = format!("{event}-{i}");
            let (st, v) = deliver(&server, event, &delivery, &body);
            if event == "ping" {
                assert_eq!((st, &v["pong"]), (200, &json!(true)), "{v}");
                continue;
            }
            // Examples that repeat an earlier one byte for byte are what a
            // replay looks like: the first one's trigger.
            if let Some((_, _, first)) = sent.iter().find(|(e, x, _)| e == event && *x == ex) {
                assert_eq!(
                    (st, v["trigger"].as_str(), &v["duplicate"]),
                    (200, Some(first.as_str()), &json!(true)),
                    "{event} #{i}"
                );
                continue;
            }
            assert!(st == 202, "{event} #{i}: {st} {v}");
            sent.push((
                event.to_string(),
                ex,
                v["trigger"].as_str().unwrap().to_string(),
            ));
        }
    }
    assert!(sent.len() > 250, "{} examples", sent.len());
    let (event, ex, first) = &sent[0];
    let (st, v) = deliver(&server, event, &format!("{event}-0"), &ex.to_string());
    assert_eq!(
        (st, v["trigger"].as_str(), &v["duplicate"]),
        (200, Some(first.as_str()), &json!(true))
    );
    // A captured delivery replayed under a new ID is known by its body.
    let (st, v) = deliver(&server, event, "replayed-under-a-new-id", &ex.to_string());
    assert_eq!(
        (st, v["trigger"].as_str(), &v["duplicate"]),
        (200, Some(first.as_str()), &json!(true)),
        "a replay is the first delivery's trigger"
    );

    let threads: std::collections::HashMap<String, String> = server
        .json(&["threads", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap().to_string(),
                t["external"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let triggers: std::collections::HashMap<String, Value> = server
        .json(&["events", "ls", "--limit", "2000"])
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_string(), t.clone()))
        .collect();
    let mut handled = 0;
    let mut mentions = 0;
    for (event, ex, id) in &sent {
        let t = &triggers[id];
        assert_eq!(t["kind"], "github", "{t}");
        mentions += usize::from(t["mention"] == true);
        match expected(event, ex) {
            Some((thread, user, text)) => {
                handled += 1;
                assert_eq!(
                    threads[t["thread_id"].as_str().unwrap()],
                    thread,
                    "{event}: {t}"
                );
                assert_eq!(t["user"], user.as_str(), "{event}: {t}");
                assert!(
                    t["text"].as_str().unwrap().contains(&text),
                    "{event}: {t} lacks {text:?}"
                );
            }
            None => {
                assert_eq!(t["decision"], "ignored", "{event}: {t}");
                assert!(
                    t["reason"]
                        .as_str()
                        .unwrap()
                        .contains("not one byom acts on"),
                    "{t}"
                );
            }
        }
    }
    assert!(handled > 80, "{handled} handled examples");
    assert_eq!(mentions, 1, "only the comment that says @{BOT}");
    // author_association is kept for containment.
    let assoc = triggers
        .values()
        .filter(|t| t["author_association"] == "OWNER")
        .count();
    assert!(assoc > 0);
}

#[test]
fn comments_go_out_with_a_token_or_as_an_app() {
    // A token: `@bot` on an issue gets structured comments back; the first
    // is rate-limited and waits until x-ratelimit-reset.
    let api = github_api(None);
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    let token = dir.path().join("gh.token");
    std::fs::write(&token, TOKEN).unwrap();
    add(
        &server,
        dir.path(),
        &api.url(),
        &["--token-file", token.to_str().unwrap()],
    );
    let test = server.json(&["connectors", "test", "gh"]);
    assert_eq!(test["ok"], true, "{test}");
    let comment = json!({"action": "created", "repository": {"full_name": "acme/app"},
        "issue": {"number": 12, "title": "flaky build"},
        "comment": {"id": 555, "body": format!("@{BOT} please run `echo from-github` on lap"),
                    "html_url": "https://github.com/acme/app/issues/12#issuecomment-555",
                    "user": {"login": "octocat", "type": "User"}, "author_association": "MEMBER"},
        "sender": {"login": "octocat", "type": "User"}});
    let (st, v) = deliver(&server, "issue_comment", "c1", &comment.to_string());
    assert_eq!(st, 202, "{v}");
    let done = wait_for("the result comment", T, || {
        api.requests().into_iter().find(|r| {
            r.path == "/repos/acme/app/issues/12/comments"
                && r.body.contains("from-github")
                && r.body.contains("Done")
        })
    });
    let body = done.json()["body"].as_str().unwrap().to_string();
    assert!(
        body.contains("### Summary"),
        "asynchronous channels get structure: {body}"
    );
    let posts: Vec<Seen> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/comments"))
        .collect();
    assert!(posts.len() >= 3, "{posts:?}");
    let gap = posts[1].at.duration_since(posts[0].at);
    assert!(
        gap >= Duration::from_millis(900),
        "rate limit honoured: {gap:?}"
    );
    let out = server.json(&["outbox", "ls"]);
    assert!(
        out.as_array()
            .unwrap()
            .iter()
            .all(|it| it["state"] == "sent"),
        "{out}"
    );
    // The bot's own comment echoed back by GitHub is not a trigger.
    let mut own = comment.clone();
    own["comment"]["user"]["login"] = json!(format!("{BOT}[bot]"));
    let (st, v) = deliver(&server, "issue_comment", "c2", &own.to_string());
    assert_eq!(st, 200, "{v}");
    assert!(v["ignored"].is_string(), "{v}");

    // A GitHub App: JWT (RS256, checked against the public key) → the
    // repository's installation → its token on the comment.
    let key = dir.path().join("app.pem");
    let st = Command::new("openssl")
        .args([
            "genrsa",
            "-traditional",
            "-out",
            key.to_str().unwrap(),
            "2048",
        ])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let der = Command::new("openssl")
        .args([
            "rsa",
            "-in",
            key.to_str().unwrap(),
            "-RSAPublicKey_out",
            "-outform",
            "DER",
        ])
        .output()
        .unwrap();
    assert!(der.status.success());
    let app_api = github_api(Some(der.stdout));
    connect_github(
        &server,
        dir.path(),
        "ghapp",
        SECRET,
        &app_api.url(),
        "byom-app",
        &[
            "--app-id",
            "42",
            "--private-key-file",
            key.to_str().unwrap(),
        ],
    );
    let shown = server.json(&["connectors", "show", "ghapp"]);
    assert_eq!(shown["has_private_key"], true);
    assert!(!shown.to_string().contains("PRIVATE KEY"), "{shown}");
    let test = server.json(&["connectors", "test", "ghapp"]);
    assert_eq!(test["ok"], true, "{test}");
    assert!(
        test["identity"].as_str().unwrap().contains("byom-app"),
        "{test}"
    );
    let sig = webhook_sign(
        SECRET.as_bytes(),
        &comment.to_string().replace(BOT, "byom-app"),
    );
    let (st, v) = post_hook(
        server.webhook_addr,
        "/github/ghapp",
        &[
            ("X-GitHub-Event", "issue_comment"),
            ("X-GitHub-Delivery", "a1"),
            ("X-Hub-Signature-256", &sig),
        ],
        &comment.to_string().replace(BOT, "byom-app"),
    );
    assert_eq!(st, 202, "{v}");
    wait_for("a comment with the installation token", T, || {
        app_api.requests().into_iter().find(|r| {
            r.path == "/repos/acme/app/issues/12/comments"
                && r.header("authorization") == Some("Bearer ghs_installation_token")
                && r.body.contains("Done")
        })
    });
    let exchanges = app_api
        .requests()
        .iter()
        .filter(|r| r.path == "/app/installations/7/access_tokens")
        .count();
    assert_eq!(
        exchanges, 1,
        "the installation token is reused until it nears expiry"
    );
}
