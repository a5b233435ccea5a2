//! Rules over parsed commands: globs, command patterns (`git push`,
//! `rm -rf /`) matched on a program's argv (with operands as what they
//! may be when they run: [`operand`]), and the allow-list's resolved
//! executables ([`files`]).

pub mod files;
pub mod operand;

use std::path::{Path, PathBuf};

use super::analysis::{base, git, Exec};
use crate::shell::{Arg, Part};

/// Matches `text` against a glob (`*` any run of characters, `?` one,
/// `[*]` a literal star). Iterative, so hostile patterns stay linear-ish.
pub fn glob(pattern: &str, text: &str) -> bool {
    glob_with(pattern, text, true)
}

/// A glob whose `*` and `?` do not match `/` (as in a shell's paths).
pub fn path_glob(pattern: &str, text: &str) -> bool {
    glob_with(pattern, text, false)
}

/// `[*]` is a literal `*`. Runs for every rule on every command, so the
/// usual (ASCII) case allocates nothing.
fn glob_with(pattern: &str, text: &str, cross_slash: bool) -> bool {
    if pattern.is_ascii() && text.is_ascii() {
        glob_ascii(pattern.as_bytes(), text.as_bytes(), cross_slash)
    } else {
        glob_chars(pattern, text, cross_slash)
    }
}

