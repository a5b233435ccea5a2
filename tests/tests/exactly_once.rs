//! Exactly once, end to end: creating calls carry idempotency keys, so a
//! retry after a lost answer returns the first result; and the chaos test:
//! the server killed with SIGKILL at random moments under a mixed workload
//! of detached and attached commands and agent tasks, clients retrying with
//! their keys. Every acknowledged command must run exactly once and end.
//!
//! `BYOM_CHAOS_KILLS=200 cargo test -p byom-tests --test exactly_once chaos
//! -- --nocapture` runs a longer chaos run and prints its figures.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use byom_protocol::pb;
use byom_tests::{byom_headers_at, stderr, stdout, wait_for, webhook_post, Daemon, Server};

const T: Duration = Duration::from_secs(60);

fn setup() -> (tempfile::TempDir, Server, Daemon) {
    Server::with_lap(&[], &[])
}

/// How many times each line appears in `path`.
fn counts(path: &Path) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for l in std::fs::read_to_string(path).unwrap_or_default().lines() {
        *seen.entry(l.to_string()).or_insert(0) += 1;
    }
    seen
}

#[test]
fn a_retried_exec_with_the_same_key_creates_once() {
    let (dir, server, _d) = setup();
    let runs = dir.path().join("runs");
    let line = format!("echo once >> {}", runs.display());
    let args = [
        "exec",
        "lap",
        "--detach",
        "--idempotency-key",
        "k-1",
        "--sh",
        &line,
    ];
    let a = server.byom(&args);
    assert!(a.status.success(), "{}", stderr(&a));
    let b = server.byom(&args);
    assert!(b.status.success(), "{}", stderr(&b));
    assert_eq!(
        stdout(&a).trim(),
        stdout(&b).trim(),
        "the retry names the first command"
    );
    server.wait_done(stdout(&a).trim(), T);
    assert_eq!(counts(&runs).get("once"), Some(&1));
    // The same key for another command is a mistake, said as one.
    let other = server.byom(&[
        "exec",
        "lap",
        "--detach",
        "--idempotency-key",
        "k-1",
        "--",
        "true",
    ]);
    assert!(!other.status.success());
    assert!(
        stderr(&other).contains("different request"),
        "{}",
        stderr(&other)
    );
    // Without a key (a new one per invocation) the same command runs again.
    let c = server.byom(&["exec", "lap", "--detach", "--sh", &line]);
    server.wait_done(stdout(&c).trim(), T);
    assert_eq!(counts(&runs).get("once"), Some(&2));
}

#[test]
fn every_creating_call_answers_a_retry_with_its_first_result() {
    let (_dir, server, _d) = setup();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let creds = byom_api::load_creds(Some(&server.creds()), None).unwrap();
        let mut c = byom_api::connect(&creds).await.unwrap();
        let ev = pb::SendEventRequest {
            source: "chat".into(),
            thread: "retries".into(),
            user: "ada".into(),
            text: "hello".into(),
            idempotency_key: "ev-1".into(),
            ..Default::default()
        };
        let t1 = c
            .send_event(ev.clone())
            .await
            .unwrap()
            .into_inner()
            .trigger
            .unwrap();
        let t2 = c
            .send_event(ev)
            .await
            .unwrap()
            .into_inner()
            .trigger
            .unwrap();
        assert_eq!(t1.id, t2.id);
        let tok = pb::CreateTokenRequest {
            name: "retried".into(),
            labels: [("a".into(), "1".into()), ("b".into(), "2".into())].into(),
            idempotency_key: "tok-1".into(),
            ..Default::default()
        };
        let a = c.create_token(tok.clone()).await.unwrap().into_inner();
        let b = c.create_token(tok).await.unwrap().into_inner();
        assert_eq!(a.token.unwrap().id, b.token.unwrap().id);
        assert_eq!(a.secret, b.secret, "the retry shows the same token");
        let pol = pb::AddPolicyRequest {
            text: "ignore messages from nobody".into(),
            idempotency_key: "pol-1".into(),
        };
        let p1 = c
            .add_policy(pol.clone())
            .await
            .unwrap()
            .into_inner()
            .policy
            .unwrap();
        let p2 = c
            .add_policy(pol)
            .await
            .unwrap()
            .into_inner()
            .policy
            .unwrap();
        assert_eq!(p1.id, p2.id);
        let all = c
            .list_policies(pb::ListPoliciesRequest {})
            .await
            .unwrap()
            .into_inner()
            .policies;
        assert_eq!(all.len(), 1);
        let cmd = pb::CreateCommandRequest {
            machine: "lap".into(),
            argv: vec!["true".into()],
            env: [("X".into(), "1".into()), ("Y".into(), "2".into())].into(),
            idempotency_key: "cmd-1".into(),
            ..Default::default()
        };
        let c1 = c
            .create_command(cmd.clone())
            .await
            .unwrap()
            .into_inner()
            .command
            .unwrap();
        let c2 = c
            .create_command(cmd)
            .await
            .unwrap()
            .into_inner()
            .command
            .unwrap();
        assert_eq!(c1.id, c2.id, "map fields in any order are the same request");
    });
}

