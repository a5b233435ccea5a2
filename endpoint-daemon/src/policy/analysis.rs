//! What a command will run: every program, with the words it gets, through
//! shells (`sh -c`, `eval`, `trap`), the common wrappers (`env`, `nice`,
//! `nohup`, `timeout`, `xargs`, `find -exec`, `busybox APPLET`, `sudo`,
//! `doas`, `su -c`, `watch`, `flock`, …) and the substitutions of a shell
//! line. What only the running shell can know is listed as unknown, with the
//! reason; the policy treats it as matching its strictest rule.

use std::collections::BTreeSet;

use crate::shell::{self, Arg, Part, MAX_DEPTH};

/// One program the command starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    /// The program word, then its arguments.
    pub argv: Vec<Arg>,
    /// What started it, outermost first (`sudo`, `sh -c`, `find -exec`).
    pub via: Vec<String>,
    /// A shell builtin or a function of the line, not a file on disk.
    pub builtin: bool,
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
}

impl Analysis {
    pub fn unknowable(&mut self, why: impl Into<String>) {
        shell::add_reason(&mut self.unknown, why);
    }
}

/// Analyses a request: `argv` run directly, or `shell` run by `sh -c`.
pub fn analyze(argv: &[String], shell: &str, home: Option<&str>) -> Analysis {
    let mut a = Walk {
        out: Analysis::default(),
        home: home.map(str::to_string),
    };
    if shell.is_empty() {
        let words = argv.iter().map(|w| Arg::lit(w.clone())).collect();
        a.words(words, Vec::new(), 0, &BTreeSet::new());
    } else {
        a.script(shell, Vec::new(), 0);
    }
    for name in &a.out.assigned.clone() {
        if hijacks(name) {
            a.out
                .unknowable(format!("{name} is set, which changes what programs run"));
        }
    }
    a.out
}

/// Whether setting variable `name` can make a shell or the loader run
/// code the command line does not show.
pub fn hijacks(name: &str) -> bool {
    HIJACKING_ENV.contains(&name) || name.starts_with("BASH_FUNC_")
}

/// Variables that make a shell or the loader run other code.
const HIJACKING_ENV: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "LD_PRELOAD",
    "LD_AUDIT",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
];

/// Shell builtins that run nothing else.
pub const PLAIN_BUILTINS: &[&str] = &[
    "cd", "pwd", "echo", "printf", "true", "false", ":", "test", "[", "export", "unset", "set",
    "shift", "exit", "return", "read", "wait", "local", "readonly", "declare", "typeset", "type",
    "getopts", "break", "continue", "times", "umask", "let", "shopt", "jobs",
];

const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "yash",
];

/// How a wrapper's options read.
struct Spec {
    /// Short options that take a value.
    short_values: &'static str,
    /// Short options that do not.
    short_flags: &'static str,
    long_values: &'static [&'static str],
    long_flags: &'static [&'static str],
    /// Words between the options and the command (timeout's DURATION).
    positionals: usize,
    /// `NAME=value` words before the command set its environment.
    assignments: bool,
    /// `-5`-style numeric options (nice).
    digits: bool,
}

const NONE: Spec = Spec {
    short_values: "",
    short_flags: "",
    long_values: &[],
    long_flags: &[],
    positionals: 0,
    assignments: false,
    digits: false,
};

