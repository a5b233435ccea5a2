//! The sandbox helper against the real kernel, without a server: specs
//! built by the same planner the daemon uses, run by the built `byomd`.
//! The end-to-end attacks are in the workspace's tests (sandbox.rs); here
//! are the shapes a daemon cannot be pushed into on this machine (Landlock
//! alone, as on a kernel without user namespaces) and the helper's own
//! contract: exit codes and signals passed through, setup and exec
//! failures reported, never a command run outside what was planned.

#![cfg(target_os = "linux")]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use byom_daemon::sandbox::plan::{build, Context};
use byom_daemon::sandbox::{self, Origin, Report, SandboxRules, Spec, Support};

fn helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_byomd"))
}

struct Run {
    code: Option<i32>,
    signal: Option<i32>,
    out: String,
    report: Option<Report>,
}

fn run(spec: &Spec) -> Run {
    let p = sandbox::prepare(&helper(), spec).unwrap();
    let mut cmd = p.cmd;
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let child = cmd.spawn().unwrap();
    drop(p.keep);
    let _alive = p.alive;
    let report = sandbox::read_report(p.report);
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code(),
        signal: out.status.signal(),
        out: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        report,
    }
}

fn support() -> Support {
    let s = sandbox::probe(&helper());
    assert!(
        s.landlock_abi > 0 && s.seccomp,
        "this test needs Landlock and seccomp: {s:?}"
    );
    s
}

fn sh(spec: &mut Spec, line: &str, cwd: &Path) {
    spec.argv = vec!["sh".into(), "-c".into(), line.into()];
    spec.env = vec!["PATH=/usr/local/bin:/usr/bin:/bin".into()];
    spec.cwd = cwd.to_path_buf();
}

/// The plan for a command in `home/work`, with `~` as the write root and
/// byomd's config dir in `home/.config/byomd`, as the daemon makes it.
fn plan_in(home: &Path, rules: &SandboxRules, support: &Support) -> Result<Spec, String> {
    let roots = vec!["~".to_string()];
    let cwd = home.join("work");
    let config = home.join(".config/byomd");
    build(&Context {
        rules,
        support,
        origin: Origin::Admin,
        home: Some(home.to_path_buf()),
        run_as_home: None,
        uid: 0,
        roots: &roots,
        cwd: &cwd,
        config_dir: &config,
        config_aliases: Vec::new(),
        exe: None,
        tmp: None,
    })
}

/// A home with byomd's config dir and a key inside the write root.
struct Home {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join(".config/byomd")).unwrap();
        std::fs::create_dir_all(root.join(".ssh")).unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        std::fs::write(root.join(".config/byomd/policy.toml"), "mine").unwrap();
        std::fs::write(root.join(".ssh/id"), "KEY").unwrap();
        std::fs::write(root.join(".bashrc"), "rc").unwrap();
        Home { _dir: dir, root }
    }

    fn spec(&self, support: &Support) -> Spec {
        let rules = SandboxRules {
            deny_read: vec!["~/.ssh".into()],
            read_only: vec!["~/.bashrc".into()],
            ..Default::default()
        };
        plan_in(&self.root, &rules, support).unwrap()
    }
}

