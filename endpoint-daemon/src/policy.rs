//! The machine owner's local policy: a TOML file in the daemon's config dir
//! that says what the cloud may run here. The server can neither read its
//! rules' effects away nor change it: nothing the server sends touches this
//! file, and every command passes [`Policy::check`] before it starts.
//!
//! Rules: programs allowed/denied (the first word of each simple command,
//! shell lines included), glob patterns over the full command line
//! (`deny_patterns`), working-directory roots, environment variables
//! scrubbed before exec, a maximum runtime and a maximum concurrency.
//!
//! A policy that does not parse stops `byomd run` from starting (and a bad
//! edit while running keeps the previous policy): an unreadable policy must
//! never mean "anything goes".

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub const POLICY_FILE: &str = "policy.toml";

/// Written by `byomd pair` when no policy exists: safe but useful.
pub const DEFAULT_POLICY: &str = r#"# byomd local policy. The byom server cannot change this file: it is yours.
# byomd re-reads it when it changes. `byomd policy show` prints the effective
# policy; `byomd policy check -- CMD ARGS` explains what would happen to CMD.

[commands]
# Programs that may run; empty means any program not denied below.
allow = []
# Programs that never run (matched against the first word of every simple
# command, so `sh -c 'ls; sudo x'` is denied too).
deny = ["sudo", "su", "doas", "pkexec", "passwd", "visudo", "chsh", "shutdown", "reboot"]
# Full command lines that never run. Glob: * is any text, ? one character.
deny_patterns = ["*rm -rf /", "*rm -rf / *", "*rm -rf /[*]*", "*rm -rf ~", "*rm -rf ~/", "*mkfs*", "*of=/dev/sd*", "*of=/dev/nvme*"]
# Programs or command lines that wait for you: they start only after
# `byomd approve ID` on this machine (`byomd pending` lists them).
confirm = ["git push*", "*git push *", "npm publish*", "cargo publish*"]

[dirs]
# Commands run in, and may only be started in, a directory under one of these.
# "~" is your home directory. Commands without a directory start in the first.
roots = ["~", "/tmp"]

