//! The agent in Slack: Events API requests shaped as Slack documents them
//! and signed by Slack's own SDK (slack_sdk's signature module), replies
//! through `chat.postMessage` on a loopback server that checks the method,
//! the bot token and the body, and answers as Slack does (including 429
//! with Retry-After and `ok:false`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use byom_tests::channels::{enc, post_hook, slack_signature, FakeApi, Seen};
use byom_tests::{stderr, wait_for, Server};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);
const TOKEN: &str = "xoxb-test-token-123";
const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Whether eve has joined C0LATER (she is in its member list from then).
static EVE_JOINED_LATER: AtomicBool = AtomicBool::new(false);

/// Slack's Web API: auth.test and chat.postMessage, the first post
/// answered 429 with Retry-After: 2.
fn slack_api() -> FakeApi {
    let posts = Arc::new(AtomicUsize::new(0));
    FakeApi::start(move |r: &Seen| {
        let authed = r.header("authorization") == Some(&format!("Bearer {TOKEN}"));
        // Who is in a private channel: ada and byom; in C0GUESTS eve too.
        if authed && r.method == "GET" && r.path.starts_with("/api/conversations.members?") {
            let mut members = vec!["U0ADA", "UBOT"];
            if r.path.contains("channel=C0GUESTS")
                || r.path.contains("channel=C0MENTIONED")
                || (r.path.contains("channel=C0LATER") && EVE_JOINED_LATER.load(Ordering::SeqCst))
            {
                members.push("U0EVE");
            }
            return (
                200,
                vec![],
                json!({"ok": true, "members": members, "response_metadata": {"next_cursor": ""}})
                    .to_string(),
            );
        }
        // What a channel is: C0MENTIONED is private, the rest public.
        if authed && r.method == "GET" && r.path.starts_with("/api/conversations.info?") {
            let private = r.path.contains("channel=C0MENTIONED");
            return (
                200,
                vec![],
                json!({"ok": true, "channel": {"is_channel": !private, "is_group": false,
                       "is_private": private, "is_im": false, "is_mpim": false}})
                .to_string(),
            );
        }
        if r.method != "POST" || !authed {
            return (
                200,
                vec![],
                json!({"ok": false, "error": "invalid_auth"}).to_string(),
            );
        }
        match r.path.as_str() {
            "/api/auth.test" => (
                200,
                vec![],
                json!({"ok": true, "url": "https://acme.slack.com/", "team": "Acme",
                       "user": "byom", "team_id": "T0001", "user_id": "UBOT"})
                .to_string(),
            ),
            "/api/chat.postMessage" => {
                let b = r.json();
                if posts.fetch_add(1, Ordering::SeqCst) == 0 {
                    return (
                        429,
                        vec![("Retry-After".into(), "2".into())],
                        json!({"ok": false, "error": "ratelimited"}).to_string(),
                    );
                }
                if b["channel"] == "CGONE" {
                    return (
                        200,
                        vec![],
                        json!({"ok": false, "error": "channel_not_found"}).to_string(),
                    );
                }
                (
                    200,
                    vec![],
                    json!({"ok": true, "channel": b["channel"], "ts": format!("1800000000.{:06}", posts.load(Ordering::SeqCst)),
                           "message": {"text": b["text"]}})
                    .to_string(),
                )
            }
            _ => (
                404,
                vec![],
                json!({"ok": false, "error": "unknown_method"}).to_string(),
            ),
        }
    })
}

fn signed(server: &Server, body: &str, ts: u64) -> (u16, Value) {
    let sig = slack_signature(SECRET, ts, body);
    let ts = ts.to_string();
    post_hook(
        server.webhook_addr,
        "/slack/acme/events",
        &[
            ("X-Slack-Request-Timestamp", &ts),
            ("X-Slack-Signature", &sig),
        ],
        body,
    )
}

/// An `event_callback` as Slack sends it.
fn callback(event_id: &str, event: Value) -> String {
    json!({
        "token": "verification-token-unused", "team_id": "T0001", "api_app_id": "A0001",
        "event": event, "type": "event_callback", "event_id": event_id,
        "event_time": now_s(), "authorizations": [{"enterprise_id": null, "team_id": "T0001",
            "user_id": "UBOT", "is_bot": true, "is_enterprise_install": false}],
        "is_ext_shared_channel": false, "event_context": "4-eyJldCI6Im1lc3NhZ2UifQ"
    })
    .to_string()
}

