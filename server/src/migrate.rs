//! `byom store migrate`: moves a stopped server's embedded store (and the
//! secrets and settings in its data dir) into an empty shared store, so
//! its machines, tokens, tasks and CA carry on under replicas.

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use byom_store::{Backend, Op, PgBackend, SledBackend, Space, Store};

use crate::vault::{Vault, CA, SERVER, SNAPSHOT_KEY, TOKEN_KEY, WEBHOOK_KEY};

/// Rows (or bytes) per write to the destination.
const CHUNK_ROWS: usize = 500;
const CHUNK_BYTES: usize = 8 << 20;

/// What a migration moved.
#[derive(Debug, Default)]
pub struct MigrateReport {
    /// Records per keyspace, as found in the source and then counted again
    /// in the destination.
    pub spaces: Vec<(&'static str, usize)>,
    /// The secrets sealed into the destination.
    pub secrets: Vec<String>,
    /// Settings files carried over (agents.toml, sources.toml).
    pub settings: Vec<String>,
}

/// The secret groups of a data dir, as the server's vault names them.
const GROUPS: [(&str, &[&str]); 5] = [
    (CA.0, &CA.1),
    (SERVER.0, &SERVER.1),
    (TOKEN_KEY, &[TOKEN_KEY]),
    (WEBHOOK_KEY, &[WEBHOOK_KEY]),
    (SNAPSHOT_KEY, &[SNAPSHOT_KEY]),
];

/// Copies everything under `data_dir` into the empty store at `url`.
pub fn migrate(data_dir: &Path, url: &str, key_file: &Path) -> anyhow::Result<MigrateReport> {
    let sled_dir = data_dir.join("store");
    if !sled_dir.exists() {
        anyhow::bail!(
            "{} holds no store: is it a byom server's data dir (--data-dir)?",
            data_dir.display()
        );
    }
    let from = SledBackend::open(&sled_dir).with_context(|| {
        format!(
            "cannot open the store in {}; stop its server first",
            data_dir.display()
        )
    })?;
    let redacted = crate::startup::redact_url(url);
    let to = Arc::new(
        PgBackend::connect(url).with_context(|| format!("cannot open the store {redacted}"))?,
    );
    for space in Space::ALL {
        if space == Space::Secrets {
            continue;
        }
        let any = to.range(space, Bound::Unbounded, Bound::Unbounded, false, 1)?;
        if !any.is_empty() {
            anyhow::bail!(
                "{redacted} already holds a byom store ({} is not empty); migrate into an empty database",
                space.name()
            );
        }
    }
    let mut report = MigrateReport::default();
    for space in Space::ALL {
        let n = copy_space(&from, to.as_ref(), space)?;
        let copied = to.keys(space)?.len();
        if copied != n {
            anyhow::bail!(
                "{}: {n} records in the source but {copied} in {redacted} after copying",
                space.name()
            );
        }
        report.spaces.push((space.name(), n));
    }
    let store = Store::new(to.clone());
    let vault = Vault::sealed(store.clone(), key_file)?;
    let dir = Vault::Dir(data_dir.to_path_buf());
    for (group, names) in GROUPS {
        let Some(values) = dir.load(group, names)? else {
            continue;
        };
        let items: Vec<(&str, String, u32)> = names
            .iter()
            .zip(values)
            .map(|(n, v)| (*n, v, 0o600))
            .collect();
        vault.replace(group, &items)?;
        report.secrets.push(group.to_string());
    }
    for (file, key) in [
        ("agents.toml", crate::startup::AGENTS_TOML_KEY),
        ("sources.toml", crate::triggers::RULES_KEY),
    ] {
        match std::fs::read_to_string(data_dir.join(file)) {
            Ok(t) => {
                store.put_channel_state("", key, t.as_bytes())?;
                report.settings.push(file.to_string());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context(format!("cannot read {file}")),
        }
    }
    to.flush()?;
    Ok(report)
}

/// Copies one keyspace in chunks; the number of records.
fn copy_space(from: &SledBackend, to: &dyn Backend, space: Space) -> anyhow::Result<usize> {
    let mut n = 0;
    let mut ops = Vec::new();
    let mut bytes = 0;
    // Keys first, then each value: snapshots and output can be large.
    for key in from.keys(space)? {
        let Some(value) = from.get(space, &key)? else {
            continue;
        };
        bytes += key.len() + value.len();
        ops.push(Op::put(space, key, value));
        n += 1;
        if ops.len() >= CHUNK_ROWS || bytes >= CHUNK_BYTES {
            to.batch(&ops)?;
            ops.clear();
            bytes = 0;
        }
    }
    to.batch(&ops)?;
    Ok(n)
}
