//! What git and cargo run besides themselves. git's subcommand may be an
//! alias (from `-c`, the environment or any config file, the repository's
//! own included) unless it is one of git's own commands, which aliases
//! cannot replace; its configuration names commands it runs (pagers,
//! editors, `core.sshCommand`, `!` aliases); some subcommands run a command
//! they are given (`rebase -x`, `submodule foreach`, `bisect run`).

use super::{Ctx, Walk};
use crate::shell::Arg;

/// git's own commands (`git --list-cmds=main`): an alias of the same name
/// is ignored, so these are what they say.
const GIT_COMMANDS: &[&str] = &[
    "add",
    "am",
    "annotate",
    "apply",
    "archimport",
    "archive",
    "backfill",
    "bisect",
    "blame",
    "branch",
    "bugreport",
    "bundle",
    "cat-file",
    "check-attr",
    "check-ignore",
    "check-mailmap",
    "check-ref-format",
    "checkout",
    "checkout--worker",
    "checkout-index",
    "cherry",
    "cherry-pick",
    "citool",
    "clean",
    "clone",
    "column",
    "commit",
    "commit-graph",
    "commit-tree",
    "config",
    "count-objects",
    "credential",
    "credential-cache",
    "credential-cache--daemon",
    "credential-store",
    "cvsexportcommit",
    "cvsimport",
    "cvsserver",
    "daemon",
    "describe",
    "diagnose",
    "diff",
    "diff-files",
    "diff-index",
    "diff-pairs",
    "diff-tree",
    "difftool",
    "difftool--helper",
    "fast-export",
    "fast-import",
    "fetch",
    "fetch-pack",
    "filter-branch",
    "fmt-merge-msg",
    "for-each-ref",
    "for-each-repo",
    "format-patch",
    "fsck",
    "fsck-objects",
    "fsmonitor--daemon",
    "gc",
    "get-tar-commit-id",
    "grep",
    "gui",
    "hash-object",
    "help",
    "hook",
    "http-backend",
    "http-fetch",
    "http-push",
    "imap-send",
    "index-pack",
    "init",
    "init-db",
    "instaweb",
    "interpret-trailers",
    "last-modified",
    "log",
    "ls-files",
    "ls-remote",
    "ls-tree",
    "mailinfo",
    "mailsplit",
    "maintenance",
    "merge",
    "merge-base",
    "merge-file",
    "merge-index",
    "merge-octopus",
    "merge-one-file",
    "merge-ours",
    "merge-recursive",
    "merge-recursive-ours",
    "merge-recursive-theirs",
    "merge-resolve",
    "merge-subtree",
    "merge-tree",
    "mergetool",
    "mktag",
    "mktree",
    "multi-pack-index",
    "mv",
    "name-rev",
    "notes",
    "p4",
    "pack-objects",
    "pack-redundant",
    "pack-refs",
    "patch-id",
    "pickaxe",
    "prune",
    "prune-packed",
    "pull",
    "push",
    "quiltimport",
    "range-diff",
    "read-tree",
    "rebase",
    "receive-pack",
    "reflog",
    "refs",
    "remote",
    "remote-ext",
    "remote-fd",
    "remote-ftp",
    "remote-ftps",
    "remote-http",
    "remote-https",
    "repack",
    "replace",
    "replay",
    "repo",
    "request-pull",
    "rerere",
    "reset",
    "restore",
    "rev-list",
    "rev-parse",
    "revert",
    "rm",
    "send-email",
    "send-pack",
    "sh-i18n--envsubst",
    "shell",
    "shortlog",
    "show",
    "show-branch",
    "show-index",
    "show-ref",
    "sparse-checkout",
    "stage",
    "stash",
    "status",
    "stripspace",
    "submodule",
    "submodule--helper",
    "survey",
    "svn",
    "switch",
    "symbolic-ref",
    "tag",
    "unpack-file",
    "unpack-objects",
    "update-index",
    "update-ref",
    "update-server-info",
    "upload-archive",
    "upload-archive--writer",
    "upload-pack",
    "var",
    "verify-commit",
    "verify-pack",
    "verify-tag",
    "version",
    "web--browse",
    "whatchanged",
    "worktree",
    "write-tree",
];

