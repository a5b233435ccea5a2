//! `/metrics`, `/healthz` and `/readyz` of a real `byom server`, scraped
//! over HTTP, linted by Prometheus's own `promtool check metrics` and read
//! by an independent parser (the Python Prometheus client's
//! `text_string_to_metric_families`), with a real daemon whose commands
//! move the figures.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use byom_tests::channels::venv_python;
use byom_tests::{stderr, stdout, wait_for, Server, SharedStore};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// One plain HTTP/1.1 GET: the status and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a full HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_string())
}

/// A scrape as the Python client reads it: every sample's name with its
/// labels (`name{k="v",…}`, labels sorted) → value, and every family's
/// (name, type, help).
struct Scrape {
    samples: BTreeMap<String, f64>,
    families: Vec<(String, String, String)>,
}

impl Scrape {
    fn value(&self, key: &str) -> f64 {
        *self
            .samples
            .get(key)
            .unwrap_or_else(|| panic!("no sample {key} in {:#?}", self.samples.keys()))
    }
}

const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
fams, samples = [], []
for f in text_string_to_metric_families(sys.stdin.read()):
    fams.append([f.name, f.type, f.documentation])
    for s in f.samples:
        samples.append([s.name, s.labels, s.value])
print(json.dumps({"families": fams, "samples": samples}))
"#;

/// What `cmd` prints with `text` on its stdin.
fn fed(mut cmd: Command, text: &str) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn parse(text: &str) -> Scrape {
    let mut python = Command::new(venv_python());
    python.args(["-c", PARSE]);
    let out = fed(python, text);
    assert!(
        out.status.success(),
        "the Prometheus parser refused the page: {}\n{text}",
        stderr(&out)
    );
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let mut samples = BTreeMap::new();
    for s in v["samples"].as_array().unwrap() {
        let labels: BTreeMap<String, String> = serde_json::from_value(s[1].clone()).unwrap();
        let key = if labels.is_empty() {
            s[0].as_str().unwrap().to_string()
        } else {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            format!("{}{{{}}}", s[0].as_str().unwrap(), l.join(","))
        };
        let prev = samples.insert(key.clone(), s[2].as_f64().unwrap());
        assert!(prev.is_none(), "sample {key} twice");
    }
    let families = v["families"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let s = |i: usize| f[i].as_str().unwrap().to_string();
            (s(0), s(1), s(2))
        })
        .collect();
    Scrape { samples, families }
}

/// Prometheus's own linter (`promtool check metrics`, from Debian's
/// `prometheus` package that `.ci/run` installs): the page is what a
/// Prometheus server reads, names and units included.
fn promtool_check(text: &str) {
    // Debian's prometheus package, which .ci/run installs.
    let mut promtool = Command::new("promtool");
    promtool.args(["check", "metrics"]);
    let out = fed(promtool, text);
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        stdout(&out),
        stderr(&out)
    );
}

fn scrape(addr: SocketAddr) -> Scrape {
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    promtool_check(&body);
    parse(&body)
}

fn server_info(s: &Server) -> Value {
    serde_json::from_slice(&std::fs::read(s.data_dir.join("server.json")).unwrap()).unwrap()
}

