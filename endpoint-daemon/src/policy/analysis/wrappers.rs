//! Programs known to run their arguments as a command, and how to find it
//! among their options: a table of option syntaxes ([`super::specs`]), and code
//! for the few whose syntax a table cannot say (`su`, `find`, `gdb`,
//! `tmux`). An option none of these knows makes what runs unknowable.

use super::specs::{spec, Spec, OPAQUE, TMUX_SAFE};
use super::{Ctx, Exec, Walk, OTHER_SHELLS, SHELLS};
use crate::shell::{Arg, Part};

/// A wrapper's options as read: (option name, its value).
pub(super) type Opts = Vec<(String, Option<Arg>)>;

/// Reads a wrapper's options, assignments and positionals; returns them
/// and the index of the command it runs. Err: a word that makes what it
/// runs unknowable (an unknown option, a dynamic word).
pub(super) fn read_options(
    sp: &Spec,
    args: &[Arg],
    assigns: &mut Vec<(String, Arg)>,
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
            } else if sp.long_flags.contains(&name.as_str()) || sp.any_long {
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
            opts.push(("i".into(), None));
            i += 1;
            continue;
        }
        if sp.assignments && positionals == 0 {
            if let Some((name, value)) = w.split_once('=') {
                if !name.is_empty() {
                    assigns.push((name.to_string(), Arg::lit(value)));
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

fn has(opts: &Opts, names: &[&str]) -> Option<String> {
    opts.iter()
        .find(|(n, _)| names.contains(&n.as_str()))
        .map(|(n, _)| n.clone())
}

fn value<'a>(opts: &'a Opts, names: &[&str]) -> Option<&'a Arg> {
    opts.iter()
        .rev()
        .find(|(n, _)| names.contains(&n.as_str()))
        .and_then(|(_, v)| v.as_ref())
}

/// Words a program fills in at run time (the `{}` of xargs -I).
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

// Dispatch by name, and the wrappers a `Spec` describes (`env`, `sudo`,
// `xargs`, `timeout`, …).
impl Walk {
    /// What program `name` runs, given `args`, besides itself.
    pub(super) fn runs(&mut self, name: &str, args: &[Arg], cx: &Ctx) {
        if SHELLS.contains(&name) || OTHER_SHELLS.contains(&name) {
            self.shell(name, args, cx);
            return;
        }
        if OPAQUE.contains(&name) {
            self.out
                .unknowable(format!("what `{name}` runs cannot be read from its words"));
            return;
        }
        match name {
            "busybox" | "toybox" => match args.first().map(|a| (a, a.literal())) {
                Some((_, Some(applet))) if applet.starts_with('-') => {}
                Some((_, Some(_))) => self.words(args.to_vec(), cx.inner(name)),
                Some((a, None)) => self.out.unknowable(format!(
                    "{name} runs an applet only known when it runs ({})",
                    a.shown()
                )),
                None => {}
            },
            "find" => self.find(args, cx),
            "su" | "runuser" => self.su(name, args, cx),
            "sg" => self.sg(args, cx),
            "gdb" => self.gdb(args, cx),
            "tmux" => self.tmux(args),
            "perf" => {
                let runs = args.iter().filter_map(Arg::literal).any(|w| {
                    matches!(
                        w.as_str(),
                        "record"
                            | "stat"
                            | "trace"
                            | "script"
                            | "kvm"
                            | "sched"
                            | "lock"
                            | "mem"
                            | "c2c"
                            | "kmem"
                            | "ftrace"
                            | "test"
                            | "kwork"
                            | "iostat"
                    )
                });
                if runs {
                    self.out
                        .unknowable("what `perf` runs cannot be read from its words");
                }
            }
            "nix" => {
                let runs = args
                    .iter()
                    .filter_map(Arg::literal)
                    .any(|w| matches!(w.as_str(), "develop" | "shell" | "run" | "env" | "bundle"));
                if runs {
                    self.out
                        .unknowable("what `nix` runs cannot be read from its words");
                }
            }
            "git" => self.git(args, cx),
            _ => {
                if let Some(sp) = spec(name) {
                    self.wrapper(name, &sp, args, cx);
                }
            }
        }
    }

    fn wrapper(&mut self, name: &str, sp: &Spec, args: &[Arg], cx: &Ctx) {
        let mut args = args;
        if !sp.subcommands.is_empty() {
            match args.first().map(|a| (a, a.literal())) {
                None => return,
                Some((_, Some(s))) if sp.subcommands.contains(&s.as_str()) => args = &args[1..],
                // Another subcommand: it runs no command it is given.
                Some((_, Some(s))) if !s.starts_with('-') => return,
                Some((a, _)) => {
                    self.out.unknowable(format!(
                        "cannot tell what `{name}` runs: {} before its subcommand",
                        a.shown()
                    ));
                    return;
                }
            }
        }
        let mut assigns = Vec::new();
        let (opts, at) = match read_options(sp, args, &mut assigns) {
            Ok(r) => r,
            Err(why) => {
                self.out
                    .unknowable(format!("cannot tell what `{name}` runs: {why}"));
                return;
            }
        };
        for (n, v) in &assigns {
            self.assignment(n, v, cx);
        }
        for (_, v) in opts.iter().filter(|(o, _)| sp.env.contains(&o.as_str())) {
            match v.as_ref().and_then(Arg::literal) {
                Some(kv) => {
                    let (n, v) = kv.split_once('=').unwrap_or((&kv, ""));
                    self.assignment(n, &Arg::lit(v), cx);
                }
                None => self
                    .out
                    .unknowable(format!("`{name}` sets a variable only known when it runs")),
            }
        }
        if let Some(o) = has(&opts, sp.unknowable) {
            self.out.unknowable(format!(
                "what `{name}` runs with option {o} is not in the command"
            ));
            return;
        }
        if has(&opts, sp.stops).is_some() {
            return;
        }
        if has(&opts, sp.chdir).is_some() {
            self.out.changes_dir = true;
        }
        if sp.relocates {
            self.out.relocate(format!(
                "`{name}` runs its command's name from other directories than byomd's PATH"
            ));
        }
        let cx = &cx.inner(name);
        let mut scripted = false;
        for (o, v) in opts
            .iter()
            .filter(|(o, _)| sp.scripts.contains(&o.as_str()))
        {
            scripted = true;
            let v = v.clone().unwrap_or_default();
            self.sub_script(&v, cx, &format!("{name} -{o}"));
        }
        let mut inner = args[at..].to_vec();
        if sp.no_command {
            inner.clear();
        }
        match name {
            "env" | "command" | "setpriv" => {
                // A PATH of nothing, the default one, or none.
                let unset_path = value(&opts, &["u", "unset"])
                    .is_some_and(|v| !matches!(v.literal(), Some(n) if n != "PATH"));
                if has(&opts, &["i", "ignore-environment", "p", "reset-env"]).is_some()
                    || unset_path
                {
                    self.out
                        .relocate(format!("`{name}` runs its command with another PATH"));
                }
            }
            "sudo" | "doas" if has(&opts, &["s", "shell", "i", "login"]).is_some() => {
                if inner.is_empty() {
                    self.code_from_fd(0, cx, name);
                } else {
                    self.joined_script(&inner, cx, &format!("{name} -s"));
                }
                return;
            }
            "sudo" if has(&opts, &["R", "chroot"]).is_some() => {
                self.out
                    .relocate("`sudo -R` runs its command in another root");
            }
            "xargs" => {
                let replace = value(&opts, &["I", "replace"])
                    .and_then(Arg::literal)
                    .or_else(|| has(&opts, &["i", "replace"]).map(|_| "{}".to_string()));
                match &replace {
                    Some(r) => inner = placeholders(&inner, r),
                    // What it reads is appended: any words, options too.
                    None => inner.push(Arg::words()),
                }
                if inner.len() == 1 && replace.is_none() {
                    inner.insert(0, Arg::lit("echo"));
                }
            }
            "watch" if has(&opts, &["x", "exec"]).is_none() => {
                self.joined_script(&inner, cx, "watch");
                return;
            }
            "flock" => {
                let first = inner.first().and_then(Arg::literal);
                if matches!(first.as_deref(), Some("-c" | "--command")) {
                    let line = inner.get(1).cloned().unwrap_or_default();
                    self.sub_script(&line, cx, "flock -c");
                    return;
                }
            }
            "strace" => {
                let piped = opts.iter().any(|(o, v)| {
                    matches!(o.as_str(), "o" | "output")
                        && v.as_ref()
                            .is_some_and(|v| !v.known().starts_with(|c| c != '|' && c != '!'))
                });
                if piped {
                    self.out
                        .unknowable("`strace -o |LINE` runs a line with the shell");
                }
            }
            _ => {}
        }
        if inner.is_empty() {
            if sp.shell_if_empty && !scripted {
                self.code_from_fd(0, cx, name);
            }
            return;
        }
        self.words(inner, cx.clone());
    }
}

// Programs whose syntax no table can say, each read by hand: the shell
// `su` and `sg` start, gdb's batch commands, tmux's commands and `find`'s
// actions.
impl Walk {
    /// `su [options] [user [args]]` and `runuser`: a shell (the user's, or
    /// `-s SHELL`) runs `-c LINE` and the words after the user; `runuser
    /// -u USER CMD…` runs the command itself.
    fn su(&mut self, name: &str, args: &[Arg], cx: &Ctx) {
        let cx = &cx.inner(name);
        let runuser = name == "runuser";
        let (mut script, mut shell, mut user) = (None, None, false);
        let mut positionals = Vec::new();
        let mut options = true;
        let mut i = 0;
        while i < args.len() {
            let Some(w) = args[i].literal() else {
                self.out
                    .unknowable(format!("{name} is given a word only known when it runs"));
                return;
            };
            let next = |i: &mut usize| {
                *i += 1;
                args.get(*i).cloned().unwrap_or_default()
            };
            let long = |p: &str| w.strip_prefix(p).map(Arg::lit);
            match w.as_str() {
                _ if !options || !w.starts_with('-') || w == "-" => {
                    if w != "-" || !options {
                        positionals.push(args[i].clone());
                    }
                }
                "--" => options = false,
                "-c" | "--command" | "--session-command" => script = Some(next(&mut i)),
                "-s" | "--shell" => shell = Some(next(&mut i)),
                "-u" | "--user" if runuser => {
                    next(&mut i);
                    user = true;
                }
                "-g" | "--group" | "-G" | "--supp-group" | "-w" | "--whitelist-environment" => {
                    next(&mut i);
                }
                "-l"
                | "--login"
                | "-m"
                | "-p"
                | "--preserve-environment"
                | "-f"
                | "--fast"
                | "-P"
                | "--pty" => {}
                _ => {
                    if let Some(v) = long("--command=").or_else(|| long("--session-command=")) {
                        script = Some(v);
                    } else if let Some(v) = long("--shell=") {
                        shell = Some(v);
                    } else if long("--user=").is_some() && runuser {
                        user = true;
                    } else if let Some(v) = w.strip_prefix("-c") {
                        script = Some(Arg::lit(v));
                    } else if let Some(v) = w.strip_prefix("-s") {
                        shell = Some(Arg::lit(v));
                    } else if !(w.starts_with("--group=")
                        || w.starts_with("--supp-group=")
                        || w[1..].chars().all(|c| "lmpfP".contains(c)))
                    {
                        self.out
                            .unknowable(format!("cannot tell what `{name}` runs: {w}"));
                        return;
                    }
                }
            }
            i += 1;
        }
        if user && script.is_none() {
            match positionals.is_empty() {
                true => self.code_from_fd(0, cx, name),
                false => self.words(positionals, cx.clone()),
            }
            return;
        }
        let mut sh_args = Vec::new();
        if let Some(s) = script {
            sh_args.extend([Arg::lit("-c"), s]);
        }
        sh_args.extend(positionals.into_iter().skip(usize::from(!user)));
        match shell {
            Some(sh) => {
                let mut w = vec![sh];
                w.extend(sh_args);
                self.words(w, cx.clone());
            }
            None => self.shell("sh", &sh_args, cx),
        }
    }

    /// `sg [-] GROUP [-c] COMMAND`: the command is a line for /bin/sh.
    fn sg(&mut self, args: &[Arg], cx: &Ctx) {
        let mut rest = args;
        if rest.first().and_then(Arg::literal).as_deref() == Some("-") {
            rest = &rest[1..];
        }
        let mut rest = rest.get(1..).unwrap_or(&[]);
        if rest.first().and_then(Arg::literal).as_deref() == Some("-c") {
            rest = &rest[1..];
        }
        if rest.is_empty() {
            self.code_from_fd(0, cx, "sg");
        } else {
            self.joined_script(rest, cx, "sg");
        }
    }

    /// gdb runs commands from its input, `-ex` and files; it is read only
    /// in batch mode with commands known to run nothing but the program.
    fn gdb(&mut self, args: &[Arg], cx: &Ctx) {
        const SAFE: &[&str] = &[
            "run",
            "r",
            "bt",
            "backtrace",
            "bt full",
            "backtrace full",
            "thread apply all bt",
            "thread apply all bt full",
            "info registers",
            "info threads",
            "quit",
            "q",
        ];
        let words: Vec<Option<String>> = args.iter().map(Arg::literal).collect();
        let (mut batch, mut readable, mut program) = (false, true, None);
        let mut i = 0;
        while i < words.len() {
            match words[i].as_deref() {
                Some("--args") => {
                    program = Some(i + 1);
                    break;
                }
                Some("-ex" | "--ex" | "-eval-command" | "--eval-command") => {
                    i += 1;
                    let command = words.get(i).and_then(|w| w.as_deref());
                    readable &= command.is_some_and(|c| SAFE.contains(&c));
                }
                Some("-batch" | "--batch") => batch = true,
                Some(
                    "-q" | "-quiet" | "--quiet" | "-silent" | "--silent" | "-nx" | "--nx" | "-n"
                    | "-nh",
                ) => {}
                // The program, then a core file or a process.
                Some(w) if !w.starts_with('-') => {
                    program.get_or_insert(i);
                }
                _ => readable = false,
            }
            i += 1;
        }
        if !(batch && readable) {
            self.out
                .unknowable("gdb runs commands from its input, -ex or files");
            return;
        }
        if let Some(p) = program.filter(|p| *p < args.len()) {
            self.words(args[p..].to_vec(), cx.inner("gdb"));
        }
    }

    /// tmux runs shell lines in many of its commands (and in `#()` of its
    /// formats): only commands that run nothing are read.
    fn tmux(&mut self, args: &[Arg]) {
        let mut expect_command = true;
        let mut i = 0;
        while i < args.len() {
            let Some(w) = args[i].literal() else {
                self.out
                    .unknowable("tmux is given a word only known when it runs");
                return;
            };
            if w.contains("#(") {
                self.out.unknowable("a tmux format runs a shell line");
                return;
            }
            if expect_command {
                match w.as_str() {
                    "-L" | "-S" | "-T" => i += 1,
                    "-f" | "-c" => {
                        self.out
                            .unknowable("tmux -f/-c runs commands the command does not show");
                        return;
                    }
                    _ if w.starts_with('-') => {}
                    _ if TMUX_SAFE.contains(&w.as_str()) => expect_command = false,
                    _ => {
                        self.out
                            .unknowable(format!("`tmux {w}` may run shell lines"));
                        return;
                    }
                }
            } else if w == ";" || w.ends_with("\\;") {
                expect_command = true;
            }
            i += 1;
        }
    }

    /// `find START… EXPR`: `-exec CMD … {} ;` (and -execdir, -ok, -okdir)
    /// run CMD on what it finds, START or below it; `-delete` removes
    /// them, which is what `rm -rf` of them would do.
    fn find(&mut self, args: &[Arg], cx: &Ctx) {
        let mut i = 0;
        // -H -L -P, -D debugopts, -Olevel.
        while let Some(w) = args.get(i).and_then(Arg::literal) {
            match w.as_str() {
                "-H" | "-L" | "-P" => i += 1,
                "-D" => i += 2,
                _ if w.starts_with("-O") => i += 1,
                _ => break,
            }
        }
        let mut starts = Vec::new();
        while let Some(a) = args.get(i) {
            let k = a.known();
            if a.literal().is_some() && (k.starts_with('-') || k == "(" || k == "!" || k == ",") {
                break;
            }
            starts.push(a.clone());
            i += 1;
        }
        if starts.is_empty() {
            starts.push(Arg::lit("."));
        }
        // What `{}` may be: each start itself, or a path below it.
        let mut found = Vec::new();
        for s in starts.iter().take(16) {
            found.push(s.clone());
            let mut below = s.clone();
            below.parts.push(Part::Lit("/".into()));
            below.parts.push(Part::Below);
            found.push(below);
        }
        if starts.len() > 16 {
            found.push(Arg::dynamic());
        }
        let cx = &cx.inner("find -exec");
        while i < args.len() {
            match args[i].literal().as_deref() {
                Some("-exec" | "-execdir" | "-ok" | "-okdir") => {
                    let start = i + 1;
                    let mut end = start;
                    while end < args.len()
                        && !matches!(args[end].literal().as_deref(), Some(";" | "+"))
                    {
                        end += 1;
                    }
                    // Only words with `{}` differ between what it finds.
                    let uses = args[start..end].iter().any(|w| w.known().contains("{}"));
                    for f in found.iter().take(if uses { found.len() } else { 1 }) {
                        let inner = args[start..end]
                            .iter()
                            .map(|w| match w.literal().as_deref() {
                                Some("{}") => f.clone(),
                                _ if w.known().contains("{}") => Arg::dynamic(),
                                _ => w.clone(),
                            })
                            .collect();
                        self.words(inner, cx.clone());
                    }
                    i = end;
                }
                Some("-delete") => {
                    let mut argv = vec![Arg::lit("rm"), Arg::lit("-rf"), Arg::lit("--")];
                    argv.extend(found.iter().cloned());
                    let mut via = cx.via.clone();
                    via.pop();
                    via.push("find -delete".into());
                    self.push_exec(Exec {
                        argv,
                        via,
                        builtin: false,
                        function: false,
                        implied: true,
                    });
                }
                Some("-fprint" | "-fprint0" | "-fls" | "-fprintf") => {
                    if let Some(f) = args.get(i + 1) {
                        self.out.writes.push(f.clone());
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}
