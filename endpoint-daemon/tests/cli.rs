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

/// `byomd policy show | head -1`: the listing stops when its reader goes,
/// without a panic.
#[cfg(unix)]
#[test]
fn a_listing_whose_reader_went_away_stops_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_byomd"))
        .arg("--config-dir")
        .arg(dir.path())
        .args(["policy", "show"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before the first line is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!e.contains("panicked"), "{e}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?}: {e}",
        out.status
    );
}
