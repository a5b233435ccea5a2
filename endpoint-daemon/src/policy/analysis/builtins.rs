//! Shell builtins that run more than themselves: `eval`, `trap`, `.`,
//! `jobs -x`, `mapfile -C`, `compgen -C/-W`, and those that assign
//! variables by name (`read PATH`, `printf -v`, `declare`, `export`).

use super::{vars, Ctx, Walk};
use crate::shell::{Arg, Part};

/// Builtins that assign the variables their words name.
const ASSIGNING: &[&str] = &[
    "read", "printf", "getopts", "declare", "typeset", "local", "export", "readonly",
];

impl Walk {
    /// A builtin that runs commands or files of code; returns whether it
    /// was handled here (and listed), else it is judged as a program.
    pub(super) fn builtin(&mut self, name: &str, words: &[Arg], cx: &Ctx, function: bool) -> bool {
        let args = &words[1..];
        let first = args.first().and_then(Arg::literal);
        match name {
            "eval" => {
                self.push(words, cx, true, function);
                let rest = if first.as_deref() == Some("--") {
                    &args[1..]
                } else {
                    args
                };
                self.joined_script(rest, cx, "eval");
            }
            "trap" => {
                self.push(words, cx, true, function);
                self.trap(args, cx);
            }
            "." | "source" => {
                self.push(words, cx, true, function);
                self.source(name, args, cx);
            }
            // (`hash` only with -p NAME=FILE; `hash -r` forgets.)
            "alias" | "enable" | "fc" | "hash" | "bind"
                if !args.is_empty()
                    && (name != "hash"
                        || args.iter().any(|a| {
                            a.literal()
                                .is_none_or(|w| w.starts_with('-') && w.contains('p'))
                        })) =>
            {
                self.push(words, cx, true, function);
                self.out
                    .unknowable(format!("`{name}` changes what names run"));
            }
            "jobs" if first.as_deref() == Some("-x") => {
                self.push(words, cx, true, function);
                self.words(args[1..].to_vec(), cx.inner("jobs -x"));
            }
            "mapfile" | "readarray" | "compgen" | "complete" => {
                self.push(words, cx, true, function);
                self.callbacks(name, args, cx);
            }
            "cd" | "pushd" | "popd" => {
                self.out.changes_dir = true;
                return false;
            }
            _ if ASSIGNING.contains(&name) => {
                self.assigning(name, args, cx);
                return false;
            }
            _ => return false,
        }
        true
    }

    /// `trap [--] ACTION SIGNAL…`: the action is a line run later.
    fn trap(&mut self, args: &[Arg], cx: &Ctx) {
        let mut rest = args;
        match rest.first().and_then(Arg::literal).as_deref() {
            Some("--") => rest = &rest[1..],
            // Listing only.
            Some("-l" | "-p" | "-P") => return,
            _ => {}
        }
        match rest {
            [] => {}
            // `trap N`: a signal to reset, unless it cannot be one.
            [one] => {
                let signal = one
                    .literal()
                    .is_some_and(|t| t.chars().all(|c| c.is_ascii_alphanumeric() || c == '+'));
                if !signal {
                    self.sub_script(one, cx, "trap");
                }
            }
            [action, ..] => {
                if action.literal().as_deref() != Some("-") {
                    self.sub_script(action, cx, "trap");
                }
            }
        }
    }

    /// `. FILE` / `source FILE`: commands of a file. Known text (a
    /// here-document on `/dev/stdin`) is analysed, a pipe or a process
    /// substitution is unknowable, and a file on disk is code nobody
    /// listed: an allow-list cannot vouch for it.
    fn source(&mut self, name: &str, args: &[Arg], cx: &Ctx) {
        let mut rest = args;
        if rest.first().and_then(Arg::literal).as_deref() == Some("--") {
            rest = &rest[1..];
        }
        // bash 5.3: `source -p PATH FILE`.
        if rest.first().and_then(Arg::literal).as_deref() == Some("-p") {
            rest = rest.get(2..).unwrap_or(&[]);
        }
        let Some(file) = rest.first() else {
            return;
        };
        self.out.relocate(format!(
            "`{name} {}` runs the commands of a file",
            file.shown()
        ));
        self.code_from_file(file, cx, name);
    }

    /// `mapfile -C CALLBACK`, `compgen -C COMMAND` / `-W WORDS` / `-V VAR`:
    /// text the shell runs or expands.
    fn callbacks(&mut self, name: &str, args: &[Arg], cx: &Ctx) {
        let (values, flags): (&str, &str) = match name {
            "mapfile" | "readarray" => ("dnOsuCc", "t"),
            // compgen and complete.
            _ => ("oAGWFCXPSV", "abcdefgjksuvpDEIr"),
        };
        let mut i = 0;
        let mut operands = Vec::new();
        while i < args.len() {
            let a = &args[i];
            let Some(w) = a.literal() else {
                if a.known().starts_with('-') || matches!(a.parts.first(), Some(Part::Dyn)) {
                    self.out
                        .unknowable(format!("{name} is given an option only known when it runs"));
                    return;
                }
                operands.push(a.clone());
                i += 1;
                continue;
            };
            if w == "--" {
                operands.extend(args[i + 1..].iter().cloned());
                break;
            }
            let Some(opts) = w.strip_prefix('-').filter(|o| !o.is_empty()) else {
                operands.push(a.clone());
                i += 1;
                continue;
            };
            for (k, c) in opts.char_indices() {
                if values.contains(c) {
                    let value = match &opts[k + c.len_utf8()..] {
                        "" => {
                            i += 1;
                            args.get(i).cloned().unwrap_or_default()
                        }
                        glued => Arg::lit(glued),
                    };
                    self.callback_option(name, c, &value, cx);
                    break;
                } else if !flags.contains(c) {
                    self.out
                        .unknowable(format!("{name} is given an unknown option -{c}"));
                    return;
                }
            }
            i += 1;
        }
        if matches!(name, "mapfile" | "readarray") {
            // The array it fills: MAPFILE, or the last operand.
            for a in operands.iter().rev().take(1) {
                self.assigned_word(name, a);
            }
        }
    }

