//! End-to-end tests of the machine spine: real `byom server` and `byomd`
//! processes on loopback, real sled stores in temp dirs, driven through the
//! real CLI.

use std::time::{Duration, Instant};

use byom_tests::{proxy::UdpProxy, stderr, stdout, wait_for, Daemon, Server};

const T: Duration = Duration::from_secs(30);

fn setup(name: &str) -> (tempfile::TempDir, Server, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), name);
    d.start();
    server.wait_online(name, true, T);
    (dir, server, d)
}

#[test]
fn exec_streams_output_exit_code_cwd_env_stdin() {
    let (dir, server, _d) = setup("lap");
    let out = server.byom(&[
        "exec",
        "lap",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(stdout(&out), "out\n");
    assert_eq!(stderr(&out), "err\n");

    let cwd = dir.path().to_str().unwrap();
    let out = server.byom(&[
        "exec",
        "lap",
        "--cwd",
        cwd,
        "--env",
        "GREETING=hi there",
        "--",
        "sh",
        "-c",
        "pwd; echo \"$GREETING\"",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let canon = std::fs::canonicalize(cwd).unwrap();
    assert_eq!(stdout(&out), format!("{}\nhi there\n", canon.display()));

    let mut child = server
        .byom_cmd(&["exec", "lap", "-i", "--", "wc", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&[b'x'; 1000])
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out).trim(), "1000");

    let out = server.byom(&["exec", "lap", "--sh", "echo $((6*7)) | tr 4 X"]);
    assert_eq!(stdout(&out), "X2\n");

    // Nonexistent program and cwd fail clearly.
    let out = server.byom(&["exec", "lap", "--", "no-such-program-xyz"]);
    assert_eq!(out.status.code(), Some(255));
    assert!(stderr(&out).contains("cannot start"), "{}", stderr(&out));
    let out = server.byom(&["exec", "lap", "--cwd", "/no/such/dir", "--", "true"]);
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));

    // Unknown machine: clear error.
    let out = server.byom(&["exec", "nope", "--", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("byom machines ls"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn timeout_and_cancel_kill_the_process_group() {
    let (dir, server, _d) = setup("lap");
    let marker = dir.path().join("survivor");
    let m = marker.to_str().unwrap();
    // A background child that would touch the marker if it survived.
    let t = Instant::now();
    let out = server.byom(&[
        "exec",
        "lap",
        "--timeout",
        "500ms",
        "--sh",
        &format!("(sleep 3; touch {m}) & sleep 30"),
    ]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(stderr(&out).contains("timed out"));

    let id = server.detach(
        "lap",
        &[],
        &["sh", "-c", &format!("(sleep 3; touch {m}) & sleep 30")],
    );
    wait_for("running", T, || {
        (server.command(&id)["state"] == "running").then_some(())
    });
    let out = server.byom(&["commands", "cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let c = server.wait_done(&id, T);
    assert_eq!(c["state"], "cancelled");

    // Ctrl-C on `byom exec` cancels the remote command.
    let mut child = server
        .byom_cmd(&["exec", "lap", "--", "sleep", "30"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let list = wait_for("command running", T, || {
        let v = server.json(&["commands", "ls", "--state", "running"]);
        (v.as_array().map(|a| a.len()) == Some(1)).then_some(v)
    });
    let id = list[0]["id"].as_str().unwrap().to_string();
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(server.wait_done(&id, T)["state"], "cancelled");

    std::thread::sleep(Duration::from_secs(4));
    assert!(!marker.exists(), "a background child survived the kill");
}

/// Output past what the store keeps still reaches the attached client
/// whole (see streams.rs for the big and the slow cases).
#[test]
fn long_output_reaches_the_client_whole() {
    let (_dir, server, _d) = setup("lap");
    let out = server.byom(&["exec", "lap", "--", "head", "-c", "9000000", "/dev/zero"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout.len(), 9_000_000);
    assert!(!stderr(&out).contains("lost"), "{}", stderr(&out));
}

/// A fleet's token pairs up to its count, exactly, however the pairings
/// race; its machines are named from their hostnames, made unique, and
/// carry its labels.
#[test]
fn a_reusable_token_pairs_a_fleet_up_to_its_count() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let v = server.json(&[
        "token",
        "create",
        "--max-uses",
        "3",
        "--ttl",
        "24h",
        "--label",
        "team=web",
        "--name",
        "web-fleet",
    ]);
    assert_eq!(v["reusable"], true);
    let token = v["token"].as_str().unwrap().to_string();
    let pairs: Vec<_> = (0..6)
        .map(|i| {
            let (d, token) = (Daemon::new(dir.path(), &format!("m{i}")), token.clone());
            std::thread::spawn(move || d.byomd(&["pair", &token, "--key-store", "file"]))
        })
        .collect();
    let outs: Vec<_> = pairs.into_iter().map(|t| t.join().unwrap()).collect();
    let ok = outs.iter().filter(|o| o.status.success()).count();
    assert_eq!(ok, 3, "{:?}", outs.iter().map(stderr).collect::<Vec<_>>());
    for o in outs.iter().filter(|o| !o.status.success()) {
        assert!(
            stderr(o).contains("paired all the 3 machines"),
            "{}",
            stderr(o)
        );
    }
    let machines = server.json(&["machines", "ls"]);
    let machines = machines.as_array().unwrap();
    assert_eq!(machines.len(), 3);
    let mut names: Vec<String> = machines
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3, "names not unique: {names:?}");
    assert!(
        names.iter().all(|n| !n.starts_with("web-fleet")),
        "{names:?}"
    );
    assert!(machines.iter().all(|m| m["labels"]["team"] == "web"));
    let tokens = server.json(&["token", "ls", "--all"]);
    assert_eq!(tokens[0]["uses"], 3, "{tokens}");
    // Used up, it is no longer listed as usable.
    assert_eq!(server.json(&["token", "ls"]).as_array().unwrap().len(), 0);
}

#[test]
fn tokens_are_single_use_expire_and_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let token = server.token(&["--name", "one"]);
    Daemon::new(dir.path(), "a").pair(&token, "a");
    let out = Daemon::new(dir.path(), "b").byomd(&["pair", &token]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("already used"), "{}", stderr(&out));

    let short = server.token(&["--ttl", "1s"]);
    std::thread::sleep(Duration::from_millis(1500));
    let out = Daemon::new(dir.path(), "c").byomd(&["pair", &short]);
    assert!(stderr(&out).contains("expired"), "{}", stderr(&out));

    let v = server.json(&["token", "create"]);
    let (id, tok) = (
        v["id"].as_str().unwrap().to_string(),
        v["token"].as_str().unwrap().to_string(),
    );
    assert!(server.byom(&["token", "revoke", &id]).status.success());
    let out = Daemon::new(dir.path(), "d").byomd(&["pair", &tok]);
    assert!(stderr(&out).contains("revoked"), "{}", stderr(&out));

    // Listed tokens never show the secret or its hash.
    let all = server.byom(&["token", "ls", "--all", "--json"]);
    assert!(!stdout(&all).contains(&tok[6..20]));
    assert!(!stdout(&all).contains("secret"));
}

#[test]
fn fifty_concurrent_redemptions_one_wins() {
    let _heavy = byom_tests::cpu_heavy();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let token = server.token(&[]);
    let children: Vec<_> = (0..50)
        .map(|i| {
            std::process::Command::new(byom_tests::bin("byomd"))
                .arg("--config-dir")
                .arg(dir.path().join(format!("d{i}")))
                .args([
                    "pair",
                    &token,
                    "--key-store",
                    "file",
                    "--name",
                    &format!("m{i}"),
                ])
                .env("BYOMD_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let results: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let wins = results.iter().filter(|o| o.status.success()).count();
    assert_eq!(wins, 1, "exactly one redemption must win");
    for o in results.iter().filter(|o| !o.status.success()) {
        assert!(stderr(o).contains("already used"), "{}", stderr(o));
    }
    let machines = server.json(&["machines", "ls"]);
    assert_eq!(machines.as_array().unwrap().len(), 1);
}

#[test]
fn foreign_ca_and_revoked_certificates_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(&dir.path().join("a"));
    let b = Server::start(&dir.path().join("b"));
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&a.token(&[]), "lap");

    // Point the daemon at server B, trusting B's CA, still presenting the
    // certificate A issued: B must refuse it.
    let mut id = d.identity();
    id["ca_pem"] = std::fs::read_to_string(b.creds().join("ca.pem"))
        .unwrap()
        .into();
    std::fs::write(
        d.config_dir.join("identity.json"),
        serde_json::to_vec(&id).unwrap(),
    )
    .unwrap();
    d.server_override = Some(b.quic_addr.to_string());
    d.start();
    std::thread::sleep(Duration::from_secs(2));
    assert!(b.json(&["machines", "ls"]).as_array().unwrap().is_empty());
    assert!(
        d.log().contains("handshake failed") || d.log().contains("cannot connect"),
        "{}",
        d.log()
    );
    d.stop();

    // Back to A with the right CA: works; then revoke: connection closed,
    // daemon stops, certificate refused from then on.
    let mut id = d.identity();
    id["ca_pem"] = std::fs::read_to_string(a.creds().join("ca.pem"))
        .unwrap()
        .into();
    std::fs::write(
        d.config_dir.join("identity.json"),
        serde_json::to_vec(&id).unwrap(),
    )
    .unwrap();
    d.server_override = None;
    d.start();
    a.wait_online("lap", true, T);
    let out = a.byom(&["exec", "lap", "--", "true"]);
    assert!(out.status.success());
    assert!(a.byom(&["machines", "revoke", "lap"]).status.success());
    wait_for("daemon exit after revoke", T, || d.exited());
    assert!(d.log().contains("revoked"), "{}", d.log());
    // It took the close for what it was and never tried to reconnect.
    let refusals = || a.log().matches("invalid peer certificate: Revoked").count();
    assert_eq!(refusals(), 0, "{}", d.log());

    // Even with the local revoked flag cleared, the server refuses it.
    let mut id = d.identity();
    id["revoked"] = false.into();
    std::fs::write(
        d.config_dir.join("identity.json"),
        serde_json::to_vec(&id).unwrap(),
    )
    .unwrap();
    let _ = d.exited();
    d.kill9();
    let before = refusals();
    d.start();
    wait_for("daemon refused again", T, || d.exited());
    // It understood the refusal the first time, rather than retrying: in
    // TLS 1.3 the refusal comes after the client's handshake is done, as
    // the close reason behind its first read or write.
    assert_eq!(refusals() - before, 1, "{}", d.log());
    assert!(d.log().contains("revoked"), "{}", d.log());
    let m = a.machine(m_id(&a).as_str());
    assert_eq!(m["revoked"], true);
    assert_eq!(m["online"], false);
}

fn m_id(s: &Server) -> String {
    s.json(&["machines", "ls", "--all"])[0]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn revoke_kills_running_commands_within_a_second() {
    let _alone = byom_tests::cpu_heavy();
    let (dir, server, mut d) = setup("lap");
    let marker = dir.path().join("still-running");
    let m = marker.to_str().unwrap();
    let id = server.detach(
        "lap",
        &[],
        &[
            "sh",
            "-c",
            &format!("while true; do touch {m}; sleep 0.05; done"),
        ],
    );
    wait_for("running", T, || {
        (server.command(&id)["state"] == "running").then_some(())
    });
    assert!(server.byom(&["machines", "revoke", "lap"]).status.success());
    let revoked_at = std::time::SystemTime::now();
    // The loop touches the file every 50 ms while it lives; it is dead once
    // the file stays untouched for a second. Its last touch is when it died.
    let mtime = || std::fs::metadata(&marker).unwrap().modified().unwrap();
    let mut last = mtime();
    let mut still_since = Instant::now();
    wait_for("the command to stop", T, || {
        let now = mtime();
        if now != last {
            last = now;
            still_since = Instant::now();
        }
        (still_since.elapsed() >= Duration::from_secs(1)).then_some(())
    });
    let late = last.duration_since(revoked_at).unwrap_or_default();
    assert!(
        late <= Duration::from_secs(1),
        "command still ran {late:?} after the revoke returned"
    );
    assert_eq!(server.command(&id)["state"], "lost");
    wait_for("daemon exit", T, || d.exited());
    let out = server.byom(&["exec", "lap", "--", "true"]);
    assert!(stderr(&out).contains("revoked"), "{}", stderr(&out));
}

#[test]
fn daemon_restart_delivers_queue_and_marks_inflight_lost() {
    let (dir, server, mut d) = setup("lap");
    let runs = dir.path().join("runs");
    let r = runs.to_str().unwrap();
    let inflight = server.detach(
        "lap",
        &[],
        &["sh", "-c", &format!("echo x >> {r}; sleep 30")],
    );
    wait_for("running", T, || {
        (server.command(&inflight)["state"] == "running").then_some(())
    });
    d.kill9();
    // kill -9 leaves the child running in its own group; clean it up.
    let _ = std::process::Command::new("pkill")
        .args(["-f", &format!("echo x >> {r}")])
        .status();
    server.wait_online("lap", false, T);

    let queued = server.detach("lap", &[], &["echo", "delivered"]);
    assert_eq!(server.command(&queued)["state"], "queued");
    let m = server.machine("lap");
    assert_eq!(m["queued_commands"], 1);

    d.start();
    let c = server.wait_done(&queued, T);
    assert_eq!(c["state"], "exited");
    assert_eq!(c["stdout"], "delivered\n");
    let c = server.wait_done(&inflight, T);
    assert_eq!(c["state"], "lost");
    assert!(c["reason"].as_str().unwrap().contains("restarted"), "{c}");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "x\n",
        "ran exactly once"
    );
}

#[test]
fn exec_waits_for_an_offline_machine() {
    let (_dir, server, mut d) = setup("lap");
    d.stop();
    server.wait_online("lap", false, T);
    let child = server
        .byom_cmd(&["exec", "lap", "--", "echo", "hello"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    d.start();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello\n");
    assert!(stderr(&out).contains("offline"), "{}", stderr(&out));
}

#[test]
fn server_kill9_mid_command_loses_nothing_runs_nothing_twice() {
    let (dir, mut server, _d) = setup("lap");
    let runs = dir.path().join("runs");
    let r = runs.to_str().unwrap();
    let id = server.detach(
        "lap",
        &[],
        &[
            "sh",
            "-c",
            &format!("echo x >> {r}; for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.4; done"),
        ],
    );
    let queued_for_later = {
        // Started on the machine (`commands show` would follow its output
        // to the end, so the file it writes first tells).
        wait_for("running", T, || {
            std::fs::read_to_string(&runs)
                .is_ok_and(|t| t == "x\n")
                .then_some(())
        });
        server.detach("lap", &[], &["echo", "after"])
    };
    server.kill9();
    std::thread::sleep(Duration::from_millis(500));
    server.restart();
    let c = server.wait_done(&id, T);
    assert_eq!(c["state"], "exited", "{c}");
    let expected: String = (1..=8).map(|i| format!("tick {i}\n")).collect();
    assert_eq!(c["stdout"], expected);
    assert_eq!(server.wait_done(&queued_for_later, T)["stdout"], "after\n");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "x\n",
        "ran exactly once"
    );
}

#[test]
fn network_cut_mid_command_delivers_result_after_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let proxy = UdpProxy::start(server.quic_addr);
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    d.server_override = Some(proxy.addr.to_string());
    d.start();
    server.wait_online("lap", true, T);
    let runs = dir.path().join("runs");
    let r = runs.to_str().unwrap();
    let id = server.detach(
        "lap",
        &[],
        &[
            "sh",
            "-c",
            &format!("echo x >> {r}; echo before; sleep 4; echo after"),
        ],
    );
    wait_for("running", T, || {
        (server.command(&id)["state"] == "running").then_some(())
    });
    proxy.cut.set(true);
    server.wait_online("lap", false, T);
    std::thread::sleep(Duration::from_secs(4));
    proxy.cut.set(false);
    let c = server.wait_done(&id, Duration::from_secs(60));
    assert_eq!(c["state"], "exited", "{c}");
    assert_eq!(c["stdout"], "before\nafter\n");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "x\n",
        "ran exactly once"
    );
    assert!(
        d.log().contains("heartbeat lost") || d.log().contains("disconnected"),
        "{}",
        d.log()
    );
}

#[test]
fn expired_certificate_renews_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--cert-ttl", "3s"]);
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    let key_before = std::fs::read(d.config_dir.join("key.pem")).unwrap();
    let cert_before = d.identity()["cert_pem"].clone();
    std::thread::sleep(Duration::from_secs(4));
    d.start();
    server.wait_online("lap", true, T);
    assert!(server.byom(&["exec", "lap", "--", "true"]).status.success());
    assert_ne!(d.identity()["cert_pem"], cert_before, "certificate renewed");
    assert_eq!(
        std::fs::read(d.config_dir.join("key.pem")).unwrap(),
        key_before,
        "same key"
    );
    // Renewal also happens in the background before expiry.
    let c1 = d.identity()["cert_pem"].clone();
    wait_for("background renewal", T, || {
        (d.identity()["cert_pem"] != c1).then_some(())
    });
    assert_eq!(server.machine("lap")["online"], true);
}

#[test]
fn status_unpair_and_listing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&["--label", "team=web"]), "lap");
    d.run_args = vec![
        "--label".into(),
        "loc=home".into(),
        "--label".into(),
        "team=mine".into(),
    ];
    d.start();
    server.wait_online("lap", true, T);
    let m = server.machine("lap");
    assert_eq!(m["labels"]["loc"], "home", "{m}");
    assert_eq!(m["labels"]["team"], "web", "admin labels win: {m}");
    let second = d.byomd(&["run"]);
    assert!(!second.status.success());
    assert!(stderr(&second).contains("already"), "{}", stderr(&second));
    let st = d.byomd(&["status"]);
    let s = stdout(&st);
    assert!(s.contains("connected") && s.contains("0600 file"), "{s}");
    assert!(server
        .byom(&["machines", "rename", "lap", "desk"])
        .status
        .success());
    assert!(server
        .byom(&["machines", "label", "desk", "gpu=no", "team=infra"])
        .status
        .success());
    let m = server.machine("desk");
    assert_eq!(m["labels"]["team"], "infra");
    let table = stdout(&server.byom(&["machines", "ls"]));
    assert!(
        table.contains("desk") && table.contains("online") && table.contains("team=infra"),
        "{table}"
    );
    let id = m["id"].as_str().unwrap().to_string();
    let shown = stdout(&server.byom(&["show", &id]));
    assert!(shown.contains("desk"), "{shown}");
    d.stop();
    let out = d.byomd(&["unpair"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!d.config_dir.join("identity.json").exists());
    assert!(!d.config_dir.join("key.pem").exists());
    assert_eq!(server.json(&["machines", "show", &id])["revoked"], true);
}

/// Kill -9 the server at arbitrary points while commands flow: every
/// acknowledged command runs exactly once, none more than once.
#[test]
fn server_crash_loop_runs_each_command_at_most_once() {
    let _heavy = byom_tests::cpu_heavy();
    let (dir, mut server, _d) = setup("lap");
    let runs = dir.path().join("runs");
    let r = runs.to_str().unwrap().to_string();
    let mut acked = Vec::new();
    let mut ids = Vec::new();
    let mut marker = 0;
    for round in 0..4u64 {
        for _ in 0..4 {
            marker += 1;
            let out = server.byom(&[
                "exec",
                "lap",
                "--detach",
                "--",
                "sh",
                "-c",
                &format!("echo m{marker} >> {r}; sleep 0.2"),
            ]);
            if out.status.success() {
                acked.push(format!("m{marker}"));
                ids.push(stdout(&out).trim().to_string());
            }
        }
        // Crash at a different point in the flow each round.
        std::thread::sleep(Duration::from_millis(37 * round));
        server.kill9();
        server.restart();
    }
    for id in &ids {
        let c = server.wait_done(id, Duration::from_secs(60));
        assert_eq!(c["state"], "exited", "{c}");
    }
    let lines = std::fs::read_to_string(&runs).unwrap();
    let mut seen = std::collections::HashMap::new();
    for l in lines.lines() {
        *seen.entry(l.to_string()).or_insert(0) += 1;
    }
    for (m, n) in &seen {
        assert_eq!(*n, 1, "{m} ran {n} times");
    }
    for m in &acked {
        assert_eq!(
            seen.get(m),
            Some(&1),
            "{m} was acknowledged but did not run exactly once"
        );
    }
}

#[test]
fn exec_by_label_picks_the_least_busy_online_machine() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut a = Daemon::new(dir.path(), "a");
    let mut b = Daemon::new(dir.path(), "b");
    a.pair(&server.token(&["--label", "team=web"]), "web-a");
    b.pair(&server.token(&["--label", "team=web"]), "web-b");
    a.start();
    b.start();
    server.wait_online("web-a", true, T);
    server.wait_online("web-b", true, T);
    // Keep web-a busy: the next labelled command goes to web-b.
    let busy = server.detach("web-a", &[], &["sleep", "30"]);
    wait_for("busy", T, || {
        (server.command(&busy)["state"] == "running").then_some(())
    });
    let out = server.byom(&["exec", "--label", "team=web", "--json", "--", "hostname"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let c: serde_json::Value =
        serde_json::from_slice(&out.stdout[out.stdout.iter().position(|&x| x == b'{').unwrap()..])
            .unwrap();
    let b_id = server.machine("web-b")["id"].clone();
    assert_eq!(c["machine_id"], b_id, "{c}");
    let out = server.byom(&["exec", "--label", "team=nope", "--", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no machine has the labels team=nope"),
        "{}",
        stderr(&out)
    );
    a.stop();
    b.stop();
    // A stopped daemon says goodbye: offline at once, not when its
    // heartbeats are missed.
    server.wait_online("web-a", false, T);
    server.wait_online("web-b", false, T);
    let why = server.machine("web-a")["offline_reason"].clone();
    assert_eq!(why, "daemon closed the connection", "{why}");
    // A definite answer, not a server away: the CLI does not retry it (it
    // used to, for 30 s).
    let t = Instant::now();
    let out = server.byom(&["exec", "--label", "team=web", "--", "true"]);
    assert!(
        stderr(&out).contains("no online machine") && stderr(&out).contains("web-a (offline)"),
        "{}",
        stderr(&out)
    );
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    let out = server.byom(&["exec", "web-a", "--label", "team=web", "--", "true"]);
    assert!(
        !out.status.success(),
        "machine and labels together are refused"
    );
}

#[test]
fn pair_replace_takes_over_name_and_labels_and_revokes_the_old_identity() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut old = Daemon::new(dir.path(), "old");
    old.pair(&server.token(&["--label", "team=web"]), "lap");
    old.start();
    server.wait_online("lap", true, T);
    let old_id = server.machine("lap")["id"].as_str().unwrap().to_string();

    // A plain token cannot take over a machine.
    let plain = server.token(&[]);
    let out = Daemon::new(dir.path(), "x").byomd(&[
        "pair",
        &plain,
        "--replace",
        "lap",
        "--key-store",
        "file",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("byom token create --replace lap"),
        "{}",
        stderr(&out)
    );

    let tok = server.token(&["--replace", "lap"]);
    let mut new = Daemon::new(dir.path(), "new");
    let out = new.byomd(&["pair", &tok, "--replace", "lap", "--key-store", "file"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("old daemon stops", T, || old.exited());
    new.start();
    server.wait_online("lap", true, T);
    let m = server.machine("lap");
    assert_ne!(m["id"], old_id.as_str());
    assert_eq!(m["labels"]["team"], "web");
    assert_eq!(server.machine(&old_id)["revoked"], true);
    assert!(server.byom(&["exec", "lap", "--", "true"]).status.success());
}

/// As many commands as the daemon runs at once, created at once on an
/// idle machine: each counts the others in the machine's queue and goes
/// straight to the daemon, stored `dispatched` at creation, none through
/// the queue (a read of it and a second write each, a statement apiece on
/// PostgreSQL).
#[test]
fn concurrent_commands_go_straight_to_a_connected_daemon() {
    use byom_protocol::pb;
    // The default policy's `max_concurrency`.
    const N: usize = 8;
    let (_dir, server, _d) = setup("lap");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let states = rt.block_on(async {
        let creds = byom_api::load_creds(Some(&server.creds()), Some(&server.api_addr.to_string()))
            .unwrap();
        let client = byom_api::connect(&creds).await.unwrap();
        let runs: Vec<_> = (0..N)
            .map(|_| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    let req = pb::CreateCommandRequest {
                        machine: "lap".into(),
                        argv: vec!["true".into()],
                        ..Default::default()
                    };
                    let run = byom_api::run_command(&client, req).await.unwrap();
                    let created = run.command.state();
                    let end = tokio::time::timeout(
                        T,
                        run.to_end(&mut client, Default::default(), |_| {}),
                    )
                    .await
                    .expect("the command ended")
                    .unwrap()
                    .unwrap();
                    (created, end.state())
                })
            })
            .collect();
        let mut v = Vec::new();
        for r in runs {
            v.push(r.await.unwrap());
        }
        v
    });
    assert!(
        states
            .iter()
            .all(|(_, end)| *end == pb::CommandState::Exited),
        "{states:?}"
    );
    let queued = states
        .iter()
        .filter(|(created, _)| *created != pb::CommandState::Dispatched)
        .count();
    assert_eq!(queued, 0, "{queued} of {N} commands went through the queue");
}

/// `byomd status` tells the owner of a revoked machine to run `byomd
/// unpair`: that works as said, without --force, whether the daemon heard
/// of the revocation while it ran or learns it from the server's refusal,
/// and for a machine the server forgot. A machine the server still holds
/// is deregistered there; one whose server does not answer is not wiped
/// without --force.
#[test]
fn unpair_after_the_server_let_the_machine_go_just_wipes_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let wiped = |d: &Daemon| !d.config_dir.join("identity.json").exists();

    // Revoked while its daemon ran: the daemon wrote it down.
    let mut lap = Daemon::new(dir.path(), "lap");
    lap.pair(&server.token(&[]), "lap");
    lap.start();
    server.wait_online("lap", true, T);
    assert!(server.byom(&["machines", "revoke", "lap"]).status.success());
    wait_for("daemon exit after revoke", T, || lap.exited());
    let status = stdout(&lap.byomd(&["status"]));
    assert!(status.contains("run `byomd unpair`"), "{status}");
    let o = lap.byomd(&["unpair"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("already revoked"), "{}", stdout(&o));
    assert!(wiped(&lap));

    // Revoked while nothing ran: the server's refusal says so.
    let desk = Daemon::new(dir.path(), "desk");
    desk.pair(&server.token(&[]), "desk");
    assert!(server
        .byom(&["machines", "revoke", "desk"])
        .status
        .success());
    let o = desk.byomd(&["unpair"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("revoked"), "{}", stdout(&o));
    assert!(wiped(&desk));

    // Revoked and then forgotten by the server.
    let old = Daemon::new(dir.path(), "old");
    old.pair(&server.token(&[]), "old");
    assert!(server.byom(&["machines", "revoke", "old"]).status.success());
    let id = old.identity()["machine_id"].as_str().unwrap().to_string();
    let o = server.byom(&["machines", "rm", &id]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = old.byomd(&["unpair"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("nothing to deregister"),
        "{}",
        stdout(&o)
    );
    assert!(wiped(&old));

    // A machine the server holds: deregistered there, as before.
    let ok = Daemon::new(dir.path(), "ok");
    ok.pair(&server.token(&[]), "ok");
    let id = ok.identity()["machine_id"].as_str().unwrap().to_string();
    let o = ok.byomd(&["unpair"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("deregistered"), "{}", stdout(&o));
    assert!(wiped(&ok));
    assert_eq!(server.machine(&id)["revoked"], true);

    // No server: a valid machine is kept, and --force is named.
    let far = Daemon::new(dir.path(), "far");
    far.pair(&server.token(&[]), "far");
    server.kill9();
    let o = far.byomd(&["unpair"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert!(!wiped(&far));
    let o = far.byomd(&["unpair", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(wiped(&far));
}
