//! What a command will run: every program, with the words it gets, through
//! shells (`sh -c`, `eval`, `trap`, `. FILE`, a here-document fed to `sh`),
//! the wrappers that run their arguments (`env`, `nice`, `xargs`,
//! `find -exec`, `sudo`, `flock`, `chroot`, `strace`, `npx`, … see
//! [`wrappers`]), git's configuration and aliases ([`git`]), and the
//! substitutions of a shell line. What only the running shell can know is
//! listed as unknown, with the reason; the policy treats it as matching its
//! strictest rule. What only defeats an allow-list (a name that may find
//! another file: `PATH`, `LD_LIBRARY_PATH`, a sourced file) is listed
//! apart, in [`Analysis::relocated`].

use std::collections::BTreeSet;

use crate::shell::{self, Arg, Redirect, MAX_DEPTH};

mod builtins;
pub mod git;
mod specs;
mod vars;
mod wrappers;

pub use vars::{hijacks, relocates};

/// One program the command starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    /// The program word, then its arguments.
    pub argv: Vec<Arg>,
    /// What started it, outermost first (`sudo`, `sh -c`, `find -exec`).
    pub via: Vec<String>,
    /// A shell builtin, not a file on disk.
    pub builtin: bool,
    /// A function of the line has this name. Whether the function or the
    /// program runs depends on the order things happen in, so both count:
    /// the body is analysed where it is written, and the name is judged
    /// as the program too.
    pub function: bool,
    /// Not a program that starts but what one does (`find -delete` is an
    /// `rm -rf` of what it finds, `git -c alias.p=push p` a `git push`):
    /// judged by command patterns and read-only rules, not as a file.
    pub implied: bool,
}

impl Exec {
    /// The program word, when known.
    pub fn program(&self) -> Option<String> {
        self.argv.first().and_then(Arg::literal)
    }

    /// The program's file name (`/usr/bin/sudo` → `sudo`), when known.
    pub fn name(&self) -> Option<String> {
        self.program().map(|p| base(&p).to_string())
    }

    /// "su (run by find -exec)" for messages.
    pub fn describe(&self) -> String {
        let name = self.argv.first().map(Arg::shown).unwrap_or_default();
        if self.via.is_empty() {
            name
        } else {
            format!("{name} (run by {})", self.via.join(" → "))
        }
    }
}

pub fn base(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Everything a command runs, and what cannot be known about it.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    pub execs: Vec<Exec>,
    pub unknown: Vec<String>,
    /// Environment variables the command sets for what it runs.
    pub assigned: BTreeSet<String>,
    /// The line changes directory, so relative program paths move.
    pub changes_dir: bool,
    /// Files its redirections write (`> FILE`, `&> FILE`, `1<> FILE`).
    pub writes: Vec<Arg>,
    /// Script files a shell runs (`sh build.sh`): code like a program's,
    /// which a line that writes files may have written.
    pub scripts: Vec<Arg>,
    /// Why a name it runs may find another file than byomd's PATH finds
    /// now, or an allowed program may load code nobody listed: unknowable
    /// to an allow-list, which vouches for files (nothing to a deny-list).
    pub relocated: Vec<String>,
}

impl Analysis {
    pub fn unknowable(&mut self, why: impl Into<String>) {
        shell::add_reason(&mut self.unknown, why);
    }

    pub fn relocate(&mut self, why: impl Into<String>) {
        shell::add_reason(&mut self.relocated, why);
    }

    /// A variable of the request's environment: what it makes the command
    /// run counts as the command's (a `GIT_PAGER` is a command line).
    pub fn add_env(&mut self, name: &str, value: &str, home: Option<&str>) {
        let mut w = Walk {
            out: std::mem::take(self),
            home: home.map(str::to_string),
            parses: 0,
        };
        w.assignment(name, &Arg::lit(value), &Ctx::top(&[]));
        w.out.assigned.insert(name.to_string());
        w.settle();
        *self = w.out;
    }
}