/// cargo's own commands; its one-letter aliases (`b`, `t`…) are left out,
/// as a configured alias may shadow them.
const CARGO_COMMANDS: &[&str] = &[
    "add",
    "bench",
    "build",
    "check",
    "clean",
    "config",
    "doc",
    "fetch",
    "fix",
    "generate-lockfile",
    "help",
    "info",
    "init",
    "install",
    "locate-project",
    "login",
    "logout",
    "metadata",
    "new",
    "owner",
    "package",
    "pkgid",
    "publish",
    "read-manifest",
    "remove",
    "report",
    "run",
    "rustc",
    "rustdoc",
    "search",
    "test",
    "tree",
    "uninstall",
    "update",
    "vendor",
    "verify-project",
    "version",
    "yank",
];

/// Whether `sub` is one of `program`'s own subcommands. Anything else may
/// be an alias or an external `git-sub` / `cargo-sub`: it could be any
/// subcommand, `push` and `publish` included.
pub fn own_subcommand(program: &str, sub: &str) -> bool {
    match program {
        "git" => GIT_COMMANDS.contains(&sub),
        "cargo" => CARGO_COMMANDS.contains(&sub),
        _ => true,
    }
}

/// git options (before the subcommand) that take the next word as value.
const GIT_VALUE_OPTIONS: &[&str] = &[
    "-C",
    "--git-dir",
    "--work-tree",
    "--namespace",
    "--super-prefix",
    "--attr-source",
];

/// What a git configuration key does with its value.
enum Key {
    /// An alias: a shell command (`!…`) or git arguments.
    Alias,
    /// A command git runs (a pager, an editor, a helper, a driver).
    Command,
    /// Code or configuration from elsewhere (`include.path`,
    /// `core.hooksPath`, `url.*.insteadOf`): not in the command at all.
    Elsewhere,
    /// Data.
    Plain,
}

/// Configuration keys are case-insensitive (but for their middle part,
/// which never decides what they are).
fn key_kind(key: &str) -> Key {
    let key = key.to_ascii_lowercase();
    let section = key.split('.').next().unwrap_or("");
    let last = key.rsplit('.').next().unwrap_or("");
    if !key.contains('.') {
        // git refuses keys without a section.
        return Key::Plain;
    }
    if section == "alias" {
        return Key::Alias;
    }
    if matches!(section, "include" | "includeif" | "url" | "protocol")
        || matches!(
            last,
            "path" | "hookspath" | "templatedir" | "worktree" | "allow" | "insteadof"
        )
        || last.ends_with("insteadof")
    {
        return Key::Elsewhere;
    }
    const SUFFIXES: &[&str] = &[
        "command",
        "cmd",
        "editor",
        "pager",
        "program",
        "helper",
        "driver",
        "textconv",
        "askpass",
        "fsmonitor",
        "pack",
        "external",
        "proxy",
        "hook",
        "filter",
        "smtpserver",
        "browser",
        "viewer",
    ];
    if section == "pager"
        || SUFFIXES.iter().any(|s| last.ends_with(s))
        || matches!(
            last,
            "clean" | "smudge" | "process" | "update" | "vcs" | "tool"
        )
    {
        return Key::Command;
    }
    Key::Plain
}