fn spec(name: &str) -> Option<Spec> {
    Some(match name {
        "env" => Spec {
            short_values: "uCS",
            short_flags: "i0v",
            long_values: &["unset", "chdir", "split-string"],
            long_flags: &[
                "ignore-environment",
                "null",
                "debug",
                "list-signal-handling",
                "default-signal",
                "ignore-signal",
                "block-signal",
            ],
            assignments: true,
            ..NONE
        },
        "nice" => Spec {
            short_values: "n",
            long_values: &["adjustment"],
            digits: true,
            ..NONE
        },
        "nohup" | "builtin" => NONE,
        "timeout" => Spec {
            short_values: "sk",
            short_flags: "fv",
            long_values: &["signal", "kill-after"],
            long_flags: &["preserve-status", "foreground", "verbose"],
            positionals: 1,
            ..NONE
        },
        "stdbuf" => Spec {
            short_values: "ioe",
            long_values: &["input", "output", "error"],
            ..NONE
        },
        "setsid" => Spec {
            short_flags: "cfw",
            long_flags: &["ctty", "fork", "wait"],
            ..NONE
        },
        "ionice" => Spec {
            short_values: "cnpPu",
            short_flags: "t",
            long_values: &["class", "classdata", "pid", "pgid", "uid"],
            long_flags: &["ignore"],
            ..NONE
        },
        "taskset" => Spec {
            short_flags: "acp",
            long_flags: &["all-tasks", "cpu-list", "pid"],
            positionals: 1,
            ..NONE
        },
        "chrt" => Spec {
            short_values: "TPD",
            short_flags: "bdfioramRpv",
            long_values: &["sched-runtime", "sched-period", "sched-deadline"],
            long_flags: &[
                "batch",
                "deadline",
                "fifo",
                "idle",
                "other",
                "rr",
                "all-tasks",
                "max",
                "pid",
                "reset-on-fork",
                "verbose",
            ],
            positionals: 1,
            ..NONE
        },
        "time" => Spec {
            short_values: "fo",
            short_flags: "pavq",
            long_values: &["format", "output"],
            long_flags: &["portability", "append", "verbose", "quiet"],
            ..NONE
        },
        "exec" => Spec {
            short_values: "a",
            short_flags: "cl",
            ..NONE
        },
        "command" => Spec {
            short_flags: "pvV",
            ..NONE
        },
        "chroot" => Spec {
            long_values: &["userspec", "groups"],
            long_flags: &["skip-chdir"],
            positionals: 1,
            ..NONE
        },
        "sudo" => Spec {
            short_values: "ugCDprtTUR",
            short_flags: "AbEeHiKklnPSsVvBN",
            long_values: &[
                "user",
                "group",
                "close-from",
                "chdir",
                "prompt",
                "role",
                "type",
                "command-timeout",
                "other-user",
                "chroot",
                "host",
            ],
            long_flags: &[
                "askpass",
                "background",
                "preserve-env",
                "edit",
                "set-home",
                "login",
                "reset-timestamp",
                "remove-timestamp",
                "list",
                "non-interactive",
                "preserve-groups",
                "stdin",
                "shell",
                "validate",
                "bell",
                "no-update",
            ],
            assignments: true,
            ..NONE
        },
        "doas" => Spec {
            short_values: "uC",
            short_flags: "nsL",
            ..NONE
        },
        "xargs" => Spec {
            short_values: "adEILnPs",
            short_flags: "0rtpxoeil",
            long_values: &[
                "arg-file",
                "delimiter",
                "eof",
                "max-lines",
                "max-args",
                "max-procs",
                "max-chars",
                "process-slot-var",
            ],
            long_flags: &[
                "null",
                "no-run-if-empty",
                "verbose",
                "interactive",
                "exit",
                "open-tty",
                "show-limits",
                "replace",
            ],
            ..NONE
        },
        "watch" => Spec {
            short_values: "nq",
            short_flags: "bcdegptwxr",
            long_values: &["interval", "equexit"],
            long_flags: &[
                "beep",
                "color",
                "no-color",
                "differences",
                "errexit",
                "chgexit",
                "precise",
                "no-title",
                "no-wrap",
                "exec",
                "no-rerun",
            ],
            ..NONE
        },
        "flock" => Spec {
            short_values: "wEc",
            short_flags: "sxeunoF",
            long_values: &["timeout", "wait", "conflict-exit-code", "command"],
            long_flags: &[
                "shared",
                "exclusive",
                "unlock",
                "nonblock",
                "nb",
                "close",
                "no-fork",
                "verbose",
            ],
            positionals: 1,
            ..NONE
        },
        _ => return None,
    })
}

