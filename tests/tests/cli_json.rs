//! Every `--json` the CLI prints, against golden files: scripts read these,
//! so their shape (keys, value types, the values that do not depend on the
//! clock or the randomness of IDs) must not change by accident, whatever
//! the admin API underneath becomes. One real server and daemon, a chat
//! task with subagents and an approval, a GitHub connector with an outbox
//! and every listing and `show`.
//!
//! What varies from run to run is masked before comparing: IDs keep their
//! prefix (`wrk_*`), times and durations become `<time>` and `<number>`,
//! and rows whose order is only the order in which parallel work happened
//! are sorted. `BYOM_REGENERATE=1 cargo test -p byom-tests --test cli_json`
//! rewrites the files after a deliberate change (review the diff).

use std::path::{Path, PathBuf};
use std::time::Duration;

use byom_tests::channels::{connect_github, post_hook, FakeApi, Seen};
use byom_tests::{stderr, wait_for, webhook_sign, Server};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);
const SECRET: &str = "It's a Secret to Everybody";
const TOKEN: &str = "ghp_test_token_0123456789";
const PARALLEL: &str = "check `echo one`, `echo two` and `echo three` on lap in parallel, then ask me before running `echo cleaned-up`";

/// Keys whose values are clocks, durations, sizes of things that grow, or
/// environment facts: only their type is compared.
const VARYING: &[&str] = &[
    "addr",
    "api",
    "api_url",
    "public_addr",
    "quic_addr",
    "arch",
    "bytes",
    "cpu_ms",
    "daemon_version",
    "data_dir",
    "duration_ms",
    "elapsed_ms",
    "hostname",
    "kernel",
    "latency_ms",
    "os",
    "pid",
    "port",
    "remote_addr",
    "server_version",
    "token",
    "url",
    "version",
    "webhook_url",
    "webhook",
];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/cli")
}

fn is_time(s: &str) -> bool {
    byom_protocol::time::parse_rfc3339(s).is_some()
}

