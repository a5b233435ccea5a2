//! Secrets by handle: substituted on the machine, scrubbed from output
//! (also when a value is split across output chunks), never in the store.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use byom_tests::{bin, stderr, stdout, Daemon, Server};

const T: Duration = Duration::from_secs(30);
const VALUE: &str = "tok-9f8e7d6c5b4a";

fn set_secret(d: &Daemon, name: &str, value: &str) {
    set_secret_with(d, name, value, &[]);
}

fn set_secret_with(d: &Daemon, name: &str, value: &str, flags: &[&str]) {
    let mut c = Command::new(bin("byomd"))
        .arg("--config-dir")
        .arg(&d.config_dir)
        .args(["secret", "set", name])
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(format!("{value}\n").as_bytes())
        .unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn secrets_are_substituted_and_scrubbed_and_never_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    set_secret(&d, "API_TOKEN", VALUE);
    let ls = d.byomd(&["secret", "ls"]);
    assert_eq!(stdout(&ls), "API_TOKEN\n");
    d.start();
    server.wait_online("lap", true, T);

    // In argv, env and stdin; echoed back, scrubbed.
    let out = server.byom(&[
        "exec",
        "lap",
        "--env",
        "T={{secret:API_TOKEN}}",
        "--",
        "sh",
        "-c",
        "echo \"arg=$0 env=$T\"; cat",
        "{{secret:API_TOKEN}}",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "arg={{secret:API_TOKEN}} env={{secret:API_TOKEN}}\n"
    );
    // The command really saw the value: its length and a hash of it.
    let out = server.byom(&[
        "exec",
        "lap",
        "--sh",
        "printf %s '{{secret:API_TOKEN}}' | wc -c",
    ]);
    assert_eq!(stdout(&out).trim(), VALUE.len().to_string());

    // Split across two writes (and so two output chunks), on stderr too.
    let half = VALUE.len() / 2;
    let script = format!("printf %s '{}'; sleep 0.3; printf '%s\\n' '{}'; printf %s '{}' >&2; sleep 0.3; printf '%s\\n' '{}' >&2", &VALUE[..half], &VALUE[half..], &VALUE[..half], &VALUE[half..]);
    let out = server.byom(&["exec", "lap", "--sh", &script]);
    assert_eq!(stdout(&out), "{{secret:API_TOKEN}}\n");
    assert_eq!(stderr(&out), "{{secret:API_TOKEN}}\n");

    // Half on stdout, the rest on stderr: the interleaved streams are
    // scrubbed as one.
    let script = format!(
        "printf %s '{}'; sleep 0.3; printf %s '{}' >&2",
        &VALUE[..half],
        &VALUE[half..]
    );
    let out = server.byom(&["exec", "lap", "--sh", &script]);
    let both = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!both.contains(&VALUE[..half]), "{both:?}");
    assert!(!both.contains(&VALUE[half..]), "{both:?}");
    // Common encodings of the value are taken out as well.
    for enc in [
        "base64",
        "base64 -w0 | tr -d =",
        "od -An -tx1 | tr -d ' \\n'",
        "rev",
    ] {
        let out = server.byom(&[
            "exec",
            "lap",
            "--sh",
            &format!("printf %s '{{{{secret:API_TOKEN}}}}' | {enc}"),
        ]);
        assert!(out.status.success(), "{enc}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("{{secret:API_TOKEN}}"),
            "{enc}: {:?}",
            stdout(&out)
        );
    }

    // Unknown secret: the command fails clearly and never runs.
    let out = server.byom(&["exec", "lap", "--", "echo", "{{secret:NOPE}}"]);
    assert_eq!(out.status.code(), Some(255));
    assert!(
        stderr(&out).contains("unknown secret") && stderr(&out).contains("byomd secret set NOPE"),
        "{}",
        stderr(&out)
    );

    // The server and its store never saw the value.
    drop(server);
    let mut found = Vec::new();
    for entry in walk(&dir.path().join("server")) {
        if std::fs::read(&entry)
            .map(|b| b.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()))
            .unwrap_or(false)
        {
            found.push(entry);
        }
    }
    assert!(found.is_empty(), "secret value found in {found:?}");

    // rm works; secrets file is private.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(d.config_dir.join("secrets.json"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    assert!(d.byomd(&["secret", "rm", "API_TOKEN"]).status.success());
    assert!(!d.byomd(&["secret", "rm", "API_TOKEN"]).status.success());
}

