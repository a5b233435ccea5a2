//! The shared store: a server on PostgreSQL keeps nothing it needs in its
//! data dir, and `byom store migrate` moves an embedded server's machines,
//! commands, CA and keys across.

use std::time::Duration;

use byom_tests::{Daemon, Server, SharedStore};

fn exec(server: &Server, args: &[&str]) -> String {
    let out = server.byom(args);
    assert!(
        out.status.success(),
        "byom {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_fresh_data_dir_and_the_store_url_are_all_a_replica_needs() {
    let dir = tempfile::tempdir().unwrap();
    let store = SharedStore::database(dir.path());
    let a = Server::replica(dir.path(), "a", &store, &[]);
    let tok = a.token(&["--name", "lap"]);
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&tok, "lap");
    d.start();
    a.wait_online("lap", true, Duration::from_secs(60));
    assert!(exec(&a, &["exec", "lap", "--", "echo", "one"]).contains("one"));

    // Nothing the server needs is in its data dir: the CA and keys are in
    // the database, sealed, and the key file is apart from both.
    for f in ["pki", "store", "token.key", "js-snapshot.key"] {
        assert!(
            !a.data_dir.join(f).exists(),
            "{f} in a shared-store server's data dir"
        );
    }
    let mut a = a;
    a.kill9();
    // A second server, a fresh data dir, the same database: same CA (the
    // daemon trusts it), same machines, same history.
    let b = Server::replica(dir.path(), "b", &store, &[]);
    assert_eq!(a.ca_pin(), b.ca_pin());
    d.stop();
    d.server_override = Some(b.quic_addr.to_string());
    d.start();
    b.wait_online("lap", true, Duration::from_secs(60));
    assert!(exec(&b, &["exec", "lap", "--", "echo", "two"]).contains("two"));
    // Admin credentials one replica issued work against another.
    let out = b
        .byom_cmd(&["machines", "ls"])
        .env("BYOM_CREDS", a.creds())
        .env("BYOM_API", b.api_addr.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("lap"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A replica given another key file is refused before it serves.
    std::fs::write(
        dir.path().join("other.key"),
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
    )
    .unwrap();
    let out = std::process::Command::new(byom_tests::bin("byom"))
        .args(["server", "--data-dir"])
        .arg(dir.path().join("c"))
        .args([
            "--listen-quic",
            "127.0.0.1:0",
            "--listen-api",
            "127.0.0.1:0",
        ])
        .args(["--listen-webhook", "127.0.0.1:0", "--store", &store.url])
        .arg("--store-key-file")
        .arg(dir.path().join("other.key"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a wrong key was accepted");
    assert!(err.contains("sealed with another key"), "{err}");
}

#[test]
fn migrate_moves_an_embedded_server_into_postgres() {
    let dir = tempfile::tempdir().unwrap();
    // An embedded server with a machine, a command and its output.
    let mut old = Server::replica_unstarted(dir.path(), "old", None);
    old.launch();
    let tok = old.token(&["--name", "lap"]);
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&tok, "lap");
    d.start();
    old.wait_online("lap", true, Duration::from_secs(60));
    let cmd = exec(&old, &["exec", "lap", "--detach", "--", "echo", "before"])
        .trim()
        .to_string();
    old.wait_done(&cmd, Duration::from_secs(30));
    let machine = old.machine("lap")["id"].as_str().unwrap().to_string();
    let unused = old.token(&["--name", "later"]);

    // Into PostgreSQL: refused while the server runs, fine once stopped.
    let store = SharedStore::database(dir.path());
    let from = old.data_dir.clone();
    let migrate = || {
        std::process::Command::new(byom_tests::bin("byom"))
            .args(["store", "migrate", "--from"])
            .arg(&from)
            .args(["--to", &store.url, "--store-key-file"])
            .arg(&store.key_file)
            .output()
            .unwrap()
    };
    let out = migrate();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stop its server first"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    old.kill9();
    let out = migrate();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("sealed secrets:  ca, server, token.key"),
        "{said}"
    );
    // Twice is refused: the destination is no longer empty.
    let out = migrate();
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds a byom store"));

    // A new server on the database alone carries on.
    let new = Server::replica(dir.path(), "new", &store, &[]);
    assert_eq!(new.ca_pin(), old.ca_pin());
    assert_eq!(new.machine("lap")["id"].as_str(), Some(machine.as_str()));
    let c = new.command(&cmd);
    assert_eq!(c["state"], "exited", "{c}");
    assert_eq!(c["exit_code"], 0, "{c}");
    let out = exec(&new, &["commands", "show", &cmd]);
    assert!(out.contains("before"), "{out}");
    d.stop();
    d.server_override = Some(new.quic_addr.to_string());
    d.start();
    new.wait_online("lap", true, Duration::from_secs(60));
    assert!(exec(&new, &["exec", "lap", "--", "echo", "after"]).contains("after"));
    // A token made before the move pairs a machine after it.
    let mut d2 = Daemon::new(dir.path(), "later");
    d2.server_override = Some(new.quic_addr.to_string());
    let out = d2.byomd(&[
        "pair",
        &unused,
        "--name",
        "later",
        "--key-store",
        "file",
        "--server",
        &new.quic_addr.to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
