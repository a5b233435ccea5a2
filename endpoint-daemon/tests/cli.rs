//! The binary's own smoke test. Its presence also makes `cargo test` build
//! the `byomd` binary that the end-to-end tests in `tests/` run.

#[test]
fn unpaired_status_says_how_to_pair() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_byomd"))
        .arg("--config-dir")
        .arg(dir.path())
        .arg("status")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("byomd pair"), "{e}");
}

#[test]
fn bad_token_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_byomd"))
        .arg("--config-dir")
        .arg(dir.path())
        .args(["pair", "not-a-token"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("byom token create"), "{e}");
}
