//! The owner's own record of what ran on this machine: one JSON line per
//! command in `<config-dir>/audit.log` (0600), written when the command
//! ends, whatever the server says. Rotated by size: the log moves to
//! `audit.log.1` (replacing the older one) when it passes [`MAX_LOG_BYTES`].

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Size at which the log rotates.
pub const MAX_LOG_BYTES: u64 = 10 * 1024 * 1024;
/// Longest command line kept per entry.
const MAX_COMMAND_CHARS: usize = 4096;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub at_ms: u64,
    pub id: String,
    pub requested_by: String,
    /// With `{{secret:NAME}}` handles, never values.
    pub command: String,
    pub cwd: String,
    pub state: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub reason: String,
    /// Why the agent task behind it was untrusted, and who approved it
    /// (both as the server said).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub taint: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub approved_by: String,
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join("audit.log")
}

/// Appends a record; failures are logged, never fatal to the command.
pub fn append(dir: &Path, r: &Record) {
    append_limited(dir, r, MAX_LOG_BYTES)
}

fn append_limited(dir: &Path, r: &Record, max: u64) {
    let p = path(dir);
    if std::fs::metadata(&p)
        .map(|m| m.len() >= max)
        .unwrap_or(false)
    {
        let _ = std::fs::rename(&p, dir.join("audit.log.1"));
    }
    let mut r = r.clone();
    if r.command.chars().count() > MAX_COMMAND_CHARS {
        r.command = r
            .command
            .chars()
            .take(MAX_COMMAND_CHARS)
            .collect::<String>()
            + "…";
    }
    let line = match serde_json::to_string(&r) {
        Ok(l) => l,
        Err(_) => return,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(&p).and_then(|mut f| writeln!(f, "{line}")) {
        Ok(()) => {}
        Err(e) => tracing::warn!("cannot append to {}: {e}", p.display()),
    }
}

/// The last `n` records, oldest first.
pub fn tail(dir: &Path, n: usize) -> Vec<Record> {
    let mut out = Vec::new();
    for f in [dir.join("audit.log.1"), path(dir)] {
        if let Ok(text) = std::fs::read_to_string(f) {
            out.extend(
                text.lines()
                    .filter_map(|l| serde_json::from_str::<Record>(l).ok()),
            );
        }
    }
    let skip = out.len().saturating_sub(n);
    out.split_off(skip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_by_size_and_tails_across_files() {
        let dir = std::env::temp_dir().join(format!("byomd-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rec = |i: usize| Record {
            at_ms: i as u64,
            id: format!("cmd_{i}"),
            requested_by: "admin:admin".into(),
            command: "echo hi".into(),
            cwd: String::new(),
            state: "exited".into(),
            exit_code: Some(0),
            signal: None,
            duration_ms: 1,
            stdout_bytes: 3,
            stderr_bytes: 0,
            reason: String::new(),
            taint: String::new(),
            approved_by: String::new(),
        };
        for i in 0..30 {
            append_limited(&dir, &rec(i), 1000);
        }
        assert!(dir.join("audit.log.1").exists());
        assert!(std::fs::metadata(path(&dir)).unwrap().len() < 1400);
        let t = tail(&dir, 5);
        assert_eq!(
            t.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["cmd_25", "cmd_26", "cmd_27", "cmd_28", "cmd_29"]
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
