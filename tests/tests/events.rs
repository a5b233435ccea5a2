//! Triggers in: `byom events`, the webhook (HMAC-signed), threads, the fast
//! path per source, and `byom events tail`.

use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use byom_tests::{server_config, stderr, stdout, webhook_post, webhook_sign, Server};

/// Triggers from people (not the agent's own replies).
fn people(v: &serde_json::Value) -> usize {
    v.as_array()
        .unwrap()
        .iter()
        .filter(|t| t["from_bot"] != true)
        .count()
}

#[test]
fn events_threads_fast_path_and_webhook() {
    let dir = tempfile::tempdir().unwrap();
    server_config(
        dir.path(),
        "sources.toml",
        "[sources.chat]\nmode = \"addressed_only\"\n[sources.ci]\nmode = \"ignore\"\n",
    );
    let server = Server::start(dir.path());

    // CLI events: one thread per (source, thread name); fast path per source.
    let a = server.json(&[
        "events",
        "send",
        "--source",
        "chat",
        "--thread",
        "general",
        "--user",
        "ada",
        "--mention",
        "please run uname on lap",
    ]);
    assert_eq!(a["decision"], "candidate", "{a}");
    let b = server.json(&[
        "events",
        "send",
        "--source",
        "chat",
        "--thread",
        "general",
        "--user",
        "bob",
        "just chatting",
    ]);
    assert_eq!(b["decision"], "ignored");
    assert!(b["reason"].as_str().unwrap().contains("addressed"));
    assert_eq!(a["thread_id"], b["thread_id"], "same thread");
    let c = server.json(&[
        "events", "send", "--source", "ci", "--thread", "build-1", "--user", "ci", "failed",
    ]);
    assert_eq!(c["decision"], "ignored");
    assert_ne!(c["thread_id"], a["thread_id"]);
    let shown = stdout(&server.byom(&["show", a["id"].as_str().unwrap()]));
    assert!(shown.contains("please run uname"), "{shown}");
    let thread = stdout(&server.byom(&["show", a["thread_id"].as_str().unwrap()]));
    assert!(thread.contains("general"), "{thread}");
    let on_thread = server.json(&["events", "ls", "--thread", a["thread_id"].as_str().unwrap()]);
    assert_eq!(people(&on_thread), 2, "the agent's replies aside");
    let out = server.byom(&["events", "send", "--thread", "", "--user", "x", "y"]);
    assert!(!out.status.success(), "{}", stderr(&out));

    // Tail sees new triggers.
    let mut tail = server
        .byom_cmd(&["events", "tail", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));

    // Webhook: signed → stored; bad or missing signature → 401, nothing stored.
    let key = std::fs::read_to_string(server.data_dir.join("webhook.key")).unwrap();
    let key = key.trim().as_bytes().to_vec();
    let before = people(&server.json(&["events", "ls", "--limit", "1000"]));
    let body =
        r#"{"thread": "pr-42", "user": "octocat", "text": "@byom please review", "mention": true}"#;
    let (st, reply) = webhook_post(
        server.webhook_addr,
        "/hooks/github",
        Some(&webhook_sign(&key, body)),
        body,
    );
    assert_eq!(st, 202, "{reply}");
    assert!(
        reply.contains("trg_") && reply.contains("candidate"),
        "{reply}"
    );
    let (st, _) = webhook_post(
        server.webhook_addr,
        "/hooks/github",
        Some(&webhook_sign(b"wrong key wrong key wrong key!!", body)),
        body,
    );
    assert_eq!(st, 401);
    let (st, _) = webhook_post(server.webhook_addr, "/hooks/github", None, body);
    assert_eq!(st, 401);
    let tampered = body.replace("review", "delete everything");
    let (st, _) = webhook_post(
        server.webhook_addr,
        "/hooks/github",
        Some(&webhook_sign(&key, body)),
        &tampered,
    );
    assert_eq!(st, 401);
    let (st, _) = webhook_post(
        server.webhook_addr,
        "/hooks/github",
        Some(&webhook_sign(&key, "not json")),
        "not json",
    );
    assert_eq!(st, 400);
    let after = people(&server.json(&["events", "ls", "--limit", "1000"]));
    assert_eq!(after, before + 1, "only the signed webhook was stored");

    // The agent's replies may come through the tail first.
    let mut r = std::io::BufReader::new(tail.stdout.take().unwrap());
    let mut seen = String::new();
    for _ in 0..20 {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 || line.contains("octocat") {
            seen = line;
            break;
        }
    }
    assert!(seen.contains("octocat"), "{seen}");
    let _ = tail.kill();
    let _ = tail.wait();
}

