//! The laptop's boundary: every command byomd runs starts inside an OS
//! sandbox its whole process tree cannot leave. The command policy
//! (`policy/`) is a guard against accidents on top; this is the boundary.
//!
//! What an attacker controls: everything the server sends (the command
//! line, its environment, stdin, working directory, timeout, who it says
//! asked and approved) and everything the command then does. What must
//! never happen, whatever the command: byomd's own state (identity, key,
//! policy, secrets, approvals, audit log, pause switch, run files) is read
//! or changed; a file outside the owner's write roots is changed; a
//! `deny_read` path is read; a denied network is reached; a process
//! outlives the command, its timeout or its cancel; another process (byomd,
//! the owner's terminal, a concurrent command) is read, signalled or typed
//! into; the sandbox is widened on the server's word.
//!
//! On Linux ([`linux`]): user, mount, PID, IPC and network namespaces,
//! Landlock and seccomp, applied by a helper byomd re-executes per
//! command. On macOS a generated Seatbelt profile ([`seatbelt`]) states the
//! same rules. Whatever the kernel lacks is reported ([`Level`]), never
//! assumed, and `[sandbox] required = true` refuses to run without it.

#[cfg(unix)]
pub mod check;
#[cfg(unix)]
pub mod host;
pub mod plan;
pub mod seatbelt;

#[cfg(target_os = "linux")]
pub mod linux;
#[cfg(target_os = "linux")]
mod mount;
#[cfg(target_os = "linux")]
pub mod netwatch;
#[cfg(target_os = "linux")]
pub mod probe;
#[cfg(target_os = "linux")]
pub mod seccomp;
#[cfg(windows)]
pub mod windows;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::policy::sandbox::{Net, Origin, SandboxRules};
pub use plan::{Spec, Tmp};

/// What this kernel lets byomd build, found by trying each layer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Support {
    /// byomd runs as root (namespaces work without a user namespace).
    pub root: bool,
    pub user_ns: bool,
    /// Mount and PID namespaces (a private `/proc` needs both).
    pub mount_ns: bool,
    pub pid_ns: bool,
    pub net_ns: bool,
    /// 0: no Landlock.
    pub landlock_abi: u32,
    pub seccomp: bool,
    /// Why layers are missing, as the kernel said.
    pub errors: Vec<String>,
}

#[cfg(test)]
impl Support {
    /// Everything a Linux kernel can offer (for planning tests).
    pub(crate) fn everything() -> Support {
        Support {
            user_ns: true,
            mount_ns: true,
            pid_ns: true,
            net_ns: true,
            landlock_abi: 7,
            seccomp: true,
            ..Default::default()
        }
    }
}

/// The helper's word to byomd, one JSON line on the report pipe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// From the helper's start to the command's exec.
    #[serde(default)]
    pub setup_us: u64,
    /// Set when the sandbox stood but the program could not be started.
    #[serde(default)]
    pub exec_errno: i32,
}

/// How much of the sandbox a command gets here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Level {
    Full,
    /// What is missing, and what that means.
    Partial(Vec<String>),
    /// Why there is none.
    None(String),
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Level::Full => f.write_str("full"),
            Level::Partial(m) => write!(f, "partial ({})", m.join("; ")),
            Level::None(why) => write!(f, "none ({why})"),
        }
    }
}

impl Level {
    pub fn is_full(&self) -> bool {
        matches!(self, Level::Full)
    }
}