/// A redelivery (same ID) is stored once; so is the same signed request
/// replayed under a new ID or none (what was signed is what it is); the
/// same text signed again (a new timestamp) is a new event.
#[test]
fn a_webhook_redelivery_is_stored_once() {
    let (_dir, server, _d) = setup();
    let key = std::fs::read(server.data_dir.join("webhook.key")).unwrap();
    let key = String::from_utf8(key).unwrap();
    let key = key.trim().as_bytes().to_vec();
    let body = r#"{"thread":"ci","user":"ci-bot","text":"build 41 failed"}"#;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signed = byom_headers_at(&key, now, body);
    let post = |headers: &str, delivery: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(server.webhook_addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "POST /hooks/ci HTTP/1.1\r\nHost: x\r\n{headers}X-Byom-Delivery: {delivery}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let first = post(&signed, "d-1");
    let again = post(&signed, "d-1");
    assert!(first.contains(" 202 "), "{first}");
    assert!(
        again.contains(" 200 ") && again.contains("duplicate"),
        "{again}"
    );
    let replayed = post(&signed, "d-2");
    assert!(
        replayed.contains(" 200 ") && replayed.contains("duplicate"),
        "the same signed request under a new ID is a replay: {replayed}"
    );
    let (status, _) = webhook_post(server.webhook_addr, "/hooks/ci", Some(&signed), body);
    assert_eq!(status, 200, "and without an ID");
    let resigned = post(&byom_headers_at(&key, now + 1, body), "d-3");
    assert!(resigned.contains(" 202 "), "{resigned}");
    // Signed ten minutes ago: refused, whatever it says.
    let stale = post(&byom_headers_at(&key, now - 600, body), "d-4");
    assert!(
        stale.contains(" 401 ") && stale.contains("Timestamp"),
        "{stale}"
    );
    let events = server.json(&["events", "ls", "--limit", "100"]);
    let n = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["text"] == "build 41 failed")
        .count();
    assert_eq!(n, 2, "one trigger per signed request: {events}");
}

/// A deterministic generator for the chaos schedule (xorshift64*).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D) % n.max(1)
    }
}