/// Analyses a request: `argv` run directly, or `shell` run by `sh -c`.
pub fn analyze(argv: &[String], shell: &str, home: Option<&str>) -> Analysis {
    let a = analyze_with(argv, shell, home);
    // `~` and `$HOME` were read as byomd's home: a line that assigns HOME
    // (anywhere, in any order) may mean another directory by them.
    if home.is_some() && a.assigned.contains("HOME") {
        return analyze_with(argv, shell, None);
    }
    a
}

fn analyze_with(argv: &[String], shell: &str, home: Option<&str>) -> Analysis {
    let mut w = Walk {
        out: Analysis::default(),
        home: home.map(str::to_string),
        parses: 0,
    };
    let cx = Ctx::top(&[]);
    if shell.is_empty() {
        let words = argv.iter().map(|w| Arg::lit(w.clone())).collect();
        w.words(words, cx);
    } else {
        w.script(shell, &cx);
    }
    w.settle();
    w.out
}

/// Shell builtins that run nothing else (the ones that do are handled in
/// [`builtins`]).
pub const PLAIN_BUILTINS: &[&str] = &[
    "cd",
    "pwd",
    "echo",
    "printf",
    "true",
    "false",
    ":",
    "test",
    "[",
    "[[",
    "export",
    "unset",
    "set",
    "shift",
    "exit",
    "return",
    "read",
    "wait",
    "local",
    "readonly",
    "declare",
    "typeset",
    "type",
    "getopts",
    "break",
    "continue",
    "times",
    "umask",
    "let",
    "shopt",
    "jobs",
    "mapfile",
    "readarray",
    "compgen",
    "complete",
    "compopt",
    "dirs",
    "pushd",
    "popd",
    "ulimit",
    "logout",
    "help",
    "caller",
    "disown",
    "unalias",
    "history",
    "bg",
    "fg",
    "suspend",
];

/// Shells whose language byomd's parser speaks.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "ksh", "mksh", "ash", "yash", "hush", "posh", "rbash", "lksh", "oksh",
    "pdksh",
];

/// Shells whose language it does not (`fish -c 's\x75'` runs su): what
/// they are given to run is unknowable.
const OTHER_SHELLS: &[&str] = &[
    "zsh", "fish", "csh", "tcsh", "nu", "xonsh", "pwsh", "elvish", "rc", "es", "ksh93", "zsh5",
];

/// The line's functions, for commands that are not in a line.
static NO_FUNCTIONS: BTreeSet<String> = BTreeSet::new();

/// How one command runs: what started it, how deep in other commands, the
/// functions its line defines, and its redirections (a shell reading its
/// input reads what they give it).
#[derive(Debug, Clone)]
struct Ctx<'a> {
    via: Vec<String>,
    depth: usize,
    functions: &'a BTreeSet<String>,
    redirects: &'a [Redirect],
}

impl<'a> Ctx<'a> {
    fn top(redirects: &'a [Redirect]) -> Ctx<'a> {
        Ctx {
            via: Vec::new(),
            depth: 0,
            functions: &NO_FUNCTIONS,
            redirects,
        }
    }

    /// For what `what` runs: one level deeper, where the line's functions
    /// are not (`env f` runs a program `f`), with the same input.
    fn inner(&self, what: &str) -> Ctx<'a> {
        let mut via = self.via.clone();
        via.push(what.to_string());
        Ctx {
            via,
            depth: self.depth + 1,
            functions: &NO_FUNCTIONS,
            redirects: self.redirects,
        }
    }
}

/// The words joined as a shell would see them, if all are known.
fn joined(words: &[Arg]) -> Option<String> {
    words
        .iter()
        .map(Arg::literal)
        .collect::<Option<Vec<_>>>()
        .map(|w| w.join(" "))
}

/// The descriptor a path reads (`/dev/stdin` → 0, `/dev/fd/3`,
/// `/proc/self/fd/3`, also reached by `../../dev/stdin`), and whether it
/// is some other device or process file (`/dev/tcp/…`, `/proc/…`).
fn descriptor(path: &str) -> (Option<i32>, bool) {
    let n = super::paths::normalize(path);
    let climbs = n.starts_with('/') || n.starts_with("..");
    let rest = n.trim_start_matches(['/', '.']);
    let parts: Vec<&str> = rest.split('/').collect();
    let fd = match parts.as_slice() {
        ["dev", "stdin"] => Some(0),
        ["dev", "fd", n] => n.parse().ok(),
        ["proc", _, "fd", n] => n.parse().ok(),
        _ => None,
    };
    let device = climbs && matches!(parts.first(), Some(&"dev") | Some(&"proc"));
    (fd, device)
}