[env]
# Environment variables removed before a command starts (glob on the name).
scrub = ["*_TOKEN", "*_SECRET", "*_SECRET_*", "*_PASSWORD", "*_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]

[limits]
# Longest a command may run, whatever timeout the server asks for.
max_runtime = "2h"
# Commands running at once.
max_concurrency = 8
"#;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CommandRules {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub deny_patterns: Vec<String>,
    /// Programs or full command lines (globs) that wait for the owner's
    /// `byomd approve ID` before they start.
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

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyFile {
    pub commands: CommandRules,
    pub dirs: DirRules,
    pub env: EnvRules,
    pub limits: LimitRules,
}

/// What the policy says about one command.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Run it, in `cwd`, with `timeout` (the smaller of the request's and
    /// the policy's), without the `scrubbed` environment variables; if
    /// `confirm` names a rule, only after the owner approves it locally.
    Allow {
        cwd: PathBuf,
        timeout: Option<Duration>,
        scrub: Vec<String>,
        confirm: Option<String>,
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
    mtime: Option<SystemTime>,
}

/// Matches `text` against a glob (`*` any run of characters, `?` one,
/// `[…]` taken literally). Iterative, so hostile patterns stay linear-ish.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.replace("[*]", "\u{1}").chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti] || (p[pi] == '\u{1}' && t[ti] == '*')) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "fish", "ash", "busybox"];
const WRAPPERS: &[&str] = &[
    "env", "nohup", "nice", "time", "exec", "command", "builtin", "xargs", "timeout", "stdbuf",
    "setsid", "ionice", "chrt", "taskset", "then", "do", "else", "!",
];

fn base(w: &str) -> String {
    let w = w.trim_matches(|c| c == '"' || c == '\'' || c == '(' || c == ')');
    w.rsplit('/').next().unwrap_or(w).to_string()
}

/// The script of `sh -c SCRIPT` (also `-ec`, `-lc`, …), if argv is one.
fn shell_script(argv: &[String]) -> Option<&str> {
    let first = base(argv.first()?);
    if !SHELLS.contains(&first.as_str()) {
        return None;
    }
    let i = argv
        .iter()
        .position(|a| a.starts_with('-') && !a.starts_with("--") && a.contains('c'))?;
    argv.get(i + 1).map(String::as_str)
}

/// Program names a command would start, in command position: argv[0] (and
/// what wrappers such as `env`/`nohup` start), or the first word of every
/// simple command in a shell line, without `VAR=value` assignments.
pub fn programs(argv: &[String], shell: &str) -> Vec<String> {
    if shell.is_empty() {
        let mut out = Vec::new();
        let mut i = 0;
        while i < argv.len() {
            let b = base(&argv[i]);
            let wrapper = WRAPPERS.contains(&b.as_str());
            out.push(b);
            if !wrapper {
                break;
            }
            // Skip the wrapper's options, numbers and assignments.
            i += 1;
            while i < argv.len()
                && (argv[i].starts_with('-')
                    || argv[i].contains('=')
                    || argv[i].parse::<f64>().is_ok())
            {
                i += 1;
            }
        }
        if let Some(script) = shell_script(argv) {
            out.extend(programs(&[], script));
        }
        return out;
    }
    let mut out = Vec::new();
    for seg in shell.split([';', '&', '|', '(', ')', '\n', '`', '{', '}']) {
        let seg = seg.trim_start_matches('$');
        let mut words = seg
            .split_whitespace()
            .skip_while(|w| w.contains('=') && !w.starts_with('='));
        let mut w = words.next();
        while let Some(x) = w {
            if WRAPPERS.contains(&base(x).as_str()) {
                out.push(base(x));
                w = words.next();
            } else {
                break;
            }
        }
        if let Some(x) = w {
            let b = base(x);
            if !b.is_empty() {
                out.push(b);
            }
        }
    }
    out
}

/// Words the deny list is checked against: every program in command
/// position, and, for shell lines and `sh -c` scripts, every word at all.
/// Deny errs on the side of no: `echo sudo` in a shell line is denied too.
pub fn deny_candidates(argv: &[String], shell: &str) -> Vec<String> {
    let mut out = programs(argv, shell);
    let script = if shell.is_empty() {
        shell_script(argv)
    } else {
        Some(shell)
    };
    if let Some(s) = script {
        out.extend(
            s.split(|c: char| {
                c.is_whitespace()
                    || matches!(
                        c,
                        ';' | '&' | '|' | '(' | ')' | '`' | '{' | '}' | '$' | '<' | '>'
                    )
            })
            .map(base)
            .filter(|w| !w.is_empty()),
        );
    }
    out.sort();
    out.dedup();
    out
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

fn expand(p: &str) -> Option<PathBuf> {
    if p == "~" {
        return home();
    }
    if let Some(rest) = p.strip_prefix("~/") {
        return home().map(|h| h.join(rest));
    }
    Some(PathBuf::from(p))
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
        let file: PolicyFile = toml::from_str(text)
            .with_context(|| format!("{} is not a valid policy", path.display()))?;
        let max_runtime = match &file.limits.max_runtime {
            Some(s) => Some(humantime::parse_duration(s).with_context(|| {
                format!(
                    "{}: bad limits.max_runtime {s:?} (use e.g. \"2h\")",
                    path.display()
                )
            })?),
            None => None,
        };
        if file.limits.max_concurrency == Some(0) {
            anyhow::bail!(
                "{}: limits.max_concurrency must be at least 1",
                path.display()
            );
        }
        Ok(Policy {
            digest: byom_wire::hex(&byom_wire::sha256(text.as_bytes())),
            file,
            path: path.to_path_buf(),
            max_runtime,
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

    pub fn max_concurrency(&self) -> Option<usize> {
        self.file.limits.max_concurrency
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
        let mut s = parts.join("; ");
        s.truncate(200);
        s
    }

    /// Decides about one command. Pure apart from resolving the directory.
    pub fn check(
        &self,
        argv: &[String],
        shell: &str,
        cwd: &str,
        env: &std::collections::HashMap<String, String>,
        timeout: Option<Duration>,
    ) -> Result<Decision, String> {
        let file = self.path.display();
        let line = if shell.is_empty() {
            argv.join(" ")
        } else {
            shell.to_string()
        };
        let progs = programs(argv, shell);
        let c = &self.file.commands;
        for p in deny_candidates(argv, shell) {
            if let Some(d) = c.deny.iter().find(|d| glob(d, &p)) {
                return Ok(Decision::Deny {
                    rule: format!("commands.deny {d:?} matches {p:?} ({file})"),
                });
            }
        }
        for p in &progs {
            if !c.allow.is_empty() && !c.allow.iter().any(|a| glob(a, p)) {
                return Ok(Decision::Deny {
                    rule: format!("program {p:?} is not in commands.allow ({file})"),
                });
            }
        }
        if let Some(pat) = c.deny_patterns.iter().find(|pat| glob(pat, &line)) {
            return Ok(Decision::Deny {
                rule: format!("commands.deny_patterns {pat:?} matches the command line ({file})"),
            });
        }
        let roots: Vec<PathBuf> = self
            .file
            .dirs
            .roots
            .iter()
            .filter_map(|r| expand(r))
            .map(|r| std::fs::canonicalize(&r).unwrap_or(r))
            .collect();
        let wanted = if cwd.is_empty() {
            match roots.first() {
                Some(r) => r.clone(),
                None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            }
        } else {
            expand(cwd).ok_or_else(|| "cannot expand ~: HOME is not set".to_string())?
        };
        let real = std::fs::canonicalize(&wanted).map_err(|_| {
            format!(
                "working directory {} does not exist on this machine",
                wanted.display()
            )
        })?;
        if !real.is_dir() {
            return Err(format!("{} is not a directory", real.display()));
        }
        if !roots.is_empty() && !roots.iter().any(|r| real.starts_with(r)) {
            return Ok(Decision::Deny {
                rule: format!(
                    "directory {} is outside dirs.roots {:?} ({file})",
                    real.display(),
                    self.file.dirs.roots
                ),
            });
        }
        let mut scrub: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .chain(env.keys().cloned())
            .filter(|k| self.file.env.scrub.iter().any(|p| glob(p, k)))
            .collect();
        scrub.sort();
        scrub.dedup();
        let timeout = match (timeout, self.max_runtime) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let confirm = c
            .confirm
            .iter()
            .find(|pat| glob(pat, &line) || progs.iter().any(|p| glob(pat, p)))
            .map(|pat| format!("commands.confirm {pat:?} ({file})"));
        Ok(Decision::Allow {
            cwd: real,
            timeout,
            scrub,
            confirm,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*rm -rf /", "sudo rm -rf /"));
        assert!(!glob("*rm -rf /", "rm -rf /tmp/x"));
        assert!(glob("*rm -rf / *", "rm -rf / --no-preserve-root"));
        assert!(glob("*rm -rf /[*]*", "rm -rf /*"));
        assert!(glob("*_TOKEN", "GITHUB_TOKEN"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("a?c", "ac"));
        assert!(glob("**", ""));
        assert!(!glob(&"*a".repeat(50), &"a".repeat(40)));
    }

    #[test]
    fn wrappers_and_shells_do_not_hide_programs() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(
            deny_candidates(&v(&["sh", "-c", "true; sudo x"]), "").contains(&"sudo".to_string())
        );
        assert!(
            deny_candidates(&v(&["/bin/bash", "-lc", "echo; doas y"]), "")
                .contains(&"doas".to_string())
        );
        assert_eq!(
            programs(&v(&["env", "A=1", "sudo", "x"]), ""),
            vec!["env", "sudo"]
        );
        assert_eq!(
            programs(&v(&["nohup", "nice", "-n", "5", "su"]), ""),
            vec!["nohup", "nice", "su"]
        );
        assert!(deny_candidates(&[], "bash -c 'sudo id'").contains(&"sudo".to_string()));
        assert!(!deny_candidates(&v(&["grep", "sudo", "f"]), "").contains(&"sudo".to_string()));
    }

    #[test]
    fn programs_in_shell_lines() {
        let s = |x: &str| programs(&[], x);
        assert_eq!(s("ls -l; sudo rm x"), vec!["ls", "sudo"]);
        assert_eq!(s("FOO=1 /usr/bin/sudo x"), vec!["sudo"]);
        assert_eq!(
            s("echo $(sudo id) | env doas y"),
            vec!["echo", "sudo", "env", "doas"]
        );
        assert_eq!(
            programs(&["/usr/bin/git".into(), "push".into()], ""),
            vec!["git"]
        );
    }

    #[test]
    fn default_policy_decisions() {
        let dir = std::env::temp_dir();
        let p = Policy::parse(DEFAULT_POLICY, &dir.join("policy.toml")).unwrap();
        let env = Default::default();
        let deny = |argv: &[&str], sh: &str| {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            matches!(
                p.check(&argv, sh, "/tmp", &env, None),
                Ok(Decision::Deny { .. })
            )
        };
        assert!(deny(&["sudo", "ls"], ""));
        assert!(deny(&[], "ls && sudo reboot"));
        assert!(deny(&["rm", "-rf", "/"], ""));
        assert!(!deny(&["ls", "-l"], ""));
        assert!(!deny(&[], "cargo test 2>&1 | tail"));
        assert!(matches!(
            p.check(&["ls".into()], "", "/etc", &env, None),
            Ok(Decision::Deny { .. })
        ));
        assert!(p.check(&["ls".into()], "", "/no/such", &env, None).is_err());
        match p.check(
            &["ls".into()],
            "",
            "/tmp",
            &env,
            Some(Duration::from_secs(99_999)),
        ) {
            Ok(Decision::Allow { timeout, .. }) => {
                assert_eq!(timeout, Some(Duration::from_secs(7200)))
            }
            o => panic!("{o:?}"),
        }
        assert!(Policy::parse("[commands]\nbogus = 1", &dir).is_err());
        assert!(Policy::parse("[limits]\nmax_runtime = \"soon\"", &dir).is_err());
    }
}