fn message(channel: &str, ts: &str, text: &str, extra: Value) -> Value {
    let mut m = json!({"type": "message", "channel": channel, "user": "U0ADA", "text": text,
                       "ts": ts, "event_ts": ts, "channel_type": "channel",
                       "user_profile": {"display_name": "Ada", "real_name": "Ada Lovelace", "name": "ada"}});
    if let Value::Object(x) = extra {
        for (k, v) in x {
            m[k] = v;
        }
    }
    m
}

/// `byom connectors add slack acme` with the test's token and secret
/// Waits for byom to post in `channel` a message with `has` in it.
fn posted(api: &FakeApi, what: &str, channel: &str, has: &str) -> Value {
    wait_for(what, T, || {
        posts(api)
            .into_iter()
            .map(|r| r.json())
            .find(|b| b["channel"] == channel && b["text"].as_str().unwrap_or("").contains(has))
    })
}

/// (written to files in `dir`) and the Web API at `url`.
fn add_connector(server: &Server, dir: &std::path::Path, url: &str) -> std::process::Output {
    let token = dir.join("bot.token");
    let secret = dir.join("signing.secret");
    std::fs::write(&token, TOKEN).unwrap();
    std::fs::write(&secret, SECRET).unwrap();
    server.byom(&[
        "connectors",
        "add",
        "slack",
        "acme",
        "--bot-token-file",
        token.to_str().unwrap(),
        "--signing-secret-file",
        secret.to_str().unwrap(),
        "--api-url",
        url,
    ])
}

fn posts(api: &FakeApi) -> Vec<Seen> {
    api.requests()
        .into_iter()
        .filter(|r| r.path == "/api/chat.postMessage")
        .collect()
}