fn metrics_addr(s: &Server) -> SocketAddr {
    server_info(s)["metrics_addr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn metrics_move_when_commands_run_and_health_answers() {
    let (_dir, server, _lap) = Server::with_lap(&[], &[]);
    // By default on the admin API's port, in plain HTTP beside its TLS.
    let addr = metrics_addr(&server);
    assert_eq!(addr, server.api_addr);
    assert!(server.log().contains(&format!("http://{addr}/metrics")));

    let before = scrape(addr);
    for (name, kind, help) in &before.families {
        assert!(name.starts_with("byom_"), "{name}");
        assert!(!help.is_empty(), "{name} has no HELP");
        assert!(
            ["counter", "gauge", "histogram"].contains(&kind.as_str()),
            "{name}: {kind}"
        );
    }
    assert_eq!(before.value(r#"byom_machines{state="online"}"#), 1.0);
    assert_eq!(before.value("byom_quic_connections"), 1.0);
    assert_eq!(before.value("byom_store_up"), 1.0);
    assert_eq!(before.value("byom_agents_running"), 1.0);
    let exited = r#"byom_commands_finished_total{state="exited"}"#;
    let waits = "byom_command_queue_wait_seconds_count";
    let dispatches = "byom_command_dispatch_seconds_count";
    assert_eq!(before.value(exited), 0.0);
    assert_eq!(before.value(waits), 0.0);
    assert_eq!(
        before.value(r#"byom_command_queue_wait_seconds_bucket{le="+Inf"}"#),
        before.value(waits)
    );

    // A command through the daemon; its text and the machine's name must
    // never show in the figures.
    let out = server.byom(&["exec", "lap", "--", "sh", "-c", "echo metrics-marker-7731"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "metrics-marker-7731\n");

    let after = wait_for("the figures to move", T, || {
        let s = scrape(addr);
        (s.value(exited) >= 1.0).then_some(s)
    });
    assert_eq!(after.value(exited), before.value(exited) + 1.0);
    assert_eq!(after.value(waits), before.value(waits) + 1.0);
    assert_eq!(after.value(dispatches), before.value(dispatches) + 1.0);
    assert!(after.value(r#"byom_store_commit_seconds_count{op="write"}"#) > 0.0);
    // Nothing waits or runs any more (read from the store at scrape time).
    let idle = wait_for("the command to leave the queue figures", T, || {
        let s = scrape(addr);
        (s.value(r#"byom_commands{state="running"}"#) == 0.0).then_some(s)
    });
    assert_eq!(idle.value(r#"byom_commands{state="queued"}"#), 0.0);
    assert_eq!(idle.value(r#"byom_machines{state="online"}"#), 1.0);
    let (_, raw) = get(addr, "/metrics");
    assert!(!raw.contains("metrics-marker"), "command text leaked");
    assert!(!raw.contains("\"lap\""), "a machine's name leaked");
    assert!(!raw.contains("mch_") && !raw.contains("cmd_"), "IDs leaked");

    // A message for the agents: the Router takes a turn on it, and its
    // model request, tokens and busy time are counted.
    let t = server.say("ops", "hello there");
    assert_eq!(t["decision"], "candidate", "{t}");
    let agents = wait_for("the Router's turn in the figures", T, || {
        let s = scrape(addr);
        (s.value("byom_router_batch_size_count") >= 1.0
            && s.value(r#"byom_model_request_seconds_count{role="router"}"#) >= 1.0)
            .then_some(s)
    });
    assert!(agents.value(r#"byom_model_tokens_total{kind="input",role="router"}"#) > 0.0);
    assert!(agents.value(r#"byom_model_tokens_total{kind="output",role="router"}"#) > 0.0);
    assert!(agents.value("byom_router_busy_seconds_total") > 0.0);
    assert!(agents.value("byom_router_batch_size_sum") >= 1.0);
    assert_eq!(agents.value("byom_approvals_waiting"), 0.0);

    // Health: up, and ready (the store answers).
    assert_eq!(get(addr, "/healthz"), (200, "ok\n".into()));
    let (status, body) = get(addr, "/readyz");
    assert_eq!(status, 200, "{body}");
    let (status, _) = get(addr, "/nothing-here");
    assert_eq!(status, 404);

    // The API itself still answers on the same port (TLS).
    let ls = server.json(&["machines", "ls"]);
    assert_eq!(ls.as_array().map(|a| a.len()), Some(1), "{ls}");
}

#[test]
fn listen_metrics_moves_them_to_a_port_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--listen-metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&server);
    assert_ne!(addr, server.api_addr);
    assert!(server.log().contains(&format!("http://{addr}/metrics")));
    let s = scrape(addr);
    assert_eq!(s.value(r#"byom_machines{state="offline"}"#), 0.0);
    assert_eq!(get(addr, "/healthz").0, 200);
    // The admin port is the API's alone now: plain HTTP gets no answer.
    let mut c = std::net::TcpStream::connect(server.api_addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(
        !String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"),
        "the API port served metrics"
    );
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--listen-metrics", "off"]);
    assert_eq!(server_info(&server)["metrics_addr"], "");
    assert!(server.log().contains("metrics:  off"));
}

/// Replicas on PostgreSQL: each serves its own figures, one says it runs
/// the agents; ready while the database answers, 503 while it is down.
#[test]
fn replicas_serve_their_own_metrics_and_readiness_follows_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let store = SharedStore::in_dir(dir.path());
    let a = Server::replica(dir.path(), "r0", &store, &[]);
    let b = Server::replica(dir.path(), "r1", &store, &[]);
    let (ma, mb) = (metrics_addr(&a), metrics_addr(&b));
    wait_for("one replica to run the agents", T, || {
        let n = scrape(ma).value("byom_agents_running") + scrape(mb).value("byom_agents_running");
        (n == 1.0).then_some(())
    });
    for addr in [ma, mb] {
        let (status, body) = wait_for("ready", T, || {
            let r = get(addr, "/readyz");
            (r.0 == 200).then_some(r)
        });
        assert_eq!(status, 200);
        assert!(body.contains("agents"), "{body}");
    }

    store.cluster.kill();
    let (status, body) = wait_for("not ready while the database is down", T, || {
        let r = get(ma, "/readyz");
        (r.0 == 503).then_some(r)
    });
    assert_eq!(status, 503);
    assert!(body.starts_with("not ready:"), "{body}");
    assert_eq!(get(ma, "/healthz").0, 200, "still up");
    // Scrapes within a second share a look at the store: wait past it.
    wait_for("byom_store_up 0", T, || {
        (scrape(ma).value("byom_store_up") == 0.0).then_some(())
    });

    store.cluster.restart();
    wait_for("ready again", T, || {
        (get(ma, "/readyz").0 == 200).then_some(())
    });
}
