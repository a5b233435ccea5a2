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
            "[commands]\nallow = [\"echo\", \"sleep\", \"env\"]\ndeny_patterns = [\"echo forbidden*\"]\n[dirs]\nroots = [\"{}\"]\n[env]\nscrub = [\"SECRETISH_*\"]\n[limits]\nmax_runtime = \"1s\"\n",
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
    // Long enough for the slow CLI calls below to see it running.
    let first = server.detach("lap", &[], &["sleep", "3"]);
    let second = server.detach("lap", &[], &["echo", "second"]);
    wait_for("first running", T, || {
        (server.command(&first)["state"] == "running").then_some(())
    });
    assert_eq!(server.command(&second)["state"], "queued", "one at a time");
    assert_eq!(server.wait_done(&second, T)["stdout"], "second\n");
    assert_eq!(server.command(&first)["state"], "exited");
}

/// Every line the review ran past `commands.deny = ["su"]` and the raw-line
/// patterns, through `byomd policy check` and through a real byomd: the
/// same answer from both. The programs the lines name are harmless fakes
/// first on the command's PATH, so a wrong "allow" shows as a marker file,
/// never as a real `su` or `rm -rf /`.
#[test]
fn policy_table_same_answer_from_check_and_runtime() {
    let (dir, server, d) = setup();
    let fake = dir.path().join("fakebin");
    let marks = dir.path().join("ran");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::create_dir_all(&marks).unwrap();
    for name in [
        "su",
        "sudo",
        "doas",
        "rm",
        "git",
        "busybox",
        "mkfs.ext4",
        "dd",
    ] {
        let p = fake.join(name);
        std::fs::write(&p, format!("#!/bin/sh\ntouch {}/{name}\n", marks.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!("PATH={}:/usr/bin:/bin", fake.display());
    let table: &[(&str, &str)] = &[
        ("s''u -c id", "deny"),
        ("\\su -c id", "deny"),
        ("x=s; ${x}u -c id", "deny"),
        ("eval \"s\"\"u -c id\"", "deny"),
        ("find / -maxdepth 0 -exec su -c id ';'", "deny"),
        ("busybox su", "deny"),
        ("env A=1 su -c id", "deny"),
        ("nice -n 5 nohup timeout 5 su -c id", "deny"),
        ("echo id | xargs su -c", "deny"),
        ("sudo id", "deny"),
        ("echo $(doas id)", "deny"),
        ("sh -c 'su -c id'", "deny"),
        ("rm -fr /", "deny"),
        ("rm -r -f /", "deny"),
        ("rm -rf --no-preserve-root /", "deny"),
        ("rm -rf //", "deny"),
        ("rm -rf ~", "deny"),
        ("mkfs.ext4 /dev/sda1", "deny"),
        ("cd /tmp && git push", "confirm"),
        ("git -C /tmp push", "confirm"),
        ("git -c a=b push", "confirm"),
        ("echo su is denied", "allow"),
        ("git status", "allow"),
        ("rm -rf /tmp/byom-policy-table-nothing", "allow"),
    ];
    for (line, want) in table {
        // The owner's view.
        let out = d.byomd(&[
            "policy", "check", "--cwd", "/tmp", "--env", &path, "--sh", line,
        ]);
        let text = stdout(&out);
        let said = if text.starts_with("denied:") {
            "deny"
        } else if text.starts_with("allowed after your approval") {
            "confirm"
        } else if text.starts_with("allowed:") {
            "allow"
        } else {
            "?"
        };
        assert_eq!(said, *want, "policy check {line:?}: {text}");
        // The runtime's.
        let id = server.detach("lap", &["--cwd", "/tmp", "--env", &path, "--sh", line], &[]);
        let state = wait_for("a decision", T, || {
            let c = server.command(&id);
            let s = c["state"].as_str().unwrap_or("").to_string();
            matches!(
                s.as_str(),
                "denied" | "awaiting_local_approval" | "exited" | "failed"
            )
            .then_some((s, c))
        });
        let got = match state.0.as_str() {
            "denied" => "deny",
            "awaiting_local_approval" => "confirm",
            _ => "allow",
        };
        assert_eq!(got, *want, "byomd ran {line:?}: {}", state.1);
        if got == "confirm" {
            assert!(server.byom(&["commands", "cancel", &id]).status.success());
        }
        if *want == "deny" {
            let c = server.command(&id);
            let reason = c["reason"].as_str().unwrap_or("");
            assert!(
                reason.contains("denied by local policy"),
                "{line:?}: {reason}"
            );
        }
    }
    let ran: Vec<_> = std::fs::read_dir(&marks)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // Only the allowed `git status` and `rm` of a path that is not there ran.
    let mut ran = ran;
    ran.sort();
    assert_eq!(ran, ["git", "rm"], "a denied command ran");
}

/// `[agents] commands` applies to what agents send, not to the owner's own
/// `byom exec`; `[run] user` runs commands as an unprivileged local user.
#[test]
fn agents_rule_and_run_as_user() {
    let (dir, server, d) = setup();
    std::fs::write(
        d.config_dir.join("policy.toml"),
        "[agents]\ncommands = \"deny\"\n[dirs]\nroots = [\"/tmp\"]\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let check = d.byomd(&["policy", "check", "--from-agent", "--", "hostname"]);
    assert!(
        stdout(&check).starts_with("denied: agents.commands"),
        "{}",
        stdout(&check)
    );
    let out = server.byom(&["exec", "lap", "--", "hostname"]);
    assert!(
        out.status.success(),
        "the owner's own command: {}",
        stderr(&out)
    );
    // An agent's: the scripted worker runs `hostname` when asked.
    let sent = server.byom(&[
        "events",
        "send",
        "--source",
        "chat",
        "--thread",
        "t1",
        "--user",
        "ada",
        "--mention",
        "please run `hostname` on lap",
    ]);
    assert!(sent.status.success(), "{}", stderr(&sent));
    let denied = wait_for("the agent's command denied", T, || {
        let cmds = server.json(&["commands", "ls", "--state", "denied"]);
        cmds.as_array().and_then(|a| a.first().cloned())
    });
    assert!(
        denied["requested_by"]
            .as_str()
            .unwrap_or("")
            .starts_with("wrk_"),
        "{denied}"
    );
    assert!(
        denied["reason"]
            .as_str()
            .unwrap()
            .contains("agents.commands"),
        "{denied}"
    );

    // Running as `nobody` needs byomd to be root: only then is it tested.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping run.user: not root");
        return;
    }
    std::fs::write(
        d.config_dir.join("policy.toml"),
        "[run]\nuser = \"nobody\"\n[dirs]\nroots = [\"/tmp\"]\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let out = server.byom(&["exec", "lap", "--sh", "id -u; id -G; echo $HOME"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "65534", "{text}");
    assert!(
        !lines[1].split(' ').any(|g| g == "0"),
        "no root group: {text}"
    );
    assert!(stdout(&d.byomd(&["policy", "show"])).contains("runs as nobody"));
    // A file only root may write stays unwritten.
    let target = dir.path().join("root-only");
    std::fs::write(&target, "x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = server.byom(&[
        "exec",
        "lap",
        "--sh",
        &format!("echo y > {}", target.display()),
    ]);
    assert!(!out.status.success());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "x");
}
