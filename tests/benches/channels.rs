//! Channel benchmarks (`cargo bench -p byom-tests --bench channels`), with
//! a real `byom server` (and Synapse) on loopback, each against a baseline
//! in the same run:
//!
//! 1. Inbound events per second on each connector's endpoint (signature
//!    check, dedupe, store, flush): Slack's `/slack/NAME/events` and
//!    GitHub's `/github/NAME`, next to the generic `/hooks/SOURCE`.
//! 2. Message → reply latency through Synapse with a zero-latency scripted
//!    model (p50, p99), next to Synapse's own echo of a message to its
//!    sender (baseline).
//!
//! Figures only mean something relative to each other in the same run.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use byom_tests::channels::{enc, matrix_room, post_hook, MatrixRoom, Synapse};
use byom_tests::{webhook_sign, Server};
use ring::hmac;
use serde_json::{json, Value};

const EVENTS: usize = 1500;
const CLIENTS: usize = 4;
const MESSAGES: usize = 40;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `EVENTS` requests from `CLIENTS` threads; events per second.
fn rate(
    addr: SocketAddr,
    make: impl Fn(usize) -> (String, Vec<(String, String)>, String) + Sync,
) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let make = &make;
            s.spawn(move || {
                for i in (c..EVENTS).step_by(CLIENTS) {
                    let (path, headers, body) = make(i);
                    let h: Vec<(&str, &str)> = headers
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    let (st, v) = post_hook(addr, &path, &h, &body);
                    assert!(st == 200 || st == 202, "{path}: {st} {v}");
                }
            });
        }
    });
    EVENTS as f64 / t.elapsed().as_secs_f64()
}

fn inbound() {
    let dir = tempfile::tempdir().unwrap();
    // Stored and decided, never handed to the agents: the endpoints are
    // measured, not the Router.
    byom_tests::server_config(
        dir.path(),
        "sources.toml",
        "[sources.ci]\nmode = \"ignore\"\n[sources.acme]\nmode = \"ignore\"\n[sources.gh]\nmode = \"ignore\"\n",
    );
    let server = Server::start(dir.path());
    let key = std::fs::read_to_string(server.data_dir.join("webhook.key")).unwrap();
    let key = key.trim().as_bytes().to_vec();
    for (name, args) in [
        (
            "slack",
            vec![
                "acme",
                "--bot-token-file",
                "T",
                "--signing-secret-file",
                "S",
                "--api-url",
                "http://127.0.0.1:9",
            ],
        ),
        (
            "github",
            vec![
                "gh",
                "--webhook-secret-file",
                "S",
                "--token-file",
                "T",
                "--api-url",
                "http://127.0.0.1:9",
            ],
        ),
    ] {
        std::fs::write(dir.path().join("T"), "token").unwrap();
        std::fs::write(dir.path().join("S"), "secret").unwrap();
        let mut a = vec!["connectors", "add", name];
        let t = dir.path().join("T");
        let s = dir.path().join("S");
        let args: Vec<&str> = args
            .iter()
            .map(|x| match *x {
                "T" => t.to_str().unwrap(),
                "S" => s.to_str().unwrap(),
                x => x,
            })
            .collect();
        a.extend(args);
        assert!(server.byom(&a).status.success());
    }
    let addr = server.webhook_addr;
    let generic = rate(addr, |i| {
        // Each its own request (a repeated signed body is a replay).
        let body = json!({"thread": format!("t{}", i % 50), "user": "ci",
                          "text": format!("build {i} failed on main")})
        .to_string();
        let ts = now_s().to_string();
        let sig = webhook_sign(&key, &format!("{ts}.{body}"));
        (
            "/hooks/ci".into(),
            vec![
                ("X-Byom-Timestamp".into(), ts),
                ("X-Byom-Signature".into(), sig),
                ("X-Byom-Delivery".into(), format!("g{i}")),
            ],
            body,
        )
    });
    let slack = rate(addr, |i| {
        let body = json!({"type": "event_callback", "team_id": "T1", "event_id": format!("Ev{i}"),
            "event": {"type": "message", "channel": "C1", "user": "U1", "text": "build failed on main",
                      "ts": format!("1700000000.{i:06}"), "channel_type": "channel"},
            "authorizations": [{"user_id": "UBOT"}]})
        .to_string();
        let ts = now_s().to_string();
        let mut msg = format!("v0:{ts}:").into_bytes();
        msg.extend_from_slice(body.as_bytes());
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, b"secret"), &msg);
        let sig = format!(
            "v0={}",
            tag.as_ref()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        (
            "/slack/acme/events".into(),
            vec![
                ("X-Slack-Request-Timestamp".into(), ts),
                ("X-Slack-Signature".into(), sig),
            ],
            body,
        )
    });
    let github = rate(addr, |i| {
        let body = json!({"action": "created", "repository": {"full_name": "acme/app"},
            "issue": {"number": i % 50}, "sender": {"login": "octocat"},
            "comment": {"id": i, "body": "build failed on main", "user": {"login": "octocat"}}})
        .to_string();
        let sig = webhook_sign(b"secret", &body);
        (
            "/github/gh".into(),
            vec![
                ("X-GitHub-Event".into(), "issue_comment".into()),
                ("X-GitHub-Delivery".into(), format!("d{i}")),
                ("X-Hub-Signature-256".into(), sig),
            ],
            body,
        )
    });
    println!("inbound events per second ({EVENTS} each, {CLIENTS} clients, stored and flushed):");
    println!("  generic /hooks/ci        {generic:8.0}/s  (baseline)");
    println!(
        "  slack /slack/acme/events {slack:8.0}/s  ({:.2}x)",
        slack / generic
    );
    println!(
        "  github /github/gh        {github:8.0}/s  ({:.2}x)",
        github / generic
    );
}

