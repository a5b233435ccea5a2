//! Rules over parsed commands: globs, command patterns (`git push`,
//! `rm -rf /`) matched on a program's argv, and the allow-list's resolved
//! executables.

use std::path::{Path, PathBuf};

use super::analysis::{base, Exec};
use crate::shell::Arg;

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

/// A path as text, with `.`, `..`, repeated and trailing slashes resolved
/// without touching the disk (`//` and `/.` are `/`).
pub fn normalize(p: &str) -> String {
    if p.is_empty() {
        return String::new();
    }
    let absolute = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() && !absolute {
                    parts.push("..");
                }
            }
            c => parts.push(c),
        }
    }
    let joined = parts.join("/");
    match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

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

    /// Whether `exec` matches. A subcommand only known when the command
    /// runs counts as a match: these rules deny or ask, so they err on
    /// that side.
    pub fn matches(&self, exec: &Exec, home: Option<&Path>, roots: &[String]) -> bool {
        let Some(program) = exec.program() else {
            return false;
        };
        let name = base(&program);
        let prog_ok = if self.program.contains('/') {
            glob(&self.program, &program)
        } else {
            glob(&self.program, name)
        };
        if !prog_ok {
            return false;
        }
        let cmd = Parsed::of(name, &exec.argv[1..]);
        if self.short.iter().any(|c| !cmd.short.contains(c)) {
            return false;
        }
        if self.long.iter().any(|l| !cmd.long.contains(l)) {
            return false;
        }
        let mut want = self.operands.iter();
        if cmd.has_subcommands {
            if let Some(first) = want.next() {
                match &cmd.subcommand {
                    // An alias set on the command line could be anything.
                    Some(s) if s.is_dynamic() || cmd.dynamic_alias => {}
                    Some(s) => {
                        if !glob(first, &s.known()) {
                            return false;
                        }
                    }
                    None => return false,
                }
            }
        }
        want.all(|w| {
            let targets = self.targets(w, home, roots);
            cmd.operands.iter().any(|o| operand_matches(w, &targets, o))
        })
    }

    /// What a pattern operand stands for, as normalised paths.
    fn targets(&self, w: &str, home: Option<&Path>, roots: &[String]) -> Vec<String> {
        if w == "{root}" {
            return roots
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

fn operand_matches(pattern: &str, targets: &[String], operand: &Arg) -> bool {
    // Unknown parts count as empty: `"$X/"` may well be `/`.
    let text = operand.known();
    let looks_like_path =
        pattern.starts_with('/') || pattern.starts_with('~') || pattern == "{root}";
    if looks_like_path {
        let n = normalize(&text);
        targets.iter().any(|t| path_glob(t, &n))
    } else {
        glob(pattern, &text)
    }
}

/// A command's arguments, read the way its program reads them.
struct Parsed {
    has_subcommands: bool,
    subcommand: Option<Arg>,
    /// `git -c alias.x=…`: the subcommand may be an alias made right there.
    dynamic_alias: bool,
    short: Vec<char>,
    long: Vec<String>,
    operands: Vec<Arg>,
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
            dynamic_alias: false,
            short: Vec::new(),
            long: Vec::new(),
            operands: Vec::new(),
        };
        let mut i = 0;
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
                    if !l.contains('=') && long_values.contains(&l) {
                        i += 1;
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
                        if c == 'c' && value.starts_with("alias.") {
                            out.dynamic_alias = true;
                        }
                    }
                    i += 1;
                    continue;
                }
                break;
            }
            out.subcommand = args.get(i).cloned();
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
        a.execs
            .iter()
            .any(|e| p.matches(e, Some(home), &["~".into(), "/tmp".into()]))
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
