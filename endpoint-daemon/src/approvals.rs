//! Local approval: commands the owner's policy marks `confirm` wait until
//! the owner runs `byomd approve ID` or `byomd deny ID` on the machine.
//!
//! The hand-off is a folder the owner controls, `<config-dir>/approvals/`:
//! the daemon writes `ID.json` describing the command; `byomd approve`
//! writes `ID.approved` (or `ID.denied`); the daemon polls for the answer.
//! Nothing in it survives a daemon restart (such commands become `lost`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// How often a waiting command looks for the owner's answer.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub id: String,
    /// The command line with secret handles, never values.
    pub command: String,
    pub cwd: String,
    pub rule: String,
    pub requested_at_ms: u64,
}

pub fn dir(config_dir: &Path) -> PathBuf {
    config_dir.join("approvals")
}

fn valid_id(id: &str) -> bool {
    byom_protocol::id::CommandId::parse(id).is_ok()
}

pub fn request(config_dir: &Path, r: &Request) -> anyhow::Result<()> {
    let p = dir(config_dir).join(format!("{}.json", r.id));
    byom_wire::write_atomic(&p, &serde_json::to_vec_pretty(r)?, 0o600)
        .with_context(|| format!("cannot write {}", p.display()))
}

/// The owner's answer: Some(true) approved, Some(false) denied.
pub fn answer(config_dir: &Path, id: &str) -> Option<bool> {
    let d = dir(config_dir);
    if d.join(format!("{id}.approved")).exists() {
        Some(true)
    } else if d.join(format!("{id}.denied")).exists() {
        Some(false)
    } else {
        None
    }
}

pub fn clear(config_dir: &Path, id: &str) {
    let d = dir(config_dir);
    for ext in ["json", "approved", "denied"] {
        let _ = std::fs::remove_file(d.join(format!("{id}.{ext}")));
    }
}

/// Forgets every request (at daemon start: earlier ones are lost).
pub fn clear_all(config_dir: &Path) {
    let _ = std::fs::remove_dir_all(dir(config_dir));
}

pub fn pending(config_dir: &Path) -> Vec<Request> {
    let mut out: Vec<Request> = std::fs::read_dir(dir(config_dir))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|r: &Request| r.requested_at_ms);
    out
}

/// Records the owner's decision for a waiting command.
pub fn decide(config_dir: &Path, id: &str, approve: bool) -> anyhow::Result<Request> {
    if !valid_id(id) {
        bail!("{id:?} is not a command ID (cmd_…): see `byomd pending`");
    }
    let d = dir(config_dir);
    let req: Request = match std::fs::read(d.join(format!("{id}.json"))) {
        Ok(b) => serde_json::from_slice(&b)?,
        Err(_) => bail!("no command {id} is waiting for approval: see `byomd pending`"),
    };
    let marker = d.join(format!(
        "{id}.{}",
        if approve { "approved" } else { "denied" }
    ));
    byom_wire::write_atomic(&marker, b"", 0o600)?;
    Ok(req)
}
