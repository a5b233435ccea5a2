//! Laptops sleep: a daemon frozen (SIGSTOP) past every heartbeat keeps its
//! commands; when it wakes they are re-attached and their results
//! delivered. Only a machine away past the offline allowance (shortened
//! here by `--offline-allowance`) loses them. A worker whose command waits
//! on a sleeping machine hears that it is pending.

use std::time::Duration;

use byom_tests::{stderr, wait_for, Daemon, Server};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

fn setup(allowance: &str) -> (tempfile::TempDir, Server, Daemon) {
    Server::with_lap(&["--offline-allowance", allowance], &[])
}

fn running(server: &Server, id: &str) {
    wait_for(&format!("{id} running"), T, || {
        (server.command(id)["state"] == "running").then_some(())
    });
}

#[test]
fn a_laptop_asleep_past_every_heartbeat_delivers_its_result_when_it_wakes() {
    let (_dir, server, mut d) = setup("30s");
    let id = server.detach("lap", &[], &["sh", "-c", "sleep 2; echo woke"]);
    running(&server, &id);
    d.sigstop();
    // Asleep past the heartbeat (6 s) and QUIC's idle timeout: the server
    // sees the machine go, and keeps the command.
    server.wait_online("lap", false, T);
    std::thread::sleep(Duration::from_secs(8));
    let c = server.command(&id);
    assert_eq!(c["state"], "running", "kept while the laptop sleeps: {c}");
    d.sigcont();
    let c = server.wait_done(&id, T);
    assert_eq!(c["state"], "exited", "{c}");
    assert_eq!(c["exit_code"], 0, "{c}");
    assert_eq!(c["stdout"], "woke\n", "the held result is delivered: {c}");
}

#[test]
fn a_machine_away_past_the_offline_allowance_loses_its_commands() {
    let (_dir, server, mut d) = setup("2s");
    let id = server.detach("lap", &[], &["sleep", "30"]);
    running(&server, &id);
    d.sigstop();
    let c = server.wait_done(&id, T);
    assert_eq!(c["state"], "lost", "{c}");
    assert!(
        c["reason"].as_str().unwrap().contains("offline allowance"),
        "{c}"
    );
    // Waking later changes nothing: the command stays lost, the machine
    // comes back.
    d.sigcont();
    server.wait_online("lap", true, T);
    assert_eq!(server.command(&id)["state"], "lost");
}

#[test]
fn a_worker_hears_its_command_is_pending_while_the_machine_sleeps() {
    let (_dir, server, mut d) = setup("60s");
    let out = server.byom(&[
        "events",
        "send",
        "--source",
        "chat",
        "--thread",
        "nap",
        "--user",
        "ada",
        "--mention",
        "please run `sleep 3; echo rested` on lap",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cmd = wait_for("the task's command to run", T, || {
        let v = server.json(&["commands", "ls"]);
        v.as_array()?
            .iter()
            .find(|c| {
                c["shell"].as_str().is_some_and(|s| s.contains("rested")) && c["state"] == "running"
            })
            .map(|c| c["id"].as_str().unwrap_or("").to_string())
    });
    d.sigstop();
    let worker = wait_for("the worker to hear its command is pending", T, || {
        let tasks = server.json(&["tasks", "ls"]);
        let id = tasks.as_array()?.first()?["id"].as_str()?.to_string();
        let w = server.json(&["workers", "show", &id]);
        let heard = w["conversation"].as_array()?.iter().any(|m| {
            m["text"]
                .as_str()
                .is_some_and(|t| t.contains("state=pending") && t.contains(&cmd))
        });
        heard.then_some(id)
    });
    d.sigcont();
    let thread = wait_for("the result in the thread", T, || {
        let v: Value = server.json(&["threads", "show", "nap"]);
        let done = v["messages"].as_array()?.iter().any(|m| {
            m["text"]
                .as_str()
                .is_some_and(|t| t.contains("Done") && t.contains("rested"))
        });
        done.then_some(v)
    });
    let c = server.command(&cmd);
    assert_eq!(c["state"], "exited", "{c}; {thread}");
    let w = server.json(&["workers", "show", &worker]);
    assert_ne!(w["status"], "failed", "{w}");
}

/// The OS says the laptop goes to sleep (logind's PrepareForSleep, sent
/// here on a bus of the test's own, a real dbus-daemon): the daemon tells
/// the server, which shows it `asleep`, not offline, once it falls silent
/// (SIGSTOP stands in for the suspend); awake again, it is online. A
/// machine that said nothing and falls silent is offline.
#[test]
fn a_machine_that_says_it_sleeps_is_shown_asleep_not_gone() {
    let dir = tempfile::tempdir().unwrap();
    let bus_path = dir.path().join("system_bus");
    let bus = format!("unix:path={}", bus_path.display());
    let mut dbus = std::process::Command::new("dbus-daemon")
        .args(["--session", "--nofork", "--nopidfile"])
        .arg(format!("--address={bus}"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("dbus-daemon (apt install dbus)");
    wait_for("the bus", T, || bus_path.exists().then_some(()));
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "lap");
    d.env.push(("DBUS_SYSTEM_BUS_ADDRESS".into(), bus.clone()));
    d.pair(&server.token(&["--name", "lap"]), "lap");
    d.start();
    server.wait_online("lap", true, T);
    wait_for("the daemon listening to the bus", T, || {
        d.log()
            .contains("listening for logind's sleep notifications")
            .then_some(())
    });
    let sent = std::process::Command::new("dbus-send")
        .arg(format!("--bus={bus}"))
        .args([
            "--type=signal",
            "/org/freedesktop/login1",
            "org.freedesktop.login1.Manager.PrepareForSleep",
            "boolean:true",
        ])
        .status()
        .unwrap();
    assert!(sent.success());
    wait_for("the server to hear it", T, || {
        (!server.machine("lap")["asleep_since"].is_null()).then_some(())
    });
    d.sigstop();
    server.wait_online("lap", false, T);
    let ls = server.byom(&["machines", "ls"]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("asleep"),
        "{}",
        String::from_utf8_lossy(&ls.stdout)
    );
    let shown = server.byom(&["machines", "show", "lap"]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("asleep since"));
    d.sigcont();
    server.wait_online("lap", true, T);
    assert!(server.machine("lap")["asleep_since"].is_null());

    // Silent without a word: offline.
    d.sigstop();
    server.wait_online("lap", false, T);
    let ls = server.byom(&["machines", "ls"]);
    let text = String::from_utf8_lossy(&ls.stdout);
    assert!(
        text.contains("offline") && !text.contains("asleep"),
        "{text}"
    );
    d.sigcont();
    let _ = dbus.kill();
    let _ = dbus.wait();
}
