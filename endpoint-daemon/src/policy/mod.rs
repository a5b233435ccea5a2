//! The machine owner's local policy: a TOML file in the daemon's config dir
//! that says what the cloud may run here. The server can neither read its
//! rules' effects away nor change it: nothing the server sends touches this
//! file, and every command passes [`Policy::check`] before it starts;
//! `byomd policy check` calls the same function.
//!
//! Rules judge parsed commands, not text ([`analysis`]): every program a
//! command would start, through shells, substitutions and wrappers. Programs
//! denied or allowed by name (an allow-list checks the resolved file),
//! command patterns on parsed argv (`git push`, `rm -rf /`), working-directory
//! roots, environment variables scrubbed, what agents' commands may do,
//! per-secret restrictions, the user commands run as, a maximum runtime and
//! concurrency. What cannot be known before a command runs (a program name
//! built from a variable, `eval` of one, a script piped into `sh`) counts as
//! a match of the strictest rule in force.
//!
//! A policy that does not parse stops `byomd run` from starting (and a bad
//! edit while running keeps the previous policy): an unreadable policy must
//! never mean "anything goes".

pub mod analysis;
mod check;
pub mod paths;
pub mod rules;
pub mod sandbox;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub use rules::glob;
use rules::Pattern;

pub const POLICY_FILE: &str = "policy.toml";

/// Written by `byomd pair` when no policy exists: safe but useful.
pub const DEFAULT_POLICY: &str = r#"# byomd local policy. The byom server cannot change this file: it is yours.
# byomd re-reads it when it changes. `byomd policy show` prints the effective
# policy; `byomd policy check -- CMD ARGS` (or --sh 'LINE') explains what
# would happen to a command, exactly as byomd would decide it.
#
# Rules look at commands as a shell runs them: quotes and escapes removed,
# every program of a line (`a; b && c | d $(e)`, functions, traps), through
# shells (`sh -c`, `eval`, a here-document fed to `sh`), git's aliases and
# configuration, and programs that run their arguments (`env`, `nice`,
# `timeout`, `xargs`, `find -exec`, `busybox APPLET`, `sudo`, `su -c`,
# `flock`, `chroot`, `strace`, `npx`, …). What is only known when the command
# runs counts as matching the strictest rule: denied while any deny or allow
# rule exists here, else it waits for your approval. That is: a program name
# built from a variable (`$x`, `$(…)`, `eval "$y"`), a script read from a pipe
# or a process substitution (`… | sh`, `source <(…)`, `sh /dev/stdin`), a
# variable that makes a shell, the loader or git run other code (BASH_ENV,
# LD_PRELOAD, GIT_CONFIG_*), and for `deny_patterns` and `confirm` an operand
# or subcommand only known then (`rm -rf "$X"`, `rm -rf *` after `cd`, a git
# alias).
#
# A deny list is a guard against accidents, not a security boundary: an
# interpreter (`python3 -c`, `perl -e`, `node -e`), a copy or a symlink of a
# binary under another name, or a program's own way of running others
# (git aliases, make, ssh) gets past any list of names. For a boundary, use
# the allow-list below (checked on the resolved file, not the name),
# `[agents] commands = "confirm"`, and `[run] user` (an unprivileged user).

