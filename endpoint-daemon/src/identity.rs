//! The daemon's identity, the only thing it keeps on disk: machine ID,
//! server address, pinned CA, certificate, and the private key, which lives
//! in the OS keyring when one works and otherwise in a 0600 file written
//! atomically in the config dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

pub use byom_wire::write_atomic;

const IDENTITY_FILE: &str = "identity.json";
const KEY_FILE: &str = "key.pem";
const KEYRING_SERVICE: &str = "byomd";
/// A keyring that does not answer in this time counts as unavailable
/// (a headless box with a half-configured D-Bus can hang).
const KEYRING_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KeyStore {
    /// The OS keyring (Secret Service, macOS Keychain, Windows Credential Manager).
    Keyring,
    /// A 0600 file in the config dir.
    File,
}

/// Where to put the key: `auto` tries the keyring and falls back to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyStoreChoice {
    Auto,
    Keyring,
    File,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    pub machine_id: String,
    pub name: String,
    pub server_addr: String,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_store: KeyStore,
    /// Set when the server told us we were revoked; `run` then refuses.
    #[serde(default)]
    pub revoked: bool,
    #[serde(default)]
    pub paired_at_ms: u64,
}

/// Default config dir: `$BYOMD_CONFIG_DIR`, else `$XDG_CONFIG_HOME/byomd`,
/// else `~/.config/byomd`.
pub fn default_config_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("BYOMD_CONFIG_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CONFIG_HOME") {
        return PathBuf::from(d).join("byomd");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".config/byomd");
    }
    PathBuf::from("byomd-config")
}

impl Identity {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(IDENTITY_FILE)
    }

    pub fn exists(dir: &Path) -> bool {
        Self::path(dir).exists()
    }

    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let p = Self::path(dir);
        let bytes = std::fs::read(&p).with_context(|| {
            format!(
                "this machine is not paired ({} is missing): run `byomd pair TOKEN` with a token from `byom token create`",
                p.display()
            )
        })?;
        serde_json::from_slice(&bytes).with_context(|| format!("{} is damaged", p.display()))
    }

    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_vec_pretty(self)?;
        write_atomic(&Self::path(dir), &json, 0o600)
            .with_context(|| format!("cannot write {}", Self::path(dir).display()))
    }

    fn keyring_user(&self, dir: &Path) -> String {
        keyring_user(&self.machine_id, dir)
    }

    pub fn load_key(&self, dir: &Path) -> anyhow::Result<String> {
        match self.key_store {
            KeyStore::File => std::fs::read_to_string(dir.join(KEY_FILE)).with_context(|| {
                format!(
                    "cannot read the private key {}",
                    dir.join(KEY_FILE).display()
                )
            }),
            KeyStore::Keyring => keyring_get(&self.keyring_user(dir))
                .context("cannot read the private key from the OS keyring"),
        }
    }

    /// Removes the identity and its key.
    pub fn wipe(&self, dir: &Path) -> anyhow::Result<()> {
        if self.key_store == KeyStore::Keyring {
            let _ = keyring_delete(&self.keyring_user(dir));
        }
        let _ = std::fs::remove_file(dir.join(KEY_FILE));
        std::fs::remove_file(Self::path(dir))
            .with_context(|| format!("cannot remove {}", Self::path(dir).display()))?;
        Ok(())
    }
}

/// Keyring account name for `name` under this config dir. Several daemons
/// (config dirs) on one account must not share entries.
pub(crate) fn keyring_user(name: &str, dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let h = crate::tls::hex(&crate::tls::sha256(dir.to_string_lossy().as_bytes()));
    format!("{name}:{}", &h[..16])
}

/// Runs a keyring call on its own thread with a timeout: some backends
/// block, and some must not run inside an async runtime.
fn with_keyring<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, keyring::Error> + Send + 'static,
) -> anyhow::Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(KEYRING_TIMEOUT) {
        Ok(r) => Ok(r?),
        Err(_) => bail!("the OS keyring did not answer within {KEYRING_TIMEOUT:?}"),
    }
}

fn keyring_get(user: &str) -> anyhow::Result<String> {
    keyring_get_entry(KEYRING_SERVICE, user)
}

fn keyring_set(user: &str, secret: &str) -> anyhow::Result<()> {
    keyring_set_entry(KEYRING_SERVICE, user, secret)
}

fn keyring_delete(user: &str) -> anyhow::Result<()> {
    keyring_delete_entry(KEYRING_SERVICE, user)
}

pub(crate) fn keyring_get_entry(service: &str, user: &str) -> anyhow::Result<String> {
    let (service, user) = (service.to_string(), user.to_string());
    with_keyring(move || keyring::Entry::new(&service, &user)?.get_password())
}

pub(crate) fn keyring_set_entry(service: &str, user: &str, secret: &str) -> anyhow::Result<()> {
    let (service, user, secret) = (service.to_string(), user.to_string(), secret.to_string());
    with_keyring(move || {
        let e = keyring::Entry::new(&service, &user)?;
        e.set_password(&secret)?;
        // Read back: some backends accept writes they cannot keep.
        if e.get_password()? != secret {
            return Err(keyring::Error::NoEntry);
        }
        Ok(())
    })
}

pub(crate) fn keyring_delete_entry(service: &str, user: &str) -> anyhow::Result<()> {
    let (service, user) = (service.to_string(), user.to_string());
    with_keyring(move || keyring::Entry::new(&service, &user)?.delete_credential())
}

/// Stores a private key, returning where it went. `auto` falls back to the
/// file, logging why the keyring was not used.
pub fn store_key(
    dir: &Path,
    machine_id: &str,
    key_pem: &str,
    choice: KeyStoreChoice,
) -> anyhow::Result<(KeyStore, Option<String>)> {
    let write_file = || -> anyhow::Result<()> {
        write_atomic(&dir.join(KEY_FILE), key_pem.as_bytes(), 0o600)
            .with_context(|| format!("cannot write {}", dir.join(KEY_FILE).display()))
    };
    match choice {
        KeyStoreChoice::File => {
            write_file()?;
            Ok((KeyStore::File, None))
        }
        KeyStoreChoice::Keyring => {
            keyring_set(&keyring_user(machine_id, dir), key_pem)
                .context("the OS keyring is not usable here; use --key-store file")?;
            Ok((KeyStore::Keyring, None))
        }
        KeyStoreChoice::Auto => match keyring_set(&keyring_user(machine_id, dir), key_pem) {
            Ok(()) => Ok((KeyStore::Keyring, None)),
            Err(e) => {
                write_file()?;
                Ok((KeyStore::File, Some(format!("{e:#}"))))
            }
        },
    }
}
