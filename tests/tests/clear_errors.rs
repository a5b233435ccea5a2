//! Clear errors instead of silent substitutions: durations out of range,
//! text that would drive an admin's terminal, names after a revoke.

use std::time::Duration;

use byom_tests::{stderr, stdout, Daemon, Server};

const T: Duration = Duration::from_secs(60);

fn setup() -> (tempfile::TempDir, Server, Daemon) {
    Server::with_lap(&[], &[])
}

#[test]
fn durations_out_of_range_are_refused_the_same_way_everywhere() {
    let (_dir, server, _d) = setup();
    for (args, says) in [
        (
            vec!["exec", "lap", "--timeout", "0", "--", "true"],
            "at least 1ms",
        ),
        (
            vec!["exec", "lap", "--timeout", "1ns", "--", "true"],
            "at least 1ms",
        ),
        (
            vec!["exec", "lap", "--timeout", "8d", "--", "true"],
            "at most 7days",
        ),
        (
            vec!["exec", "lap", "--queue-ttl", "0", "--", "true"],
            "at least 1ms",
        ),
        (
            vec!["exec", "lap", "--queue-ttl", "8d", "--", "true"],
            "at most 7days",
        ),
        (vec!["token", "create", "--ttl", "0"], "at least 1ms"),
        (vec!["token", "create", "--ttl", "30d"], "at most 7days"),
    ] {
        let out = server.byom(&args);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    // Nothing was created by any of them.
    assert_eq!(
        server.json(&["commands", "ls"]).as_array().unwrap().len(),
        0
    );
}

#[test]
fn text_from_channels_cannot_drive_the_admins_terminal() {
    let (_dir, server, _d) = setup();
    let evil = "build ok\x1b[2J\x1b]0;owned\x07\rbyom › approved \u{202e}gpj.exe";
    let out = server.byom(&[
        "events",
        "send",
        "--thread",
        "ops\x1b[31m",
        "--user",
        "mallory\r",
        evil,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).split_whitespace().next().unwrap().to_string();
    for args in [
        vec!["events", "ls"],
        vec!["show", id.as_str()],
        vec!["threads", "ls"],
    ] {
        let shown = stdout(&server.byom(&args));
        assert!(
            !shown.contains('\x1b') && !shown.contains('\r') && !shown.contains('\u{202e}'),
            "{args:?} printed raw control characters: {shown:?}"
        );
    }
    let thread = server.json(&["events", "ls"])[0]["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    let shown = stdout(&server.byom(&["threads", "show", &thread]));
    assert!(
        !shown.contains('\x1b') && !shown.contains('\r'),
        "{shown:?}"
    );
    assert!(shown.contains("\\x1b[2J"), "shown, as escapes: {shown}");
    // JSON keeps the text exactly (it is escaped by JSON itself).
    let v = server.json(&["show", &id]);
    assert_eq!(v["text"], evil);
}

#[test]
fn a_revoked_machine_frees_its_name_and_can_be_forgotten() {
    let (dir, server, mut d) = setup();
    let old = server.machine("lap")["id"].as_str().unwrap().to_string();
    // Asking for a second `lap` while one is paired is warned about.
    let out = server.byom(&["token", "create", "--name", "lap"]);
    assert!(stderr(&out).contains("already paired"), "{}", stderr(&out));
    assert!(server.byom(&["machines", "revoke", "lap"]).status.success());
    d.kill9();
    let out = server.byom(&["exec", "lap", "--", "true"]);
    assert!(stderr(&out).contains("was revoked"), "{}", stderr(&out));
    // Re-paired under the same name: it gets it, not lap-2.
    let mut again = Daemon::new(dir.path(), "lap-again");
    again.pair(&server.token(&["--name", "lap"]), "lap");
    again.start();
    server.wait_online("lap", true, T);
    let m = server.machine("lap");
    assert_eq!(m["name"], "lap");
    assert_ne!(m["id"], old.as_str());
    let out = server.byom(&["exec", "lap", "--", "echo", "new lap"]);
    assert_eq!(stdout(&out), "new lap\n", "{}", stderr(&out));
    // The revoked one is still shown by ID, and can be forgotten.
    assert_eq!(server.machine(&old)["revoked"], true);
    let out = server.byom(&["machines", "rm", "lap"]);
    assert!(stderr(&out).contains("not revoked"), "{}", stderr(&out));
    assert!(server.byom(&["machines", "rm", &old]).status.success());
    let all = server.json(&["machines", "ls", "--all"]);
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
}