/// A wrapper's options as read: (option name, its value).
type Opts = Vec<(String, Option<Arg>)>;

/// Reads a wrapper's options, assignments and positionals; returns them
/// and the index of the command it runs. Err: a word that makes what it
/// runs unknowable (an unknown option, a dynamic word).
fn read_options(
    sp: &Spec,
    args: &[Arg],
    assigned: &mut BTreeSet<String>,
) -> Result<(Opts, usize), String> {
    let mut opts = Opts::new();
    let mut i = 0;
    let mut positionals = 0;
    while i < args.len() {
        let Some(w) = args[i].literal() else {
            return Err(format!(
                "the word {:?} is only known when it runs",
                args[i].shown()
            ));
        };
        if positionals == 0 && w == "--" {
            i += 1;
            // Only positionals and the command follow.
            while positionals < sp.positionals && i < args.len() {
                positionals += 1;
                i += 1;
            }
            return Ok((opts, i));
        }
        if positionals == 0 && w.starts_with("--") && w.len() > 2 {
            let (name, value) = match w[2..].split_once('=') {
                Some((n, v)) => (n.to_string(), Some(Arg::lit(v))),
                None => (w[2..].to_string(), None),
            };
            if sp.long_values.contains(&name.as_str()) {
                let value = match value {
                    Some(v) => v,
                    None => {
                        i += 1;
                        args.get(i).cloned().unwrap_or_default()
                    }
                };
                opts.push((name, Some(value)));
            } else if sp.long_flags.contains(&name.as_str()) {
                opts.push((name, value));
            } else {
                return Err(format!("unknown option --{name}"));
            }
            i += 1;
            continue;
        }
        if positionals == 0 && w.starts_with('-') && w.len() > 1 {
            let letters: Vec<char> = w[1..].chars().collect();
            if sp.digits && letters.iter().all(char::is_ascii_digit) {
                i += 1;
                continue;
            }
            let mut k = 0;
            while k < letters.len() {
                let c = letters[k];
                if sp.short_values.contains(c) {
                    let rest: String = letters[k + 1..].iter().collect();
                    let value = if rest.is_empty() {
                        i += 1;
                        args.get(i).cloned().unwrap_or_default()
                    } else {
                        Arg::lit(rest)
                    };
                    opts.push((c.to_string(), Some(value)));
                    break;
                } else if sp.short_flags.contains(c) {
                    opts.push((c.to_string(), None));
                } else {
                    return Err(format!("unknown option -{c}"));
                }
                k += 1;
            }
            i += 1;
            continue;
        }
        if w == "-" && sp.assignments {
            // `env -`: like -i.
            i += 1;
            continue;
        }
        if sp.assignments && positionals == 0 {
            if let Some((name, _)) = w.split_once('=') {
                if !name.is_empty() {
                    assigned.insert(name.to_string());
                    i += 1;
                    continue;
                }
            }
        }
        if positionals < sp.positionals {
            positionals += 1;
            i += 1;
            continue;
        }
        return Ok((opts, i));
    }
    Ok((opts, i))
}

fn has(opts: &Opts, names: &[&str]) -> bool {
    opts.iter().any(|(n, _)| names.contains(&n.as_str()))
}

fn value<'a>(opts: &'a Opts, names: &[&str]) -> Option<&'a Arg> {
    opts.iter()
        .rev()
        .find(|(n, _)| names.contains(&n.as_str()))
        .and_then(|(_, v)| v.as_ref())
}

/// The words joined as a shell would see them, if all are known.
fn joined(words: &[Arg]) -> Option<String> {
    words
        .iter()
        .map(Arg::literal)
        .collect::<Option<Vec<_>>>()
        .map(|w| w.join(" "))
}

