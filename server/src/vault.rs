//! Where the server keeps its own secrets (the CA and server keys, the
//! token, webhook and snapshot keys).
//!
//! With the embedded store they are files in the data dir, as they always
//! were. With a shared store every replica must hold the same ones, and a
//! fresh container must start from the database alone: they live in the
//! store, sealed with AES-256-GCM under a key the store never sees
//! (`--store-key-file`), each bound to its name so a row cannot be passed
//! off as another.
//!
//! Secrets come in groups written at once (a CA's key with its
//! certificate): [`Vault::create`] lets the first of several replicas
//! starting together win, and the rest take what it wrote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use byom_store::{Space, Store};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Store(#[from] byom_store::StoreError),
    #[error("the store's secrets cannot be opened with {0}: they were sealed with another key (every replica needs the same --store-key-file)")]
    WrongKey(PathBuf),
    #[error("the store key file {path} {why}; it holds 32 random bytes as 64 hex digits (`head -c 32 /dev/urandom | xxd -p -c 64`)")]
    BadKeyFile { path: PathBuf, why: String },
    #[error("the secret {0} in the store is corrupt")]
    Corrupt(String),
}

type Result<T> = std::result::Result<T, VaultError>;

/// The server's secret groups and the names (data-dir paths) in each:
/// the CA, the server's certificate, and its keys.
pub const CA: (&str, [&str; 2]) = ("ca", ["pki/ca.key", "pki/ca.pem"]);
pub const SERVER: (&str, [&str; 3]) = (
    "server",
    ["pki/server.key", "pki/server.pem", "pki/server.names"],
);
pub const TOKEN_KEY: &str = "token.key";
pub const WEBHOOK_KEY: &str = "webhook.key";
pub const SNAPSHOT_KEY: &str = "js-snapshot.key";

/// What a sealed value starts with, so a later format can be told apart.
const SEALED_V1: &[u8] = b"byom-sealed-1:";
/// Sealed in the store at first start, opened at every start: a wrong key
/// file is caught before anything is read with it.
const CHECK: &str = "vault-check";

