//! Installing byomd in one line and upgrading it, with real processes: a
//! `byom server --dist` hands out the installer and the release over
//! HTTPS on its public port, the printed one-liner runs under `sh` in a
//! fresh HOME with nothing of byom on PATH, and what it cannot check
//! (another server's token, a changed artifact or manifest) it refuses.
//! The packages install into a throwaway root; upgrades drain, try, swap
//! and roll back.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use byom_tests::{bin, stamped_byomd, stderr, stdout, wait_for, write_dist, Daemon, Server};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

fn this_dist(dir: &Path, version: &str) -> PathBuf {
    let d = dir.join(format!("dist-{version}"));
    let (os, arch) = byom_protocol::manifest::this_platform();
    let bytes = if version == byom_protocol::VERSION {
        std::fs::read(bin("byomd")).unwrap()
    } else {
        stamped_byomd(version)
    };
    write_dist(
        &d,
        version,
        &[(
            &format!("byomd-{version}-{os}-{arch}"),
            "byomd",
            "bin",
            &bytes,
        )],
    );
    d
}

/// A laptop with nothing installed: its own HOME, a PATH without byom.
struct Laptop {
    home: PathBuf,
}

impl Laptop {
    fn new(dir: &Path, name: &str) -> Laptop {
        let home = dir.join(name);
        std::fs::create_dir_all(&home).unwrap();
        Laptop { home }
    }