impl Support {
    /// The level commands get under `rules`.
    pub fn level(&self, rules: &SandboxRules) -> Level {
        if !rules.enabled {
            return Level::None("sandbox.enabled = false in policy.toml".into());
        }
        if cfg!(windows) {
            return Level::Partial(vec![
                "Windows: a Job Object keeps the process tree (it ends with the command) and away from other windows and the clipboard; files, byomd's own files and the network are not confined; see README".into(),
            ]);
        }
        if !cfg!(target_os = "linux") {
            return Level::None("byomd sandboxes commands on Linux only so far; see README".into());
        }
        if !self.mount_ns && self.landlock_abi == 0 && !self.seccomp {
            return Level::None(format!(
                "this kernel offers no namespaces, Landlock or seccomp to byomd{}",
                self.why()
            ));
        }
        let mut missing = Vec::new();
        if !self.mount_ns {
            missing.push(
                "no mount namespace: byomd's files and sandbox.deny_read are kept out by Landlock alone, sandbox.read_only by granting around it, directories on the way to them can be listed, file modes and times outside the write roots are not confined, and commands share one temp dir folder"
                    .to_string(),
            );
        }
        if !self.pid_ns {
            missing.push("no PID namespace: a command's background processes can outlive it, and it sees other processes (their command lines, secrets substituted into them included)".into());
        }
        if self.landlock_abi == 0 {
            missing.push("no Landlock: writes are not confined to the write roots".into());
        }
        if !self.seccomp {
            missing.push(
                "no seccomp: mount, keyring, TIOCSTI and similar calls are not refused".into(),
            );
        }
        let nets = [
            &rules.network.admin,
            &rules.network.agent,
            &rules.network.untrusted,
        ];
        if nets.iter().any(|n| **n == Net::Deny) && !self.net_ns {
            missing.push(
                "no network namespace: a denied network is denied by refusing IP sockets".into(),
            );
        }
        if (1..3).contains(&self.landlock_abi) {
            missing.push(
                "Landlock below ABI 3: files outside the write roots can still be truncated".into(),
            );
        }
        if (1..5).contains(&self.landlock_abi) {
            missing.push("Landlock below ABI 5: ioctls on devices are not confined".into());
        }
        if (1..6).contains(&self.landlock_abi) {
            missing.push("Landlock below ABI 6: abstract unix sockets (X11's, some agents') and signals outside are not scoped".into());
        }
        if nets.iter().any(|n| matches!(n, Net::Ports(_))) && self.landlock_abi < 4 {
            missing.push("Landlock below ABI 4: port lists deny the network instead".into());
        }
        if missing.is_empty() {
            Level::Full
        } else {
            Level::Partial(missing)
        }
    }

    fn why(&self) -> String {
        if self.errors.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.errors.join("; "))
        }
    }
}

/// `byomd doctor`'s line: whether commands get the whole sandbox here,
/// and if not, what is missing and what to do.
pub fn doctor(rules: &SandboxRules) -> (bool, String) {
    let support = probe(&default_helper());
    let level = support.level(rules);
    let mut detail = level.to_string();
    if !level.is_full() {
        if !support.errors.is_empty() {
            detail.push_str(&format!("; the kernel said: {}", support.errors.join("; ")));
        }
        if rules.enabled && !support.user_ns && !support.root {
            detail.push_str("; user namespaces may be off (sysctl kernel.unprivileged_userns_clone=1, or an AppArmor rule for byomd on Ubuntu 24.04+)");
        }
        if rules.required {
            detail.push_str("; sandbox.required = true, so byomd refuses every command");
        }
    }
    (level.is_full(), detail)
}

/// The helper binary: byomd itself.
pub fn default_helper() -> PathBuf {
    PathBuf::from("/proc/self/exe")
}

/// What this kernel allows, asked of the helper (a separate process: the
/// probe makes namespaces, which a threaded process cannot). A probe that
/// fails reports nothing available.
pub fn probe(helper: &Path) -> Support {
    #[cfg(target_os = "linux")]
    {
        let out = std::process::Command::new(helper)
            .arg(linux::PROBE_ARG)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {
                serde_json::from_slice(&o.stdout).unwrap_or_else(|e| Support {
                    errors: vec![format!("the sandbox probe said something unreadable: {e}")],
                    ..Default::default()
                })
            }
            Ok(o) => Support {
                errors: vec![format!("the sandbox probe failed ({})", o.status)],
                ..Default::default()
            },
            Err(e) => Support {
                errors: vec![format!("cannot run the sandbox probe: {e}")],
                ..Default::default()
            },
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = helper;
        Support::default()
    }
}

/// A command ready to spawn in its sandbox: the helper with the spec on
/// descriptor 3 and the report pipe on 4.
#[cfg(target_os = "linux")]
pub struct Prepared {
    pub cmd: std::process::Command,
    /// Read end of the report pipe.
    pub report: std::os::fd::OwnedFd,
    /// The spec's memfd and the report's write end: dropped once spawned.
    pub keep: Vec<std::os::fd::OwnedFd>,
    /// Held while the command runs: when byomd goes, so does the command.
    pub alive: std::os::fd::OwnedFd,
    /// Read end of the helper's network-use report ([`netwatch`]).
    pub usage: std::os::fd::OwnedFd,
}