#[test]
fn landlock_alone_keeps_byomds_files_and_deny_read_out() {
    let mut s = support();
    // As on a kernel without user namespaces, byomd not root.
    s.root = false;
    s.user_ns = false;
    s.mount_ns = false;
    s.pid_ns = false;
    s.net_ns = false;
    let h = Home::new();
    let mut spec = h.spec(&s);
    assert!(!spec.mount_ns && spec.landlock);
    let r = h.root.display();
    sh(
        &mut spec,
        &format!(
            "cat {r}/.config/byomd/policy.toml; echo x > {r}/.config/byomd/policy.toml; \
             cat {r}/.ssh/id; echo y >> {r}/.bashrc; mv {r}/.config {r}/.moved; \
             echo ok > {r}/work/out && cat {r}/work/out; echo z > /var/tmp/byom-ll-$$"
        ),
        &h.root.join("work"),
    );
    let run = run(&spec);
    assert!(
        run.report.as_ref().is_some_and(|r| r.ok),
        "{:?} {}",
        run.report,
        run.out
    );
    assert!(!run.out.contains("mine"), "read the policy: {}", run.out);
    assert!(!run.out.contains("KEY"), "read the key: {}", run.out);
    assert!(
        run.out.contains("ok"),
        "could not write its own dir: {}",
        run.out
    );
    assert_eq!(
        std::fs::read_to_string(h.root.join(".config/byomd/policy.toml")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(h.root.join(".bashrc")).unwrap(),
        "rc"
    );
    assert!(h.root.join(".config").exists());
}

#[test]
fn exit_codes_and_signals_pass_through() {
    let s = support();
    let h = Home::new();
    let mut spec = h.spec(&s);
    sh(&mut spec, "exit 7", &h.root.join("work"));
    assert_eq!(run(&spec).code, Some(7));
    sh(&mut spec, "kill -TERM $$", &h.root.join("work"));
    let r = run(&spec);
    assert_eq!((r.code, r.signal), (None, Some(libc::SIGTERM)), "{}", r.out);
    sh(&mut spec, "echo out; echo err >&2", &h.root.join("work"));
    let r = run(&spec);
    assert_eq!(r.code, Some(0));
    assert!(r.out.contains("out") && r.out.contains("err"), "{}", r.out);
}

#[test]
fn exec_and_setup_failures_are_reported_and_nothing_runs() {
    let s = support();
    let h = Home::new();
    let mut spec = h.spec(&s);
    spec.argv = vec!["no-such-program-byom".into()];
    spec.env = vec!["PATH=/usr/bin:/bin".into()];
    spec.cwd = h.root.join("work");
    let r = run(&spec);
    let rep = r.report.expect("a report");
    assert!(!rep.ok && rep.exec_errno == libc::ENOENT, "{rep:?}");
    assert!(rep.error.contains("cannot start"), "{rep:?}");
    assert_eq!(r.code, Some(127));
    // A layer that cannot be set up stops the command before it runs.
    let marker = h.root.join("work/ran");
    let mut spec = h.spec(&s);
    sh(
        &mut spec,
        &format!("touch {}", marker.display()),
        &h.root.join("work"),
    );
    spec.cwd = h.root.join("missing-dir");
    let r = run(&spec);
    let rep = r.report.expect("a report");
    assert!(
        !rep.ok && rep.error.contains("could not be set up"),
        "{rep:?}"
    );
    assert_eq!(r.code, Some(125));
    assert!(!marker.exists(), "the command ran anyway");
}

#[test]
fn an_empty_command_is_refused() {
    let r = run(&Spec {
        cwd: "/".into(),
        ..Default::default()
    });
    let rep = r.report.expect("a report");
    assert!(!rep.ok && rep.error.contains("empty command"), "{rep:?}");
    assert_eq!(r.code, Some(125));
}

/// What byomd planned is what the helper uses: a component of a planned
/// path swapped for a symlink between the plan and the run (a concurrent
/// command can do that in a write root) stops the command; it never
/// lands on the symlink's target.
#[test]
fn a_planned_path_swapped_for_a_symlink_stops_the_command() {
    let s = support();
    let h = Home::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(outside.path().join("etc")).unwrap();
    std::fs::create_dir_all(h.root.join("work/x/etc")).unwrap();
    let mut spec = h.spec(&s);
    // Planned with the real directory…
    sh(
        &mut spec,
        "echo pwned > planted",
        &h.root.join("work/x/etc"),
    );
    spec.write.push(h.root.join("work/x/etc"));
    // …swapped before the helper runs.
    std::fs::rename(h.root.join("work/x"), h.root.join("work/x.real")).unwrap();
    std::os::unix::fs::symlink(outside.path(), h.root.join("work/x")).unwrap();
    let r = run(&spec);
    let rep = r.report.expect("a report");
    assert!(!rep.ok && rep.error.contains("without symlinks"), "{rep:?}");
    assert!(
        !outside.path().join("etc/planted").exists(),
        "wrote through the swap"
    );
    // A hidden path swapped the same way is refused too, not left open.
    std::fs::remove_file(h.root.join("work/x")).unwrap();
    std::fs::rename(h.root.join("work/x.real"), h.root.join("work/x")).unwrap();
    let mut spec = h.spec(&s);
    sh(&mut spec, "true", &h.root.join("work"));
    let ssh = h.root.join(".ssh");
    assert!(spec.hide.contains(&ssh) || !spec.mount_ns, "{spec:?}");
    if spec.mount_ns {
        std::fs::rename(&ssh, h.root.join(".ssh.real")).unwrap();
        std::os::unix::fs::symlink(h.root.join("work"), &ssh).unwrap();
        let r = run(&spec);
        assert!(!r.report.expect("a report").ok);
    }
}

/// Dotfile managers make ~/.config, ~/.profile and ~/.ssh symlinks: the
/// protection on their targets must not be undone by replacing the links
/// (a fake config dir with the owner's policy rewritten, a login file, an
/// ssh config).
#[test]
fn symlinks_on_the_way_to_what_is_protected_cannot_be_replaced() {
    let s = support();
    let dir = tempfile::tempdir().unwrap();
    let home = std::fs::canonicalize(dir.path()).unwrap();
    for d in ["dot/config/byomd", "dot/ssh", "work"] {
        std::fs::create_dir_all(home.join(d)).unwrap();
    }
    std::fs::write(home.join("dot/config/byomd/policy.toml"), "mine").unwrap();
    std::fs::write(home.join("dot/profile"), "# login").unwrap();
    std::fs::write(home.join("dot/ssh/id"), "KEY").unwrap();
    std::os::unix::fs::symlink("dot/config", home.join(".config")).unwrap();
    std::os::unix::fs::symlink(home.join("dot/profile"), home.join(".profile")).unwrap();
    std::os::unix::fs::symlink("dot/ssh", home.join(".ssh")).unwrap();
    let rules = SandboxRules {
        deny_read: vec!["~/.ssh".into()],
        read_only: vec!["~/.profile".into()],
        ..Default::default()
    };
    let cwd = home.join("work");
    let mut spec = plan_in(&home, &rules, &s).unwrap();
    let h = home.display();
    sh(
        &mut spec,
        &format!(
            "rm -f {h}/.config {h}/.profile {h}/.ssh; mv {h}/.config {h}/c2; \
             mkdir -p {h}/.config/byomd && echo evil > {h}/.config/byomd/policy.toml; \
             echo evil > {h}/.profile; echo ok > {h}/work/out; cat {h}/work/out"
        ),
        &cwd,
    );
    let r = run(&spec);
    assert!(
        r.report.as_ref().is_some_and(|r| r.ok),
        "{:?} {}",
        r.report,
        r.out
    );
    assert!(
        r.out.contains("ok"),
        "the rest of the home stays writable: {}",
        r.out
    );
    for link in [".config", ".profile", ".ssh"] {
        let m = std::fs::symlink_metadata(home.join(link)).unwrap();
        assert!(m.file_type().is_symlink(), "{link} was replaced: {}", r.out);
    }
    assert_eq!(
        std::fs::read_to_string(home.join("dot/config/byomd/policy.toml")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(home.join("dot/profile")).unwrap(),
        "# login"
    );
}

/// Only what byomd hands over reaches the command: not descriptors byomd
/// inherited from whatever started it (a socket would get past every
/// network rule), and no capabilities beyond the ordinary ones, however
/// byomd was started.
#[test]
fn inherited_descriptors_and_extra_capabilities_stay_out() {
    use std::os::unix::process::CommandExt;
    let s = support();
    let h = Home::new();
    let mut spec = h.spec(&s);
    sh(
        &mut spec,
        "ls /proc/self/fd; grep -E '^Cap(Inh|Bnd|Amb)' /proc/self/status",
        &h.root.join("work"),
    );
    let p = sandbox::prepare(&helper(), &spec).unwrap();
    let mut cmd = p.cmd;
    let (r, w) = std::io::pipe().unwrap();
    let w_fd = std::os::fd::AsRawFd::as_raw_fd(&w);
    // SAFETY: dup2 only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // A descriptor byomd holds without close-on-exec, at 20.
            if libc::dup2(w_fd, 20) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    drop(p.keep);
    let _alive = p.alive;
    let _ = sandbox::read_report(p.report);
    let out = child.wait_with_output().unwrap();
    drop((r, w));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let fds: Vec<&str> = text.lines().take_while(|l| !l.starts_with("Cap")).collect();
    assert!(
        !fds.contains(&"20"),
        "an inherited descriptor reached the command: {text}"
    );
    assert!(text.contains("CapInh:\t0000000000000000"), "{text}");
    assert!(text.contains("CapAmb:\t0000000000000000"), "{text}");
    if unsafe { libc::geteuid() } == 0 {
        // chown, dac_override, kill, setgid, setuid, ipc_lock, sys_nice,
        // audit_write.
        assert!(text.contains("CapBnd:\t00000000208040e3"), "{text}");
    }
}
