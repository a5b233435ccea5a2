//! Personal admin identities: who may use the API, each with their own
//! certificate, so the audit log, approvals and cancels name a person.
//!
//! The list lives in the store (every restart and replica sees it). Each
//! personal admin's public key is pinned: a certificate is accepted only
//! if it carries the key `byom admins add` recorded, so re-issuing a name
//! retires the old certificate, and a revoked name is refused at once,
//! connection or not. The bootstrap admin (`admin`, whose bundle the
//! server writes into its data dir) has no pin, since the server may
//! re-issue it at start; it works until someone revokes it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use byom_store::{Op, Store, StoreError};
use serde::{Deserialize, Serialize};

/// Server-wide setting under which the list is stored.
const ADMINS_KEY: &str = "admins";
/// The bootstrap admin's name.
pub const BOOTSTRAP: &str = "admin";
/// Longest admin name; names go into certificates and audit lines.
pub const MAX_NAME: usize = 64;
/// Most admins a server keeps (the list is one record).
pub const MAX_ADMINS: usize = 1000;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AdminRecord {
    pub name: String,
    /// SHA-256 of the certificate's public key; empty for the bootstrap
    /// admin.
    #[serde(default)]
    pub spki_sha256: String,
    #[serde(default)]
    pub created_ms: u64,
    #[serde(default)]
    pub created_by: String,
    #[serde(default)]
    pub revoked_ms: Option<u64>,
    #[serde(default)]
    pub revoked_by: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub type Admins = BTreeMap<String, AdminRecord>;

/// The stored list. One that no longer parses refuses everyone but the
/// bootstrap admin (failing closed for the people it named) and is
/// reported.
pub fn load(store: &Store) -> Result<Admins, StoreError> {
    Ok(match store.channel_state("", ADMINS_KEY)? {
        Some(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
            tracing::error!("the stored admin list does not parse ({e}); only `admin` may call");
            Admins::new()
        }),
        None => Admins::new(),
    })
}

fn save(store: &Store, a: &Admins) -> Result<(), StoreError> {
    let json = serde_json::to_vec(a).unwrap_or_default();
    store.batch(&[Op::channel_state("", ADMINS_KEY, &json)])?;
    changed();
    store.flush()
}

/// How long a replica may check calls against the admin list it read last,
/// when several servers share the store. A change made here applies to the
/// next call; one made on another replica as soon as its note arrives
/// ([`changed`]), or after this if the note was lost.
pub const SHARED_FRESH: Duration = Duration::from_secs(1);

/// Bumped whenever the list may have changed. Process-wide: several
/// servers in one process (tests) only re-read more often.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// The admin list changed (here, or a replica said so).
pub fn changed() {
    CHANGES.fetch_add(1, Ordering::SeqCst);
}

/// The admin list every API call is checked against. On a store of its
/// own the server reads it each time (a local read costs microseconds);
/// on a shared one that read is a database statement per call, so the
/// list is kept for up to [`SHARED_FRESH`] and until it changes.
#[derive(Default)]
pub struct Checker(Mutex<Option<(u64, Instant, Arc<Admins>)>>);

impl Checker {
    pub fn admins(&self, store: &Store) -> Result<Arc<Admins>, StoreError> {
        if !store.is_shared() {
            return load(store).map(Arc::new);
        }
        // Read before the list: a change after this re-reads next time.
        let gen = CHANGES.load(Ordering::SeqCst);
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((g, at, a)) = &*kept {
            if *g == gen && at.elapsed() < SHARED_FRESH {
                return Ok(a.clone());
            }
        }
        let a = Arc::new(load(store)?);
        *kept = Some((gen, Instant::now(), a.clone()));
        Ok(a)
    }
}

/// Whether a caller presenting `name`'s certificate with key `spki` may
/// use the API; the error says what is wrong and what to do.
pub fn check(admins: &Admins, name: &str, spki: &str) -> Result<(), String> {
    match admins.get(name) {
        Some(r) if r.revoked_ms.is_some() => {
            let by = if r.revoked_by.is_empty() {
                "an admin"
            } else {
                &r.revoked_by
            };
            Err(if name == BOOTSTRAP {
                format!("the bootstrap admin was revoked by {by}; use your personal bundle (`BYOM_CREDS=DIR`, from `byom admins add YOUR-NAME`)")
            } else {
                format!("the admin certificate for {name} was revoked by {by}; ask an admin for a new one (`byom admins add {name}`)")
            })
        }
        Some(r) if !r.spki_sha256.is_empty() && r.spki_sha256 != spki => Err(format!(
            "this admin certificate for {name} was replaced by a newer one; use the bundle `byom admins add {name}` wrote last"
        )),
        Some(_) => Ok(()),
        None if name == BOOTSTRAP => Ok(()),
        None => Err(format!(
            "{name} is not an admin of this server; ask an admin to run `byom admins add {name}`"
        )),
    }
}