#[test]
fn router_policies_add_list_remove_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let a = server.json(&[
        "policy",
        "add",
        "Ignore #random unless someone asks for help",
    ]);
    let b = server.json(&["policy", "add", "Never deploy on Fridays"]);
    assert!(a["id"].as_str().unwrap().starts_with("pol_"));
    assert_eq!(a["created_by"], "admin:admin");
    server.kill9();
    server.restart();
    let ls = server.json(&["policy", "ls"]);
    let texts: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        [
            "Ignore #random unless someone asks for help",
            "Never deploy on Fridays"
        ],
        "oldest first"
    );
    assert!(server
        .byom(&["policy", "rm", a["id"].as_str().unwrap()])
        .status
        .success());
    assert!(!server
        .byom(&["policy", "rm", a["id"].as_str().unwrap()])
        .status
        .success());
    assert_eq!(server.json(&["policy", "ls"]).as_array().unwrap().len(), 1);
    assert!(!server.byom(&["policy", "add", "  "]).status.success());
    let _ = b;
}

/// The rules file is reloaded when it changes: a good edit takes effect
/// without a restart, a bad one is refused (the rules stay, the reason is
/// shown by `byom sources show`), and `byom sources set` changes them too.
#[test]
fn routing_rules_change_at_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let send = |user: &str| {
        server.json(&[
            "events", "send", "--source", "chat", "--thread", "general", "--user", user, "chatter",
        ])
    };
    assert_eq!(send("ada")["decision"], "candidate");
    let file = server.data_dir.join("sources.toml");
    std::fs::write(&file, "[sources.chat]\nmode = \"addressed_only\"\n").unwrap();
    byom_tests::wait_for("the edit to take effect", Duration::from_secs(20), || {
        (send("ada")["decision"] == "ignored").then_some(())
    });
    std::fs::write(&file, "[sources.chat]\nmode = \"whenever\"\n").unwrap();
    let shown = byom_tests::wait_for("the bad edit refused", Duration::from_secs(20), || {
        let v = server.json(&["sources", "show"]);
        (!v["last_refused_edit"].as_str().unwrap().is_empty()).then_some(v)
    });
    assert!(
        shown["last_refused_edit"]
            .as_str()
            .unwrap()
            .contains("whenever"),
        "{shown}"
    );
    assert!(
        shown["rules"].as_str().unwrap().contains("addressed_only"),
        "{shown}"
    );
    assert_eq!(
        send("ada")["decision"],
        "ignored",
        "the previous rules stay"
    );
    let human = server.byom(&["sources", "show"]);
    assert!(stdout(&human).contains("refused"), "{}", stdout(&human));

    let other = dir.path().join("rules.toml");
    std::fs::write(&other, "[sources.chat]\nmode = \"ignore\"\n").unwrap();
    let ok = server.byom(&["sources", "check", other.to_str().unwrap()]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let set = server.byom(&["sources", "set", other.to_str().unwrap()]);
    assert!(set.status.success(), "{}", stderr(&set));
    let v = send("ada");
    assert!(v["reason"].as_str().unwrap().contains("ignored"), "{v}");
    std::fs::write(&other, "[sources.chat]\nmode = 3\n").unwrap();
    let bad = server.byom(&["sources", "check", other.to_str().unwrap()]);
    assert!(!bad.status.success());
}
