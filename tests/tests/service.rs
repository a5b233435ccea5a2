//! The service definitions `byomd service install` writes: a systemd user
//! unit that `systemd-analyze verify` accepts, a launchd plist that parses,
//! a Windows service script; `--dry-run` prints exactly what would be
//! written and run.

use std::process::Command;

use byom_tests::{bin, stderr, stdout, Daemon};

fn dry_run(dir: &std::path::Path, platform: &str) -> String {
    let d = Daemon::new(dir, "daemon");
    let out = d.byomd(&["service", "install", "--dry-run", "--platform", platform]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

/// The first file in a dry run's output.
fn first_file(out: &str) -> (String, String) {
    let mut lines = out.lines();
    let header = lines.next().unwrap();
    let path = header
        .strip_prefix("# would write ")
        .unwrap()
        .trim_end_matches(':')
        .to_string();
    let body: Vec<&str> = lines
        .take_while(|l| {
            !l.starts_with("# would run")
                && !l.starts_with("# to keep")
                && !l.starts_with("# logs")
                && !l.starts_with("# run from")
        })
        .collect();
    (path, body.join("\n") + "\n")
}

#[test]
fn systemd_unit_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let out = dry_run(dir.path(), "linux");
    let (path, unit) = first_file(&out);
    assert!(
        path.ends_with(".config/systemd/user/byomd.service"),
        "{path}"
    );
    assert!(
        unit.contains(&format!(
            "ExecStart={} --config-dir {} run",
            bin("byomd").display(),
            dir.path().join("daemon").display()
        )),
        "{unit}"
    );
    assert!(unit.contains("Restart=on-failure"));
    assert!(out.contains("# would run: systemctl --user enable --now byomd"));
    assert!(out.contains("loginctl enable-linger"), "the lingering hint");
    let file = dir.path().join("byomd.service");
    std::fs::write(&file, &unit).unwrap();
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .output()
    {
        Ok(o) => assert!(
            o.status.success(),
            "systemd-analyze verify: {}{}",
            stdout(&o),
            stderr(&o)
        ),
        Err(e) => panic!(
            "systemd-analyze not available ({e}): .ci/run installs the Debian package systemd"
        ),
    }
}

#[test]
fn launchd_plist_parses() {
    let dir = tempfile::tempdir().unwrap();
    let out = dry_run(dir.path(), "macos");
    let (path, plist) = first_file(&out);
    assert!(
        path.ends_with("Library/LaunchAgents/dev.byom.byomd.plist"),
        "{path}"
    );
    let file = dir.path().join("p.plist");
    std::fs::write(&file, &plist).unwrap();
    let py = Command::new("python3")
        .arg("-c")
        .arg("import plistlib,sys,json; d=plistlib.load(open(sys.argv[1],'rb')); print(json.dumps(d['ProgramArguments'])); assert d['Label']=='dev.byom.byomd' and d['RunAtLoad'] and d['KeepAlive']['SuccessfulExit'] is False")
        .arg(&file)
        .output()
        .unwrap();
    assert!(py.status.success(), "{}", stderr(&py));
    let args: Vec<String> = serde_json::from_slice(&py.stdout).unwrap();
    assert_eq!(args.last().unwrap(), "run");
    assert_eq!(args[0], bin("byomd").display().to_string());
}

#[test]
fn windows_script_and_controls() {
    let dir = tempfile::tempdir().unwrap();
    let out = dry_run(dir.path(), "windows");
    assert!(
        out.contains("New-Service -Name \"byomd\"") && out.contains("restart/2000"),
        "{out}"
    );
    assert!(out.contains(&bin("byomd").display().to_string()));
    let d = Daemon::new(dir.path(), "daemon");
    for (action, want) in [
        ("start", "systemctl --user start byomd"),
        ("stop", "systemctl --user stop byomd"),
        ("uninstall", "systemctl --user disable --now byomd"),
    ] {
        let o = d.byomd(&["service", action, "--dry-run", "--platform", "linux"]);
        assert!(stdout(&o).contains(want), "{action}: {}", stdout(&o));
    }
    let o = d.byomd(&["service", "install", "--platform", "macos"]);
    assert!(
        !o.status.success(),
        "rendering for another platform needs --dry-run"
    );
}