/// A name `byom admins add` may issue: not the bootstrap admin's.
pub fn validate_name(name: &str) -> Result<(), AdminError> {
    if name == BOOTSTRAP {
        return Err(AdminError::Invalid(format!(
            "{BOOTSTRAP} is the bootstrap admin, kept in the server's data dir; choose a person's name"
        )));
    }
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(AdminError::Invalid(format!(
            "{name:?} is not an admin name: 1 to {MAX_NAME} letters, digits, '.', '_', '-' or '@', starting with a letter or digit"
        )))
    }
}

/// Records `name` with the key its new certificate carries; an earlier
/// certificate for the name stops working.
pub fn add(
    store: &Store,
    name: &str,
    spki: &str,
    by: &str,
    now_ms: u64,
) -> Result<AdminRecord, AdminError> {
    validate_name(name)?;
    let mut all = load(store)?;
    if !all.contains_key(name) && all.len() >= MAX_ADMINS {
        return Err(AdminError::Refused(format!(
            "this server already has {MAX_ADMINS} admins; revoke some first"
        )));
    }
    let r = AdminRecord {
        name: name.to_string(),
        spki_sha256: spki.to_string(),
        created_ms: now_ms,
        created_by: by.to_string(),
        revoked_ms: None,
        revoked_by: String::new(),
    };
    all.insert(name.to_string(), r.clone());
    save(store, &all)?;
    Ok(r)
}

/// Revokes `name`. Nobody revokes themselves, and the last admin who can
/// still call stays, so the server is never left without one.
pub fn revoke(store: &Store, name: &str, by: &str, now_ms: u64) -> Result<AdminRecord, AdminError> {
    let mut all = load(store)?;
    if by == format!("admin:{name}") {
        return Err(AdminError::Refused(format!(
            "you are {name}: another admin revokes you, so the server always keeps someone who can"
        )));
    }
    let active = |all: &Admins, n: &str| match all.get(n) {
        Some(r) => r.revoked_ms.is_none(),
        None => n == BOOTSTRAP,
    };
    if !active(&all, name) {
        // Revoked already: a retried call (say, after a server restart)
        // gets the record it made, not an error.
        return match all.get(name) {
            Some(r) => Ok(r.clone()),
            None => Err(AdminError::Invalid(format!(
                "{name} is not an admin; see `byom admins ls`"
            ))),
        };
    }
    let r = all.entry(name.to_string()).or_insert_with(|| AdminRecord {
        name: name.to_string(),
        ..Default::default()
    });
    r.revoked_ms = Some(now_ms);
    r.revoked_by = by.to_string();
    let r = r.clone();
    save(store, &all)?;
    tracing::info!(name, by, "admin revoked");
    Ok(r)
}

/// Every admin, the bootstrap one included, for `byom admins ls`.
pub fn list(store: &Store) -> Result<Vec<AdminRecord>, StoreError> {
    let mut all = load(store)?;
    all.entry(BOOTSTRAP.to_string())
        .or_insert_with(|| AdminRecord {
            name: BOOTSTRAP.to_string(),
            created_by: "the server (bootstrap)".into(),
            ..Default::default()
        });
    Ok(all.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_revocation_and_lockout() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sled(dir.path()).unwrap();
        let all = load(&store).unwrap();
        assert!(check(&all, "admin", "").is_ok(), "bootstrap works at first");
        assert!(check(&all, "ada", "k1")
            .unwrap_err()
            .contains("not an admin"));
        add(&store, "ada", "k1", "admin:admin", 1).unwrap();
        let all = load(&store).unwrap();
        assert!(check(&all, "ada", "k1").is_ok());
        assert!(check(&all, "ada", "k0").unwrap_err().contains("replaced"));
        assert!(add(&store, "admin", "k", "admin:ada", 2).is_err());
        assert!(add(&store, "bad name", "k", "admin:ada", 2).is_err());
        assert!(matches!(
            revoke(&store, "ada", "admin:ada", 3),
            Err(AdminError::Refused(_))
        ));
        revoke(&store, "admin", "admin:ada", 3).unwrap();
        let all = load(&store).unwrap();
        let e = check(&all, "admin", "").unwrap_err();
        assert!(
            e.contains("revoked by admin:ada") && e.contains("personal bundle"),
            "{e}"
        );
        // Revoking again (a retry) answers with the first revocation.
        let again = revoke(&store, "admin", "admin:bob", 4).unwrap();
        assert_eq!(
            (again.revoked_ms, again.revoked_by.as_str()),
            (Some(3), "admin:ada")
        );
        assert_eq!(list(&store).unwrap().len(), 2);
    }
}