/// Words a program fills in at run time (`{}` of find and xargs).
fn placeholders(words: &[Arg], marker: &str) -> Vec<Arg> {
    words
        .iter()
        .map(|w| {
            if w.known().contains(marker) {
                Arg::dynamic()
            } else {
                w.clone()
            }
        })
        .collect()
}

struct Walk {
    out: Analysis,
    home: Option<String>,
}

impl Walk {
    fn script(&mut self, text: &str, via: Vec<String>, depth: usize) {
        // Its depth limit is the parser's.
        let s = shell::parse(text, self.home.as_deref(), depth);
        for u in s.unknown {
            self.out.unknowable(u);
        }
        self.out.assigned.extend(s.assigned);
        for c in s.commands {
            self.words(c.words, via.clone(), depth, &s.functions);
        }
    }

    fn sub_script(&mut self, script: &Arg, via: Vec<String>, depth: usize, what: &str) {
        match script.literal() {
            Some(s) => self.script(&s, via, depth + 1),
            None => self.out.unknowable(format!(
                "{what} runs a line only known when it runs ({})",
                script.shown()
            )),
        }
    }

    fn push(&mut self, argv: &[Arg], via: &[String], builtin: bool) {
        if self.out.execs.len() < shell::MAX_COMMANDS {
            self.out.execs.push(Exec {
                argv: argv.to_vec(),
                via: via.to_vec(),
                builtin,
            });
        } else {
            self.out.unknowable(format!(
                "more than {} programs in one command",
                shell::MAX_COMMANDS
            ));
        }
    }

    /// One command's words: the program, then (for wrappers and shells)
    /// what it runs in turn.
    fn words(
        &mut self,
        words: Vec<Arg>,
        mut via: Vec<String>,
        depth: usize,
        functions: &BTreeSet<String>,
    ) {
        let Some(first) = words.first() else {
            return;
        };
        let Some(program) = first.literal() else {
            self.out.unknowable(format!(
                "the program name {:?} is only known when it runs",
                first.shown()
            ));
            self.push(&words, &via, false);
            return;
        };
        if depth > MAX_DEPTH {
            self.out
                .unknowable(format!("commands nested more than {MAX_DEPTH} levels deep"));
            return;
        }
        let name = base(&program).to_string();
        let args = &words[1..];
        if functions.contains(&program) {
            // Its body is in the line and was analysed there.
            self.push(&words, &via, true);
            return;
        }
        match name.as_str() {
            "eval" => {
                self.push(&words, &via, true);
                via.push("eval".into());
                match joined(args) {
                    Some(s) => self.script(&s, via, depth + 1),
                    None => self.out.unknowable("eval of text only known when it runs"),
                }
                return;
            }
            "trap" => {
                self.push(&words, &via, true);
                if let Some(action) = args.first() {
                    if args.len() > 1 && !action.known().starts_with('-') {
                        via.push("trap".into());
                        self.sub_script(action, via, depth, "trap");
                    }
                }
                return;
            }
            // A file's commands are like a program's: not read here (the
            // policy file says so), and not unknowable either.
            "." | "source" => {
                self.push(&words, &via, true);
                return;
            }
            "alias" | "enable" | "fc" | "hash" if !args.is_empty() => {
                self.push(&words, &via, true);
                self.out
                    .unknowable(format!("`{name}` changes what names run"));
                return;
            }
            "cd" | "pushd" | "popd" => self.out.changes_dir = true,
            _ => {}
        }
        // `exec`, `command` and `builtin` are the shell's own; what they
        // start is judged below.
        let plain = (PLAIN_BUILTINS.contains(&name.as_str())
            || matches!(name.as_str(), "exec" | "command" | "builtin"))
            && !program.contains('/');
        self.push(&words, &via, plain);
        if SHELLS.contains(&name.as_str()) {
            via.push(format!("{name} -c"));
            self.shell(&name, args, via, depth);
            return;
        }
        match name.as_str() {
            "busybox" => {
                if let Some(applet) = args.first().and_then(Arg::literal) {
                    if !applet.starts_with('-') {
                        via.push("busybox".into());
                        self.words(args.to_vec(), via, depth + 1, &BTreeSet::new());
                    }
                }
            }
            "find" => self.find(args, via, depth),
            "su" | "runuser" => self.su(&name, args, via, depth),
            _ => {
                if let Some(sp) = spec(&name) {
                    self.wrapper(&name, &sp, args, via, depth);
                }
            }
        }
    }