/// Most lines parsed for one command (each `sh -c`, `eval`, alias, find's
/// `{}` …): past it, what it runs is unknowable, not slow.
const MAX_PARSES: usize = 1_000;

struct Walk {
    out: Analysis,
    home: Option<String>,
    /// Lines parsed so far.
    parses: usize,
}

impl Walk {
    /// Variables the command sets: some make it unknowable, some only
    /// matter to an allow-list.
    fn settle(&mut self) {
        for name in self.out.assigned.clone() {
            if hijacks(&name) {
                self.out
                    .unknowable(format!("{name} is set, which changes what programs run"));
            } else if relocates(&name) {
                self.out.relocate(format!(
                    "{name} is set, which changes which files names run or what they load"
                ));
            }
        }
    }

    fn script(&mut self, text: &str, cx: &Ctx) {
        self.parses += 1;
        if self.parses > MAX_PARSES {
            self.out
                .unknowable(format!("more than {MAX_PARSES} lines within one command"));
            return;
        }
        // Its depth limit is the parser's.
        let s = shell::parse(text, self.home.as_deref(), cx.depth);
        for u in s.unknown {
            self.out.unknowable(u);
        }
        self.out.assigned.extend(s.assigned);
        self.out.writes.extend(s.writes);
        if s.arith_vars {
            self.out.relocate(
                "arithmetic evaluates variables, whose values may assign any other (PATH…)",
            );
        }
        for c in &s.commands {
            for (name, value) in &c.assigns {
                self.assignment(name, value, cx);
            }
            let inner = Ctx {
                via: cx.via.clone(),
                depth: cx.depth,
                functions: &s.functions,
                redirects: &c.redirects,
            };
            self.words(c.words.clone(), inner);
        }
    }

    /// `NAME=value` for what runs: a value that is a command line (a
    /// pager, an editor) is analysed as one.
    fn assignment(&mut self, name: &str, value: &Arg, cx: &Ctx) {
        self.out.assigned.insert(name.to_string());
        if vars::runs_value(name) {
            self.sub_script(value, cx, &format!("{name}="));
        }
    }

    /// A line given as one word (`sh -c WORD`, `trap WORD`).
    fn sub_script(&mut self, script: &Arg, cx: &Ctx, what: &str) {
        match script.literal() {
            Some(s) => self.script(&s, &cx.inner(what)),
            None => self.out.unknowable(format!(
                "{what} runs a line only known when it runs ({})",
                script.shown()
            )),
        }
    }

    /// A line given as words joined by spaces (`eval A B`, `watch A B`).
    fn joined_script(&mut self, words: &[Arg], cx: &Ctx, what: &str) {
        match joined(words) {
            Some(s) => self.script(&s, &cx.inner(what)),
            None => self
                .out
                .unknowable(format!("{what} runs text only known when it runs")),
        }
    }

    fn push(&mut self, argv: &[Arg], cx: &Ctx, builtin: bool, function: bool) {
        self.push_exec(Exec {
            argv: argv.to_vec(),
            via: cx.via.clone(),
            builtin,
            function,
            implied: false,
        });
    }

    fn push_exec(&mut self, e: Exec) {
        if self.out.execs.len() < shell::MAX_COMMANDS {
            self.out.execs.push(e);
        } else {
            self.out.unknowable(format!(
                "more than {} programs in one command",
                shell::MAX_COMMANDS
            ));
        }
    }

