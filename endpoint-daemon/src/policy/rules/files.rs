//! Whether the file a name runs could be another by the time it runs. An
//! allow-list vouches for files; a line that writes files and then runs a
//! name or path it could have written (`cp /bin/sh ~/bin/tool; tool`)
//! would get past it. A file cannot change under a command that can write
//! neither it nor any directory on the way to it, nor any directory
//! searched before it on PATH.

use std::path::{Path, PathBuf};

/// Whether a redirection to `target` only writes to the command's own
/// output or nowhere.
pub fn discards(target: &crate::shell::Arg) -> bool {
    matches!(
        target.literal().as_deref(),
        Some("/dev/null" | "/dev/stdout" | "/dev/stderr")
    )
}

/// Programs that write no file (but through a redirection, judged apart).
pub const WRITES_NOTHING: &[&str] = &[
    "ls",
    "cat",
    "grep",
    "egrep",
    "fgrep",
    "rg",
    "head",
    "tail",
    "wc",
    "pwd",
    "id",
    "whoami",
    "hostname",
    "uname",
    "date",
    "stat",
    "file",
    "which",
    "du",
    "df",
    "ps",
    "uptime",
    "echo",
    "printf",
    "true",
    "false",
    "test",
    "[",
    "basename",
    "dirname",
    "realpath",
    "readlink",
    "seq",
    "sleep",
    "env",
    "nice",
    "timeout",
    "stdbuf",
    "setsid",
    "tty",
    "groups",
    "nproc",
    "arch",
    "printenv",
    "cmp",
    "comm",
    "cut",
    "tr",
    "jq",
    "md5sum",
    "sha1sum",
    "sha256sum",
    "sha512sum",
    "b2sum",
    "cksum",
    "expr",
    "yes",
    "free",
    "lsblk",
    "locale",
    "getent",
    "diff",
    "nl",
    "od",
    "xxd",
    "hexdump",
    "strings",
    "column",
    "fold",
    "fmt",
    "paste",
    "join",
    "rev",
    "tac",
    "base64",
    // Shells and wrappers: what they run is judged on its own.
    "sh",
    "bash",
    "dash",
    "ksh",
    "mksh",
    "ash",
    "yash",
    "xargs",
    "taskset",
    "ionice",
    "chrt",
    "flock",
    "watch",
    "command",
    "exec",
    "builtin",
];

/// The file a redirection to `target` writes, when known now: a path
/// that exists, through its links; a new file in a directory that does.
/// None: it may be any (a dangling link, a directory the line moved to).
pub fn written(target: &str, cwd: &Path, cwd_moves: bool) -> Option<PathBuf> {
    if cwd_moves && !target.starts_with('/') {
        return None;
    }
    let p = cwd.join(target);
    match std::fs::symlink_metadata(&p) {
        Ok(_) => std::fs::canonicalize(&p).ok(),
        Err(_) => {
            let parent = std::fs::canonicalize(p.parent()?).ok()?;
            Some(parent.join(p.file_name()?))
        }
    }
}

/// The directories a name is looked for in, in order, up to and with the
/// one it is found in, and the file found; None if not found. A path is
/// its own directory.
pub fn lookup(program: &str, path: &str, cwd: &Path) -> Option<(Vec<PathBuf>, PathBuf)> {
    if program.contains('/') {
        let p = cwd.join(program);
        let dir = p.parent().map(Path::to_path_buf).unwrap_or_default();
        return Some((vec![dir], p));
    }
    let mut searched = Vec::new();
    for d in std::env::split_paths(path) {
        let d = if d.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else {
            cwd.join(d)
        };
        let p = d.join(program);
        searched.push(d);
        if super::is_executable(&p) {
            return Some((searched, p));
        }
    }
    None
}

/// What a line may write before the programs it runs start.
pub struct Writes {
    /// The programs that may write files (any not known to write nothing).
    writers: Vec<usize>,
    /// It redirects output into files.
    redirects: bool,
    /// The files its redirections write; None when one is only known when
    /// it runs.
    targets: Option<Vec<PathBuf>>,
    who: Who,
}

impl Writes {
    /// `found`: where each of `a`'s programs was found (see [`lookup`]).
    pub fn of(
        a: &crate::policy::analysis::Analysis,
        found: &[Option<(Vec<PathBuf>, PathBuf)>],
        cwd: &Path,
        who: Who,
    ) -> Writes {
        let writers = (a.execs.iter().enumerate())
            .filter(|(i, e)| {
                // Only the function runs when no program has its name.
                let only_function = e.function && found.get(*i).is_none_or(Option::is_none);
                let harmless = e
                    .name()
                    .is_some_and(|n| WRITES_NOTHING.contains(&n.as_str()));
                !(e.builtin || e.implied || only_function || harmless)
            })
            .map(|(i, _)| i)
            .collect();
        let redirected: Vec<_> = a.writes.iter().filter(|w| !discards(w)).collect();
        let targets = (redirected.iter())
            .map(|w| written(&w.literal()?, cwd, a.changes_dir))
            .collect();
        Writes {
            writers,
            redirects: !redirected.is_empty(),
            targets,
            who,
        }
    }

    /// Whether the line may write files at all.
    pub fn any(&self) -> bool {
        self.redirects || !self.writers.is_empty()
    }

    /// Whether program `i`, `name` found in `dirs` as `file` (`real`
    /// through its links), may be another file by the time it runs: some
    /// other program may write where its user can, and a redirection
    /// writes the file it names.
    pub fn may_rewrite(
        &self,
        i: usize,
        name: &str,
        dirs: &[PathBuf],
        file: &Path,
        real: &Path,
    ) -> bool {
        // A program cannot write its own file before it starts.
        let others = self.writers.iter().any(|w| *w != i);
        let chain = || {
            (dirs.iter().map(PathBuf::as_path))
                .chain([file, real])
                .any(|p| changeable(p, self.who))
        };
        match (&self.targets, others, self.redirects) {
            (_, true, _) | (None, false, true) => chain(),
            (Some(ts), false, true) => dirs
                .iter()
                .filter_map(|d| std::fs::canonicalize(d).ok())
                .map(|d| d.join(name))
                .chain([file.to_path_buf(), real.to_path_buf()])
                .any(|c| ts.contains(&c)),
            (_, false, false) => false,
        }
    }
}

/// Who runs the command: the daemon's own user, or `[run] user`.
#[derive(Debug, Clone, Copy)]
pub enum Who {
    Daemon,
    User { uid: u32 },
}

/// Whether `who` can change what `p` is: write it, or any directory from
/// it up to `/` (a directory it can write may have its entries renamed).
pub fn changeable(p: &Path, who: Who) -> bool {
    let mut at = Some(p);
    while let Some(q) = at {
        if q.exists() && writable(q, who) {
            return true;
        }
        at = q.parent();
    }
    false
}

#[cfg(unix)]
fn writable(p: &Path, who: Who) -> bool {
    use std::os::unix::fs::MetadataExt;
    match who {
        Who::Daemon => {
            let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
                return true;
            };
            // SAFETY: a NUL-terminated path; access(2) only reads it.
            unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
        }
        Who::User { uid } => match std::fs::symlink_metadata(p) {
            // Supplementary groups are not looked up: a group-writable
            // file counts as writable, so this errs on the side of no.
            Ok(m) => uid == 0 || (m.uid() == uid && m.mode() & 0o200 != 0) || m.mode() & 0o022 != 0,
            Err(_) => true,
        },
    }
}

#[cfg(not(unix))]
fn writable(_: &Path, _: Who) -> bool {
    true
}