fn glob_ascii(p: &[u8], t: &[u8], cross_slash: bool) -> bool {
    const LITERAL_STAR: &[u8] = b"[*]";
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        let any = cross_slash || t[ti] != b'/';
        let literal = p[pi..].starts_with(LITERAL_STAR);
        if literal && t[ti] == b'*' {
            pi += LITERAL_STAR.len();
            ti += 1;
        } else if pi < p.len() && !literal && ((p[pi] == b'?' && any) || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star.filter(|&(_, st)| cross_slash || t[st] != b'/') {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

fn glob_chars(pattern: &str, text: &str, cross_slash: bool) -> bool {
    let p: Vec<char> = pattern.replace("[*]", "\u{1}").chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        let any = cross_slash || t[ti] != '/';
        if pi < p.len()
            && ((p[pi] == '?' && any) || p[pi] == t[ti] || (p[pi] == '\u{1}' && t[ti] == '*'))
        {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star.filter(|&(_, st)| cross_slash || t[st] != '/') {
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

/// `~` and `~/…` as the home directory.
pub fn expand(p: &str, home: Option<&Path>) -> Option<PathBuf> {
    if p == "~" {
        return home.map(Path::to_path_buf);
    }
    if let Some(rest) = p.strip_prefix("~/") {
        return home.map(|h| h.join(rest));
    }
    Some(PathBuf::from(p))
}

pub use super::paths::normalize;

/// Programs with subcommands whose global options are known, so
/// `git -C dir -c k=v push` is `git push`: (program, short options that
/// take a value, long options that take a value).
const SUBCOMMANDS: &[(&str, &str, &[&str])] = &[
    (
        "git",
        "Cc",
        &[
            "git-dir",
            "work-tree",
            "namespace",
            "config-env",
            "super-prefix",
            "attr-source",
            "list-cmds",
        ],
    ),
    ("cargo", "CZ", &["config", "color", "manifest-path"]),
];

/// Long options a program accepts, for GNU-style unique prefixes
/// (`rm --rec`), and the short flag each stands for.
const LONG_FLAGS: &[(&str, &[(&str, char)])] = &[
    (
        "rm",
        &[
            ("recursive", 'r'),
            ("force", 'f'),
            ("dir", 'd'),
            ("interactive", 'i'),
            ("one-file-system", '\0'),
            ("no-preserve-root", '\0'),
            ("preserve-root", '\0'),
            ("verbose", 'v'),
        ],
    ),
    (
        "cp",
        &[("recursive", 'r'), ("force", 'f'), ("archive", 'a')],
    ),
    ("git", &[("force", 'f'), ("force-with-lease", '\0')]),
];

/// `-R` is `-r` for these.
const CAPITAL_R_IS_RECURSIVE: &[&str] = &["rm", "cp", "chmod", "chown", "chgrp"];

/// Where a command runs, for the paths of patterns.
#[derive(Debug, Clone, Copy, Default)]
pub struct Place<'a> {
    pub home: Option<&'a Path>,
    /// `dirs.roots`, for `{root}`.
    pub roots: &'a [String],
    /// The request's directory, when it exists (relative operands).
    pub cwd: Option<&'a Path>,
    /// The line changes directory: a relative operand may be anywhere.
    pub cwd_moves: bool,
}

/// A command pattern from the policy file: a program, then words.
/// `git push` matches git with subcommand push after its global options;
/// `rm -rf /` matches rm given -r and -f (any spelling: `-fr`, `-r -f`,
/// `--recursive --force`) and an operand that is `/` (also `//`, `/.`).
/// `{root}` stands for each of `dirs.roots`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    pub text: String,
    program: String,
    short: Vec<char>,
    long: Vec<String>,
    operands: Vec<String>,
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let mut words = text.split_whitespace();
        let Some(program) = words.next() else {
            return Err("an empty pattern".into());
        };
        let mut p = Pattern {
            text: text.to_string(),
            program: program.to_string(),
            short: Vec::new(),
            long: Vec::new(),
            operands: Vec::new(),
        };
        for w in words {
            if let Some(l) = w.strip_prefix("--").filter(|l| !l.is_empty()) {
                p.long.push(l.to_string());
            } else if let Some(s) = w.strip_prefix('-').filter(|s| !s.is_empty()) {
                for c in s.chars() {
                    p.short.push(canonical_short(base(program), c));
                }
            } else {
                p.operands.push(w.to_string());
            }
        }
        Ok(p)
    }

    /// Whether `exec` matches. What is only known when the command runs
    /// counts as a match (these rules deny or ask, so they err on that
    /// side): a subcommand that may be an alias, an operand built from a
    /// variable, words that may be the options the pattern wants.
    pub fn matches(&self, exec: &Exec, at: &Place) -> bool {
        let Some(program) = exec.program() else {
            return false;
        };
        let name = base(&program);
        if !self.program_is(&program, name) {
            // `git-push` (in git's exec path) is `git push`.
            if let Some(sub) = name.strip_prefix("git-") {
                if self.program_is("git", "git") {
                    let mut args = vec![Arg::lit(sub)];
                    args.extend(exec.argv[1..].iter().cloned());
                    return self.matches_args("git", &args, at);
                }
            }
            return false;
        }
        self.matches_args(name, &exec.argv[1..], at)
    }

    fn program_is(&self, program: &str, name: &str) -> bool {
        if self.program.contains('/') {
            glob(&self.program, program)
        } else {
            glob(&self.program, name)
        }
    }

    fn matches_args(&self, name: &str, args: &[Arg], at: &Place) -> bool {
        let cmd = Parsed::of(name, args);
        let mut want = self.operands.iter();
        if cmd.has_subcommands {
            if let Some(first) = want.next() {
                match &cmd.subcommand {
                    // An alias (of the line, the environment or any config
                    // file), an external command or a word only known when
                    // it runs: any subcommand, with any words.
                    Some(_) if cmd.any_subcommand => return true,
                    Some(s) => {
                        if !glob(first, &s.known()) {
                            return false;
                        }
                    }
                    None => return false,
                }
            }
        }
        let want: Vec<&String> = want.collect();
        let rm = name == "rm";
        let operands_match = |skip: Option<usize>| {
            want.iter().all(|w| {
                let targets = self.targets(w, at);
                cmd.operands
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| Some(*i) != skip)
                    .any(|(_, o)| operand_matches(w, &targets, o, at, rm))
            })
        };
        let lacks = self.short.iter().any(|c| !cmd.short.contains(c))
            || self.long.iter().any(|l| !cmd.long.contains(l));
        if !lacks {
            return operands_match(None);
        }
        // A word only known when it runs may be the options it lacks (and,
        // if the shell splits it, operands too).
        cmd.wild.iter().any(|&k| {
            let o = &cmd.operands[k];
            operands_match((!o.splits && !o.expands).then_some(k))
        })
    }

    /// What a pattern operand stands for, as normalised paths.
    fn targets(&self, w: &str, at: &Place) -> Vec<String> {
        let home = at.home;
        if w == "{root}" {
            return at
                .roots
                .iter()
                .filter_map(|r| expand(r, home))
                .flat_map(|r| {
                    let canon = std::fs::canonicalize(&r).ok();
                    [Some(r), canon].into_iter().flatten()
                })
                .map(|r| normalize(&r.to_string_lossy()))
                .collect();
        }
        if w.starts_with('~') {
            return expand(w, home)
                .map(|p| vec![normalize(&p.to_string_lossy())])
                .unwrap_or_default();
        }
        vec![normalize(w)]
    }
}

fn canonical_short(program: &str, c: char) -> char {
    if c == 'R' && CAPITAL_R_IS_RECURSIVE.contains(&program) {
        'r'
    } else {
        c
    }
}

/// Whether `operand` may be what a pattern operand names.
fn operand_matches(pattern: &str, targets: &[String], operand: &Arg, at: &Place, rm: bool) -> bool {
    let from = operand::From {
        cwd: at.cwd,
        cwd_moves: at.cwd_moves,
    };
    let looks_like_path =
        pattern.starts_with('/') || pattern.starts_with('~') || pattern == "{root}";
    if looks_like_path {
        return operand::path_shapes(operand, &from, rm)
            .iter()
            .any(|s| targets.iter().any(|t| operand::meets(s, t, false)));
    }
    if operand::text_shapes(operand)
        .iter()
        .any(|s| operand::meets(s, pattern, true))
    {
        return true;
    }
    // `of=/dev/sd*`: after `=` a path, however it is spelled.
    let (Some((key, path)), Some(Part::Lit(first))) =
        (pattern.split_once('='), operand.parts.first())
    else {
        return false;
    };
    let Some((k, rest)) = first.split_once('=') else {
        return false;
    };
    if !path.starts_with('/') || !glob(key, k) {
        return false;
    }
    let mut value = operand.clone();
    value.parts[0] = Part::Lit(rest.to_string());
    let target = normalize(path);
    operand::path_shapes(&value, &from, false)
        .iter()
        .any(|s| operand::meets(s, &target, false))
}

/// Whether `program ARGS` (git) runs a subcommand that is not its own:
/// an alias, from any configuration file, or a `git-NAME` program.
pub fn runs_other_subcommand(program: &str, args: &[Arg]) -> bool {
    let p = Parsed::of(program, args);
    p.has_subcommands && p.subcommand.is_some() && p.any_subcommand
}

/// A command's arguments, read the way its program reads them.
struct Parsed {
    has_subcommands: bool,
    subcommand: Option<Arg>,
    /// The subcommand may be any: an alias, an external command, a word
    /// only known when it runs.
    any_subcommand: bool,
    short: Vec<char>,
    long: Vec<String>,
    operands: Vec<Arg>,
    /// Operands only known when they run that may be options.
    wild: Vec<usize>,
}

impl Parsed {
    fn of(program: &str, args: &[Arg]) -> Parsed {
        let table = SUBCOMMANDS.iter().find(|(p, _, _)| *p == program);
        let longs = LONG_FLAGS
            .iter()
            .find(|(p, _)| *p == program)
            .map(|(_, l)| *l)
            .unwrap_or(&[]);
        let mut out = Parsed {
            has_subcommands: table.is_some(),
            subcommand: None,
            any_subcommand: false,
            short: Vec::new(),
            long: Vec::new(),
            operands: Vec::new(),
            wild: Vec::new(),
        };
        let mut i = 0;
        let mut aliases: Vec<String> = Vec::new();
        if let Some((_, short_values, long_values)) = table {
            // Global options, then the subcommand.
            while i < args.len() {
                let w = args[i].known();
                if args[i].is_dynamic() && !w.starts_with('-') {
                    break;
                }
                if program == "cargo" && w.starts_with('+') {
                    i += 1;
                    continue;
                }
                if w == "--" {
                    i += 1;
                    break;
                }
                if let Some(l) = w.strip_prefix("--") {
                    let (name, value) = match l.split_once('=') {
                        Some((n, v)) => (n, Some(v.to_string())),
                        None => (l, None),
                    };
                    if value.is_none() && long_values.contains(&name) {
                        i += 1;
                    }
                    let value = value.or_else(|| args.get(i).map(Arg::known));
                    // `cargo --config alias.x=…`: an alias made right there.
                    if name == "config" && value.is_some_and(|v| v.contains("alias")) {
                        out.any_subcommand = true;
                    }
                    i += 1;
                    continue;
                }
                if w.starts_with('-') && w.len() > 1 {
                    let c = w.chars().nth(1).unwrap_or('-');
                    if short_values.contains(c) {
                        let value = if w.len() > 2 {
                            w[2..].to_string()
                        } else {
                            i += 1;
                            args.get(i).map(Arg::known).unwrap_or_default()
                        };
                        // `git -c alias.p=…`: known, and judged as the
                        // git command it expands to (see analysis::git).
                        let value = value.to_ascii_lowercase();
                        if let Some(alias) = value.strip_prefix("alias.") {
                            aliases.push(alias.split('=').next().unwrap_or("").to_string());
                        }
                    }
                    i += 1;
                    continue;
                }
                break;
            }
            out.subcommand = args.get(i).cloned();
            if let Some(s) = &out.subcommand {
                // git's own commands cannot be aliased; anything else may be.
                out.any_subcommand |= match s.literal() {
                    Some(s) => {
                        program == "git"
                            && !git::own_subcommand(program, &s)
                            && !aliases.contains(&s.to_ascii_lowercase())
                    }
                    None => true,
                };
            }
            i += 1;
        }
        let mut options_end = false;
        for a in args.iter().skip(i) {
            let w = a.known();
            if !options_end && a.literal().is_some() {
                if w == "--" {
                    options_end = true;
                    continue;
                }
                if let Some(l) = w.strip_prefix("--") {
                    let l = l.split('=').next().unwrap_or(l);
                    // GNU getopt takes an exact name, or any unique prefix.
                    let prefixed: Vec<&(&str, char)> =
                        longs.iter().filter(|(n, _)| n.starts_with(l)).collect();
                    let known = match prefixed.as_slice() {
                        [one] => Some(*one),
                        _ => longs.iter().find(|(n, _)| *n == l),
                    };
                    let resolved = match known {
                        Some((n, c)) => {
                            if *c != '\0' {
                                out.short.push(*c);
                            }
                            n.to_string()
                        }
                        None => l.to_string(),
                    };
                    out.long.push(resolved);
                    continue;
                }
                if w.starts_with('-') && w.len() > 1 {
                    for c in w[1..].chars() {
                        out.short.push(canonical_short(program, c));
                    }
                    continue;
                }
            }
            let may_be_option = a.splits
                || a.expands
                || matches!(a.parts.first(), Some(Part::Dyn))
                || w.starts_with('-');
            if !options_end && a.literal().is_none() && may_be_option {
                out.wild.push(out.operands.len());
            }
            out.operands.push(a.clone());
        }
        out
    }
}

/// The file a program name runs: a path as given (relative to `cwd`), or
/// the first executable of that name on `path`; symlinks resolved.
pub fn resolve(program: &str, path: &str, cwd: &Path) -> Option<PathBuf> {
    if program.contains('/') {
        return std::fs::canonicalize(cwd.join(program)).ok();
    }
    std::env::split_paths(path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
        .and_then(|p| std::fs::canonicalize(p).ok())
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::analysis::analyze;

    /// The ASCII matcher answers as the general one does.
    #[test]
    fn ascii_globs_agree_with_char_globs() {
        let alphabet = b"ab/*?[]";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for _ in 0..20_000 {
            let mut word = |max: usize| -> String {
                let len = next(max + 1);
                (0..len)
                    .map(|_| alphabet[next(alphabet.len())] as char)
                    .collect()
            };
            let (p, t) = (word(6), word(8));
            for cross in [false, true] {
                assert_eq!(
                    glob_ascii(p.as_bytes(), t.as_bytes(), cross),
                    glob_chars(&p, &t, cross),
                    "pattern {p:?}, text {t:?}, cross_slash {cross}"
                );
            }
        }
    }

    #[test]
    fn globs() {
        assert!(glob("*_TOKEN", "GITHUB_TOKEN"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("a?c", "ac"));
        assert!(glob("**", ""));
        assert!(!glob(&"*a".repeat(50), &"a".repeat(40)));
        assert!(path_glob("/*", "/usr"));
        assert!(path_glob("/*", "/*"));
        assert!(!path_glob("/*", "/usr/lib"));
        assert!(!path_glob("/?", "//"));
        assert!(glob("/[*]", "/*"));
        assert!(!glob("/[*]", "/a"));
    }

    #[test]
    fn paths_normalize() {
        for (p, n) in [
            ("//", "/"),
            ("/.", "/"),
            ("/./", "/"),
            ("/tmp/..", "/"),
            ("/../..", "/"),
            ("/tmp//x/", "/tmp/x"),
            ("a/../..", ".."),
            ("", ""),
        ] {
            assert_eq!(normalize(p), n, "{p}");
        }
    }

    fn matches(pattern: &str, line: &str) -> bool {
        let p = Pattern::parse(pattern).unwrap();
        let home = Path::new("/home/u");
        let a = analyze(&[], line, Some("/home/u"));
        let roots = ["~".to_string(), "/tmp".to_string()];
        let at = Place {
            home: Some(home),
            roots: &roots,
            cwd: None,
            cwd_moves: a.changes_dir,
        };
        a.execs.iter().any(|e| p.matches(e, &at))
    }

    #[test]
    fn patterns_match_parsed_commands() {
        for line in [
            "git push",
            "cd repo && git push",
            "git -C /tmp push",
            "git -c a=b push origin main",
            "git --git-dir=/x push",
            "/usr/bin/git push -f",
            "git -c alias.p=push p",
        ] {
            assert!(matches("git push", line), "{line}");
        }
        for line in [
            "git status",
            "git commit -m push",
            "echo git push",
            "git log --grep push",
        ] {
            assert!(!matches("git push", line), "{line}");
        }
        for line in [
            "rm -rf /",
            "rm -fr /",
            "rm -r -f /",
            "rm -rf --no-preserve-root /",
            "rm -rf //",
            "rm -Rf /.",
            "rm --recursive --force /",
            "rm --rec --for /",
            "rm -rf -- /",
            "rm -rf x /",
            "rm / -rf",
            "rm -rf \"$X/\"",
            "sudo rm -rf /",
        ] {
            assert!(matches("rm -rf /", line), "{line}");
        }
        for line in [
            "rm -rf /tmp/x",
            "rm -r /",
            "rm -f /",
            "rm -rf ./build",
            "echo rm -rf /",
        ] {
            assert!(!matches("rm -rf /", line), "{line}");
        }
        assert!(matches("rm -rf /*", "rm -rf /*"));
        assert!(matches("rm -rf /*", "rm -rf /usr"));
        assert!(!matches("rm -rf /*", "rm -rf /usr/lib/x"));
        assert!(matches("rm -rf ~", "rm -rf ~"));
        assert!(matches("rm -rf ~", "rm -rf ~/"));
        assert!(matches("rm -rf ~", "rm -rf $HOME"));
        assert!(matches("rm -rf ~", "rm -rf /home/u/."));
        assert!(matches("rm -rf {root}", "rm -rf /tmp/"));
        assert!(!matches("rm -rf {root}", "rm -rf /tmp/build"));
        assert!(matches("dd of=/dev/sd*", "dd if=x of=/dev/sda bs=1M"));
        assert!(matches("mkfs*", "mkfs.ext4 /dev/x"));
    }
}