[commands]
# Allow-list mode: when not empty, only these programs run (names found on
# byomd's PATH, or absolute paths), each checked on the file it resolves to,
# so a copy or symlink named like an allowed program does not pass. Shell
# builtins such as cd, echo and test need no entry. In this mode these are
# unknown too (so denied): a sourced file (`. FILE`), a variable that changes
# which file a name runs or what it loads (PATH, LD_LIBRARY_PATH, IFS,
# NODE_OPTIONS, PYTHONPATH, …), a git subcommand that may be an alias, and a
# line that may write the file it then runs (`cp x ~/bin/tool; tool`).
allow = []
# Programs that never run, by name (glob), wherever they appear in a command.
deny = ["sudo", "su", "doas", "pkexec", "passwd", "visudo", "chsh", "shutdown", "reboot"]
# Commands that never run, written as you would type them and matched on the
# parsed command: the program (glob), its flags in any order or spelling
# (`-rf` matches `-r -f`, `-fr`, `--recursive --force`), and words it must be
# given (`/` also matches `//` and `/.`; `/*` any top-level directory;
# `{root}` each of dirs.roots). For git and cargo the first word is the
# subcommand after their global options (`git -C dir push` is `git push`).
deny_patterns = ["rm -rf /", "rm -rf /*", "rm -rf ~", "rm -rf {root}", "mkfs*", "dd of=/dev/sd*", "dd of=/dev/nvme*", "dd of=/dev/mmcblk*"]
# Commands (same patterns) that wait for you: they start only after
# `byomd approve ID` on this machine (`byomd pending` lists them).
confirm = ["git push", "npm publish", "cargo publish"]

[agents]
# Commands the agents send (not the ones you run with `byom exec`):
# "allow" (subject to the rules above), "confirm" (each waits for
# `byomd approve`), or "deny".
commands = "allow"
# Commands from an agent task that read text from someone the server does
# not trust (a stranger's GitHub comment, a guest in a chat room): "deny",
# "confirm" (each waits for `byomd approve`, unless a person the server
# names approved it there, or it runs only read_only programs), or "allow".
# The server says which tasks are untrusted and who approved: a server
# that is compromised could lie about both. If that is in your threat
# model, set commands = "confirm" above, which trusts nothing it is told.
untrusted = "confirm"
# Programs you declare read-only (a program, or a program and its first
# words: "git status"): commands of only these need no approval for
# untrusted tasks, and their output may be posted where the task came from.
# List only programs whose output you would show anyone.
read_only = []

[dirs]
# Commands run in, and may only be started in, a directory under one of these.
# "~" is your home directory. Commands without a directory start in the first.
roots = ["~", "/tmp"]

