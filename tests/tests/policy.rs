//! The machine owner's local policy, end to end: the server sends, the
//! daemon decides, and the owner's file wins.

use std::time::Duration;

use byom_tests::{stderr, stdout, wait_for, Daemon, Server};

const T: Duration = Duration::from_secs(30);

fn setup() -> (tempfile::TempDir, Server, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    d.start();
    server.wait_online("lap", true, T);
    (dir, server, d)
}

#[test]
fn default_policy_is_written_at_pairing_and_denies_sudo() {
    let (dir, server, d) = setup();
    assert!(d.config_dir.join("policy.toml").exists());
    let marker = dir.path().join("ran");
    let m = marker.to_str().unwrap();
    for argv in [
        vec!["sudo", "touch", m],
        vec!["sh", "-c", &format!("true; sudo touch {m}")],
    ] {
        let mut args = vec!["exec", "lap", "--"];
        args.extend(argv.iter().copied());
        let out = server.byom(&args);
        assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("denied by local policy") && stderr(&out).contains("sudo"),
            "{}",
            stderr(&out)
        );
    }
    let out = server.byom(&["exec", "lap", "--sh", &format!("touch {m}; sudo true")]);
    assert_eq!(out.status.code(), Some(126));
    assert!(!marker.exists(), "a denied command never starts");
    let denied = server.json(&["commands", "ls", "--state", "denied"]);
    assert_eq!(denied.as_array().unwrap().len(), 3);
    assert!(denied[0]["reason"]
        .as_str()
        .unwrap()
        .contains("commands.deny"));
    // Outside the allowed roots.
    let out = server.byom(&["exec", "lap", "--cwd", "/etc", "--", "ls"]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(stderr(&out).contains("dirs.roots"), "{}", stderr(&out));
    // The summary reaches the server.
    let machine = server.machine("lap");
    assert!(
        machine["policy_summary"]
            .as_str()
            .unwrap()
            .contains("deny sudo"),
        "{machine}"
    );
    assert_eq!(machine["policy_digest"].as_str().unwrap().len(), 64);
}

#[test]
fn owner_edits_take_effect_and_bad_edits_are_ignored() {
    let (dir, server, d) = setup();
    let policy = d.config_dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[commands]\nallow = [\"echo\", \"sleep\", \"env\"]\ndeny_patterns = [\"*forbidden*\"]\n[dirs]\nroots = [\"{}\"]\n[env]\nscrub = [\"SECRETISH_*\"]\n[limits]\nmax_runtime = \"1s\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let out = server.byom(&["exec", "lap", "--", "ls"]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not in commands.allow"),
        "{}",
        stderr(&out)
    );
    let out = server.byom(&["exec", "lap", "--", "echo", "forbidden fruit"]);
    assert_eq!(out.status.code(), Some(126));
    let out = server.byom(&[
        "exec",
        "lap",
        "--env",
        "SECRETISH_KEY=v",
        "--env",
        "PLAIN=p",
        "--",
        "env",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("PLAIN=p") && !stdout(&out).contains("SECRETISH_KEY"),
        "{}",
        stdout(&out)
    );
    // No cwd: the command runs in the first root.
    let out = server.byom(&["exec", "lap", "--", "sh", "-c", "pwd"]);
    assert_eq!(out.status.code(), Some(126), "sh is not allowed");
    // max_runtime caps what the server asks for.
    let out = server.byom(&["exec", "lap", "--timeout", "1h", "--", "sleep", "5"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));

    // A broken edit keeps the previous policy (ls still denied).
    std::fs::write(&policy, "[commands\nallow = oops").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let out = server.byom(&["exec", "lap", "--", "ls"]);
    assert_eq!(out.status.code(), Some(126));
    assert!(
        d.log().contains("keeping the previous policy"),
        "{}",
        d.log()
    );

    // A daemon will not start on a broken policy.
    let mut d2 = Daemon::new(dir.path(), "daemon2");
    d2.pair(&server.token(&[]), "lap2");
    std::fs::write(d2.config_dir.join("policy.toml"), "[nonsense]\nx = 1").unwrap();
    d2.start();
    wait_for("daemon2 to refuse to start", T, || d2.exited());
    assert!(d2.log().contains("not a valid policy"), "{}", d2.log());
}