impl Walk {
    /// What `git ARGS` runs besides git: its configuration's commands,
    /// aliases, and the commands some subcommands are given.
    pub(super) fn git(&mut self, args: &[Arg], cx: &Ctx) {
        let cx = cx.inner("git");
        let mut i = 0;
        while i < args.len() {
            let Some(w) = args[i].literal() else {
                // The subcommand, which the patterns take as any; unless it
                // may be options (`-c core.pager=…`): split into several
                // words, or followed by more.
                let a = &args[i];
                if a.splits || a.expands || a.known().starts_with('-') || i + 1 < args.len() {
                    self.out
                        .unknowable("git is given options only known when it runs");
                }
                return;
            };
            if w == "--" {
                i += 1;
                break;
            }
            if w == "-c" || (w.starts_with("-c") && w.len() > 2) {
                let kv = if w == "-c" {
                    i += 1;
                    args.get(i).cloned().unwrap_or_default()
                } else {
                    Arg::lit(&w[2..])
                };
                self.git_setting_word(&kv, &cx);
            } else if w == "--config-env" || w.starts_with("--config-env=") {
                // The value comes from a variable: only known when it runs.
                let spec = match w.strip_prefix("--config-env=") {
                    Some(v) => Some(v.to_string()),
                    None => {
                        i += 1;
                        args.get(i).and_then(Arg::literal)
                    }
                };
                match spec.as_deref().and_then(|s| s.rsplit_once('=')) {
                    Some((key, _)) => self.git_setting(key, None, &cx),
                    None => self
                        .out
                        .unknowable("git --config-env sets a key only known when it runs"),
                }
            } else if w.starts_with("--exec-path=") {
                self.out
                    .unknowable("git --exec-path=… runs its commands from another directory");
            } else if GIT_VALUE_OPTIONS.contains(&w.as_str()) {
                i += 1;
            } else if !w.starts_with('-') {
                break;
            }
            i += 1;
        }
        let Some(sub) = args.get(i).and_then(Arg::literal) else {
            return;
        };
        let rest = &args[(i + 1).min(args.len())..];
        self.git_subcommand(&sub, rest, &cx);
    }

    fn git_subcommand(&mut self, sub: &str, rest: &[Arg], cx: &Ctx) {
        let cx = &cx.inner(&format!("git {sub}"));
        // Options whose value is a shell command, per subcommand.
        let script_options: &[&str] = match sub {
            "rebase" => &["-x", "--exec"],
            "difftool" => &["-x", "--extcmd"],
            "grep" => &["-O", "--open-files-in-pager"],
            "filter-branch" => &[
                "--setup",
                "--env-filter",
                "--tree-filter",
                "--index-filter",
                "--parent-filter",
                "--msg-filter",
                "--commit-filter",
                "--tag-name-filter",
            ],
            "fetch" | "pull" | "clone" | "ls-remote" | "push" | "archive" | "send-pack"
            | "fetch-pack" | "submodule" | "remote" => {
                &["-u", "--upload-pack", "--receive-pack", "--exec"]
            }
            "send-email" => &[
                "--smtp-server",
                "--to-cmd",
                "--cc-cmd",
                "--header-cmd",
                "--sendmail-cmd",
            ],
            _ => &[],
        };
        let mut i = 0;
        while i < rest.len() {
            let w = rest[i].literal().unwrap_or_default();
            for o in script_options {
                let value = if w == *o {
                    // `grep -O` alone uses the configured pager.
                    if *o == "-O" {
                        None
                    } else {
                        i += 1;
                        rest.get(i).cloned()
                    }
                } else if let Some(v) = w.strip_prefix(&format!("{o}=")) {
                    Some(Arg::lit(v))
                } else if o.len() == 2 && w.starts_with(o) && w.len() > 2 {
                    Some(Arg::lit(&w[2..]))
                } else {
                    None
                };
                if let Some(v) = value {
                    self.sub_script(&v, cx, &format!("git {sub} {o}"));
                }
            }
            i += 1;
        }
        let words: Vec<Option<String>> = rest.iter().map(Arg::literal).collect();
        let at = |word: &str| words.iter().position(|w| w.as_deref() == Some(word));
        match sub {
            "submodule" => {
                if let Some(k) = at("foreach") {
                    let mut k = k + 1;
                    while matches!(
                        words.get(k).and_then(|w| w.as_deref()),
                        Some("--recursive" | "-q" | "--quiet" | "--")
                    ) {
                        k += 1;
                    }
                    self.joined_script(&rest[k.min(rest.len())..], cx, "git submodule foreach");
                }
            }
            "bisect" => {
                if let Some(k) = at("run") {
                    self.words(rest[k + 1..].to_vec(), cx.clone());
                }
            }
            "config" => self.git_config_command(rest, cx),
            _ => {}
        }
    }

