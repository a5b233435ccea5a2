//! Exec round-trip benchmark (run with `cargo bench -p byom-tests --bench exec`).
//!
//! In one run, on loopback, with a real `byom server` and `byomd`:
//!  1. baseline: spawn `true` locally;
//!  2. `true` through the admin API on an established connection
//!     (CreateCommand + WatchCommand until the exit is stored);
//!  3. `byom exec M -- true` end to end (a new CLI process each time);
//!  4. `ssh -o ControlMaster=auto -o ControlPersist=60 localhost true`
//!     against a local sshd (skipped if openssh-server is not installed);
//!  5. the OS sandbox: `byom exec` and the API round trip on a machine
//!     with the sandbox (the default) and one with `[sandbox] enabled =
//!     false`, interleaved, and the helper's own setup time per command
//!     (from fork to the command's exec, as the daemon logs it).
//!
//! Prints p50/p99 and ratios; figures only mean something relative to each
//! other in the same run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use byom_tests::{Daemon, Server};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

struct Row {
    name: String,
    p50: Duration,
    p99: Duration,
    n: usize,
}

fn row(name: &str, mut v: Vec<Duration>) -> Row {
    Row {
        name: name.into(),
        n: v.len(),
        p50: pct(&mut v, 0.5),
        p99: pct(&mut v, 0.99),
    }
}

fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    // A separate TCP port for the fallback, with nothing on its UDP side,
    // gives a second machine a network where QUIC gets no answer.
    let server = Server::start_with(dir.path(), &["--listen-tcp", "127.0.0.1:0"]);
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    d.start();
    server.wait_online("lap", true, Duration::from_secs(30));

    let mut rows = Vec::new();
    let local: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let s = Command::new("true").status().unwrap();
            assert!(s.success());
            t.elapsed()
        })
        .collect();
    rows.push(row("spawn `true` locally (baseline)", local));

    let rt = tokio::runtime::Runtime::new().unwrap();
    let api: Vec<Duration> = rt.block_on(async {
        let creds = byom_api::load_creds(Some(&server.creds()), None).unwrap();
        let mut c = byom_api::connect(&creds).await.unwrap();
        let mut v = Vec::with_capacity(n);
        for i in 0..n + 10 {
            let d = byom_tests::api_round_trip(&mut c, "lap").await;
            if i >= 10 {
                v.push(d); // first 10 warm up
            }
        }
        v
    });
    rows.push(row("`true` via the API, established connection", api));

    // The TCP fallback: a second machine whose UDP gets no answer.
    let mut dt = Daemon::new(dir.path(), "daemon-tcp");
    dt.pair(&server.token(&[]), "lap-tcp");
    dt.server_override = Some(server.tcp_addr.to_string());
    dt.start();
    server.wait_online("lap-tcp", true, Duration::from_secs(60));
    assert_eq!(server.machine("lap-tcp")["transport"], "tcp");
    let (quic_rt, tcp_rt): (Vec<Duration>, Vec<Duration>) = rt.block_on(async {
        let creds = byom_api::load_creds(Some(&server.creds()), None).unwrap();
        let mut c = byom_api::connect(&creds).await.unwrap();
        let mut q = Vec::new();
        let mut t = Vec::new();
        for i in 0..(n + 10) {
            for (machine, out) in [("lap", &mut q), ("lap-tcp", &mut t)] {
                let d = byom_tests::api_round_trip(&mut c, machine).await;
                if i >= 10 {
                    out.push(d);
                }
            }
        }
        (q, t)
    });
    let (q50, t50) = (
        pct(&mut quic_rt.clone(), 0.5),
        pct(&mut tcp_rt.clone(), 0.5),
    );
    let tcp_row = row("`true` via the API over the TCP fallback", tcp_rt);
    let quic_row = row("`true` via the API over QUIC (same run)", quic_rt);

    let cli_n = (n / 3).max(10);
    let cli: Vec<Duration> = (0..cli_n)
        .map(|_| {
            let t = Instant::now();
            let out = server.byom(&["exec", "lap", "--", "true"]);
            assert!(out.status.success());
            t.elapsed()
        })
        .collect();
    rows.push(row("`byom exec lap -- true` end to end", cli));

    let ssh_dir = tempfile::tempdir().unwrap();
    let ssh = byom_tests::Sshd::start(ssh_dir.path());
    if let Some(sshd) = &ssh {
        let mut args = sshd.ssh_args();
        args.push("true".into());
        let args = &args;
        let v: Vec<Duration> = (0..cli_n)
            .map(|_| {
                let t = Instant::now();
                let s = Command::new("ssh")
                    .args(args)
                    .stdin(Stdio::null())
                    .status()
                    .unwrap();
                assert!(s.success());
                t.elapsed()
            })
            .collect();
        rows.push(row("`ssh -o ControlMaster=auto localhost true`", v));
    }

    println!(
        "\nexec round trip ({} build, loopback)",
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "release"
        }
    );
    println!(
        "{:<48} {:>6} {:>12} {:>12} {:>10}",
        "", "n", "p50", "p99", "p50 ratio"
    );
    let base = rows[0].p50;
    for r in &rows {
        println!(
            "{:<48} {:>6} {:>12} {:>12} {:>9.2}x",
            r.name,
            r.n,
            ms(r.p50),
            ms(r.p99),
            r.p50.as_secs_f64() / base.as_secs_f64()
        );
    }
    if rows.len() == 4 {
        println!(
            "byom exec / ssh ControlMaster p50: {:.2}x",
            rows[2].p50.as_secs_f64() / rows[3].p50.as_secs_f64()
        );
    } else {
        println!("ssh comparison skipped: install openssh-server (Debian) to run it");
    }
    println!("\ntransport (API round trip, interleaved on one server)");
    for r in [&quic_row, &tcp_row] {
        println!(
            "{:<48} {:>6} {:>12} {:>12}",
            r.name,
            r.n,
            ms(r.p50),
            ms(r.p99)
        );
    }
    println!(
        "TCP fallback / QUIC p50: {:.2}x",
        t50.as_secs_f64() / q50.as_secs_f64()
    );
    // sshd stops when its handle goes.
    drop(ssh);
    sandbox(&server, dir.path(), &d, n, &rt);
}

