//! Several `byom server` replicas on one PostgreSQL store: any replica
//! serves any daemon and any CLI call, one of them runs the agents under a
//! lease, and any of them can die.

use std::time::{Duration, Instant};

use byom_tests::{stderr, stdout, wait_for, Daemon, Server, SharedStore};

const T: Duration = Duration::from_secs(60);

fn replicas(dir: &std::path::Path, n: usize) -> (SharedStore, Vec<Server>) {
    let store = SharedStore::in_dir(dir);
    let servers = (0..n)
        .map(|i| Server::replica(dir, &format!("r{i}"), &store, &[]))
        .collect();
    (store, servers)
}

fn addrs(servers: &[&Server]) -> String {
    servers
        .iter()
        .map(|s| s.quic_addr.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The replica running the agents now (the last to say it took the lease
/// and has not stood down since).
fn lease_holder(servers: &[Server]) -> Option<usize> {
    servers.iter().position(|s| {
        let log = s.log();
        let took = log.rfind("took the agents' lease");
        let down = log.rfind("stood down from the agents");
        took.is_some() && took > down && s.pid().is_some()
    })
}

/// A daemon paired through one replica learns every replica's address
/// from its HelloAck, keeps them, and when that replica dies connects to
/// another by itself (no --server given).
#[test]
fn a_daemon_learns_the_replicas_and_fails_over_to_them() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut s) = replicas(dir.path(), 3);
    let tok = s[0].token(&["--name", "lap"]);
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&tok, "lap");
    d.start();
    s[0].wait_online("lap", true, T);
    let all: Vec<String> = s.iter().map(|r| r.quic_addr.to_string()).collect();
    wait_for("the daemon to keep every replica's address", T, || {
        let kept = std::fs::read_to_string(d.config_dir.join("replicas")).unwrap_or_default();
        all.iter().all(|a| kept.contains(a.as_str())).then_some(())
    });
    s[0].kill9();
    wait_for("the daemon on another replica", T, || {
        let v = s[1].json(&["machines", "ls"]);
        (v[0]["online"] == true && !v[0]["remote_addr"].as_str().unwrap_or("").is_empty())
            .then_some(())
    });
    let out = s[2].byom(&["exec", "lap", "echo", "still here"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "still here");
}

#[test]
fn any_replica_serves_any_machine_and_any_call() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, s) = replicas(dir.path(), 3);
    let (a, b, c) = (&s[0], &s[1], &s[2]);
    // Paired through a, connected to b.
    let tok = a.token(&["--name", "lap"]);
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&tok, "lap");
    d.server_override = Some(b.quic_addr.to_string());
    d.start();
    for r in [a, b, c] {
        r.wait_online("lap", true, T);
    }
    // Created on a, run by b, streamed back through a.
    let out = a.byom(&[
        "exec",
        "lap",
        "--",
        "sh",
        "-c",
        "echo one; sleep 0.3; echo two",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "one\ntwo\n");
    // Cancelled through c while b runs it.
    let id = a.detach("lap", &[], &["sleep", "30"]);
    wait_for("running", T, || {
        (a.command(&id)["state"] == "running").then_some(())
    });
    let out = c.byom(&["commands", "cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = c.wait_done(&id, T);
    assert_eq!(done["state"], "cancelled", "{done}");

    // A token is redeemed once, whichever replicas the tries reach.
    let tok = c.token(&["--name", "contested"]);
    let tries: Vec<_> = (0..6)
        .map(|i| {
            let r = &s[i % 3];
            let d = Daemon::new(dir.path(), &format!("try{i}"));
            std::process::Command::new(&d.exe)
                .arg("--config-dir")
                .arg(&d.config_dir)
                .args(["pair", &tok, "--key-store", "file", "--server"])
                .arg(r.quic_addr.to_string())
                .env("BYOMD_KEY_STORE", "file")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let won = tries
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .filter(|o| o.status.success())
        .count();
    assert_eq!(won, 1, "a single-use token paired {won} machines");

    // Revoked on a: the connection held by b closes within a second.
    let t = Instant::now();
    let out = a.byom(&["machines", "revoke", "lap"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(
        "the daemon told it was revoked",
        Duration::from_secs(5),
        || d.exited().map(|_| ()),
    );
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(1) + Duration::from_millis(500),
        "the revocation reached the daemon after {took:?}"
    );
    assert!(d.log().contains("revoked"), "{}", d.log());

    // An admin added on a works on c; revoked on a, she is refused on c
    // within a second, though c keeps the list it checks calls against.
    let ada = dir.path().join("ada-creds");
    let out = a.byom(&["admins", "add", "ada", "--out", ada.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let as_ada = |r: &Server| {
        r.byom_cmd(&["machines", "ls"])
            .env("BYOM_CREDS", &ada)
            .output()
            .unwrap()
    };
    for r in [a, b, c] {
        let out = as_ada(r);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = a.byom(&["admins", "revoke", "ada"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let t = Instant::now();
    let refused = wait_for("ada refused on c", Duration::from_secs(5), || {
        let out = as_ada(c);
        (!out.status.success()).then(|| stderr(&out))
    });
    let took = t.elapsed();
    assert!(refused.contains("revoked"), "{refused}");
    assert!(
        took < Duration::from_secs(1) + Duration::from_millis(500),
        "the admin's revocation reached another replica after {took:?}"
    );
}

const PARALLEL: &str = "check `echo one`, `echo two` and `echo three` on lap in parallel, then ask me before running `echo cleaned-up`";

fn commands_with(server: &Server, text: &str) -> usize {
    server
        .json(&["commands", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.to_string().contains(text))
        .count()
}

#[test]
fn killing_replicas_loses_nothing_and_runs_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut s) = replicas(dir.path(), 3);
    let runs = dir.path().join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    // The victim is the replica running the agents; lap connects to it
    // first, desk to another. Both are given every replica.
    let victim = wait_for("an agents' lease holder", T, || lease_holder(&s));
    let (x, y) = ((victim + 1) % 3, (victim + 2) % 3);
    let mut daemons = Vec::new();
    for (name, first) in [("lap", victim), ("desk", x)] {
        let tok = s[x].token(&["--name", name]);
        let mut d = Daemon::new(dir.path(), name);
        d.pair(&tok, name);
        let order: Vec<&Server> = (0..3).map(|k| &s[(first + k) % 3]).collect();
        d.server_override = Some(addrs(&order));
        d.start();
        daemons.push(d);
    }
    for name in ["lap", "desk"] {
        s[y].wait_online(name, true, T);
    }
    // A program paused for approval, and a task in flight.
    s[x].say("p1", PARALLEL);
    wait_for("the approval", T, || {
        (!s[y]
            .json(&["approvals", "ls"])
            .as_array()
            .unwrap()
            .is_empty())
        .then_some(())
    });
    s[y].say("t1", "please run `sleep 3; echo agent-done` on lap");
    // Detached commands through every replica, each leaving a mark per run.
    let mut ids = Vec::new();
    for i in 0..6 {
        let m = if i % 2 == 0 { "lap" } else { "desk" };
        let mark = runs.join(format!("c{i}"));
        let cmd = format!("sleep 2; echo run >> {}; echo done-{i}", mark.display());
        ids.push((i, s[i % 3].detach(m, &[], &["sh", "-c", &cmd])));
    }
    // And one attached through a survivor, on the machine the victim holds.
    let attached = s[x]
        .byom_cmd(&[
            "exec",
            "lap",
            "--",
            "sh",
            "-c",
            "echo before; sleep 3; echo after",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    s[victim].kill9();
    let survivor = &s[x];

    let out = attached.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "before\nafter\n");
    for (i, id) in &ids {
        let c = survivor.wait_done(id, T);
        assert_eq!(c["state"], "exited", "{c}");
        assert_eq!(c["stdout"], format!("done-{i}\n"), "{c}");
        let marks = std::fs::read_to_string(runs.join(format!("c{i}"))).unwrap();
        assert_eq!(
            marks,
            "run\n",
            "command {i} ran {} times",
            marks.lines().count()
        );
    }
    for name in ["lap", "desk"] {
        survivor.wait_online(name, true, T);
    }
    // The agents moved, finished the task and resume the paused program.
    wait_for("the lease to move", T, || {
        lease_holder(&s).filter(|h| *h != victim)
    });
    wait_for("the agent's reply", T, || {
        survivor
            .replies("t1")
            .iter()
            .any(|m| m.contains("agent-done"))
            .then_some(())
    });
    let open = survivor.json(&["approvals", "ls"]);
    let apr = open[0]["id"]
        .as_str()
        .expect("the pause survived")
        .to_string();
    let out = s[y].byom(&["approvals", "approve", &apr, "--answer", "\"ship it\""]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("the program's result", T, || {
        survivor
            .replies("p1")
            .iter()
            .any(|m| m.contains("cleaned-up"))
            .then_some(())
    });
    // Nothing the agents ran, ran twice.
    for c in [
        "agent-done",
        "echo one",
        "echo two",
        "echo three",
        "echo cleaned-up",
    ] {
        assert_eq!(commands_with(survivor, c), 1, "{c}");
    }
}

#[test]
fn a_paused_lease_holder_is_fenced_and_stands_down() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut s) = replicas(dir.path(), 2);
    let tok = s[0].token(&["--name", "lap"]);
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&tok, "lap");
    d.server_override = Some(addrs(&[&s[0], &s[1]]));
    d.start();
    s[0].wait_online("lap", true, T);
    let holder = wait_for("a lease holder", T, || lease_holder(&s));
    let other = 1 - holder;
    // Frozen past its lease: the other takes over.
    s[holder].sigstop();
    wait_for("the other replica to take over", T, || {
        s[other]
            .log()
            .contains("took the agents' lease")
            .then_some(())
    });
    s[other].say("t2", "please run `echo after-takeover` on lap");
    wait_for("the new holder's reply", T, || {
        s[other]
            .replies("t2")
            .iter()
            .any(|m| m.contains("after-takeover"))
            .then_some(())
    });
    // Woken, the old holder finds its epoch gone and stands down.
    s[holder].sigcont();
    wait_for("the old holder to stand down", T, || {
        s[holder]
            .log()
            .contains("stood down from the agents")
            .then_some(())
    });
    // Work goes on, once each, under the new holder.
    s[holder].say("t3", "please run `echo still-once` on lap");
    let r = wait_for("a reply", T, || {
        let r = s[other].replies("t3");
        r.iter().any(|m| m.contains("still-once")).then_some(r)
    });
    std::thread::sleep(Duration::from_secs(2));
    let r2 = s[other].replies("t3");
    assert_eq!(r.len(), r2.len(), "replies kept coming: {r2:?}");
}

#[test]
fn calls_wait_out_a_database_outage() {
    let dir = tempfile::tempdir().unwrap();
    let (store, s) = replicas(dir.path(), 1);
    let a = &s[0];
    let tok = a.token(&["--name", "lap"]);
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&tok, "lap");
    d.start();
    a.wait_online("lap", true, T);

    // The database goes down (a crash, a failover) and is back in 3 s: a
    // call made meanwhile is answered "unavailable", sent again by the
    // CLI, and runs once the database is back.
    store.cluster.kill();
    let t = Instant::now();
    let out = std::thread::scope(|sc| {
        let call = sc.spawn(|| a.byom(&["exec", "lap", "--", "sh", "-c", "echo back"]));
        std::thread::sleep(Duration::from_secs(3));
        store.cluster.restart();
        call.join().expect("the call")
    });
    assert!(
        out.status.success(),
        "{} after {:?}; PostgreSQL said: {}",
        stderr(&out),
        t.elapsed(),
        store.cluster.log()
    );
    assert_eq!(stdout(&out), "back\n");
    assert!(t.elapsed() >= Duration::from_secs(3), "{:?}", t.elapsed());
    // Nothing ran twice.
    let list = a.json(&["commands", "ls"]);
    assert_eq!(list.as_array().map(|l| l.len()), Some(1), "{list}");
}
