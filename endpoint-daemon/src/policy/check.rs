//! [`Policy::check`]: the one decision about a command, for the runtime
//! and `byomd policy check` alike. The parsed command is held against the
//! deny list and patterns, the working-directory roots, the allow-list (on
//! the files names resolve to), the secrets' restrictions, the agents'
//! rules and the confirm patterns, in that order. Loading and describing a
//! policy stay in [`super`]; this is only the judging.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::analysis::{self, analyze, Analysis, Exec};
use super::rules::{self, expand, resolve};
use super::{glob, home, scrubbed, AgentCommands, Decision, Policy, Request, UntrustedCommands};
use crate::shell::Arg;

impl Policy {
    /// Decides about one command: the one decision both the runtime and
    /// `byomd policy check` use. Pure apart from reading the disk (the
    /// directory, the allow-list's files, the secrets' restrictions).
    pub fn check(&self, req: &Request) -> Result<Decision, String> {
        let file = self.path.display();
        let home = home();
        let home_text = home.as_ref().map(|h| h.to_string_lossy().into_owned());
        // A HOME in the request's environment is what `~` means to it.
        let line_home = match req.env {
            Some(env) if env.contains_key("HOME") => None,
            _ => home_text.as_deref(),
        };
        let mut a = analyze(req.argv, req.shell, line_home);
        if req.login_shell {
            // `[SHELL, -l]` as byomd made it: the one unknowable is that
            // it reads the person's keys.
            a.unknown.clear();
        }
        if let Some(env) = req.env {
            for (k, v) in env {
                a.add_env(k, v, line_home);
            }
        }
        let c = &self.file.commands;
        let roots = &self.file.dirs.roots;
        let deny = |rule: String| Ok(Decision::Deny { rule });
        // Read now for the patterns' relative paths; refused below.
        let dir = self.directory(req.cwd, home.as_deref());
        let known_dir = match &dir {
            Ok(Ok(d)) => Some(d.clone()),
            _ => None,
        };
        let at = rules::Place {
            home: home.as_deref(),
            roots,
            cwd: known_dir.as_deref(),
            cwd_moves: a.changes_dir,
        };

        // Named programs, then patterns, anywhere in the command. What a
        // program does (`find -delete`) is judged by patterns only.
        for e in a.execs.iter().filter(|e| !e.implied) {
            if let (Some(name), Some(program)) = (e.name(), e.program()) {
                let hit = c.deny.iter().find(|d| {
                    if d.contains('/') {
                        glob(d, &program)
                    } else {
                        glob(d, &name)
                    }
                });
                if let Some(d) = hit {
                    return deny(format!(
                        "commands.deny {d:?} matches {} ({file})",
                        e.describe()
                    ));
                }
            }
        }
        for e in &a.execs {
            if let Some(p) = self.deny_patterns.iter().find(|p| p.matches(e, &at)) {
                return deny(format!(
                    "commands.deny_patterns {:?} matches {} ({file})",
                    p.text,
                    shown_argv(e)
                ));
            }
        }
        let cwd = match dir? {
            Ok(cwd) => cwd,
            Err(rule) => return deny(rule),
        };
        if !c.allow.is_empty() {
            if let Some(rule) = self.not_allowed(&c.allow, &mut a, &cwd, "commands.allow", false) {
                return deny(rule);
            }
        }
        let strict = !c.deny.is_empty() || !self.deny_patterns.is_empty() || !c.allow.is_empty();
        let mut confirm: Option<String> = None;
        if !a.unknown.is_empty() {
            let why = a.unknown.join("; ");
            if strict {
                return deny(format!(
                    "what it runs cannot be known before it runs ({why}), and with deny or allow rules in force such a command is denied ({file})"
                ));
            }
            confirm = Some(format!(
                "what it runs cannot be known before it runs ({why})"
            ));
        }
        // Restrictions the owner put on the secrets it uses.
        let used = req.secrets();
        let secrets = match self.config_dir() {
            Some(d) if !used.is_empty() => crate::secrets::restrictions(d),
            _ => Default::default(),
        };
        for name in used {
            let Some(r) = secrets.get(&name) else {
                continue;
            };
            if !r.allow_programs.is_empty() {
                let key = format!(
                    "the restriction on secret {name} (byomd secret set {name} --allow-program …)"
                );
                if let Some(rule) = self.not_allowed(&r.allow_programs, &mut a, &cwd, &key, true) {
                    return deny(rule);
                }
                if !a.unknown.is_empty() {
                    return deny(format!(
                        "secret {name} may only be used by {}, and what this command runs cannot be known before it runs",
                        r.allow_programs.join(", ")
                    ));
                }
            }
            if r.confirm && confirm.is_none() {
                confirm = Some(format!(
                    "secret {name} is used (byomd secret set {name} --confirm)"
                ));
            }
        }
        if req.from_agent() {
            match self.file.agents.commands {
                AgentCommands::Allow => {}
                AgentCommands::Deny => {
                    return deny(format!("agents.commands = \"deny\" ({file})"));
                }
                AgentCommands::Confirm => {
                    confirm
                        .get_or_insert_with(|| format!("agents.commands = \"confirm\" ({file})"));
                }
            }
        }
        if req.from_agent() && !req.taint.is_empty() {
            match self.file.agents.untrusted {
                UntrustedCommands::Allow => {}
                UntrustedCommands::Deny => {
                    return deny(format!(
                        "agents.untrusted = \"deny\": the task read untrusted input ({}) ({file})",
                        req.taint
                    ));
                }
                UntrustedCommands::Confirm => {
                    if req.approved_by.is_empty() && !self.only_read_only(&a) {
                        confirm.get_or_insert_with(|| {
                            format!(
                                "agents.untrusted = \"confirm\": the task read untrusted input ({}) and nobody approved it ({file})",
                                req.taint
                            )
                        });
                    }
                }
            }
        }
        if confirm.is_none() {
            'find: for e in &a.execs {
                for p in &self.confirm {
                    if p.matches(e, &at) {
                        confirm = Some(format!("commands.confirm {:?} ({file})", p.text));
                        break 'find;
                    }
                }
            }
        }
        let mut scrub = self.own_scrub.clone();
        if let Some(env) = req.env {
            scrub.extend(scrubbed(
                &self.file.env.scrub,
                env.keys().map(OsString::from),
            ));
            scrub.sort();
            scrub.dedup();
        }
        let timeout = match (req.timeout, self.max_runtime) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(Decision::Allow {
            cwd,
            timeout,
            scrub,
            confirm,
            run_as: self.run_as.clone(),
        })
    }

    /// Every program the command runs is declared read-only, with its
    /// declared first words, and nothing about it is unknowable.
    fn only_read_only(&self, a: &Analysis) -> bool {
        let declared = &self.file.agents.read_only;
        if declared.is_empty() || !a.unknown.is_empty() || a.execs.is_empty() {
            return false;
        }
        // Output redirected into a file writes it, whatever the program.
        if a.writes.iter().any(|w| !rules::files::discards(w)) {
            return false;
        }
        a.execs.iter().all(|e| {
            let mut words: Vec<Option<String>> = e.argv.iter().map(Arg::literal).collect();
            if let Some(Some(p)) = words.first_mut() {
                *p = analysis::base(p).to_string();
            }
            e.via.is_empty()
                && declared.iter().any(|d| {
                    let want: Vec<&str> = d.split_whitespace().collect();
                    !want.is_empty()
                        && words.len() >= want.len()
                        && want
                            .iter()
                            .zip(&words)
                            .all(|(w, have)| have.as_deref() == Some(*w))
                })
        })
    }

    /// The working directory: Ok(Ok(dir)), Ok(Err(deny rule)), or Err when
    /// it does not exist.
    fn directory(&self, cwd: &str, home: Option<&Path>) -> Result<Result<PathBuf, String>, String> {
        let roots: Vec<PathBuf> = self
            .file
            .dirs
            .roots
            .iter()
            .filter_map(|r| expand(r, home))
            .map(|r| std::fs::canonicalize(&r).unwrap_or(r))
            .collect();
        let wanted = if cwd.is_empty() {
            match roots.first() {
                Some(r) => r.clone(),
                None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            }
        } else {
            expand(cwd, home).ok_or_else(|| "cannot expand ~: HOME is not set".to_string())?
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
            return Ok(Err(format!(
                "directory {} is outside dirs.roots {:?} ({})",
                real.display(),
                self.file.dirs.roots,
                self.path.display()
            )));
        }
        Ok(Ok(real))
    }

    /// Checks every program against an allow-list of names and paths, on
    /// the files they resolve to; Some(rule) names the first that fails.
    /// Makes a changed PATH or directory unknowable (names move with them).
    /// With `builtins`, shell builtins must be listed too (by name): a
    /// secret given to `echo` can go anywhere.
    fn not_allowed(
        &self,
        list: &[String],
        a: &mut Analysis,
        cwd: &Path,
        key: &str,
        builtins: bool,
    ) -> Option<String> {
        use rules::files::{changeable, lookup, Who, Writes};
        let path = std::env::var("PATH").unwrap_or_default();
        if a.assigned.contains("PATH") {
            a.unknowable("PATH is changed, so which file a name runs is not known");
        }
        // What only defeats a list of files (a name that may find another
        // file, a sourced file, a loader variable) is unknowable here.
        for why in a.relocated.clone() {
            a.unknowable(why);
        }
        let home = home();
        let allowed: Vec<(String, PathBuf)> = list
            .iter()
            .filter_map(|entry| {
                let file = if entry.contains('/') || entry.starts_with('~') {
                    expand(entry, home.as_deref()).and_then(|p| std::fs::canonicalize(p).ok())
                } else {
                    resolve(entry, &path, cwd)
                };
                file.map(|f| (analysis::base(entry).to_string(), f))
            })
            .collect();
        let found: Vec<Option<(Vec<PathBuf>, PathBuf)>> = (a.execs.iter())
            .map(|e| {
                let p = e.program().filter(|_| !e.builtin && !e.implied)?;
                lookup(&p, &path, cwd)
            })
            .collect();
        let who = match &self.run_as {
            Some(r) => Who::User { uid: r.uid },
            None => Who::Daemon,
        };
        let writes = Writes::of(a, &found, cwd, who);
        let mut unknown = Vec::new();
        for (i, e) in
            (a.execs.iter().enumerate()).filter(|(_, e)| !e.implied && (builtins || !e.builtin))
        {
            let Some(program) = e.program() else {
                continue;
            };
            if e.builtin {
                if !list.iter().any(|n| n == &program) {
                    return Some(format!(
                        "{} is not in {key} ({})",
                        e.describe(),
                        self.path.display()
                    ));
                }
                continue;
            }
            if !program.starts_with('/') && program.contains('/') && a.changes_dir {
                unknown.push(format!(
                    "{program} is a relative path in a line that changes directory"
                ));
                continue;
            }
            let name = analysis::base(&program);
            // A function of the line, and no program of that name: only
            // the function (whose body is judged) can run.
            if e.function && found[i].is_none() {
                continue;
            }
            let real = found[i]
                .as_ref()
                .and_then(|(_, f)| std::fs::canonicalize(f).ok());
            let ok = real
                .as_ref()
                .is_some_and(|file| allowed.iter().any(|(n, f)| f == file && n == name));
            if !ok {
                return Some(format!(
                    "{} is not in {key} ({})",
                    e.describe(),
                    self.path.display()
                ));
            }
            if let (Some((dirs, file)), Some(real)) = (&found[i], &real) {
                if writes.may_rewrite(i, name, dirs, file, real) {
                    unknown.push(format!(
                        "{program} may be written by the line before it runs"
                    ));
                }
            }
            // git runs aliases (of any configuration file) and git-NAME
            // programs for subcommands that are not its own.
            if name == "git" && rules::runs_other_subcommand("git", &e.argv[1..]) {
                unknown.push(format!(
                    "{} may run an alias or another program",
                    shown_argv(e)
                ));
            }
        }
        // A script a shell runs is code like a program's: the line must not
        // be able to write it first.
        if writes.any() {
            for f in &a.scripts {
                let file = f.literal().filter(|f| f.starts_with('/') || !a.changes_dir);
                if file.is_none_or(|f| changeable(&cwd.join(f), who)) {
                    unknown.push(format!(
                        "the script {} may be written by the line before it runs",
                        f.shown()
                    ));
                }
            }
        }
        for why in unknown {
            a.unknowable(why);
        }
        None
    }
}

fn shown_argv(e: &Exec) -> String {
    let words: Vec<String> = e.argv.iter().map(|a| a.shown()).collect();
    let mut s = words.join(" ");
    if s.chars().count() > 120 {
        s = s.chars().take(120).collect::<String>() + "…";
    }
    if e.via.is_empty() {
        s
    } else {
        format!("{s} (run by {})", e.via.join(" → "))
    }
}