[env]
# Environment variables removed before a command starts (glob on the name).
scrub = ["*_TOKEN", "*_SECRET", "*_SECRET_*", "*_PASSWORD", "*_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]

[run]
# Run commands as this local user instead of byomd's own (byomd must then
# run as root). An unprivileged user is a real boundary: a command can do
# no more than that user can. dirs.roots must be directories it can enter.
# user = "byom-runner"

[terminal]
# Who may open a terminal here (`byom exec -t`, `byom shell`): "admins"
# (people with the server's admin certificate, never an agent) or "none".
# A terminal's shell runs what is typed, which no rule above can judge
# before; it runs in the same sandbox as any command, and is audited. The
# server says who is an admin: if a server that lies is in your threat
# model, set "none". A policy without this section has no terminals.
allow = "admins"

[limits]
# Longest a command may run, whatever timeout the server asks for.
max_runtime = "2h"
# Commands running at once.
max_concurrency = 8

[upgrade]
# Install the byomd your server ships as soon as it is newer and no command
# is running: checked against the manifest the server's CA signed, tried
# before it replaces this one, rolled back if it does not reconnect.
# `byomd upgrade` does the same by hand. A new byomd enforces this file, so
# whoever runs the server could ship one that does not: turn this on only if
# you trust them as much as the binary you run now.
auto_upgrade = false

[sandbox]
# Every command (an agent's or an admin's) runs in an OS sandbox that it and
# everything it starts cannot leave: the boundary beneath the guard above.
# byomd's own files (this file, its identity and key, secrets, approvals,
# the audit log, the pause switch) are out of every command's reach; a
# command's background processes end with it. `byomd sandbox check -- CMD`
# shows what a command may touch; `byomd doctor` whether this kernel gives
# the whole sandbox. The server cannot widen any of this.
enabled = true
# Refuse to run commands when the kernel cannot give the whole sandbox.
required = false
# Where commands may write. Unset (the default): dirs.roots, the command's
# working directory and a private temp dir ($TMPDIR). Write {roots} and
# {cwd} to keep those and add more, e.g. ["{roots}", "{cwd}", "/srv/data"].
# write = ["{roots}", "{cwd}"]
# Paths no command may read (nor write), whatever the write roots say: a
# list you set replaces this one, so keep what you want of it. {runtime} is
# your runtime dir (/run/user/UID): the session bus, through which
# `systemd-run --user` would start programs outside any sandbox, and the
# keyring and agent sockets. Any program that runs what whoever reaches
# its socket asks (tmux, screen, an editor's server, a container engine)
# is a way out of the sandbox: the list hides the common ones; add yours.
# A * in the last part matches names there.
deny_read = ["~/.ssh", "~/.gnupg", "~/.aws", "~/.azure", "~/.config/gcloud", "~/.kube", "~/.docker", "~/.netrc", "~/.git-credentials", "~/.config/gh", "~/.password-store", "~/.local/share/keyrings", "~/Library/Keychains", "~/.mozilla", "~/.config/google-chrome", "~/.config/chromium", "~/.config/BraveSoftware", "~/Library/Application Support/Google/Chrome", "~/Library/Application Support/Firefox", "~/snap/firefox", "{runtime}", "/run/user", "/run/dbus", "/run/systemd/private", "/tmp/tmux-*", "/tmp/vscode-*", "/tmp/kitty-*", "/tmp/nvim*", "~/.config/byomd*", "~/.cache/git/credential", "~/.colima", "~/.lima", "~/.rd", "/run/screen", "/tmp/screens", "/tmp/emacs*", "/tmp/.X11-unix", "/tmp/.ICE-unix", "/tmp/ssh-*", "/run/docker.sock", "/var/run/docker.sock", "/run/containerd", "/run/podman", "/run/libvirt", "/run/snapd.socket", "/run/snapd-snap.socket", "/var/snap/lxd/common/lxd"]
# Paths commands may read but not change even under a write root: files
# that run programs outside the sandbox later (shell startup files, user
# services, git's configuration). byomd's own binary always is. A file
# that does not exist yet cannot be protected this way.
read_only = ["~/.bashrc", "~/.bash_aliases", "~/.bash_profile", "~/.bash_login", "~/.bash_logout", "~/.profile", "~/.zshrc", "~/.zshenv", "~/.zprofile", "~/.zlogin", "~/.config/fish", "~/.pam_environment", "~/.xprofile", "~/.xsession", "~/.xinitrc", "~/.config/autostart", "~/.config/environment.d", "~/.config/systemd", "~/.local/share/systemd", "~/Library/LaunchAgents", "~/.local/share/applications", "~/.gitconfig", "~/.config/git"]

[sandbox.network]
# Per origin: "allow", "deny" (a loopback of its own, nothing else), or a
# list of TCP ports it may connect to, e.g. [443, 22] (UDP is not limited).
# admin: `byom exec`; agent: agent tasks; untrusted: agent tasks that read
# text from someone the server does not trust.
admin = "allow"
agent = "allow"
untrusted = "deny"
"#;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CommandRules {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub deny_patterns: Vec<String>,
    /// Command patterns that wait for the owner's `byomd approve ID`.
    pub confirm: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DirRules {
    pub roots: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvRules {
    pub scrub: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitRules {
    pub max_runtime: Option<String>,
    pub max_concurrency: Option<usize>,
}

/// What happens to agents' commands from tasks that read untrusted text.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum UntrustedCommands {
    Allow,
    #[default]
    Confirm,
    Deny,
}

/// What happens to commands the agents send.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AgentCommands {
    #[default]
    Allow,
    Confirm,
    Deny,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AgentRules {
    pub commands: AgentCommands,
    pub untrusted: UntrustedCommands,
    /// Programs (with their first words) that only read.
    pub read_only: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunRules {
    pub user: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyFile {
    pub commands: CommandRules,
    pub agents: AgentRules,
    pub dirs: DirRules,
    pub env: EnvRules,
    pub run: RunRules,
    pub limits: LimitRules,
    pub upgrade: UpgradeRules,
    pub sandbox: sandbox::SandboxRules,
    pub terminal: TerminalRules,
}

/// `[terminal]`: who may open a terminal on this machine.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TerminalRules {
    pub allow: TerminalAllow,
}

/// Off unless the owner's file says otherwise: a policy written before
/// terminals existed (no `[terminal]`) does not gain them on upgrade.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TerminalAllow {
    /// People with the server's admin certificate; never an agent.
    Admins,
    #[default]
    None,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpgradeRules {
    pub auto_upgrade: bool,
}

/// The local user commands run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// One command to judge, as the server sent it.
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    pub argv: &'a [String],
    pub shell: &'a str,
    pub cwd: &'a str,
    pub env: Option<&'a HashMap<String, String>>,
    pub stdin: &'a [u8],
    pub timeout: Option<Duration>,
    /// A worker ID (`wrk_…`) when an agent sent it.
    pub requested_by: &'a str,
    /// Why the server says the agent task is untrusted (empty: it is not).
    pub taint: &'a str,
    /// Who the server says approved it anyway.
    pub approved_by: &'a str,
    /// A terminal's login shell, which byomd itself named (never the
    /// server): what a person types into it cannot be judged before, so
    /// the `[terminal]` grant decides instead, and only that it reads its
    /// input is let through.
    pub login_shell: bool,
}

impl Request<'_> {
    pub fn from_agent(&self) -> bool {
        self.requested_by.starts_with("wrk_")
    }

    /// The secrets the command uses by handle.
    fn secrets(&self) -> std::collections::BTreeSet<String> {
        let mut texts: Vec<&str> = self.argv.iter().map(String::as_str).collect();
        texts.push(self.shell);
        if let Some(env) = self.env {
            texts.extend(env.values().map(String::as_str));
        }
        let stdin = String::from_utf8_lossy(self.stdin);
        texts.push(&stdin);
        texts
            .into_iter()
            .flat_map(crate::secrets::handles)
            .map(|(_, name)| name.to_string())
            .collect()
    }
}

/// What the policy says about one command.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Run it, in `cwd`, with `timeout` (the smaller of the request's and
    /// the policy's), without the `scrubbed` environment variables, as
    /// `run_as` if set; if `confirm` names a rule, only after the owner
    /// approves it locally.
    Allow {
        cwd: PathBuf,
        timeout: Option<Duration>,
        scrub: Vec<String>,
        confirm: Option<String>,
        run_as: Option<RunAs>,
    },
    /// Never run it; `rule` names the rule that said no.
    Deny { rule: String },
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub file: PolicyFile,
    /// SHA-256 (hex) of the policy file's bytes ("builtin" digest if none).
    pub digest: String,
    pub path: PathBuf,
    max_runtime: Option<Duration>,
    deny_patterns: Vec<Pattern>,
    confirm: Vec<Pattern>,
    run_as: Option<RunAs>,
    mtime: Option<SystemTime>,
    /// The daemon's own variables that `[env] scrub` names: its
    /// environment does not change while it runs, so they are found once
    /// per policy, not per command.
    own_scrub: Vec<String>,
}