#[test]
fn policy_show_and_check_explain_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    let out = d.byomd(&["policy", "show"]);
    assert!(out.status.success());
    assert!(
        stdout(&out).contains("deny = [") && stdout(&out).contains("# digest:"),
        "{}",
        stdout(&out)
    );
    let out = d.byomd(&["policy", "check", "--", "sudo", "ls"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).starts_with("denied:"), "{}", stdout(&out));
    let out = d.byomd(&["policy", "check", "--cwd", "/tmp", "--", "ls", "-l"]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("allowed: runs in /tmp"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn pause_holds_commands_on_the_server_until_resume() {
    let (_dir, server, d) = setup();
    assert!(d.byomd(&["pause"]).status.success());
    wait_for("server sees paused", T, || {
        (server.machine("lap")["paused"] == true).then_some(())
    });
    let id = server.detach("lap", &[], &["echo", "after resume"]);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        server.command(&id)["state"],
        "queued",
        "nothing is sent to a paused machine"
    );
    assert!(stdout(&server.byom(&["machines", "ls"])).contains("paused"));
    assert!(stdout(&d.byomd(&["status"])).contains("paused by you"));
    assert!(d.byomd(&["resume"]).status.success());
    let c = server.wait_done(&id, T);
    assert_eq!(c["stdout"], "after resume\n");
    assert_eq!(server.machine("lap")["paused"], false);

    // Racing the status update: a command sent just as the owner pauses is
    // refused by the daemon before it starts and queued again.
    assert!(d.byomd(&["pause"]).status.success());
    let id = server.detach("lap", &[], &["echo", "raced"]);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(server.command(&id)["state"], "queued");
    assert!(d.byomd(&["resume"]).status.success());
    assert_eq!(server.wait_done(&id, T)["stdout"], "raced\n");
}

#[test]
fn local_approval_approve_deny_cancel_and_restart() {
    let (dir, server, mut d) = setup();
    std::fs::write(
        d.config_dir.join("policy.toml"),
        format!(
            "[commands]\nconfirm = [\"touch*\"]\n[dirs]\nroots = [\"{}\"]\n",
            dir.path().display()
        ),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let marker = dir.path().join("approved-ran");
    let m = marker.to_str().unwrap();
    let waiting = |id: &str| {
        wait_for("awaiting approval", T, || {
            (server.command(id)["state"] == "awaiting_local_approval").then_some(())
        })
    };

    // Approve.
    let id = server.detach("lap", &[], &["touch", m]);
    waiting(&id);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "nothing runs before approval");
    let pending = stdout(&d.byomd(&["pending"]));
    assert!(
        pending.contains(&id) && pending.contains("touch"),
        "{pending}"
    );
    assert!(d.byomd(&["approve", &id]).status.success());
    assert_eq!(server.wait_done(&id, T)["state"], "exited");
    assert!(marker.exists());

    // Deny.
    let id = server.detach("lap", &[], &["touch", &format!("{m}.2")]);
    waiting(&id);
    assert!(d.byomd(&["deny", &id]).status.success());
    let c = server.wait_done(&id, T);
    assert_eq!(c["state"], "denied");
    assert!(c["reason"].as_str().unwrap().contains("owner"), "{c}");
    assert!(!std::path::Path::new(&format!("{m}.2")).exists());
    assert!(
        !d.byomd(&["approve", &id]).status.success(),
        "no longer pending"
    );

    // Cancel from the server while waiting.
    let id = server.detach("lap", &[], &["touch", &format!("{m}.3")]);
    waiting(&id);
    assert!(server.byom(&["commands", "cancel", &id]).status.success());
    assert_eq!(server.wait_done(&id, T)["state"], "cancelled");

    // Daemon restart while waiting: lost, never run.
    let id = server.detach("lap", &[], &["touch", &format!("{m}.4")]);
    waiting(&id);
    d.kill9();
    d.start();
    assert_eq!(server.wait_done(&id, T)["state"], "lost");
    assert!(stdout(&d.byomd(&["pending"])).contains("no command"));
    assert!(!std::path::Path::new(&format!("{m}.4")).exists());
}

#[test]
fn max_concurrency_from_the_policy_is_respected_by_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    let p = d.config_dir.join("policy.toml");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("max_concurrency = 8", "max_concurrency = 1");
    std::fs::write(&p, text).unwrap();
    d.start();
    server.wait_online("lap", true, T);
    let first = server.detach("lap", &[], &["sleep", "1"]);
    let second = server.detach("lap", &[], &["echo", "second"]);
    wait_for("first running", T, || {
        (server.command(&first)["state"] == "running").then_some(())
    });
    assert_eq!(server.command(&second)["state"], "queued", "one at a time");
    assert_eq!(server.wait_done(&second, T)["stdout"], "second\n");
    assert_eq!(server.command(&first)["state"], "exited");
}