    fn sh(&self, line: &str) -> Output {
        Command::new("sh")
            .arg("-c")
            .arg(line)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("BYOMD_KEY_STORE", "file")
            // As root (CI) the default is /usr/local/bin: keep to HOME.
            .env("BYOM_BIN_DIR", self.home.join(".local/bin"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn byomd(&self) -> PathBuf {
        self.home.join(".local/bin/byomd")
    }

    fn config(&self) -> PathBuf {
        self.home.join(".config/byomd")
    }
}

/// Kills a background daemon the installer started, whatever happens.
struct Reap(PathBuf);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.0.join("byomd.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: a signal to a process the test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn both(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

fn install_line(server: &Server, name: &str) -> (String, String) {
    let v = server.json(&["token", "create", "--name", name]);
    (
        v["install_command"]
            .as_str()
            .expect("token create prints the one-liner when the server ships byomd")
            .to_string(),
        v["token"].as_str().unwrap().to_string(),
    )
}

#[test]
fn the_one_liner_installs_pairs_and_starts_byomd() {
    let dir = tempfile::tempdir().unwrap();
    let dist = this_dist(dir.path(), byom_protocol::VERSION);
    let server = Server::start_with(dir.path(), &["--dist", dist.to_str().unwrap()]);
    let (line, _) = install_line(&server, "fresh");
    assert!(
        line.starts_with("curl -fsSL --pinnedpubkey 'sha256//")
            && line.contains("/install.sh | sh -s -- byom1-"),
        "{line}"
    );
    // The human form says where to paste it.
    let human = server.byom(&["token", "create"]);
    assert!(
        stderr(&human).contains("Install, pair and start byomd"),
        "{}",
        stderr(&human)
    );

    let lap = Laptop::new(dir.path(), "home");
    let _reap = Reap(lap.config());
    let started = Instant::now();
    let out = lap.sh(&line);
    let took = started.elapsed();
    assert!(out.status.success(), "install failed: {}", both(&out));
    eprintln!("figure: one-liner to online in {} ms", took.as_millis());
    let text = both(&out);
    assert!(text.contains("installed byomd"), "{text}");
    assert!(text.contains("connection:   connected"), "{text}");
    assert!(lap.byomd().exists());
    server.wait_online("fresh", true, T);
    let o = server.byom(&["exec", "fresh", "echo", "reached"]);
    assert_eq!(stdout(&o).trim(), "reached", "{}", stderr(&o));

    // Running it again is safe: the token is not spent twice, the daemon
    // is back online.
    let again = lap.sh(&line);
    assert!(again.status.success(), "{}", both(&again));
    assert!(both(&again).contains("already paired"), "{}", both(&again));
    server.wait_online("fresh", true, T);

    // --uninstall stops it, unpairs and removes the binary.
    let un = line.replace(line.rsplit_once(' ').unwrap().1, "--uninstall");
    let o = lap.sh(&un);
    assert!(o.status.success(), "{}", both(&o));
    assert!(!lap.byomd().exists());
    assert!(!lap.config().join("identity.json").exists());
    let ls = server.json(&["machines", "ls", "--all"]);
    let m = ls
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "fresh")
        .cloned()
        .unwrap_or(Value::Null);
    assert!(m.is_null() || m["revoked"] == true, "{m}");
}

#[test]
fn the_one_liner_refuses_what_it_cannot_check() {
    let dir = tempfile::tempdir().unwrap();
    let dist = this_dist(dir.path(), byom_protocol::VERSION);
    let a = Server::start_with(&dir.path().join("a"), &["--dist", dist.to_str().unwrap()]);
    let b = Server::start_with(&dir.path().join("b"), &["--dist", dist.to_str().unwrap()]);
    let (line_a, tok_a) = install_line(&a, "x");
    let (_, tok_b) = install_line(&b, "y");
    let lap = Laptop::new(dir.path(), "home");
    let _reap = Reap(lap.config());
    let refused = |line: &str, why: &str| {
        let o = lap.sh(line);
        assert!(!o.status.success(), "installed anyway: {}", both(&o));
        assert!(both(&o).contains(why), "wanted {why:?} in: {}", both(&o));
        assert!(!lap.byomd().exists(), "a binary was left behind");
    };

    // A token for another server: its CA is not the one served here.
    refused(&line_a.replace(&tok_a, &tok_b), "but the token pins");
    // A server key the line does not pin: curl stops before the script
    // runs (and `sh` reads nothing, so the pipeline itself succeeds).
    let o = lap.sh(&line_a.replace("sha256//", "sha256//AAAA"));
    assert!(stderr(&o).contains("pinned public key"), "{}", both(&o));
    assert!(!lap.byomd().exists());

    // An artifact changed after the server checked it.
    let (os, arch) = byom_protocol::manifest::this_platform();
    let art = dist.join(format!("byomd-{}-{os}-{arch}", byom_protocol::VERSION));
    let good = std::fs::read(&art).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&art, &bad).unwrap();
    refused(&line_a, "but the signed manifest says");
    std::fs::write(&art, &good).unwrap();

    // A manifest changed after the server signed it (pointing at the
    // changed artifact, as an attacker would).
    let manifest = std::fs::read_to_string(dist.join("manifest")).unwrap();
    let sha =
        byom_protocol::manifest::hex(ring::digest::digest(&ring::digest::SHA256, &bad).as_ref());
    let good_sha =
        byom_protocol::manifest::hex(ring::digest::digest(&ring::digest::SHA256, &good).as_ref());
    std::fs::write(dist.join("manifest"), manifest.replace(&good_sha, &sha)).unwrap();
    std::fs::write(&art, &bad).unwrap();
    refused(&line_a, "which the server checked and signed");
    // A server started on a release whose artifact does not match its
    // manifest refuses to ship it at all.
    std::fs::write(dist.join("manifest"), &manifest).unwrap();
    let mut o = byom_tests::server_cmd(&dir.path().join("c"))
        .arg("--dist")
        .arg(&dist)
        .env("BYOM_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a server that wrongly starts is killed, and the test fails.
    let exited = wait_for("the server to refuse the release", T, || {
        o.try_wait().ok().flatten()
    });
    let _ = o.kill();
    let mut why = String::new();
    std::io::Read::read_to_string(&mut o.stderr.take().unwrap(), &mut why).unwrap();
    assert!(
        !exited.success() && why.contains("does not match its manifest"),
        "{why}"
    );
}

#[test]
fn a_server_without_a_release_says_how_to_ship_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let v = server.json(&["token", "create"]);
    assert!(v.get("install_command").is_none(), "{v}");
    let o = server.byom(&["token", "create"]);
    assert!(stderr(&o).contains("--dist"), "{}", stderr(&o));
    // The installer URL answers with the reason, not a hang or a crash.
    let url = format!("https://{}/install.sh", server.quic_addr);
    let o = Command::new("curl").args(["-sk", &url]).output().unwrap();
    assert!(stdout(&o).contains("ships no daemon"), "{}", both(&o));
    // Daemons still get the tunnel on the same port.
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&server.token(&[]), "lap");
    d.start();
    server.wait_online("lap", true, T);
}

#[test]
fn release_packages_install_and_uninstall_in_a_throwaway_root() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dist");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = Command::new("bash")
        .arg(root.join("installers/release.sh"))
        .args([
            "--profile",
            "dev",
            "--targets",
            "native",
            "--no-build",
            "--programs",
            "byomd",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "release.sh: {}", both(&o));
    let manifest = std::fs::read(out.join("manifest")).unwrap();
    let m =
        byom_protocol::manifest::Manifest::parse(&manifest).expect("the script's manifest parses");
    let (os, arch) = byom_protocol::manifest::this_platform();
    for kind in ["bin", "deb", "rpm"] {
        assert!(
            m.artifacts
                .iter()
                .any(|a| a.kind == kind && a.os == os && a.arch == arch),
            "no {kind} in {}",
            String::from_utf8_lossy(&manifest)
        );
    }
    let deb = m.artifacts.iter().find(|a| a.kind == "deb").unwrap();
    let rpm = m.artifacts.iter().find(|a| a.kind == "rpm").unwrap();

    // dpkg into a root the test makes.
    let r = dir.path().join("root");
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").unwrap();
    let dpkg = |args: &[&str]| {
        let o = Command::new("dpkg")
            .arg(format!("--root={}", r.display()))
            .args([
                "--force-not-root",
                "--force-script-chrootless",
                "--log=/dev/null",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "dpkg {args:?}: {}", both(&o));
        stdout(&o)
    };
    dpkg(&["-i", out.join(&deb.file).to_str().unwrap()]);
    let exe = r.join("usr/bin/byomd");
    let v = Command::new(&exe).arg("--version").output().unwrap();
    assert!(stdout(&v).contains(byom_protocol::VERSION), "{}", both(&v));
    let unit = r.join("usr/lib/systemd/user/byomd.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(text.contains("ExecStart=/usr/bin/byomd run"), "{text}");
    // systemd checks ExecStart's binary on this host: point it into the root.
    let check = dir.path().join("byomd.service");
    std::fs::write(
        &check,
        text.replace("/usr/bin/byomd", exe.to_str().unwrap()),
    )
    .unwrap();
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&check)
        .output()
        .unwrap();
    assert!(o.status.success(), "systemd-analyze verify: {}", both(&o));
    dpkg(&["-r", "byomd"]);
    assert!(!exe.exists() && !unit.exists(), "dpkg -r left files");

    // rpm into another.
    let rr = dir.path().join("rpmroot");
    std::fs::create_dir_all(&rr).unwrap();
    let rpm_run = |args: &[&str]| {
        let o = Command::new("rpm")
            .arg("--root")
            .arg(&rr)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "rpm {args:?}: {}", both(&o));
    };
    rpm_run(&["--initdb"]);
    rpm_run(&[
        "-i",
        "--nodeps",
        "--nosignature",
        out.join(&rpm.file).to_str().unwrap(),
    ]);
    assert!(rr.join("usr/bin/byomd").exists());
    rpm_run(&["-e", "byomd"]);
    assert!(!rr.join("usr/bin/byomd").exists());

    // And a server ships exactly this directory.
    let server = Server::start_with(&dir.path().join("srv"), &["--dist", out.to_str().unwrap()]);
    let v = server.json(&["token", "create"]);
    assert!(v["install_command"].is_string(), "{v}");
}

fn machine_row(server: &Server, name: &str) -> Value {
    server
        .json(&["machines", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .cloned()
        .unwrap()
}

#[test]
fn upgrades_wait_for_commands_and_a_broken_build_is_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let next = "0.99.1";
    let dist = this_dist(dir.path(), next);
    let mut server = Server::start_with(dir.path(), &["--dist", dist.to_str().unwrap()]);
    // The daemon runs from its own copy: upgrades replace it in place.
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let exe = bin_dir.join("byomd");
    std::fs::copy(bin("byomd"), &exe).unwrap();
    let mut d = Daemon::new(dir.path(), "lap");
    d.exe = exe.clone();
    d.pair(&server.token(&[]), "lap");
    d.start();
    server.wait_online("lap", true, T);
    let row = machine_row(&server, "lap");
    assert_eq!(row["version"], byom_protocol::VERSION);
    assert_eq!(row["behind"], true, "{row}");
    let table = stdout(&server.byom(&["machines", "ls"]));
    assert!(table.contains(&format!("(behind {next})")), "{table}");
    let check = d.byomd(&["upgrade", "--check"]);
    assert!(
        stdout(&check).contains(&format!("the server ships {next}")),
        "{}",
        both(&check)
    );

    // An owner who opted in gets it without asking.
    let auto_bin = dir.path().join("auto-bin");
    std::fs::create_dir_all(&auto_bin).unwrap();
    std::fs::copy(bin("byomd"), auto_bin.join("byomd")).unwrap();
    let mut auto = Daemon::new(dir.path(), "auto");
    auto.exe = auto_bin.join("byomd");
    auto.pair(&server.token(&[]), "auto");
    let policy = auto.config_dir.join("policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    assert!(
        text.contains("auto_upgrade = false"),
        "the default policy offers it"
    );
    std::fs::write(
        &policy,
        text.replace("auto_upgrade = false", "auto_upgrade = true"),
    )
    .unwrap();
    auto.start();

    // A command is running: the upgrade waits for it.
    let cmd = server.detach("lap", &[], &["sh", "-c", "sleep 2; echo finished"]);
    wait_for("the command to run", T, || {
        (server.command(&cmd)["state"] == "running").then_some(())
    });
    let pid = d_pid(&d);
    let o = d.byomd(&["upgrade"]);
    let text = both(&o);
    assert!(o.status.success(), "upgrade: {text}");
    assert!(text.contains("waiting for 1 running command"), "{text}");
    assert!(
        text.contains(&format!(
            "upgraded from {} to {next}",
            byom_protocol::VERSION
        )),
        "{text}"
    );
    let c = server.wait_done(&cmd, T);
    assert_eq!(c["state"], "exited", "{c}");
    assert_eq!(c["exit_code"], 0, "{c}");
    server.wait_online("lap", true, T);
    let row = wait_for("the new version on the server", T, || {
        let r = machine_row(&server, "lap");
        (r["version"] == next).then_some(r)
    });
    assert_eq!(row["behind"], false, "{row}");
    assert_eq!(
        d_pid(&d),
        pid,
        "the upgrade execs in place: one PID for the service manager"
    );
    // The old binary is kept where no command can change it.
    assert!(d.config_dir.join("byomd.prev").exists());
    assert!(!bin_dir.join("byomd.prev").exists());
    wait_for("the opted-in machine to upgrade itself", T, || {
        (machine_row(&server, "auto")["version"] == next).then_some(())
    });
    auto.stop();
    let o = server.byom(&["exec", "lap", "echo", "still here"]);
    assert_eq!(stdout(&o).trim(), "still here", "{}", both(&o));

    // A broken build: it answers --version but never connects.
    let broken = "0.99.2";
    let bdist = dir.path().join("dist-broken");
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in --version) echo byomd {broken};; *) exec sleep 600;; esac\n"
    );
    let (os, arch) = byom_protocol::manifest::this_platform();
    write_dist(
        &bdist,
        broken,
        &[(
            &format!("byomd-{broken}-{os}-{arch}"),
            "byomd",
            "bin",
            script.as_bytes(),
        )],
    );
    server.extra_args = vec!["--dist".into(), bdist.to_str().unwrap().into()];
    server.restart();
    server.wait_online("lap", true, T);
    let before = std::fs::read(&exe).unwrap();
    let o = d.byomd(&["upgrade", "--within", "3s"]);
    let text = both(&o);
    assert!(!o.status.success(), "a broken build must not pass: {text}");
    assert!(
        text.contains("rolled back") && text.contains("did not connect within 3s"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(&exe).unwrap(),
        before,
        "the binary was not swapped"
    );
    server.wait_online("lap", true, T);
    let row = machine_row(&server, "lap");
    assert_eq!(row["version"], next);
    assert_eq!(row["behind"], true);
    let o = server.byom(&["exec", "lap", "echo", "kept"]);
    assert_eq!(stdout(&o).trim(), "kept", "{}", both(&o));

    // --now does not wait: the running command is cancelled, and says so.
    let last = "0.99.3";
    let ndist = this_dist(dir.path(), last);
    server.extra_args = vec!["--dist".into(), ndist.to_str().unwrap().into()];
    server.restart();
    server.wait_online("lap", true, T);
    let cmd = server.detach("lap", &[], &["sleep", "600"]);
    wait_for("the long command to run", T, || {
        (server.command(&cmd)["state"] == "running").then_some(())
    });
    let o = d.byomd(&["upgrade", "--now"]);
    assert!(o.status.success(), "{}", both(&o));
    let c = server.wait_done(&cmd, T);
    assert_eq!(c["state"], "cancelled", "{c}");
    wait_for("the last version on the server", T, || {
        (machine_row(&server, "lap")["version"] == last).then_some(())
    });
    let st = stdout(&d.byomd(&["status"]));
    assert!(st.contains("last upgrade: done"), "{st}");
    d.stop();
}

fn d_pid(d: &Daemon) -> u64 {
    let v: Value = serde_json::from_slice(
        &std::fs::read(byom_daemon::conn::RunStatus::path(&d.config_dir)).unwrap_or_default(),
    )
    .unwrap_or(Value::Null);
    v["pid"].as_u64().unwrap_or(0)
}
