//! Triggers in: `byom events`, the webhook (HMAC-signed), threads, the fast
//! path per source, and `byom events tail`.

use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use byom_tests::{byom_headers, https_post, server_config, stderr, stdout, webhook_post, Server};

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
        Some(&byom_headers(&key, body)),
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
        Some(&byom_headers(b"wrong key wrong key wrong key!!", body)),
        body,
    );
    assert_eq!(st, 401);
    let (st, _) = webhook_post(server.webhook_addr, "/hooks/github", None, body);
    assert_eq!(st, 401);
    let tampered = body.replace("review", "delete everything");
    let (st, _) = webhook_post(
        server.webhook_addr,
        "/hooks/github",
        Some(&byom_headers(&key, body)),
        &tampered,
    );
    assert_eq!(st, 401);
    let (st, _) = webhook_post(
        server.webhook_addr,
        "/hooks/github",
        Some(&byom_headers(&key, "not json")),
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

/// A non-loopback address of this machine (where another machine's
/// packets would come from), found by asking the kernel for a route.
fn outside_ip() -> std::net::IpAddr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.connect("192.0.2.1:9")
        .expect("a route to another network (for an address other machines would see)");
    let ip = s.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "{ip}");
    ip
}

/// The webhook port speaks TLS: with the server's own certificate (a
/// client trusting the server's CA posts a signed webhook over HTTPS), or
/// with the operator's (`--webhook-tls-cert/--webhook-tls-key`); plain
/// HTTP is answered from this machine and refused from another address;
/// `connectors add` prints the https:// URL to register.
#[test]
fn the_webhook_port_speaks_tls() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::replica_unstarted(dir.path(), "server", None);
    server.webhook_addr = "0.0.0.0:0".parse().unwrap();
    server.launch();
    let key = std::fs::read_to_string(server.data_dir.join("webhook.key")).unwrap();
    let key = key.trim().as_bytes().to_vec();
    let ca = std::fs::read_to_string(server.data_dir.join("admin/ca.pem")).unwrap();
    let port = server.webhook_addr.port();
    let local: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let outside = std::net::SocketAddr::new(outside_ip(), port);
    let body = r#"{"thread": "tls", "user": "ci", "text": "over https"}"#;

    let (st, v) = https_post(
        local,
        "localhost",
        &ca,
        "/hooks/ci",
        &byom_headers(&key, body),
        body,
    )
    .expect("TLS with the server's certificate");
    assert_eq!(st, 202, "{v}");
    let b2 = r#"{"thread": "tls", "user": "ci", "text": "from afar over https"}"#;
    let (st, v) = https_post(
        outside,
        "localhost",
        &ca,
        "/hooks/ci",
        &byom_headers(&key, b2),
        b2,
    )
    .expect("TLS from another address");
    assert_eq!(st, 202, "{v}");
    // Plain HTTP: this machine's own scripts yes, other machines no.
    let b3 = r#"{"thread": "tls", "user": "ci", "text": "plain and local"}"#;
    let (st, v) = webhook_post(local, "/hooks/ci", Some(&byom_headers(&key, b3)), b3);
    assert_eq!(st, 202, "{v}");
    let b4 = r#"{"thread": "tls", "user": "ci", "text": "plain from afar"}"#;
    let (st, v) = webhook_post(outside, "/hooks/ci", Some(&byom_headers(&key, b4)), b4);
    assert_eq!(st, 400, "{v}");
    assert!(v.contains("https://"), "{v}");
    // A client still sending when the refusal comes reads it, not a reset:
    // the port closes gracefully (a lingering close), whatever is unread.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(outside).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"POST /hooks/ci HTTP/1.1\r\nHost: x\r\nContent-Length: 50000\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        s.write_all(&[b'x'; 50_000])
            .expect("the body sent after the refusal is read, not reset");
        let mut out = String::new();
        s.read_to_string(&mut out)
            .expect("the refusal, then an orderly close");
        assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    }
    let texts: Vec<String> = server
        .json(&["events", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(!texts.iter().any(|t| t == "plain from afar"), "{texts:?}");

    // `connectors add` says where GitHub should post.
    std::fs::write(dir.path().join("secret"), "s3cret").unwrap();
    std::fs::write(dir.path().join("token"), "ghp_x").unwrap();
    let out = server.byom(&[
        "connectors",
        "add",
        "github",
        "gh",
        "--webhook-secret-file",
        dir.path().join("secret").to_str().unwrap(),
        "--token-file",
        dir.path().join("token").to_str().unwrap(),
        "--api-url",
        "http://127.0.0.1:9",
        "--bot-login",
        "byom-bot",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains(&format!(":{port}/github/gh")) && said.contains("https://"),
        "{said}"
    );
    server.kill9();

    // The operator's certificate, for a name peers verify.
    let cert = rcgen::generate_simple_self_signed(vec!["hooks.example.test".to_string()]).unwrap();
    std::fs::write(dir.path().join("hook.crt"), cert.cert.pem()).unwrap();
    std::fs::write(
        dir.path().join("hook.key"),
        cert.signing_key.serialize_pem(),
    )
    .unwrap();
    let mut server = Server::replica_unstarted(dir.path(), "server", None);
    server.extra_args = vec![
        "--webhook-tls-cert".into(),
        dir.path().join("hook.crt").to_str().unwrap().into(),
        "--webhook-tls-key".into(),
        dir.path().join("hook.key").to_str().unwrap().into(),
    ];
    server.launch();
    let b5 = r#"{"thread": "tls", "user": "ci", "text": "with the operator's certificate"}"#;
    let (st, v) = https_post(
        server.webhook_addr,
        "hooks.example.test",
        &cert.cert.pem(),
        "/hooks/ci",
        &byom_headers(&key, b5),
        b5,
    )
    .expect("TLS with the operator's certificate");
    assert_eq!(st, 202, "{v}");
    // The server's own CA no longer vouches for the port.
    assert!(https_post(server.webhook_addr, "localhost", &ca, "/hooks/ci", "", "{}").is_err());
}

/// The generic webhook signed the way people sign it: `openssl dgst
/// -hmac "$(cat webhook.key)"` (the shell drops the key file's newline),
/// or `byom webhook sign`; and a refusal that says what was wrong.
#[test]
fn webhooks_signed_with_openssl_and_byom_webhook_sign_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    // A key its owner wrote, as `openssl rand -base64 32 > webhook.key`
    // does: not hex, ending in a newline. (A shared store keeps its own
    // key and writes it here: the rest holds for that one too.)
    let key_file = dir.path().join("server/webhook.key");
    if !byom_tests::test_store_is_postgres() {
        std::fs::create_dir_all(key_file.parent().unwrap()).unwrap();
        std::fs::write(&key_file, "q9Lw0VbYp1m3ZC2R/7xJd+ElGf8kTnHuXs4aOPiW6cY=\n").unwrap();
    }
    let server = Server::start(dir.path());
    let key = std::fs::read_to_string(&key_file).unwrap();
    let body = r#"{"thread":"ci","user":"ci-bot","text":"build 41 failed","mention":true}"#;
    let body_file = dir.path().join("body.json");
    std::fs::write(&body_file, body).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();

    // README's line, with the real openssl.
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"printf '%s.%s' "$TS" "$(cat "$BODY")" | openssl dgst -sha256 -hmac "$(cat "$KEY")" | cut -d' ' -f2"#)
        .env("TS", now.to_string())
        .env("BODY", &body_file)
        .env("KEY", &key_file)
        .output()
        .expect("openssl (Debian package openssl; .ci/run installs it)");
    assert!(o.status.success(), "{}", stderr(&o));
    let hex = stdout(&o).trim().to_string();
    assert_eq!(hex.len(), 64, "{hex}");
    let headers = format!("X-Byom-Timestamp: {now}\r\nX-Byom-Signature: sha256={hex}\r\n");
    let (st, reply) = webhook_post(server.webhook_addr, "/hooks/ci", Some(&headers), body);
    assert_eq!(st, 202, "{reply}");

    // byom webhook sign: the same value for the same time, and headers
    // that are accepted as they are.
    let sign = |args: &[&str]| {
        let o = std::process::Command::new(byom_tests::bin("byom"))
            .args(["webhook", "sign"])
            .args(args)
            .env("BYOM_DATA_DIR", &server.data_dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let value = sign(&[
        "--timestamp",
        &now.to_string(),
        "--value",
        body_file.to_str().unwrap(),
    ]);
    assert_eq!(value.trim(), format!("sha256={hex}"));
    let second = body.replace("41", "42");
    std::fs::write(&body_file, &second).unwrap();
    let headers = sign(&[
        "--key",
        key_file.to_str().unwrap(),
        body_file.to_str().unwrap(),
    ]);
    assert!(headers.starts_with("X-Byom-Timestamp: "), "{headers}");
    let headers = headers.replace('\n', "\r\n");
    let (st, reply) = webhook_post(server.webhook_addr, "/hooks/ci", Some(&headers), &second);
    assert_eq!(st, 202, "{reply}");

    // A body changed on the way (curl -d @FILE drops newlines): 401 that
    // says which header, which algorithm and over what, and nothing of
    // the key.
    let (st, reply) = webhook_post(
        server.webhook_addr,
        "/hooks/ci",
        Some(&headers),
        &format!("{second}\n"),
    );
    assert_eq!(st, 401, "{reply}");
    let why: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let text = why["error"].as_str().unwrap();
    for want in [
        "bad signature",
        "X-Byom-Signature",
        "HMAC-SHA256",
        "--data-binary",
    ] {
        assert!(text.contains(want), "{want:?} missing: {text}");
    }
    assert_eq!(why["header"], "X-Byom-Signature");
    assert_eq!(why["algorithm"], "HMAC-SHA256");
    assert_eq!(why["body_bytes"], second.len() + 1);
    assert!(!reply.contains(key.trim()), "{reply}");
    let (st, reply) = webhook_post(server.webhook_addr, "/hooks/ci", None, body);
    assert_eq!(st, 401);
    assert!(reply.contains("missing X-Byom-Timestamp"), "{reply}");
}