/// The sandbox's cost: the same commands on a sandboxed and an unboxed
/// daemon, interleaved, and the helper's setup time.
fn sandbox(server: &Server, dir: &Path, boxed: &Daemon, n: usize, rt: &tokio::runtime::Runtime) {
    let mut raw = Daemon::new(dir, "daemon-raw");
    raw.pair(&server.token(&[]), "lap-raw");
    let policy = raw.config_dir.join("policy.toml");
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace("enabled = true", "enabled = false");
    std::fs::write(&policy, text).unwrap();
    raw.start();
    server.wait_online("lap-raw", true, Duration::from_secs(60));
    assert_eq!(server.machine("lap")["sandbox"], "full");
    let (api_box, api_raw): (Vec<Duration>, Vec<Duration>) = rt.block_on(async {
        let creds = byom_api::load_creds(Some(&server.creds()), None).unwrap();
        let mut c = byom_api::connect(&creds).await.unwrap();
        let (mut b, mut r) = (Vec::new(), Vec::new());
        for i in 0..(n + 10) {
            for (machine, out) in [("lap", &mut b), ("lap-raw", &mut r)] {
                let d = byom_tests::api_round_trip(&mut c, machine).await;
                if i >= 10 {
                    out.push(d);
                }
            }
        }
        (b, r)
    });
    let cli_n = (n / 3).max(10);
    let (mut cli_box, mut cli_raw) = (Vec::new(), Vec::new());
    for _ in 0..cli_n {
        for (machine, out) in [("lap", &mut cli_box), ("lap-raw", &mut cli_raw)] {
            let t = Instant::now();
            let o = server.byom(&["exec", machine, "--", "true"]);
            assert!(o.status.success());
            out.push(t.elapsed());
        }
    }
    // The daemon's debug lines, without their colours.
    let log: String = {
        let raw = boxed.log();
        let mut out = String::with_capacity(raw.len());
        let mut it = raw.chars().peekable();
        while let Some(c) = it.next() {
            if c == '\u{1b}' {
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    };
    let figures = |line: &str, key: &str| -> Vec<Duration> {
        log.lines()
            .filter(|l| l.contains(line))
            .filter_map(|l| {
                let v = l.split(&format!("{key}=")).nth(1)?;
                let digits: String = v.chars().take_while(|c| c.is_ascii_digit()).collect();
                Some(Duration::from_micros(digits.parse().ok()?))
            })
            .collect()
    };
    let mut setup = figures("command started in its sandbox", "setup_us");
    let mut parts: Vec<(&str, Vec<Duration>)> = vec![
        (
            "policy and sandbox plan",
            figures("policy and sandbox planned", "plan_us"),
        ),
        (
            "temp dir and environment",
            figures("command started in its sandbox", "finish_us"),
        ),
        (
            "helper started",
            figures("command started in its sandbox", "spawn_us"),
        ),
        (
            "to the command's exec, all told",
            figures("command started in its sandbox", "total_us"),
        ),
    ];
    println!(
        "
the OS sandbox (interleaved on one server; sandbox {} here)",
        server.machine("lap")["sandbox"]
    );
    let rows = [
        row("`byom exec` end to end, sandboxed", cli_box),
        row("`byom exec` end to end, sandbox off", cli_raw),
        row("API round trip, sandboxed", api_box),
        row("API round trip, sandbox off", api_raw),
    ];
    for r in &rows {
        println!(
            "{:<48} {:>6} {:>12} {:>12}",
            r.name,
            r.n,
            ms(r.p50),
            ms(r.p99)
        );
    }
    println!(
        "sandboxed / off p50: byom exec {:.3}x, API round trip {:.3}x",
        rows[0].p50.as_secs_f64() / rows[1].p50.as_secs_f64(),
        rows[2].p50.as_secs_f64() / rows[3].p50.as_secs_f64()
    );
    if setup.is_empty() {
        println!("sandbox setup: no figures in the daemon's log");
    } else {
        let k = setup.len();
        println!(
            "sandbox setup (helper start to exec), {k} commands: p50 {}, p99 {}",
            ms(pct(&mut setup, 0.5)),
            ms(pct(&mut setup, 0.99))
        );
    }
    for (name, v) in parts.iter_mut().filter(|(_, v)| !v.is_empty()) {
        println!("  {name}: p50 {}", ms(pct(v, 0.5)));
    }
}