    fn callback_option(&mut self, name: &str, option: char, value: &Arg, cx: &Ctx) {
        let what = format!("{name} -{option}");
        match (name, option) {
            // Called with words appended (an index and a line; the words
            // completed), which may change what it runs: `sudo -u`.
            ("mapfile" | "readarray", 'C') | ("compgen" | "complete", 'C') => {
                match value.literal() {
                    Some(v) => self.script(&format!("{v} \"$1\" \"$2\" \"$3\""), &cx.inner(&what)),
                    None => self
                        .out
                        .unknowable(format!("{what} runs a line only known when it runs")),
                }
            }
            // Each word is expanded as the shell would: `$(…)` runs.
            ("compgen" | "complete", 'W') => match value.literal() {
                Some(v) => self.script(&format!(": {v}"), &cx.inner(&what)),
                None => self
                    .out
                    .unknowable(format!("{what} expands words only known when it runs")),
            },
            ("compgen", 'V') => self.assigned_word(name, value),
            _ => {}
        }
    }

    /// `read NAME`, `printf -v NAME`, `declare [-n] NAME=VALUE`, … : the
    /// variables they assign, and values that are command lines.
    fn assigning(&mut self, name: &str, args: &[Arg], cx: &Ctx) {
        let mut i = 0;
        let mut nameref = false;
        let mut options = true;
        while i < args.len() {
            let a = &args[i];
            let w = a.literal();
            if options {
                match w.as_deref() {
                    Some("--") => {
                        options = false;
                        i += 1;
                        continue;
                    }
                    Some(o) if (o.starts_with('-') || o.starts_with('+')) && o.len() > 1 => {
                        let letters = &o[1..];
                        nameref |= matches!(name, "declare" | "typeset" | "local")
                            && letters.contains('n');
                        // Options whose value is a variable name, or not.
                        let (named, valued): (&str, &str) = match name {
                            "read" => ("a", "dinNptu"),
                            "printf" => ("v", ""),
                            _ => ("", ""),
                        };
                        for (k, c) in letters.char_indices() {
                            if named.contains(c) || valued.contains(c) {
                                let value = match &letters[k + 1..] {
                                    "" => {
                                        i += 1;
                                        args.get(i).cloned().unwrap_or_default()
                                    }
                                    glued => Arg::lit(glued),
                                };
                                if named.contains(c) {
                                    self.assigned_word(name, &value);
                                }
                                break;
                            }
                        }
                        i += 1;
                        continue;
                    }
                    _ if a.is_dynamic() && a.known().starts_with('-') => {
                        self.out.unknowable(format!(
                            "{name} is given an option only known when it runs"
                        ));
                        i += 1;
                        continue;
                    }
                    _ => {}
                }
            }
            match name {
                // printf's operands are its format and arguments.
                "printf" => break,
                // getopts OPTSTRING NAME [ARGS]: only NAME.
                "getopts" => {
                    if let Some(n) = args.get(i + 1) {
                        self.assigned_word(name, n);
                    }
                    break;
                }
                _ => {}
            }
            self.assigned_word(name, a);
            if nameref {
                // `declare -n r=PATH`: assigning r assigns PATH; a target
                // set later or only known when it runs could be any.
                match (a.literal(), a.known().split_once('=')) {
                    (Some(_), Some((_, target))) => {
                        self.out.assigned.insert(target.to_string());
                    }
                    _ => self.out.unknowable(format!(
                        "{name} -n refers to a variable only known when it runs"
                    )),
                }
            }
            if let (Some(w), true) = (
                a.literal(),
                matches!(
                    name,
                    "declare" | "typeset" | "local" | "export" | "readonly"
                ),
            ) {
                if let Some((n, v)) = w.split_once('=') {
                    let n = n.trim_end_matches('+');
                    if vars::runs_value(n) {
                        self.assignment(n, &Arg::lit(v), cx);
                    }
                }
            } else if let Some((n, _)) = a.known().split_once('=') {
                if vars::runs_value(n.trim_end_matches('+')) {
                    self.out
                        .unknowable(format!("{n} is set to a command only known when it runs"));
                }
            }
            i += 1;
        }
    }

    /// A word naming a variable a builtin assigns (`NAME`, `NAME=value`,
    /// `NAME[i]`): one only known when it runs could be any (PATH).
    fn assigned_word(&mut self, builtin: &str, a: &Arg) {
        let first = match a.parts.first() {
            Some(Part::Lit(t)) => t.clone(),
            _ => String::new(),
        };
        let end = first
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(first.len());
        let name = &first[..end];
        let whole = end < first.len() || a.parts.len() == 1;
        if !name.is_empty() && whole {
            self.out.assigned.insert(name.to_string());
            let declares = matches!(
                builtin,
                "declare" | "typeset" | "local" | "export" | "readonly"
            );
            // `read EDITOR`: a command line from the input.
            if vars::runs_value(name) && !declares {
                self.out.unknowable(format!(
                    "{builtin} sets {name}, a command line, to text only known when it runs"
                ));
            }
        } else if a.is_dynamic() {
            self.out.unknowable(format!(
                "{builtin} assigns a variable only known when it runs ({})",
                a.shown()
            ));
        }
    }
}