/// The variable names among `names` that a `[env] scrub` pattern matches,
/// sorted.
fn scrubbed(patterns: &[String], names: impl Iterator<Item = OsString>) -> Vec<String> {
    let mut out: Vec<String> = names
        .filter_map(|k| k.into_string().ok())
        .filter(|k| patterns.iter().any(|p| glob(p, k)))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// A password-database entry as (uid, gid, home), from `getpwnam_r` or
/// `getpwuid_r` (given as `call`, filling the struct and buffer it is
/// handed).
#[cfg(unix)]
pub(crate) fn passwd_entry(
    call: impl FnOnce(
        *mut libc::passwd,
        *mut libc::c_char,
        usize,
        *mut *mut libc::passwd,
    ) -> libc::c_int,
) -> Option<(u32, u32, PathBuf)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: zeroed is a valid passwd to be filled.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = call(&mut pw, buf.as_mut_ptr(), buf.len(), &mut result);
    if rc != 0 || result.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: pw_dir points into buf, NUL-terminated, alive here.
    let dir = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
    Some((
        pw.pw_uid,
        pw.pw_gid,
        PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes())),
    ))
}

/// Looks a local user up (name → uid, gid, home).
#[cfg(unix)]
fn lookup_user(name: &str) -> Result<RunAs, String> {
    let cname = std::ffi::CString::new(name).map_err(|_| format!("bad user name {name:?}"))?;
    // SAFETY: getpwnam_r writes into the struct and buffer it is given only.
    let (uid, gid, home) = passwd_entry(|pw, buf, len, result| unsafe {
        libc::getpwnam_r(cname.as_ptr(), pw, buf, len, result)
    })
    .ok_or_else(|| format!("no local user {name:?}"))?;
    Ok(RunAs {
        user: name.to_string(),
        uid,
        gid,
        home,
    })
}

