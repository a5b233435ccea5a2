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

/// `byomd service …` as on a machine reached by `su`, `sudo`, cron or
/// in a container: no user session, so no user manager to talk to.
fn without_user_session(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(bin("byomd"))
        .arg("--config-dir")
        .arg(dir.join("daemon"))
        .args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env("HOME", dir)
        .env("USER", "ada")
        .env("BYOMD_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn without_a_user_session_the_unit_is_written_and_the_way_on_said() {
    let dir = tempfile::tempdir().unwrap();
    let unit = dir.path().join(".config/systemd/user/byomd.service");
    let advice = |o: &std::process::Output| {
        let all = format!("{}{}", stdout(o), stderr(o));
        for want in [
            "no systemd user manager",
            "XDG_RUNTIME_DIR",
            "loginctl enable-linger ada",
            "systemctl --user daemon-reload",
            "service install --system",
        ] {
            assert!(all.contains(want), "{want:?} missing from: {all}");
        }
        assert!(!all.contains("Failed to connect to bus"), "{all}");
    };

    // Asked to start it: the unit is there, and the exit says it did not start.
    let o = without_user_session(dir.path(), &["service", "install"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    advice(&o);
    assert!(stderr(&o).contains("not started"), "{}", stderr(&o));
    assert!(unit.exists());
    std::fs::remove_file(&unit).unwrap();

    // Asked only to write it: done.
    let o = without_user_session(dir.path(), &["service", "install", "--no-start"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    advice(&o);
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(text.contains("ExecStart="), "{text}");

    // Start, stop and status cannot work, and say why.
    for action in ["start", "stop", "status"] {
        let o = without_user_session(dir.path(), &["service", action]);
        assert_eq!(o.status.code(), Some(1), "{action}: {}", stderr(&o));
        advice(&o);
    }

    // Uninstall removes the unit all the same, and says nothing was stopped.
    let o = without_user_session(dir.path(), &["service", "uninstall"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!unit.exists());
    assert!(stdout(&o).contains("nothing was stopped"), "{}", stdout(&o));
    let o = without_user_session(dir.path(), &["service", "uninstall"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("nothing to remove"), "{}", stdout(&o));
}

#[test]
fn a_system_unit_runs_byomd_as_the_owner_and_needs_root() {
    let dir = tempfile::tempdir().unwrap();
    let units = dir.path().join("units");
    // As root under sudo (the tests run as root): the owner is SUDO_USER,
    // with the config dir of that user's home unless one is given.
    let mut c = Command::new(bin("byomd"));
    let o = c
        .args(["service", "install", "--system", "--unit-dir"])
        .arg(&units)
        .env("SUDO_USER", "nobody")
        .env_remove("BYOMD_CONFIG_DIR")
        .env("BYOMD_LOG", "warn")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(units.join("byomd.service")).unwrap();
    let nobody_home = std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("nobody:"))
        .and_then(|l| l.split(':').nth(4))
        .map(str::to_string)
        .expect("nobody in /etc/passwd");
    assert!(text.contains("User=nobody\n"), "{text}");
    assert!(
        text.contains(&format!(
            "ExecStart={} --config-dir {nobody_home}/.config/byomd run",
            bin("byomd").display()
        )),
        "{text}"
    );
    assert!(text.contains("WantedBy=multi-user.target"), "{text}");
    assert!(stdout(&o).contains("runs as nobody"), "{}", stdout(&o));

    // A config dir given is the one the service uses; systemd accepts it.
    let cfg = dir.path().join("cfg");
    let o = Command::new(bin("byomd"))
        .arg("--config-dir")
        .arg(&cfg)
        .args(["service", "install", "--system", "--no-start", "--unit-dir"])
        .arg(&units)
        .env("SUDO_USER", "nobody")
        .env("BYOMD_LOG", "warn")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(units.join("byomd.service")).unwrap();
    assert!(
        text.contains(&format!("--config-dir {} run", cfg.display())),
        "{text}"
    );
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(units.join("byomd.service"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "systemd-analyze verify: {}{}",
        stdout(&o),
        stderr(&o)
    );
    let o = Command::new(bin("byomd"))
        .args(["service", "uninstall", "--system", "--unit-dir"])
        .arg(&units)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!units.join("byomd.service").exists());

    // Not root: refused before anything is written, with the sudo line.
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let d = Daemon::unprivileged(dir.path(), "owner", &home);
    let o = d.byomd(&["service", "install", "--system"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("sudo byomd --config-dir")
            && stderr(&o).contains("service install --system"),
        "{}",
        stderr(&o)
    );
}