pub enum Vault {
    /// Files under the data dir (the embedded store).
    Dir(PathBuf),
    /// Sealed in a shared store.
    Sealed {
        store: Store,
        key: Box<LessSafeKey>,
        key_file: PathBuf,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> VaultError + '_ {
    move |err| VaultError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// 32 random bytes as hex: the form every key of the server takes.
pub fn random_hex_key() -> Result<String> {
    // byom's one source and policy for randomness (byom_protocol::random).
    Ok(byom_wire::hex(&byom_protocol::random::bytes::<32>()))
}

impl Vault {
    /// The vault of a shared store, sealed with the key in `key_file`. A
    /// missing key file is created when the store holds no secrets yet (the
    /// first replica); after that every replica must be given it.
    pub fn sealed(store: Store, key_file: &Path) -> Result<Vault> {
        let text = match std::fs::read_to_string(key_file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if store.get_raw(Space::Secrets, CHECK)?.is_some() {
                    return Err(VaultError::BadKeyFile {
                        path: key_file.to_path_buf(),
                        why: "does not exist, but the store's secrets were sealed with a key: give this replica the same file the first one created".into(),
                    });
                }
                let k = random_hex_key()?;
                byom_wire::write_atomic(key_file, format!("{k}\n").as_bytes(), 0o600)
                    .map_err(io(key_file))?;
                tracing::warn!(
                    file = %key_file.display(),
                    "created the store key: keep it safe and give every replica the same file; it is not in the database"
                );
                k
            }
            Err(e) => return Err(io(key_file)(e)),
        };
        let bad = |why: &str| VaultError::BadKeyFile {
            path: key_file.to_path_buf(),
            why: why.to_string(),
        };
        let hex = text.trim();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("is not 64 hex digits"));
        }
        let raw: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad("is not 64 hex digits"))?;
        let key = Box::new(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &raw).map_err(|_| bad("is not a usable key"))?,
        ));
        let v = Vault::Sealed {
            store,
            key,
            key_file: key_file.to_path_buf(),
        };
        // The check: sealed once, opened every start.
        v.create(CHECK, &[("check", "byom".to_string(), 0o600)])
            .map_err(|e| match e {
                VaultError::Corrupt(_) => VaultError::WrongKey(key_file.to_path_buf()),
                e => e,
            })?;
        Ok(v)
    }

    fn seal(key: &LessSafeKey, group: &str, plain: &[u8]) -> Result<Vec<u8>> {
        let nonce = byom_protocol::random::bytes::<NONCE_LEN>();
        let mut buf = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(group.as_bytes()),
            &mut buf,
        )
        .map_err(|_| VaultError::Corrupt(group.to_string()))?;
        let mut out = SEALED_V1.to_vec();
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buf);
        Ok(out)
    }

    fn open_sealed(
        key: &LessSafeKey,
        group: &str,
        sealed: &[u8],
    ) -> Result<BTreeMap<String, String>> {
        let corrupt = || VaultError::Corrupt(group.to_string());
        let rest = sealed.strip_prefix(SEALED_V1).ok_or_else(corrupt)?;
        if rest.len() < NONCE_LEN {
            return Err(corrupt());
        }
        let (nonce, ct) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| corrupt())?;
        let mut buf = ct.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(group.as_bytes()), &mut buf)
            .map_err(|_| corrupt())?;
        serde_json::from_slice(plain).map_err(|_| corrupt())
    }

    /// The secrets `names` of `group`, if all of them are there.
    pub fn load(&self, group: &str, names: &[&str]) -> Result<Option<Vec<String>>> {
        match self {
            Vault::Dir(dir) => {
                let mut out = Vec::new();
                for n in names {
                    let path = dir.join(n);
                    match std::fs::read_to_string(&path) {
                        Ok(t) => out.push(t),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                        Err(e) => return Err(io(&path)(e)),
                    }
                }
                Ok(Some(out))
            }
            Vault::Sealed { store, key, .. } => {
                let Some(sealed) = store.get_raw(Space::Secrets, group)? else {
                    return Ok(None);
                };
                let map = Self::open_sealed(key, group, &sealed)?;
                Ok(names.iter().map(|n| map.get(*n).cloned()).collect())
            }
        }
    }

    /// Writes `items` (name, value, file mode) as `group` unless it exists;
    /// returns the values that are there now, ours or an earlier writer's.
    pub fn create(&self, group: &str, items: &[(&str, String, u32)]) -> Result<Vec<String>> {
        let names: Vec<&str> = items.iter().map(|i| i.0).collect();
        if let Some(v) = self.load(group, &names)? {
            return Ok(v);
        }
        match self {
            // The data dir is locked to this process: no one to race.
            Vault::Dir(_) => self.replace(group, items)?,
            Vault::Sealed { store, key, .. } => {
                let sealed = Self::seal(key, group, &Self::encode(items))?;
                if !store.create_raw(Space::Secrets, group, &sealed)? {
                    // Another replica was first: take what it wrote.
                    return self
                        .load(group, &names)?
                        .ok_or_else(|| VaultError::Corrupt(group.to_string()));
                }
            }
        }
        Ok(items.iter().map(|i| i.1.clone()).collect())
    }

    /// Writes `items` as `group`, over whatever was there.
    pub fn replace(&self, group: &str, items: &[(&str, String, u32)]) -> Result<()> {
        match self {
            Vault::Dir(dir) => {
                for (name, value, mode) in items {
                    let path = dir.join(name);
                    byom_wire::write_atomic(&path, value.as_bytes(), *mode).map_err(io(&path))?;
                }
                Ok(())
            }
            Vault::Sealed { store, key, .. } => {
                let sealed = Self::seal(key, group, &Self::encode(items))?;
                Ok(store.put_raw(Space::Secrets, group, &sealed)?)
            }
        }
    }

    fn encode(items: &[(&str, String, u32)]) -> Vec<u8> {
        let map: BTreeMap<&str, &str> = items.iter().map(|i| (i.0, i.1.as_str())).collect();
        serde_json::to_vec(&map).unwrap_or_default()
    }

    /// The key `name` (a file in the data dir, or a sealed secret), made on
    /// first use. Files written by hand in either form the server reads
    /// (hex, or at least 32 raw bytes) are kept.
    pub fn key(&self, name: &str) -> Result<Vec<u8>> {
        match self {
            Vault::Dir(dir) => {
                let path = dir.join(name);
                byom_wire::load_or_create_key(&path).map_err(io(&path))
            }
            Vault::Sealed { .. } => {
                let v = self.create(name, &[(name, random_hex_key()?, 0o600)])?;
                Ok(v.into_iter().next().unwrap_or_default().into_bytes())
            }
        }
    }

    /// Where the secrets are, for messages.
    pub fn describe(&self) -> String {
        match self {
            Vault::Dir(d) => d.display().to_string(),
            Vault::Sealed { key_file, .. } => {
                format!("the store, sealed with {}", key_file.display())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open_sled(&d.path().join("s")).unwrap();
        (d, s)
    }

    #[test]
    fn sealed_secrets_round_trip_and_the_first_writer_wins() {
        let (d, s) = store();
        let kf = d.path().join("store.key");
        let a = Vault::sealed(s.clone(), &kf).unwrap();
        let b = Vault::sealed(s.clone(), &kf).unwrap();
        let got = a.create("ca", &[("k", "one".into(), 0o600)]).unwrap();
        assert_eq!(got, ["one"]);
        // A second replica racing with its own value gets the first one's.
        assert_eq!(
            b.create("ca", &[("k", "two".into(), 0o600)]).unwrap(),
            ["one"]
        );
        assert_eq!(a.key("token.key").unwrap(), b.key("token.key").unwrap());
        // Nothing readable in the store itself.
        let raw = s.get_raw(Space::Secrets, "ca").unwrap().unwrap();
        assert!(!String::from_utf8_lossy(&raw).contains("one"));
        b.replace("ca", &[("k", "three".into(), 0o600)]).unwrap();
        assert_eq!(a.load("ca", &["k"]).unwrap().unwrap(), ["three"]);
    }

    #[test]
    fn a_wrong_or_missing_key_file_is_refused_clearly() {
        let (d, s) = store();
        let kf = d.path().join("store.key");
        Vault::sealed(s.clone(), &kf).unwrap();
        let other = d.path().join("other.key");
        std::fs::write(&other, format!("{}\n", random_hex_key().unwrap())).unwrap();
        let e = Vault::sealed(s.clone(), &other).err().unwrap();
        assert!(matches!(e, VaultError::WrongKey(_)), "{e}");
        let e = Vault::sealed(s.clone(), &d.path().join("missing.key"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("same file"), "{e}");
        std::fs::write(&other, "short").unwrap();
        let e = Vault::sealed(s, &other).err().unwrap();
        assert!(e.to_string().contains("64 hex digits"), "{e}");
    }

    #[test]
    fn a_sealed_value_cannot_be_passed_off_under_another_name() {
        let (d, s) = store();
        let v = Vault::sealed(s.clone(), &d.path().join("k")).unwrap();
        v.create("a", &[("x", "secret".into(), 0o600)]).unwrap();
        let raw = s.get_raw(Space::Secrets, "a").unwrap().unwrap();
        s.put_raw(Space::Secrets, "b", &raw).unwrap();
        assert!(matches!(v.load("b", &["x"]), Err(VaultError::Corrupt(_))));
    }
}
