//! What the API accepts reaches the machine, and cancel always ends a
//! command that has not started running.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use byom_tests::{stderr, stdout, wait_for, Daemon, Server};

const T: Duration = Duration::from_secs(60);

fn setup() -> (tempfile::TempDir, Server, Daemon) {
    Server::with_lap(&[], &[])
}

#[test]
fn the_largest_command_the_api_accepts_runs() {
    let (_dir, server, _d) = setup();
    // Every part at its limit at once: stdin, arguments, environment.
    let stdin = vec![b'x'; byom_protocol::limits::MAX_STDIN_BYTES];
    let arg = "a".repeat(byom_protocol::limits::MAX_COMMAND_LINE_BYTES - 64);
    let mut args: Vec<String> = vec!["exec".into(), "lap".into(), "-i".into()];
    for i in 0..15 {
        args.push("--env".into());
        args.push(format!("V{i}={}", "e".repeat(8000)));
    }
    args.extend([
        "--".into(),
        "sh".into(),
        "-c".into(),
        "wc -c".into(),
        "sh".into(),
        arg,
    ]);
    let mut child = server
        .byom_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), stdin.len().to_string());
}

#[test]
fn what_cannot_reach_a_machine_is_refused_when_it_is_made() {
    let (_dir, server, _d) = setup();
    // Each variable within what one argument may carry, together too many.
    let mut args = vec!["exec".to_string(), "lap".into()];
    for i in 0..20 {
        args.push("--env".into());
        args.push(format!("V{i}={}", "e".repeat(8000)));
    }
    args.extend(["--".into(), "true".into()]);
    let out = server.byom(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("environment too large"),
        "{}",
        stderr(&out)
    );
    let cwd = "/x".repeat(byom_protocol::limits::MAX_CWD_BYTES / 2 + 1);
    let out = server.byom(&["exec", "lap", "--cwd", &cwd, "--", "true"]);
    assert!(
        stderr(&out).contains("working directory too long"),
        "{}",
        stderr(&out)
    );
    let cmds = server.json(&["commands", "ls"]);
    assert_eq!(
        cmds.as_array().unwrap().len(),
        0,
        "nothing half-made: {cmds}"
    );
}

#[test]
fn cancel_ends_a_command_sent_to_a_frozen_daemon_and_it_never_runs() {
    let (dir, server, mut d) = setup();
    let marker = dir.path().join("ran");
    d.sigstop();
    // Sent (dispatched) before the server notices the daemon is gone.
    let line = format!("sleep 1; touch {}", marker.display());
    let out = server.byom(&["exec", "lap", "--detach", "--sh", &line]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    wait_for("dispatched", T, || {
        (server.command(&id)["state"] == "dispatched").then_some(())
    });
    let out = server.byom(&["commands", "cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(server.command(&id)["state"], "cancelled", "ended at once");
    d.sigcont();
    server.wait_online("lap", true, T);
    // The daemon hears the cancel (on its stream, or at its next Hello).
    std::thread::sleep(Duration::from_secs(3));
    assert!(!marker.exists(), "a cancelled command must not run");
    assert_eq!(server.command(&id)["state"], "cancelled");
}