#[test]
fn secret_values_are_never_taken_from_argv() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::new(dir.path(), "daemon");
    let out = d.byomd(&["secret", "set", "X", "value"]);
    assert!(
        !out.status.success(),
        "a value on the command line must be refused"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn audit_trail_on_the_server_and_on_the_machine() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    set_secret(&d, "PW", VALUE);
    d.start();
    server.wait_online("lap", true, T);
    assert!(server
        .byom(&[
            "exec",
            "lap",
            "--cwd",
            "/tmp",
            "--",
            "echo",
            "{{secret:PW}}"
        ])
        .status
        .success());
    assert_eq!(
        server
            .byom(&["exec", "lap", "--", "sudo", "true"])
            .status
            .code(),
        Some(126)
    );
    let a = server.json(&["audit", "ls", "--since", "1h"]);
    let a = a.as_array().unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(a[1]["requested_by"], "admin:admin");
    assert_eq!(a[1]["command"], "echo {{secret:PW}}");
    assert_eq!(a[1]["cwd"], "/tmp");
    assert_eq!(
        a[1]["stdout_bytes"], 14,
        "the scrubbed size: the handle, not the value"
    );
    assert_eq!(a[0]["state"], "denied");
    assert!(server
        .json(&["audit", "ls", "--since", "2999-01-01T00:00:00Z"])
        .as_array()
        .unwrap()
        .is_empty());
    let table = stdout(&server.byom(&["audit", "ls", "--machine", "lap"]));
    assert!(
        table.contains("admin:admin") && table.contains("denied"),
        "{table}"
    );

    let log = stdout(&d.byomd(&["log", "--json"]));
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert_eq!(lines[0]["command"], "echo {{secret:PW}}");
    assert_eq!(lines[0]["requested_by"], "admin:admin");
    assert_eq!(lines[1]["state"], "denied");
    assert!(!log.contains(VALUE));
    assert!(stdout(&d.byomd(&["log"])).contains("exit 0"));
}

/// The server's data dir holds command environments and outputs: it is the
/// owner's alone, and so is the daemon's run file. A data dir others can
/// read is named in the log.
#[test]
fn stored_data_is_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&server.token(&[]), "lap");
    d.start();
    server.wait_online("lap", true, Duration::from_secs(30));
    let out = server.byom(&["exec", "lap", "--env", "K=v", "--", "echo", "hi"]);
    assert!(out.status.success());
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&server.data_dir), 0o700);
    let mut open = Vec::new();
    let mut stack = vec![server.data_dir.clone()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap().path();
            if mode(&e) & 0o077 != 0 {
                open.push(format!("{} {:o}", e.display(), mode(&e)));
            }
            if e.is_dir() {
                stack.push(e);
            }
        }
    }
    assert!(open.is_empty(), "readable by others: {open:?}");
    assert_eq!(mode(&d.config_dir.join("run.json")) & 0o077, 0);
    drop(server);
    std::fs::set_permissions(
        dir.path().join("server"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let server = Server::start(dir.path());
    byom_tests::wait_for("the warning", Duration::from_secs(10), || {
        server.log().contains("was open to others").then_some(())
    });
}

/// The owner restricts what may use a secret: only named programs, or only
/// with a local yes. `policy check` and the runtime agree.
#[test]
fn secrets_restricted_to_programs_or_approval() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    set_secret_with(&d, "TOK", VALUE, &["--allow-program", "printf"]);
    set_secret_with(&d, "ASK", "ask-5e6f7a8b9c", &["--confirm"]);
    let ls = stdout(&d.byomd(&["secret", "ls"]));
    assert!(ls.contains("TOK\t(used only by printf)"), "{ls}");
    assert!(
        ls.contains("ASK\t(used each use needs your approval)") || ls.contains("ASK\t(used"),
        "{ls}"
    );
    d.start();
    server.wait_online("lap", true, T);

    let out = server.byom(&["exec", "lap", "--", "printf", "%s", "{{secret:TOK}}"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "{{secret:TOK}}");
    // Any other program in the command: denied, before anything runs.
    for line in [
        "printf %s {{secret:TOK}} | base64",
        "echo {{secret:TOK}}",
        "printf %s {{secret:TOK}} > /tmp/x; cat /tmp/x",
    ] {
        let out = server.byom(&["exec", "lap", "--sh", line]);
        assert_eq!(out.status.code(), Some(126), "{line}: {}", stderr(&out));
        assert!(stderr(&out).contains("secret TOK"), "{}", stderr(&out));
        let check = d.byomd(&["policy", "check", "--sh", line]);
        assert!(stdout(&check).starts_with("denied:"), "{}", stdout(&check));
    }
    // --confirm: waits for the owner.
    let id = server.detach("lap", &["--sh", "echo {{secret:ASK}} >/dev/null"], &[]);
    byom_tests::wait_for("approval wait", T, || {
        (server.command(&id)["state"] == "awaiting_local_approval").then_some(())
    });
    assert!(stdout(&d.byomd(&["pending"])).contains("secret ASK"));
    assert!(d.byomd(&["approve", &id]).status.success());
    assert_eq!(server.wait_done(&id, T)["state"], "exited");
}
