//! The binary's own smoke test. Its presence also makes `cargo test` build
//! the `byom` binary that the end-to-end tests in `tests/` run.

#[test]
fn help_lists_the_verbs() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_byom"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for verb in ["server", "token", "machines", "exec", "commands", "demo"] {
        assert!(s.contains(verb), "{verb} missing from --help");
    }
}

#[test]
fn missing_credentials_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_byom"))
        .args(["machines", "ls"])
        .env("BYOM_CREDS", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("byom server") && e.contains("--creds"), "{e}");
}
