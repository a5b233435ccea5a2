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

pub fn set(dir: &Path, name: &str, value: &str) -> anyhow::Result<KeyStore> {
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
    save(dir, &f)?;
    Ok(kind)
}

pub fn list(dir: &Path) -> anyhow::Result<Vec<String>> {
    Ok(load(dir)?.secrets.into_keys().collect())
}

pub fn remove(dir: &Path, name: &str) -> anyhow::Result<bool> {
    let mut f = load(dir)?;
    let had = f.secrets.remove(name).is_some();
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
    let kind = store_kind(dir);
    let mut out = BTreeMap::new();
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

/// Replaces every `{{secret:NAME}}` in `text`. Unknown names are an error
/// that names them, never an empty substitution.
pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("{{secret:") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 9..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[i..]);
            return Ok(out);
        };
        let name = &after[..end];
        match values.get(name) {
            Some(v) => out.push_str(v),
            None => {
                return Err(format!(
                "unknown secret {name:?}: set it on this machine with `byomd secret set {name}`"
            ))
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Streams output with every secret value replaced by its handle, also
/// when a value is split across chunks: bytes that could be the start of a
/// value wait for the next chunk.
pub struct Scrubber {
    secrets: Vec<(Vec<u8>, Vec<u8>)>,
    carry: Vec<u8>,
}

impl Scrubber {
    pub fn new(values: &BTreeMap<String, String>) -> Scrubber {
        let mut secrets: Vec<(Vec<u8>, Vec<u8>)> = values
            .iter()
            .filter(|(_, v)| v.len() >= MIN_VALUE_LEN)
            .map(|(k, v)| {
                (
                    v.as_bytes().to_vec(),
                    format!("{{{{secret:{k}}}}}").into_bytes(),
                )
            })
            .collect();
        // Longest first, so a value containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        Scrubber {
            secrets,
            carry: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    fn scan(&mut self, buf: &[u8], last: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'outer: while i < buf.len() {
            for (v, r) in &self.secrets {
                if buf[i..].starts_with(v) {
                    out.extend_from_slice(r);
                    i += v.len();
                    continue 'outer;
                }
            }
            if !last
                && self
                    .secrets
                    .iter()
                    .any(|(v, _)| buf.len() - i < v.len() && v.starts_with(&buf[i..]))
            {
                self.carry = buf[i..].to_vec();
                return out;
            }
            out.push(buf[i]);
            i += 1;
        }
        self.carry.clear();
        out
    }

    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.secrets.is_empty() {
            return chunk.to_vec();
        }
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(chunk);
        self.scan(&buf, false)
    }

    /// The held-back tail at end of stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let buf = std::mem::take(&mut self.carry);
        self.scan(&buf, true)
    }
}

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

    #[test]
    fn scrubbing_across_every_split() {
        let text = b"x s3cr3t-value y hunter22 z hunter2 s3cr3t-valu".to_vec();
        let want = b"x {{secret:TOKEN}} y {{secret:PW}} z hunter2 s3cr3t-valu".to_vec();
        for a in 0..text.len() {
            for b in a..text.len() {
                let mut s = Scrubber::new(&vals());
                let mut out = s.push(&text[..a]);
                out.extend(s.push(&text[a..b]));
                out.extend(s.push(&text[b..]));
                out.extend(s.finish());
                assert_eq!(out, want, "split at {a},{b}");
            }
        }
    }
}