fn latency() {
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    let syn = Synapse::start(dir.path());
    let MatrixRoom { bot, ada, room, .. } = matrix_room(&server, &syn, dir.path());
    // ada's own sync, from now on.
    let (_, v) = syn.api("GET", "/sync?timeout=0", &ada, None);
    let mut since = v["next_batch"].as_str().unwrap().to_string();
    // Waits in ada's sync for an event `pred` accepts.
    let mut wait = |pred: &dyn Fn(&Value) -> bool| -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            let (_, v) = syn.api(
                "GET",
                &format!("/sync?timeout=5000&since={}", enc(&since)),
                &ada,
                None,
            );
            since = v["next_batch"].as_str().unwrap_or(&since).to_string();
            let evs = v["rooms"]["join"][&room]["timeline"]["events"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if evs.iter().any(pred) {
                return true;
            }
        }
        false
    };
    let mut echo = Vec::new();
    let mut reply = Vec::new();
    for i in 0..MESSAGES {
        // Baseline: the homeserver alone, a message back to its sender.
        let t = Instant::now();
        let root = syn.send(
            &room,
            &ada,
            json!({"msgtype": "m.text", "body": format!("topic {i}")}),
        );
        assert!(wait(&|e| e["event_id"] == root.as_str()));
        echo.push(t.elapsed());
        // Through byom: sync → trigger → Router → reply → outbox → send.
        let t = Instant::now();
        syn.send(
            &room,
            &ada,
            json!({"msgtype": "m.text", "body": "byom please run `true` on lap",
            "m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": true,
                             "m.in_reply_to": {"event_id": root}}}),
        );
        let bot = bot.clone();
        let root2 = root.clone();
        assert!(wait(&move |e| e["sender"] == bot.as_str()
            && e["content"]["m.relates_to"]["event_id"] == root2.as_str()
            && e["content"]["body"]
                .as_str()
                .unwrap_or("")
                .contains("On it")));
        reply.push(t.elapsed());
    }
    let (e50, e99) = (pct(&mut echo, 0.5), pct(&mut echo, 0.99));
    let (r50, r99) = (pct(&mut reply, 0.5), pct(&mut reply, 0.99));
    println!(
        "message → reply through Synapse ({MESSAGES} messages, scripted model at zero latency):"
    );
    println!(
        "  synapse echo to sender  p50 {:>9}  p99 {:>9}  (baseline)",
        ms(e50),
        ms(e99)
    );
    println!(
        "  byom reply              p50 {:>9}  p99 {:>9}  ({:.1}x at p50)",
        ms(r50),
        ms(r99),
        r50.as_secs_f64() / e50.as_secs_f64()
    );
}

fn main() {
    inbound();
    latency();
}