#[cfg(target_os = "linux")]
pub fn prepare(helper: &Path, spec: &Spec) -> std::io::Result<Prepared> {
    use std::io::{Seek, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;

    let json = serde_json::to_vec(spec).map_err(std::io::Error::other)?;
    // SAFETY: memfd_create returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"byomd-spec".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is new and ours.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(memfd);
    f.write_all(&json)?;
    f.rewind()?;
    let memfd = OwnedFd::from(f);
    let (report_r, report_w) = pipe()?;
    let (alive_r, alive_w) = pipe()?;
    let (usage_r, usage_w) = pipe()?;
    let mut cmd = std::process::Command::new(helper);
    cmd.arg(linux::HELPER_ARG).env_clear();
    let fds = [
        (memfd.as_raw_fd(), linux::SPEC_FD),
        (report_w.as_raw_fd(), linux::REPORT_FD),
        (alive_r.as_raw_fd(), linux::ALIVE_FD),
        (usage_w.as_raw_fd(), linux::USAGE_FD),
    ];
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // A session of its own: no controlling terminal to type into,
            // and a process group byomd can signal whole.
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Out of the way first (any may already sit on 3 to 6),
            // then into place.
            let mut high = [0; 4];
            for (i, (fd, _)) in fds.iter().enumerate() {
                high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10);
                if high[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, (_, to)) in fds.iter().enumerate() {
                if libc::dup2(high[i], *to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(Prepared {
        cmd,
        report: report_r,
        keep: vec![memfd, report_w, alive_r, usage_w],
        alive: alive_w,
        usage: usage_r,
    })
}

#[cfg(target_os = "linux")]
pub(crate) fn pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Most of the report pipe byomd reads.
pub const MAX_REPORT_BYTES: u64 = 64 * 1024;

/// Reads the helper's report to its end (the command's exec, or the
/// helper's exit); a failure, if any was reported, wins.
#[cfg(target_os = "linux")]
pub fn read_report(fd: std::os::fd::OwnedFd) -> Option<Report> {
    use std::io::Read;
    let mut text = Vec::new();
    let _ = std::fs::File::from(fd)
        .take(MAX_REPORT_BYTES)
        .read_to_end(&mut text);
    parse_report(&text)
}

/// [`read_report`] on the async runtime (no blocking thread per command).
#[cfg(target_os = "linux")]
pub async fn read_report_async(fd: std::os::fd::OwnedFd) -> Option<Report> {
    use tokio::io::AsyncReadExt;
    let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok()?;
    let mut text = Vec::new();
    let _ = rx.take(MAX_REPORT_BYTES).read_to_end(&mut text).await;
    parse_report(&text)
}

#[cfg(target_os = "linux")]
fn parse_report(text: &[u8]) -> Option<Report> {
    let reports: Vec<Report> = String::from_utf8_lossy(text)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    reports.iter().find(|r| !r.ok).or(reports.first()).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated policy file states exactly the built-in defaults.
    #[test]
    fn the_default_policy_file_is_the_default() {
        let p = crate::policy::Policy::parse(
            crate::policy::DEFAULT_POLICY,
            std::path::Path::new("/x/policy.toml"),
        )
        .unwrap();
        assert_eq!(p.file.sandbox, SandboxRules::default());
    }

    #[test]
    fn levels_say_what_is_missing() {
        let rules = SandboxRules::default();
        let full = Support::everything();
        if cfg!(target_os = "linux") {
            assert_eq!(full.level(&rules), Level::Full);
            let mut no_ns = full.clone();
            no_ns.user_ns = false;
            no_ns.mount_ns = false;
            no_ns.pid_ns = false;
            no_ns.net_ns = false;
            let l = no_ns.level(&rules).to_string();
            assert!(l.starts_with("partial (no mount namespace"), "{l}");
            assert!(l.contains("no network namespace"), "{l}");
            assert!(Support::default()
                .level(&rules)
                .to_string()
                .starts_with("none ("));
        }
        let off = SandboxRules {
            enabled: false,
            ..Default::default()
        };
        assert_eq!(
            full.level(&off).to_string(),
            "none (sandbox.enabled = false in policy.toml)"
        );
    }
}