/// `mch_01J…` → `mch_*` wherever an ID appears in a string.
fn mask_ids(s: &str) -> String {
    const PREFIXES: [&str; 10] = [
        "mch_", "tok_", "cmd_", "trg_", "thr_", "wrk_", "snp_", "pol_", "apr_", "out_",
    ];
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    'outer: while !rest.is_empty() {
        for p in PREFIXES {
            if let Some(tail) = rest.strip_prefix(p) {
                let body: usize = tail
                    .bytes()
                    .take_while(|b| b.is_ascii_alphanumeric())
                    .count();
                if body >= 20 {
                    out.push_str(p);
                    out.push('*');
                    rest = &tail[body..];
                    continue 'outer;
                }
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Replaces the word after each `marker` when `word` accepts it:
/// approval codes, ports, timings inside text.
fn mask_after(s: &str, marker: &str, word: impl Fn(&str) -> bool, with: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(marker) {
        let (head, tail) = rest.split_at(i + marker.len());
        out.push_str(head);
        let n = tail
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric())
            .count();
        if n > 0 && word(&tail[..n]) {
            out.push_str(with);
            rest = &tail[n..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

fn mask_text(s: &str) -> String {
    let code = |w: &str| {
        w.len() == 6
            && w.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    };
    let digits = |w: &str| w.bytes().all(|b| b.is_ascii_digit());
    let mut s = mask_ids(s);
    for m in ["code ", "approve ", "deny "] {
        s = mask_after(&s, m, code, "<code>");
    }
    for m in ["127.0.0.1:", "0.0.0.0:", " ms="] {
        s = mask_after(&s, m, digits, "<n>");
    }
    s
}

fn placeholder(v: &Value) -> Value {
    match v {
        Value::Null => Value::Null,
        Value::Bool(_) => json!("<bool>"),
        Value::Number(_) => json!("<number>"),
        Value::String(_) => json!("<string>"),
        Value::Array(_) => json!("<array>"),
        Value::Object(_) => json!("<object>"),
    }
}

fn normalize(v: &Value, key: &str, dir: &str) -> Value {
    if VARYING.contains(&key)
        || key.ends_with("_at")
        || key.ends_with("_ms")
        || key.ends_with("sha256")
    {
        return placeholder(v);
    }
    match v {
        Value::String(s) if is_time(s) => json!("<time>"),
        Value::String(_) if key == "code" => json!("<code>"),
        Value::String(s) => Value::String(mask_text(&s.replace(dir, "<dir>"))),
        Value::Array(a) => {
            let mut rows: Vec<Value> = a.iter().map(|x| normalize(x, key, dir)).collect();
            rows.sort_by_key(|r| r.to_string());
            Value::Array(rows)
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (mask_ids(k), normalize(x, k, dir)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Runs `byom ARGS --json` and checks it against `golden/cli/NAME.json`.
struct Golden<'a> {
    server: &'a Server,
    dir: String,
    failures: Vec<String>,
    seen: Vec<String>,
}

impl Golden<'_> {
    fn check(&mut self, name: &str, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.server.byom(&a);
        assert!(out.status.success(), "byom {a:?}: {}", stderr(&out));
        let raw: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "byom {a:?}: not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        let got = serde_json::to_string_pretty(&normalize(&raw, "", &self.dir)).unwrap() + "\n";
        let file = golden_dir().join(format!("{name}.json"));
        self.seen.push(format!("{name}.json"));
        if std::env::var_os("BYOM_REGENERATE").is_some() {
            std::fs::create_dir_all(golden_dir()).unwrap();
            std::fs::write(&file, &got).unwrap();
        } else {
            let want = std::fs::read_to_string(&file).unwrap_or_default();
            if want != got {
                // What it printed, next to the golden file, to diff.
                let seen = std::env::temp_dir().join("byom-cli-json");
                let _ = std::fs::create_dir_all(&seen);
                let _ = std::fs::write(seen.join(format!("{name}.json")), &got);
                self.failures.push(format!(
                    "byom {}: {} differs:\n{got}",
                    a.join(" "),
                    file.display()
                ));
            }
        }
        raw
    }
}

fn github_api() -> FakeApi {
    FakeApi::start(|r: &Seen| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/user") => (200, vec![], json!({"login": "byom-bot"}).to_string()),
        ("POST", p) if p.ends_with("/comments") => (201, vec![], json!({"id": 1}).to_string()),
        _ => (404, vec![], "{}".into()),
    })
}

#[test]
fn every_json_output_matches_its_golden_file() {
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    let api = github_api();
    let token = dir.path().join("gh.token");
    std::fs::write(&token, TOKEN).unwrap();
    connect_github(
        &server,
        dir.path(),
        "gh",
        SECRET,
        &api.url(),
        "byom-bot",
        &["--token-file", token.to_str().unwrap()],
    );
    let mut g = Golden {
        server: &server,
        dir: dir.path().to_string_lossy().into_owned(),
        failures: Vec::new(),
        seen: Vec::new(),
    };

    // Machines, tokens, commands, policies.
    g.check("machines-ls", &["machines", "ls"]);
    g.check("machines-show", &["machines", "show", "lap"]);
    let tok = g.check("token-create", &["token", "create", "--ttl", "1h"]);
    g.check("token-ls", &["token", "ls"]);
    let cmd = server.detach("lap", &[], &["echo", "hello"]);
    server.wait_done(&cmd, T);
    g.check("commands-show", &["commands", "show", &cmd]);
    g.check(
        "policy-add",
        &["policy", "add", "answer questions about the build"],
    );
    g.check("policy-ls", &["policy", "ls"]);
    g.check("show-token", &["show", tok["id"].as_str().unwrap()]);
    g.check("show-command", &["show", &cmd]);
    g.check("show-machine", &["show", "lap"]);

    // A chat task with three subagents and an approval, answered.
    server.say("g1", PARALLEL);
    let open = wait_for("an approval", T, || {
        let a = server.json(&["approvals", "ls"]);
        (a.as_array().map(Vec::len) == Some(1)).then_some(a)
    });
    g.check("approvals-ls-open", &["approvals", "ls"]);
    let apr = open[0]["id"].as_str().unwrap().to_string();
    let out = server.byom(&["approvals", "approve", &apr]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("the program's result", T, || {
        let done = server
            .replies("g1")
            .iter()
            .any(|r| r.contains("cleaned-up"));
        let t = server.json(&["tasks", "ls"]);
        (done && t[0]["status"] != "running").then_some(())
    });
    let tasks = g.check("tasks-ls", &["tasks", "ls"]);
    let task = tasks[0]["id"].as_str().unwrap().to_string();
    g.check("tasks-show", &["tasks", "show", &task]);
    let workers = g.check("workers-ls", &["workers", "ls"]);
    let sub = workers
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["parent"].is_string() && w["task"].as_str().unwrap_or("").contains("echo one"))
        .and_then(|w| w["id"].as_str())
        .unwrap()
        .to_string();
    g.check("workers-show-subagent", &["workers", "show", &sub]);
    g.check("approvals-ls-all", &["approvals", "ls", "--all"]);
    g.check("show-approval", &["show", &apr]);
    g.check("show-worker", &["show", &task]);
    g.check("threads-ls", &["threads", "ls"]);
    let thread = g.check("threads-show", &["threads", "show", "g1"]);
    g.check("router", &["router"]);
    let trg = thread["messages"][0]["id"].as_str().unwrap().to_string();
    g.check("show-trigger", &["show", &trg]);
    let thr = thread["id"].as_str().unwrap().to_string();
    g.check("show-thread", &["show", &thr]);
    g.check("events-ls", &["events", "ls", "--thread", &thr]);
    g.check(
        "events-send",
        &[
            "events", "send", "--source", "chat", "--thread", "g2", "--user", "ada", "hello",
        ],
    );

    // People and trust.
    g.check("trust-ls", &["trust", "ls"]);
    g.check("admins-ls", &["admins", "ls"]);

    // A GitHub connector, a comment that becomes a task, its replies.
    g.check("connectors-ls", &["connectors", "ls"]);
    g.check("connectors-show", &["connectors", "show", "gh"]);
    g.check("connectors-test", &["connectors", "test", "gh"]);
    server.trust(&["add", "github:octocat"]);
    let comment = json!({"action": "created", "repository": {"full_name": "acme/app"},
        "issue": {"number": 12, "title": "flaky build"},
        "comment": {"id": 555, "body": "@byom-bot please run `echo from-github` on lap",
                    "html_url": "https://github.com/acme/app/issues/12#issuecomment-555",
                    "user": {"login": "octocat", "type": "User"}, "author_association": "MEMBER"},
        "sender": {"login": "octocat", "type": "User"}})
    .to_string();
    let (st, v) = post_hook(
        server.webhook_addr,
        "/github/gh",
        &[
            ("X-GitHub-Event", "issue_comment"),
            ("X-GitHub-Delivery", "d1"),
            (
                "X-Hub-Signature-256",
                &webhook_sign(SECRET.as_bytes(), &comment),
            ),
        ],
        &comment,
    );
    assert_eq!(st, 202, "{v}");
    let outbox = wait_for("the replies to be sent", T, || {
        let o = server.json(&["outbox", "ls"]);
        let rows = o.as_array().cloned().unwrap_or_default();
        let done = rows.iter().any(|r| {
            r["state"] == "sent" && r["text"].as_str().unwrap_or("").contains("from-github")
        });
        (done && rows.iter().all(|r| r["state"] == "sent")).then_some(o)
    });
    g.check("outbox-ls", &["outbox", "ls"]);
    let out_id = outbox[0]["id"].as_str().unwrap().to_string();
    g.check("outbox-show", &["outbox", "show", &out_id]);
    g.check("show-outbox", &["show", &out_id]);
    g.check("sources-show", &["sources", "show"]);

    // The whole picture.
    g.check("status", &["status"]);
    g.check("audit-ls", &["audit", "ls"]);
    g.check("commands-ls", &["commands", "ls"]);

    if std::env::var_os("BYOM_REGENERATE").is_none() {
        // A golden file no check wrote is a command that lost its test.
        let mut stale: Vec<String> = std::fs::read_dir(golden_dir())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| !g.seen.contains(n))
            .collect();
        stale.sort();
        assert!(stale.is_empty(), "golden files nothing checks: {stale:?}");
    }
    assert!(g.failures.is_empty(), "{}", g.failures.join("\n\n"));
}