    /// One command's words: the program, then (for builtins, shells and
    /// wrappers) what it runs in turn.
    fn words(&mut self, words: Vec<Arg>, cx: Ctx) {
        let Some(first) = words.first() else {
            return;
        };
        let Some(program) = first.literal() else {
            self.out.unknowable(format!(
                "the program name {:?} is only known when it runs",
                first.shown()
            ));
            self.push(&words, &cx, false, false);
            return;
        };
        if cx.depth > MAX_DEPTH {
            self.out
                .unknowable(format!("commands nested more than {MAX_DEPTH} levels deep"));
            return;
        }
        let name = base(&program).to_string();
        let function = cx.functions.contains(&program);
        // A builtin is found by its bare name only (`/bin/echo` is a file).
        let bare = !program.contains('/');
        if bare && self.builtin(&name, &words, &cx, function) {
            return;
        }
        let plain = bare
            && (PLAIN_BUILTINS.contains(&name.as_str())
                || matches!(name.as_str(), "exec" | "command" | "builtin"));
        self.push(&words, &cx, plain, function);
        self.runs(&name, &words[1..], &cx);
    }

    /// `sh -c SCRIPT`, or a shell reading a file or its input.
    fn shell(&mut self, name: &str, args: &[Arg], cx: &Ctx) {
        let cx = &cx.inner(name);
        if OTHER_SHELLS.contains(&name) {
            // Only a script file is like any program.
            match args {
                [f, ..] if f.literal().is_some_and(|f| !f.starts_with(['-', '+'])) => {
                    self.code_from_file(f, cx, name)
                }
                _ => self.out.unknowable(format!(
                    "{name} runs a line in a language byomd does not parse"
                )),
            }
            return;
        }
        let mut c = false;
        let mut stdin = false;
        let mut i = 0;
        while i < args.len() {
            let Some(w) = args[i].literal() else {
                self.out
                    .unknowable(format!("{name} is given a word only known when it runs"));
                return;
            };
            if w == "--" || w == "-" {
                i += 1;
                break;
            }
            if let Some(long) = w.strip_prefix("--") {
                if matches!(long, "rcfile" | "init-file") {
                    i += 1;
                }
                i += 1;
                continue;
            }
            if (w.starts_with('-') || w.starts_with('+')) && w.len() > 1 {
                c |= w[1..].contains('c');
                // `-s` and `-i` read commands from the input.
                stdin |= w.starts_with('-') && w[1..].contains(['s', 'i']);
                if w[1..].contains(['o', 'O']) {
                    i += 1;
                }
                i += 1;
                continue;
            }
            break;
        }
        match (c, args.get(i)) {
            (true, Some(script)) => self.sub_script(script, cx, &format!("{name} -c")),
            (true, None) => {}
            (false, Some(f)) if !stdin => self.code_from_file(f, cx, name),
            // `… | sh`: the commands are whatever comes in.
            (false, _) => self.code_from_fd(0, cx, name),
        }
    }

    /// A shell (or `.`) running the commands of `file`: a file on disk is
    /// like any program (not read here); a descriptor is what the
    /// redirections put there; anything else is unknowable.
    fn code_from_file(&mut self, file: &Arg, cx: &Ctx, what: &str) {
        let Some(path) = file.literal() else {
            self.out.unknowable(format!(
                "{what} runs a file only known when it runs ({})",
                file.shown()
            ));
            return;
        };
        match descriptor(&path) {
            (Some(fd), _) => self.code_from_fd(fd, cx, what),
            (None, true) => self
                .out
                .unknowable(format!("{what} runs commands from {path}")),
            (None, false) => self.out.scripts.push(file.clone()),
        }
    }