    /// `git config [options] [set] KEY VALUE`: what it writes is what a
    /// later git of the same line runs.
    fn git_config_command(&mut self, rest: &[Arg], cx: &Ctx) {
        let mut operands = Vec::new();
        let mut i = 0;
        while i < rest.len() {
            let a = &rest[i];
            match a.literal() {
                Some(w) if w.starts_with('-') && w.len() > 1 => {
                    if matches!(
                        w.as_str(),
                        "-f" | "--file"
                            | "--blob"
                            | "--type"
                            | "--default"
                            | "--comment"
                            | "--value"
                    ) {
                        i += 1;
                    }
                }
                _ => operands.push(a.clone()),
            }
            i += 1;
        }
        if operands.first().and_then(Arg::literal).as_deref() == Some("set") {
            operands.remove(0);
        }
        if operands.len() >= 2 {
            match operands[0].literal() {
                Some(key) => self.git_setting(&key, Some(operands[1].clone()), cx),
                None => self
                    .out
                    .unknowable("git config sets a key only known when it runs"),
            }
        }
    }

    /// `-c KEY=VALUE` (a key alone is `true`).
    fn git_setting_word(&mut self, kv: &Arg, cx: &Ctx) {
        let known = kv.known();
        match kv.literal() {
            Some(t) => match t.split_once('=') {
                Some((k, v)) => self.git_setting(k, Some(Arg::lit(v)), cx),
                None => self.git_setting(&t, Some(Arg::lit("true")), cx),
            },
            // `-c alias.p=$X`: the key is known, its value is not.
            None => match (kv.parts.first(), known.split_once('=')) {
                (Some(crate::shell::Part::Lit(first)), Some((k, _))) if first.contains('=') => {
                    self.git_setting(k, None, cx)
                }
                _ => self
                    .out
                    .unknowable("git -c sets a key only known when it runs"),
            },
        }
    }

    /// A configuration value git is given: `None` when only known when it
    /// runs.
    fn git_setting(&mut self, key: &str, value: Option<Arg>, cx: &Ctx) {
        let value = value.as_ref().and_then(Arg::literal);
        let what = format!("git config {key}");
        match (key_kind(key), value) {
            (Key::Plain, _) => {}
            (Key::Elsewhere, _) => self.out.unknowable(format!(
                "{what} makes git run code or read configuration the command does not show"
            )),
            (Key::Alias | Key::Command, None) => self
                .out
                .unknowable(format!("{what} is a command only known when it runs")),
            (Key::Alias, Some(v)) => match v.strip_prefix('!') {
                Some(line) => self.script(line, &cx.inner(&what)),
                None => {
                    // git's own arguments: the alias is this git command,
                    // judged by patterns (`git push`); what its words
                    // substitute runs for real.
                    let from = self.out.execs.len();
                    let inner = cx.inner(&what);
                    self.script(&format!("git {v}"), &inner);
                    for e in &mut self.out.execs[from..] {
                        if e.via == inner.via && e.program().as_deref() == Some("git") {
                            e.implied = true;
                        }
                    }
                }
            },
            (Key::Command, Some(v)) => {
                let line = v.strip_prefix('!').unwrap_or(&v);
                self.script(line, &cx.inner(&what));
            }
        }
    }
}