    fn wrapper(&mut self, name: &str, sp: &Spec, args: &[Arg], mut via: Vec<String>, depth: usize) {
        let (opts, at) = match read_options(sp, args, &mut self.out.assigned) {
            Ok(r) => r,
            Err(why) => {
                self.out
                    .unknowable(format!("cannot tell what `{name}` runs: {why}"));
                return;
            }
        };
        let mut inner = args[at..].to_vec();
        via.push(name.to_string());
        match name {
            "env" if has(&opts, &["S", "split-string"]) => {
                self.out
                    .unknowable("`env -S` splits a string into a command");
                return;
            }
            "env" if has(&opts, &["C", "chdir"]) => self.out.changes_dir = true,
            "command" if has(&opts, &["v", "V"]) => return,
            "ionice" if has(&opts, &["p", "P", "u", "pid", "pgid", "uid"]) => return,
            "taskset" | "chrt" if has(&opts, &["p", "pid", "m", "max"]) => return,
            "sudo"
                if has(
                    &opts,
                    &["e", "edit", "l", "list", "v", "validate", "V", "k", "K"],
                ) =>
            {
                return
            }
            "sudo" | "doas" if has(&opts, &["s", "shell", "i", "login"]) => {
                if !inner.is_empty() {
                    match joined(&inner) {
                        Some(s) => self.script(&s, via, depth + 1),
                        None => self
                            .out
                            .unknowable(format!("`{name} -s` runs a line only known when it runs")),
                    }
                }
                return;
            }
            "xargs" => {
                let replace = value(&opts, &["I"])
                    .and_then(Arg::literal)
                    .or_else(|| has(&opts, &["i", "replace"]).then(|| "{}".to_string()));
                if let Some(r) = replace {
                    inner = placeholders(&inner, &r);
                }
                if inner.is_empty() {
                    inner = vec![Arg::lit("echo")];
                }
            }
            "watch" if !has(&opts, &["x", "exec"]) => {
                match joined(&inner) {
                    Some(s) => self.script(&s, via, depth + 1),
                    None => self
                        .out
                        .unknowable("`watch` runs a line only known when it runs"),
                }
                return;
            }
            "flock" => {
                if let Some(script) = value(&opts, &["c", "command"]).cloned() {
                    self.sub_script(&script, via, depth, "flock -c");
                    return;
                }
            }
            _ => {}
        }
        if !inner.is_empty() {
            self.words(inner, via, depth + 1, &BTreeSet::new());
        }
    }