#[test]
fn slack_events_in_replies_out() {
    let api = slack_api();
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    server.trust(&["add", "slack:*"]);
    let api_url = format!("{}/api", api.url());
    let add = |url: &str| add_connector(&server, dir.path(), url);
    let out = add(&api_url);
    assert!(out.status.success(), "{}", stderr(&out));
    // The same add again (a retry) is the first; a different one is refused.
    assert!(add(&api_url).status.success());
    let other = add("http://127.0.0.1:9/api");
    assert!(!other.status.success());
    assert!(stderr(&other).contains("exists"), "{}", stderr(&other));
    let test = server.json(&["connectors", "test", "acme"]);
    assert_eq!(test["ok"], true, "{test}");
    assert!(
        test["identity"].as_str().unwrap().contains("UBOT"),
        "{test}"
    );

    // url_verification is answered with the challenge.
    let body = json!({"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"}).to_string();
    let (st, v) = signed(&server, &body, now_s());
    assert_eq!(
        (st, v["challenge"].as_str()),
        (
            200,
            Some("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P")
        )
    );

    // Forged, missing and replayed signatures are refused, nothing stored.
    let ask = callback(
        "Ev01ASK",
        message(
            "C0OPS",
            "1700000000.000100",
            "<@UBOT> please run `echo from-slack` on lap",
            json!({}),
        ),
    );
    let ts = now_s().to_string();
    let (st, _) = post_hook(
        server.webhook_addr,
        "/slack/acme/events",
        &[
            ("X-Slack-Request-Timestamp", &ts),
            (
                "X-Slack-Signature",
                "v0=0000000000000000000000000000000000000000000000000000000000000000",
            ),
        ],
        &ask,
    );
    assert_eq!(st, 401);
    let (st, _) = post_hook(server.webhook_addr, "/slack/acme/events", &[], &ask);
    assert_eq!(st, 401);
    let (st, v) = signed(&server, &ask, now_s() - 600);
    assert_eq!(st, 401, "a request from ten minutes ago is a replay: {v}");
    let (st, bad_sig) = post_hook(server.webhook_addr, "/slack/acme/events", &[], &ask);
    let (st2, unknown) = post_hook(server.webhook_addr, "/slack/nope/events", &[], &ask);
    assert_eq!(
        (st, st2, &bad_sig),
        (401, 401, &unknown),
        "an unknown connector answers as a bad signature does: names cannot be probed"
    );
    assert!(server
        .json(&["events", "ls"])
        .as_array()
        .unwrap()
        .is_empty());

    // The real one: stored before the 200, well within Slack's 3 seconds.
    let t = Instant::now();
    let (st, first) = signed(&server, &ask, now_s());
    assert_eq!(st, 200, "{first}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Slack's retry, and the app_mention Slack sends for the same message,
    // are the same trigger.
    let (st, again) = signed(&server, &ask, now_s());
    assert_eq!(
        (st, &again["trigger"], &again["duplicate"]),
        (200, &first["trigger"], &json!(true))
    );
    let mention = callback(
        "Ev01MENTION",
        message(
            "C0OPS",
            "1700000000.000100",
            "<@UBOT> please run `echo from-slack` on lap",
            json!({"type": "app_mention"}),
        ),
    );
    let (st, dup) = signed(&server, &mention, now_s());
    assert_eq!((st, &dup["trigger"]), (200, &first["trigger"]), "{dup}");

    let evs = server.json(&["events", "ls"]);
    let people: Vec<&Value> = evs
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["user"] != "byom")
        .collect();
    assert_eq!(people.len(), 1, "{evs}");
    let trg = people[0];
    assert_eq!(trg["user"], "slack:T0001/U0ADA", "{trg}");
    assert_eq!(trg["user_name"], "Ada", "{trg}");
    assert_eq!(trg["mention"], true, "{trg}");
    assert_eq!(trg["kind"], "slack", "{trg}");

    // The replies go into the message's thread, with the bot token, as
    // mrkdwn; the first post's 429 is waited out as Slack asked.
    let done = wait_for("the result posted", T, || {
        posts(&api)
            .into_iter()
            .find(|p| p.body.contains("from-slack") && p.body.contains("Done"))
    });
    let b = done.json();
    assert_eq!(b["channel"], "C0OPS");
    assert_eq!(b["thread_ts"], "1700000000.000100");
    assert_eq!(b["mrkdwn"], true);
    let all = posts(&api);
    assert!(all.len() >= 3, "429, then On it, then Done: {all:?}");
    let gap = all[1].at.duration_since(all[0].at);
    assert!(
        gap >= Duration::from_millis(1900),
        "Retry-After: 2 honoured, waited {gap:?}"
    );

    // A bot's message is stored and ignored; a DM counts as addressed.
    let bot = callback(
        "Ev02BOT",
        json!({"type": "message", "subtype": "bot_message", "bot_id": "B0DEPLOY", "channel": "C0OPS",
               "text": "deploy finished", "ts": "1700000001.000100", "channel_type": "channel"}),
    );
    let (st, b) = signed(&server, &bot, now_s());
    assert_eq!(st, 200, "{b}");
    let bt = server.json(&["show", b["trigger"].as_str().unwrap()]);
    assert_eq!(bt["decision"], "ignored", "{bt}");
    let dm = callback(
        "Ev03DM",
        message(
            "D0ADA",
            "1700000002.000100",
            "hello there",
            json!({"channel_type": "im"}),
        ),
    );
    let (_, d) = signed(&server, &dm, now_s());
    let dt = server.json(&["show", d["trigger"].as_str().unwrap()]);
    assert_eq!(dt["mention"], true, "{dt}");

    // Slack's ok:false is shown with its error name, and the item fails.
    let gone = callback(
        "Ev04GONE",
        message(
            "CGONE",
            "1700000003.000100",
            "<@UBOT> please run `echo nowhere` on lap",
            json!({}),
        ),
    );
    assert_eq!(signed(&server, &gone, now_s()).0, 200);
    let failed = wait_for("a failed outbox item", T, || {
        let v = server.json(&["outbox", "ls", "--failed"]);
        v.as_array().unwrap().first().cloned()
    });
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap()
            .contains("channel_not_found"),
        "{failed}"
    );
    assert_eq!(
        failed["external"].as_str().unwrap(),
        "CGONE/1700000003.000100"
    );
}