/// Runs `byom` with these args until it succeeds or `deadline` passes;
/// its stdout on success.
fn until_ok(bin: &Path, creds: &Path, args: &[String], deadline: Instant) -> Option<String> {
    while Instant::now() < deadline {
        let out = Command::new(bin)
            .args(args)
            .env("BYOM_CREDS", creds)
            .env_remove("BYOM_API")
            .output()
            .ok()?;
        if out.status.success() {
            return Some(stdout(&out));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

#[test]
fn chaos_server_killed_at_random_runs_every_acknowledged_command_once() {
    let _heavy = byom_tests::cpu_heavy();
    let kills: u64 = std::env::var("BYOM_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("chaos seed {seed}, {kills} kills");
    let (dir, mut server, _d) = setup();
    let runs: PathBuf = dir.path().join("runs");
    let bin = byom_tests::bin("byom");
    let creds = server.creds();
    let stop = byom_tests::Flag::default();
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(60 + kills * 3);
    let mut clients = Vec::new();
    // Detached commands (three clients), attached ones (one client).
    for (client, attached) in [(0, false), (1, false), (2, false), (3, true)] {
        let (bin, creds, runs, stop, acked) = (
            bin.clone(),
            creds.clone(),
            runs.clone(),
            stop.clone(),
            acked.clone(),
        );
        clients.push(std::thread::spawn(move || {
            for i in 0.. {
                if stop.get() || Instant::now() > deadline {
                    return;
                }
                let marker = format!("c{client}-{i}");
                let line = format!("echo {marker} >> {}", runs.display());
                let mut args: Vec<String> =
                    ["exec", "lap", "--idempotency-key", &marker, "--sh", &line]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                if !attached {
                    args.insert(2, "--detach".into());
                }
                if let Some(out) = until_ok(&bin, &creds, &args, deadline) {
                    let id = if attached {
                        String::new()
                    } else {
                        out.trim().to_string()
                    };
                    acked.lock().unwrap().push((marker, id));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }));
    }
    // Agent tasks: each event once, each task's command once.
    let agent_markers: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let (bin, creds, runs, stop, agent_markers) = (
            bin.clone(),
            creds.clone(),
            runs.clone(),
            stop.clone(),
            agent_markers.clone(),
        );
        clients.push(std::thread::spawn(move || {
            for i in 0.. {
                if stop.get() || Instant::now() > deadline {
                    return;
                }
                let marker = format!("agent-{i}");
                let text = format!("please run `echo {marker} >> {}` on lap", runs.display());
                let args: Vec<String> = [
                    "events",
                    "send",
                    "--source",
                    "chat",
                    "--thread",
                    &marker,
                    "--user",
                    "ada",
                    "--mention",
                    &text,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if until_ok(&bin, &creds, &args, deadline).is_some() {
                    agent_markers.lock().unwrap().push(marker);
                }
                std::thread::sleep(Duration::from_millis(400));
            }
        }));
    }
    let mut rng = Rng(seed);
    let started = Instant::now();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(150 + rng.below(900)));
        server.kill9();
        server.restart();
    }
    stop.set(true);
    for c in clients {
        c.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let agent_markers = agent_markers.lock().unwrap().clone();
    // Every detached command ends.
    for (_, id) in acked.iter().filter(|(_, id)| !id.is_empty()) {
        let c = server.wait_done(id, T);
        assert_eq!(c["state"], "exited", "{c}");
    }
    // Every agent task's command runs (once).
    wait_for("agent tasks to run", T, || {
        let seen = counts(&runs);
        agent_markers
            .iter()
            .all(|m| seen.contains_key(m))
            .then_some(())
    });
    let seen = counts(&runs);
    let twice: Vec<&String> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(m, _)| m)
        .collect();
    let missing: Vec<&String> = acked
        .iter()
        .map(|(m, _)| m)
        .chain(agent_markers.iter())
        .filter(|m| !seen.contains_key(*m))
        .collect();
    println!(
        "chaos: {kills} kills in {:.0} s; {} commands acknowledged ({} attached), {} agent tasks; ran twice: {}, lost: {}",
        started.elapsed().as_secs_f64(),
        acked.len(),
        acked.iter().filter(|(_, id)| id.is_empty()).count(),
        agent_markers.len(),
        twice.len(),
        missing.len()
    );
    assert!(
        acked.len() >= kills as usize,
        "the workload ran: {}",
        acked.len()
    );
    assert!(twice.is_empty(), "ran more than once: {twice:?}");
    assert!(
        missing.is_empty(),
        "acknowledged but never ran: {missing:?}"
    );
}