    /// A shell running what descriptor `fd` gives it: a here-document or
    /// here-string known now is analysed; anything else (a pipe, the
    /// request's input, a process substitution) is unknowable.
    fn code_from_fd(&mut self, fd: i32, cx: &Ctx, what: &str) {
        let from = cx.redirects.iter().rev().find(|r| r.fd() == fd);
        match from {
            Some(Redirect::Text(_, text)) => match text.literal() {
                Some(t) => self.script(&t, &cx.inner(&format!("{what} <<"))),
                None => self.out.unknowable(format!(
                    "{what} runs a here-document only known when it runs"
                )),
            },
            Some(Redirect::Read(_, file))
                if file
                    .literal()
                    .is_some_and(|f| descriptor(&f) == (None, false)) => {}
            _ => self
                .out
                .unknowable(format!("{what} reads commands from its input")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(a: &Analysis) -> Vec<String> {
        a.execs.iter().filter_map(Exec::name).collect()
    }

    fn sh(line: &str) -> Analysis {
        analyze(&[], line, Some("/home/u"))
    }

    fn argv(words: &[&str]) -> Analysis {
        let w: Vec<String> = words.iter().map(|s| s.to_string()).collect();
        analyze(&w, "", Some("/home/u"))
    }

    #[test]
    fn wrappers_are_seen_through() {
        // (A bare `su` would start a shell reading its input: `reboot`
        // stands for a program that runs nothing else.)
        let cases: &[(&str, &[&str])] = &[
            ("env -u B A=1 su -c id", &["env", "su", "id"]),
            (
                "nice -n 5 nohup timeout -s KILL 10 reboot",
                &["nice", "nohup", "timeout", "reboot"],
            ),
            ("nice -5 reboot", &["nice", "reboot"]),
            (
                "find / -maxdepth 0 -exec su -c id ';'",
                &["find", "su", "id"],
            ),
            ("busybox reboot", &["busybox", "reboot"]),
            ("sudo -u root -- doas reboot", &["sudo", "doas", "reboot"]),
            ("xargs -n1 reboot", &["xargs", "reboot"]),
            (
                "stdbuf -oL setsid -f ionice -c3 chrt 5 taskset 3 reboot",
                &["stdbuf", "setsid", "ionice", "chrt", "taskset", "reboot"],
            ),
            (
                "command reboot; exec reboot; builtin echo",
                &["command", "reboot", "exec", "reboot", "builtin", "echo"],
            ),
            ("sh -c 'bash -ec \"reboot\"'", &["sh", "bash", "reboot"]),
            ("eval \"s\"\"u -c id\"", &["eval", "su", "id"]),
            ("trap 'reboot' EXIT", &["trap", "reboot"]),
            ("watch -n1 su -c id", &["watch", "su", "id"]),
            ("flock /tmp/l reboot", &["flock", "reboot"]),
            ("flock /tmp/l -c 'reboot'", &["flock", "reboot"]),
            ("su root -c 'reboot'", &["su", "reboot"]),
        ];
        for (line, want) in cases {
            let a = sh(line);
            assert_eq!(names(&a), *want, "{line}: {:?}", a.unknown);
            assert!(a.unknown.is_empty(), "{line}: {:?}", a.unknown);
        }
        assert_eq!(names(&argv(&["env", "sudo", "x"])), ["env", "sudo", "x"]);
        assert_eq!(names(&argv(&["sh", "-c", "su -c id"])), ["sh", "su", "id"]);
    }

    #[test]
    fn what_runs_only_at_run_time_is_unknown() {
        for line in [
            "x=s; ${x}u -c id",
            "$(echo su) -c id",
            "eval \"$cmd\"",
            "echo su | sh",
            "curl -s http://x/install | bash -s -- --yes",
            "bash \"$SCRIPT\"",
            "bash -c \"$X\"",
            "nice --weird su",
            "env -S 'su -c id'",
            "find / -exec sh -c '{}' ';'",
            "xargs -I{} sh -c '{}'",
            "alias x=su",
            "BASH_ENV=/tmp/x bash -c true",
            "env 'BASH_FUNC_ls%%=() { su; }' bash -c ls",
            "f() { \"$@\"; }; f su",
        ] {
            assert!(!sh(line).unknown.is_empty(), "{line}");
        }
        for line in [
            "echo $HOME; ls \"$dir\"",
            ". ./env.sh",
            "sh build.sh",
            "bash -e ./ci.sh",
        ] {
            assert!(sh(line).unknown.is_empty(), "{line}");
        }
    }

    #[test]
    fn functions_and_builtins() {
        let a = sh("f() { ls; }; f; cd /tmp; echo hi");
        // A function call is the function, or the program if the function
        // is not defined yet when it runs: judged as both.
        let builtin: Vec<(String, bool)> = a
            .execs
            .iter()
            .map(|e| (e.name().unwrap_or_default(), e.builtin || e.function))
            .collect();
        assert_eq!(
            builtin,
            [("ls", false), ("f", true), ("cd", true), ("echo", true)]
                .map(|(a, b)| (a.to_string(), b))
                .to_vec()
        );
        assert!(a.execs[1].function && !a.execs[1].builtin);
        assert!(a.changes_dir);
    }
}