#[cfg(not(unix))]
fn lookup_user(name: &str) -> Result<RunAs, String> {
    Err(format!("run.user ({name}) is supported on Unix only"))
}

impl Policy {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(POLICY_FILE)
    }

    /// Writes the default policy if there is none (at pairing).
    pub fn write_default(dir: &Path) -> anyhow::Result<()> {
        let p = Self::path(dir);
        if !p.exists() {
            byom_wire::write_atomic(&p, DEFAULT_POLICY.as_bytes(), 0o644)
                .with_context(|| format!("cannot write {}", p.display()))?;
        }
        Ok(())
    }

    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Policy> {
        let at = path.display();
        let file: PolicyFile =
            toml::from_str(text).with_context(|| format!("{at} is not a valid policy"))?;
        let max_runtime = match &file.limits.max_runtime {
            Some(s) => Some(humantime::parse_duration(s).with_context(|| {
                format!("{at}: bad limits.max_runtime {s:?} (use e.g. \"2h\")")
            })?),
            None => None,
        };
        if file.limits.max_concurrency == Some(0) {
            anyhow::bail!("{at}: limits.max_concurrency must be at least 1");
        }
        let patterns = |list: &[String], key: &str| -> anyhow::Result<Vec<Pattern>> {
            list.iter()
                .map(|p| Pattern::parse(p).map_err(|e| anyhow::anyhow!("{at}: {key} {p:?}: {e}")))
                .collect()
        };
        let deny_patterns = patterns(&file.commands.deny_patterns, "commands.deny_patterns")?;
        let confirm = patterns(&file.commands.confirm, "commands.confirm")?;
        let run_as = match &file.run.user {
            None => None,
            Some(u) => {
                let r = lookup_user(u).map_err(|e| anyhow::anyhow!("{at}: run.user: {e}"))?;
                #[cfg(unix)]
                {
                    // SAFETY: geteuid has no preconditions.
                    let me = unsafe { libc::geteuid() };
                    if me != 0 && me != r.uid {
                        anyhow::bail!(
                            "{at}: run.user = {u:?} needs byomd to run as root (it runs as uid {me})"
                        );
                    }
                }
                Some(r)
            }
        };
        file.sandbox
            .validate()
            .map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
        let own_scrub = scrubbed(&file.env.scrub, std::env::vars_os().map(|(k, _)| k));
        Ok(Policy {
            own_scrub,
            digest: byom_wire::hex(&byom_wire::sha256(text.as_bytes())),
            file,
            path: path.to_path_buf(),
            max_runtime,
            deny_patterns,
            confirm,
            run_as,
            mtime: None,
        })
    }

    /// Loads `<dir>/policy.toml`; with no file, the built-in default.
    pub fn load(dir: &Path) -> anyhow::Result<Policy> {
        let path = Self::path(dir);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let mut p = Self::parse(&text, &path)?;
                p.mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
                Ok(p)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Self::parse(DEFAULT_POLICY, &path)
            }
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Re-reads the file if it changed. A broken edit keeps the old policy
    /// and returns the error to log.
    pub fn reload_if_changed(&mut self) -> Option<anyhow::Error> {
        let mtime = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if mtime == self.mtime {
            return None;
        }
        let dir = self
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        match Self::load(&dir) {
            Ok(p) => {
                *self = p;
                tracing::info!(digest = %self.digest, "policy reloaded");
                None
            }
            Err(e) => {
                self.mtime = mtime;
                Some(e)
            }
        }
    }

    pub fn auto_upgrade(&self) -> bool {
        self.file.upgrade.auto_upgrade
    }

    pub fn max_concurrency(&self) -> Option<usize> {
        self.file.limits.max_concurrency
    }

    /// Whether `requested_by` may have a terminal here; Err: why not.
    pub fn terminal(&self, requested_by: &str) -> Result<(), String> {
        let file = self.path.display();
        match self.file.terminal.allow {
            TerminalAllow::None => Err(format!(
                "terminals are off on this machine ([terminal] allow = \"none\" in {file})"
            )),
            // Only a person's certificate says admin: anything else (an
            // agent's worker, an unknown name) is refused.
            TerminalAllow::Admins if requested_by.starts_with("admin:") => Ok(()),
            TerminalAllow::Admins => Err(format!(
                "only admins may open a terminal on this machine ([terminal] allow = \"admins\" in {file}); {requested_by} is not one"
            )),
        }
    }

    /// One line for Hello and `byom machines show`.
    pub fn summary(&self) -> String {
        let c = &self.file.commands;
        let mut parts = Vec::new();
        if !c.allow.is_empty() {
            parts.push(format!("allow only {}", c.allow.join(",")));
        }
        if !c.deny.is_empty() {
            parts.push(format!("deny {}", c.deny.join(",")));
        }
        if !c.deny_patterns.is_empty() {
            parts.push(format!("{} denied patterns", c.deny_patterns.len()));
        }
        match self.file.agents.commands {
            AgentCommands::Allow => {}
            AgentCommands::Confirm => parts.push("agents' commands need local approval".into()),
            AgentCommands::Deny => parts.push("agents' commands denied".into()),
        }
        match self.file.agents.untrusted {
            UntrustedCommands::Allow => parts.push("untrusted tasks' commands allowed".into()),
            UntrustedCommands::Confirm => {}
            UntrustedCommands::Deny => parts.push("untrusted tasks' commands denied".into()),
        }
        if let Some(u) = &self.file.run.user {
            parts.push(format!("runs as {u}"));
        }
        if !self.file.dirs.roots.is_empty() {
            parts.push(format!("dirs {}", self.file.dirs.roots.join(",")));
        }
        if let Some(r) = &self.file.limits.max_runtime {
            parts.push(format!("max runtime {r}"));
        }
        if let Some(n) = self.file.limits.max_concurrency {
            parts.push(format!("max {n} at once"));
        }
        if !c.confirm.is_empty() {
            parts.push(format!("{} patterns need local approval", c.confirm.len()));
        }
        parts.push(self.file.sandbox.summary());
        let mut s = parts.join("; ");
        s.truncate(200);
        s
    }

    fn config_dir(&self) -> Option<&Path> {
        self.path.parent()
    }

    /// Programs declared read-only, as the server is told (it needs no
    /// approval for untrusted tasks' commands made only of these).
    pub fn read_only(&self) -> Vec<String> {
        self.file.agents.read_only.clone()
    }

    /// The `[env] scrub` patterns (told to the server for the CLI's
    /// warnings).
    pub fn env_scrub(&self) -> Vec<String> {
        self.file.env.scrub.clone()
    }
}

#[cfg(test)]
mod tests;
