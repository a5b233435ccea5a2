//! Secrets by handle: commands say `{{secret:NAME}}`; this daemon puts the
//! value in when the command starts and takes it out of everything the
//! command prints before it leaves the machine. The server, the store and
//! the model only ever see the handle.
//!
//! Values live where the private key lives: the OS keyring when the identity
//! uses it, else `secrets.json` (0600) in the config dir. The names are kept
//! in that file either way, because keyrings cannot list.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::identity::{Identity, KeyStore};

const SECRETS_FILE: &str = "secrets.json";
const KEYRING_SERVICE: &str = "byomd-secret";
/// Longest secret name and value.
pub const MAX_NAME_LEN: usize = 64;
pub const MAX_VALUE_LEN: usize = 64 * 1024;
/// Shortest value: scrubbing a 1-3 byte value would mangle ordinary output.
pub const MIN_VALUE_LEN: usize = 4;
/// Most secrets per machine.
pub const MAX_SECRETS: usize = 256;

#[derive(Debug, Default, Serialize, Deserialize)]
struct SecretsFile {
    /// name → value (file store) or "" (keyring store).
    #[serde(default)]
    secrets: BTreeMap<String, String>,
    /// name → the owner's restrictions on it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    rules: BTreeMap<String, SecretRule>,
}

/// What the owner allows a secret to be used for. A command that leaks a
/// value on purpose can encode it beyond any scrubber, so a secret is only
/// as safe as the programs allowed to use it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRule {
    /// Only commands that run nothing but these programs (names or paths,
    /// checked on the files they resolve to) may use it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_programs: Vec<String>,
    /// Every command that uses it waits for `byomd approve`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confirm: bool,
}

impl SecretRule {
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.allow_programs.is_empty() {
            parts.push(format!("only by {}", self.allow_programs.join(", ")));
        }
        if self.confirm {
            parts.push("each use needs your approval".into());
        }
        parts.join("; ")
    }
}

pub fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= MAX_NAME_LEN
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

fn path(dir: &Path) -> PathBuf {
    dir.join(SECRETS_FILE)
}

fn load(dir: &Path) -> anyhow::Result<SecretsFile> {
    match std::fs::read(path(dir)) {
        Ok(b) => serde_json::from_slice(&b)
            .with_context(|| format!("{} is damaged", path(dir).display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SecretsFile::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path(dir).display())),
    }
}

fn save(dir: &Path, f: &SecretsFile) -> anyhow::Result<()> {
    byom_wire::write_atomic(&path(dir), &serde_json::to_vec_pretty(f)?, 0o600)
        .with_context(|| format!("cannot write {}", path(dir).display()))
}

fn keyring_user(dir: &Path, name: &str) -> String {
    crate::identity::keyring_user(name, dir)
}

fn store_kind(dir: &Path) -> KeyStore {
    Identity::load(dir)
        .map(|i| i.key_store)
        .unwrap_or(KeyStore::File)
}

pub fn set(dir: &Path, name: &str, value: &str, rule: SecretRule) -> anyhow::Result<KeyStore> {
    if !valid_name(name) {
        bail!(
            "bad secret name {name:?}: use letters, digits, '_', '-', '.' (at most {MAX_NAME_LEN})"
        );
    }
    if value.len() < MIN_VALUE_LEN || value.len() > MAX_VALUE_LEN {
        bail!("a secret value must be {MIN_VALUE_LEN} to {MAX_VALUE_LEN} bytes");
    }
    let mut f = load(dir)?;
    if !f.secrets.contains_key(name) && f.secrets.len() >= MAX_SECRETS {
        bail!("at most {MAX_SECRETS} secrets");
    }
    let kind = store_kind(dir);
    match kind {
        KeyStore::Keyring => {
            crate::identity::keyring_set_entry(KEYRING_SERVICE, &keyring_user(dir, name), value)?;
            f.secrets.insert(name.to_string(), String::new());
        }
        KeyStore::File => {
            f.secrets.insert(name.to_string(), value.to_string());
        }
    }
    if rule == SecretRule::default() {
        f.rules.remove(name);
    } else {
        f.rules.insert(name.to_string(), rule);
    }
    save(dir, &f)?;
    Ok(kind)
}