    /// `sh -c SCRIPT`, or a shell reading a file or its input.
    fn shell(&mut self, name: &str, args: &[Arg], via: Vec<String>, depth: usize) {
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
                if w[1..].contains('c') {
                    c = true;
                }
                if w.starts_with('-') && w[1..].contains('s') {
                    stdin = true;
                }
                if w[1..].contains(['o', 'O']) {
                    i += 1;
                }
                i += 1;
                continue;
            }
            break;
        }
        if stdin && !c {
            self.out
                .unknowable(format!("{name} -s reads commands from its input"));
            return;
        }
        match (c, args.get(i)) {
            (true, Some(script)) => self.sub_script(script, via, depth, &format!("{name} -c")),
            (true, None) => {}
            // A script file is like any program: its name is known.
            (false, Some(f)) if !f.is_dynamic() => {}
            (false, Some(f)) => self.out.unknowable(format!(
                "{name} runs a script file only known when it runs ({})",
                f.shown()
            )),
            // `… | sh`: the commands are whatever comes in, like eval.
            (false, None) => self
                .out
                .unknowable(format!("{name} reads commands from its input")),
        }
    }

    /// `find … -exec CMD … ;` (and -execdir, -ok, -okdir).
    fn find(&mut self, args: &[Arg], mut via: Vec<String>, depth: usize) {
        via.push("find -exec".into());
        let mut i = 0;
        while i < args.len() {
            let w = args[i].literal();
            if matches!(w.as_deref(), Some("-exec" | "-execdir" | "-ok" | "-okdir")) {
                let start = i + 1;
                let mut end = start;
                while end < args.len() && !matches!(args[end].literal().as_deref(), Some(";" | "+"))
                {
                    end += 1;
                }
                let inner = placeholders(&args[start..end], "{}");
                self.words(inner, via.clone(), depth + 1, &BTreeSet::new());
                i = end;
            }
            i += 1;
        }
    }

    /// `su [user] -c SCRIPT` (options may follow the user).
    fn su(&mut self, name: &str, args: &[Arg], mut via: Vec<String>, depth: usize) {
        via.push(format!("{name} -c"));
        let mut i = 0;
        while i < args.len() {
            let w = args[i].known();
            if args[i].parts.iter().all(|p| *p == Part::Dyn) {
                self.out
                    .unknowable(format!("{name} is given a word only known when it runs"));
            }
            let script = if w == "-c" || w == "--command" || w == "--session-command" {
                i += 1;
                args.get(i).cloned()
            } else if let Some(v) = w
                .strip_prefix("--command=")
                .or_else(|| w.strip_prefix("--session-command="))
            {
                Some(Arg::lit(v))
            } else if w.starts_with("-c") && w.len() > 2 && args[i].literal().is_some() {
                Some(Arg::lit(&w[2..]))
            } else {
                None
            };
            if let Some(s) = script {
                self.sub_script(&s, via.clone(), depth, &format!("{name} -c"));
            }
            i += 1;
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
        let cases: &[(&str, &[&str])] = &[
            ("env -u B A=1 su -c id", &["env", "su", "id"]),
            (
                "nice -n 5 nohup timeout -s KILL 10 su",
                &["nice", "nohup", "timeout", "su"],
            ),
            ("nice -5 su", &["nice", "su"]),
            (
                "find / -maxdepth 0 -exec su -c id ';'",
                &["find", "su", "id"],
            ),
            ("busybox su", &["busybox", "su"]),
            ("sudo -u root -- doas su", &["sudo", "doas", "su"]),
            ("xargs -n1 su", &["xargs", "su"]),
            (
                "stdbuf -oL setsid -f ionice -c3 chrt 5 taskset 3 su",
                &["stdbuf", "setsid", "ionice", "chrt", "taskset", "su"],
            ),
            (
                "command su; exec su; builtin echo",
                &["command", "su", "exec", "su", "builtin", "echo"],
            ),
            ("sh -c 'bash -ec \"su\"'", &["sh", "bash", "su"]),
            ("eval \"s\"\"u -c id\"", &["eval", "su", "id"]),
            ("trap 'su' EXIT", &["trap", "su"]),
            ("watch -n1 su -c id", &["watch", "su", "id"]),
            ("flock /tmp/l su", &["flock", "su"]),
            ("flock -c 'su' /tmp/l", &["flock", "su"]),
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
        let builtin: Vec<(String, bool)> = a
            .execs
            .iter()
            .map(|e| (e.name().unwrap_or_default(), e.builtin))
            .collect();
        assert_eq!(
            builtin,
            [("ls", false), ("f", true), ("cd", true), ("echo", true)]
                .map(|(a, b)| (a.to_string(), b))
                .to_vec()
        );
        assert!(a.changes_dir);
    }
}