/// With `byom trust set --slack-members true`, the workspace's members are
/// trusted and its guests are not (asked of `users.info`, as Slack
/// documents it), and neither is a Slack Connect user from another
/// organisation, whatever their standing there.
#[test]
fn members_are_trusted_and_guests_are_not() {
    let api = FakeApi::start(|r: &Seen| {
        let user = |u: &str, restricted: bool| {
            json!({"ok": true, "user": {"id": u, "team_id": "T0001", "name": u,
                   "deleted": false, "is_restricted": restricted,
                   "is_ultra_restricted": false, "is_bot": false}})
            .to_string()
        };
        let authed = r.header("authorization") == Some(&format!("Bearer {TOKEN}"));
        match (authed, r.method.as_str(), r.path.as_str()) {
            (true, "GET", "/api/users.info?user=U0ADA") => (200, vec![], user("U0ADA", false)),
            (true, "GET", "/api/users.info?user=U0GUEST") => (200, vec![], user("U0GUEST", true)),
            (true, "POST", "/api/auth.test") => (
                200,
                vec![],
                json!({"ok": true, "team_id": "T0001", "user_id": "UBOT"}).to_string(),
            ),
            (true, "POST", "/api/chat.postMessage") => (
                200,
                vec![],
                json!({"ok": true, "channel": "C0OPS", "ts": "1800000000.000001"}).to_string(),
            ),
            _ => (
                200,
                vec![],
                json!({"ok": false, "error": "user_not_found"}).to_string(),
            ),
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    server.trust(&["set", "--slack-members", "true"]);
    let out = add_connector(&server, dir.path(), &format!("{}/api", api.url()));
    assert!(out.status.success(), "{}", stderr(&out));
    let cases = [
        ("U0ADA", json!({}), "member", true),
        ("U0GUEST", json!({}), "guest", false),
        ("U0NOBODY", json!({}), "", false),
        ("U0ADA", json!({"user_team": "T0OTHER"}), "external", false),
    ];
    for (i, (user, extra, assoc, trusted)) in cases.into_iter().enumerate() {
        let mut extra = extra;
        extra["user"] = json!(user);
        let ts = format!("1700000001.{i:06}");
        let body = callback(
            &format!("EvM{i}"),
            message("C0OPS", &ts, "morning all", extra),
        );
        let (st, v) = signed(&server, &body, now_s());
        assert_eq!(st, 200, "{v}");
        let id = v["trigger"].as_str().unwrap();
        let t = server.json(&["show", id]);
        assert_eq!(
            (t["author_association"].as_str(), t["trusted"].as_bool()),
            (Some(assoc), Some(trusted)),
            "{user} {i}: {t}"
        );
    }
    // Asked once per person, not once per message.
    let again = callback(
        "EvM9",
        message(
            "C0OPS",
            "1700000002.000001",
            "again",
            json!({"user": "U0ADA"}),
        ),
    );
    assert_eq!(signed(&server, &again, now_s()).0, 200);
    let asks = api
        .requests()
        .iter()
        .filter(|r| r.path == "/api/users.info?user=U0ADA")
        .count();
    assert_eq!(asks, 1);
}

/// A button press on a request, as Slack posts it to the Interactivity
/// Request URL (form-encoded `payload`, signed by Slack's SDK).
fn press(server: &Server, user: &str, action: &str, code: &str, thread_ts: &str) -> (u16, Value) {
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user, "username": user.to_lowercase(), "team_id": "T0001"},
        "api_app_id": "A0001", "token": "unused", "team": {"id": "T0001", "domain": "acme"},
        "container": {"type": "message", "message_ts": "1800000000.000009", "channel_id": "C0OPS", "is_ephemeral": false},
        "channel": {"id": "C0OPS", "name": "ops"},
        "message": {"type": "message", "ts": "1800000000.000009", "thread_ts": thread_ts, "text": "Approval needed"},
        "actions": [{"action_id": action, "block_id": "b1", "value": code, "type": "button",
                     "action_ts": format!("{}.{user}", now_s())}]
    });
    let body = format!("payload={}", enc(&payload.to_string()));
    let ts = now_s();
    let sig = slack_signature(SECRET, ts, &body);
    post_hook(
        server.webhook_addr,
        "/slack/acme/interactive",
        &[
            ("X-Slack-Request-Timestamp", &ts.to_string()),
            ("X-Slack-Signature", &sig),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &body,
    )
}

/// byom's request in Slack carries Approve and Deny buttons with its
/// code; a stranger's press is refused, an approver's approves exactly
/// that request, as them.
#[test]
fn approvers_answer_with_a_button() {
    let api = slack_api();
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    server.trust(&["approvers", "add", "slack:T0001/U0ADA"]);
    let out = add_connector(&server, dir.path(), &format!("{}/api", api.url()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        byom_tests::stdout(&out).contains("/slack/acme/interactive"),
        "{}",
        byom_tests::stdout(&out)
    );
    let thread_ts = "1700000000.000200";
    let ask = callback(
        "Ev02ASK",
        message(
            "C0OPS",
            thread_ts,
            "<@UBOT> please run `echo via-button` on lap",
            json!({"user": "U0MAL", "user_profile": {"display_name": "Mal", "name": "mal"}}),
        ),
    );
    let (st, v) = signed(&server, &ask, now_s());
    assert_eq!(st, 200, "{v}");
    let request = wait_for("the request with its buttons", T, || {
        posts(&api)
            .into_iter()
            .map(|r| r.json())
            .find(|b| b["blocks"][1]["elements"][0]["action_id"] == "byom_approve")
    });
    assert_eq!(request["thread_ts"], thread_ts, "{request}");
    let code = request["blocks"][1]["elements"][0]["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(request["blocks"][1]["elements"][1]["value"], code.as_str());
    let approval = || {
        server
            .json(&["approvals", "ls", "--all"])
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["code"] == code.as_str())
            .cloned()
            .unwrap()
    };

    let (st, v) = press(&server, "U0MAL", "byom_approve", &code, thread_ts);
    assert_eq!(st, 200, "{v}");
    let a = wait_for("the stranger's press refused", T, || {
        let a = approval();
        (!a["refused"].as_array().unwrap().is_empty()).then_some(a)
    });
    assert_eq!(a["state"], "open", "{a}");
    assert_eq!(a["refused"][0], "slack:T0001/U0MAL", "{a}");

    let (st, v) = press(&server, "U0ADA", "byom_approve", &code, thread_ts);
    assert_eq!(st, 200, "{v}");
    let a = wait_for("the approver's press", T, || {
        let a = approval();
        (a["state"] == "approved").then_some(a)
    });
    assert_eq!(a["by"], "slack:T0001/U0ADA", "{a}");
}

/// An approver may answer in their direct messages with the app (Slack's
/// signed `channel_type: im`): the code names the request, the request's
/// thread hears the outcome. A stranger's DM, and the approver's same words
/// in another channel, are not answers.
#[test]
fn approvers_answer_in_a_direct_message() {
    let api = slack_api();
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    server.trust(&["approvers", "add", "slack:T0001/U0ADA"]);
    let out = add_connector(&server, dir.path(), &format!("{}/api", api.url()));
    assert!(out.status.success(), "{}", stderr(&out));
    let thread_ts = "1700000000.000400";
    let ask = callback(
        "Ev04ASK",
        message(
            "C0OPS",
            thread_ts,
            "<@UBOT> please run `echo via-dm` on lap",
            json!({"user": "U0MAL", "user_profile": {"display_name": "Mal", "name": "mal"}}),
        ),
    );
    let (st, v) = signed(&server, &ask, now_s());
    assert_eq!(st, 200, "{v}");
    let request = wait_for("the request", T, || {
        posts(&api)
            .into_iter()
            .map(|r| r.json())
            .find(|b| b["blocks"][1]["elements"][0]["action_id"] == "byom_approve")
    });
    let code = request["blocks"][1]["elements"][0]["value"]
        .as_str()
        .unwrap()
        .to_string();
    let approval = || {
        server
            .json(&["approvals", "ls", "--all"])
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["code"] == code.as_str())
            .cloned()
            .unwrap()
    };
    let answer = format!("approve {code}");
    let not_answers = [
        ("Ev04MAL", "D0MAL", "1700000000.000401", "U0MAL", "im"),
        (
            "Ev04ELSE",
            "C0ELSE",
            "1700000000.000402",
            "U0ADA",
            "channel",
        ),
    ];
    for (id, channel, ts, user, kind) in not_answers {
        let ev = message(
            channel,
            ts,
            &answer,
            json!({"user": user, "channel_type": kind}),
        );
        let (st, v) = signed(&server, &callback(id, ev), now_s());
        assert_eq!(st, 200, "{v}");
        let id = v["trigger"].as_str().unwrap().to_string();
        let became = wait_for("the answer judged", T, || {
            let t = server.json(&["show", &id]);
            let b = t["became"].as_str().unwrap_or("").to_string();
            b.starts_with("not an answer").then_some(b)
        });
        assert!(
            became.contains(if user == "U0MAL" {
                "approver"
            } else {
                "thread"
            }),
            "{became}"
        );
    }
    assert_eq!(approval()["state"], "open", "{}", approval());
    let ev = message(
        "D0ADA",
        "1700000000.000403",
        &answer,
        json!({"user": "U0ADA", "channel_type": "im"}),
    );
    let (st, v) = signed(&server, &callback("Ev04ADA", ev), now_s());
    assert_eq!(st, 200, "{v}");
    let a = wait_for("the approver's DM", T, || {
        let a = approval();
        (a["state"] == "approved").then_some(a)
    });
    assert_eq!(a["by"], "slack:T0001/U0ADA", "{a}");
    wait_for("the request's thread told", T, || {
        posts(&api).into_iter().map(|r| r.json()).find(|b| {
            b["channel"] == "C0OPS"
                && b["thread_ts"] == thread_ts
                && b["text"].as_str().unwrap_or("").contains("direct message")
        })
    });
}

/// A channel shared with another organisation is read by people outside
/// the team: a trusted member's laptop output waits for a yes there, and
/// the request does not show it.
#[test]
fn a_shared_channel_does_not_get_the_laptop_output_unasked() {
    let api = slack_api();
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    server.trust(&["add", "slack:T0001/*"]);
    let out = add_connector(&server, dir.path(), &format!("{}/api", api.url()));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut ask: Value = serde_json::from_str(&callback(
        "Ev03ASK",
        message(
            "C0SHARED",
            "1700000000.000300",
            "<@UBOT> please run `echo shared-out` on lap",
            json!({}),
        ),
    ))
    .unwrap();
    ask["is_ext_shared_channel"] = json!(true);
    let (st, v) = signed(&server, &ask.to_string(), now_s());
    assert_eq!(st, 200, "{v}");
    let request = wait_for("the post's request", T, || {
        posts(&api)
            .into_iter()
            .map(|r| r.json())
            .find(|b| b["text"].as_str().unwrap_or("").contains("characters"))
    });
    let text = request["text"].as_str().unwrap();
    assert!(text.contains("Approval needed"), "{text}");
    assert!(
        posts(&api)
            .iter()
            .all(|p| !p.json()["text"].as_str().unwrap_or("").contains("Done:")),
        "the output was not posted"
    );
    assert!(!text.contains("shared-out"), "{text}");
}

/// A public channel is read by anyone in the workspace, not only by those
/// who spoke: with only some members trusted, a trusted member's laptop
/// output waits for a yes there. A private channel is read by its members
/// (Slack is asked who they are): posted where all are trusted, held where
/// one (eve, who never spoke) is not.
#[test]
fn a_public_channel_is_read_by_the_whole_workspace() {
    let api = slack_api();
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    server.trust(&["add", "slack:T0001/U0ADA"]);
    let out = add_connector(&server, dir.path(), &format!("{}/api", api.url()));
    assert!(out.status.success(), "{}", stderr(&out));
    let ask = |id: &str, channel: &str, ts: &str, kind: &str, cmd: &str| {
        let ev = message(
            channel,
            ts,
            &format!("<@UBOT> please run `{cmd}` on lap"),
            json!({"channel_type": kind}),
        );
        let (st, v) = signed(&server, &callback(id, ev), now_s());
        assert_eq!(st, 200, "{v}");
    };
    ask(
        "Ev05PUB",
        "C0PUBLIC",
        "1700000000.000500",
        "channel",
        "echo in-the-open",
    );
    let request = posted(&api, "the post's request", "C0PUBLIC", "characters");
    let text = request["text"].as_str().unwrap();
    assert!(
        text.contains("Approval needed") && text.contains("public channel"),
        "{text}"
    );
    ask(
        "Ev05PRIV",
        "C0PRIVATE",
        "1700000000.000501",
        "group",
        "echo among-us",
    );
    posted(
        &api,
        "the private channel's answer",
        "C0PRIVATE",
        "among-us",
    );
    assert!(
        posts(&api).iter().all(|p| {
            let b = p.json();
            !(b["channel"] == "C0PUBLIC"
                && b["text"].as_str().unwrap_or("").contains("in-the-open\n"))
        }),
        "the public channel's output was not posted"
    );
    ask(
        "Ev05EVE",
        "C0GUESTS",
        "1700000000.000502",
        "group",
        "echo eve-reads",
    );
    let request = posted(
        &api,
        "the private channel's request",
        "C0GUESTS",
        "characters",
    );
    let text = request["text"].as_str().unwrap();
    assert!(
        text.contains("Approval needed") && text.contains("U0EVE"),
        "{text}"
    );
}

/// Someone who joins a private channel reads what is posted there from
/// then on: the member list learnt minutes ago does not stand in for
/// Slack's word that she joined (its `channel_join` message, or
/// `member_joined_channel`). Eve joins after ada's first request was
/// answered; ada's next one, a minute later, waits for a yes.
#[test]
fn a_member_who_joins_a_private_channel_reads_from_then_on() {
    let api = slack_api();
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    server.trust(&["add", "slack:T0001/U0ADA"]);
    let out = add_connector(&server, dir.path(), &format!("{}/api", api.url()));
    assert!(out.status.success(), "{}", stderr(&out));
    let ask = |id: &str, ts: &str, cmd: &str| {
        let ev = message(
            "C0LATER",
            ts,
            &format!("<@UBOT> please run `{cmd}` on lap"),
            json!({"channel_type": "group"}),
        );
        let (st, v) = signed(&server, &callback(id, ev), now_s());
        assert_eq!(st, 200, "{v}");
    };
    ask("Ev06ADA1", "1700000000.000600", "echo before-eve");
    posted(&api, "the answer among the team", "C0LATER", "before-eve");
    EVE_JOINED_LATER.store(true, Ordering::SeqCst);
    let join = json!({"type": "message", "subtype": "channel_join", "channel": "C0LATER",
                      "user": "U0EVE", "text": "<@U0EVE> has joined the channel",
                      "ts": "1700000000.000601", "event_ts": "1700000000.000601",
                      "channel_type": "group"});
    let (st, v) = signed(&server, &callback("Ev06JOIN", join), now_s());
    assert_eq!(st, 200, "{v}");
    ask("Ev06ADA2", "1700000000.000602", "echo after-eve");
    let request = posted(
        &api,
        "the request now that eve reads it",
        "C0LATER",
        "characters",
    );
    let text = request["text"].as_str().unwrap();
    assert!(
        text.contains("Approval needed") && text.contains("U0EVE"),
        "{text}"
    );
    assert!(
        posts(&api).iter().all(|p| !p.json()["text"]
            .as_str()
            .unwrap_or("")
            .contains("after-eve\n")),
        "the output was not posted where eve reads"
    );
}

/// An `app_mention` (which says nothing of its channel) in a channel byom
/// has not seen: Slack is asked what it is, and a private one is read by
/// its members: with eve in it, the laptop output waits for a yes even
/// though everyone in the workspace is trusted as a member.
#[test]
fn a_mention_in_an_unseen_private_channel_is_judged_by_its_members() {
    let api = slack_api();
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    server.trust(&["add", "slack:T0001/U0ADA"]);
    let out = add_connector(&server, dir.path(), &format!("{}/api", api.url()));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut ev = message(
        "C0MENTIONED",
        "1700000000.000700",
        "<@UBOT> please run `echo mentioned` on lap",
        json!({"type": "app_mention"}),
    );
    ev.as_object_mut().unwrap().remove("channel_type");
    let (st, v) = signed(&server, &callback("Ev07MENTION", ev), now_s());
    assert_eq!(st, 200, "{v}");
    let request = posted(&api, "the request", "C0MENTIONED", "characters");
    let text = request["text"].as_str().unwrap();
    assert!(
        text.contains("Approval needed") && text.contains("U0EVE"),
        "{text}"
    );
}