/// Every secret's name, with its restrictions if any.
pub fn list(dir: &Path) -> anyhow::Result<Vec<(String, Option<SecretRule>)>> {
    let mut f = load(dir)?;
    Ok(f.secrets
        .into_keys()
        .map(|n| {
            let r = f.rules.remove(&n);
            (n, r)
        })
        .collect())
}

/// The owner's restrictions, by secret name. An unreadable file restricts
/// nothing here: using any secret then fails when its value is read.
pub fn restrictions(dir: &Path) -> BTreeMap<String, SecretRule> {
    load(dir).map(|f| f.rules).unwrap_or_default()
}

pub fn remove(dir: &Path, name: &str) -> anyhow::Result<bool> {
    let mut f = load(dir)?;
    let had = f.secrets.remove(name).is_some();
    f.rules.remove(name);
    if had {
        if store_kind(dir) == KeyStore::Keyring {
            let _ =
                crate::identity::keyring_delete_entry(KEYRING_SERVICE, &keyring_user(dir, name));
        }
        save(dir, &f)?;
    }
    Ok(had)
}

/// Every secret's value, for substitution and scrubbing.
pub fn load_values(dir: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let f = load(dir)?;
    let mut out = BTreeMap::new();
    // Read per command: with no secrets, one failed open is all it costs.
    if f.secrets.is_empty() {
        return Ok(out);
    }
    let kind = store_kind(dir);
    for (name, v) in f.secrets {
        let value = match kind {
            KeyStore::File => v,
            KeyStore::Keyring => {
                crate::identity::keyring_get_entry(KEYRING_SERVICE, &keyring_user(dir, &name))?
            }
        };
        out.insert(name, value);
    }
    Ok(out)
}

/// The `{{secret:NAME}}` handles in `text`: (byte range of the handle,
/// NAME), in order.
pub fn handles(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    const OPEN: &str = "{{secret:";
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(OPEN) {
        let start = at + i;
        let name_at = start + OPEN.len();
        let Some(end) = text[name_at..].find("}}") else {
            break;
        };
        let stop = name_at + end + 2;
        out.push((start..stop, &text[name_at..name_at + end]));
        at = stop;
    }
    out
}

/// Replaces every `{{secret:NAME}}` in `text`. Unknown names are an error
/// that names them, never an empty substitution.
pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (range, name) in handles(text) {
        let Some(v) = values.get(name) else {
            return Err(format!(
                "unknown secret {name:?}: set it on this machine with `byomd secret set {name}`"
            ));
        };
        out.push_str(&text[copied..range.start]);
        out.push_str(v);
        copied = range.end;
    }
    out.push_str(&text[copied..]);
    Ok(out)
}

// The scrubber: the forms a value can be printed in (`forms`), the readers
// that undo wrapping, dumps and escaping (`normalise`), the matcher that
// finds every form in one pass (`automaton`), and the streaming glue.
mod automaton;
mod forms;
mod normalise;
mod scrub;

pub use scrub::{Scrubber, Stream};

#[cfg(test)]
mod scrub_tests;
#[cfg(test)]
mod tool_imitations;

#[cfg(test)]
mod tests {
    use super::*;

    fn vals() -> BTreeMap<String, String> {
        [
            ("TOKEN".to_string(), "s3cr3t-value".to_string()),
            ("PW".to_string(), "hunter22".to_string()),
        ]
        .into()
    }

    #[test]
    fn substitution() {
        assert_eq!(
            substitute("a {{secret:PW}} b", &vals()).unwrap(),
            "a hunter22 b"
        );
        assert!(substitute("{{secret:NOPE}}", &vals())
            .unwrap_err()
            .contains("NOPE"));
        assert_eq!(substitute("{{secret:PW", &vals()).unwrap(), "{{secret:PW");
    }
}
