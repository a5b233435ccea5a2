//! Who is signed in to the console: single-use login links and sessions,
//! both in the store (so any replica serves them and a restart keeps
//! them), each under the SHA-256 of its secret only. A link is made by
//! `byom console` for the admin whose certificate called (name and key),
//! lives [`LINK_TTL`] and is opened once; opening it makes a session whose
//! secret is the cookie. A session ends after [`IDLE`] without a request,
//! after [`MAX_AGE`] in any case, when its admin is revoked (checked on
//! every request by the caller) or on sign-out. The CSRF token is derived
//! from the session's secret, so it is bound to the session and never
//! stored.

use std::time::Duration;

use byom_store::{Space, Store, StoreError};

/// How long a login link may wait to be opened.
pub const LINK_TTL: Duration = Duration::from_secs(5 * 60);
/// A session with no request for this long ends.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after sign-in, however busy.
pub const MAX_AGE: Duration = Duration::from_secs(12 * 3600);
/// A session's last use is written at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(60);
/// Records looked at per pruning pass (each new link prunes).
const PRUNE_SCAN: usize = 10_000;
/// Secrets are this many random bytes (256 bits), hex in links and cookies.
const SECRET_BYTES: usize = 32;

const PREFIX: &str = "console/";
const LINK: &str = "console/link/";
const SESSION: &str = "console/session/";

#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("this login link is not known (mistyped, or from another server)")]
    Unknown,
    #[error("this login link was already used: a link signs in once")]
    Used,
    #[error("this login link expired (links live 5 minutes)")]
    Expired,
    #[error("the store cannot be read: {0}")]
    Store(#[from] StoreError),
}

/// A login link as stored.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Link {
    admin: String,
    spki: String,
    read_only: bool,
    expires_ms: u64,
    /// When it was opened (0: not yet).
    used_ms: u64,
}

/// A signed-in person.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Session {
    /// The admin's name (from its certificate).
    pub admin: String,
    /// SHA-256 of the admin certificate's key, checked against the admin
    /// list on every request.
    pub spki: String,
    pub read_only: bool,
    pub created_ms: u64,
    pub last_ms: u64,
}

impl Session {
    /// Who acts, as the audit names people: `admin:NAME`.
    pub fn who(&self) -> String {
        format!("admin:{}", self.admin)
    }

    fn ended(&self, now: u64) -> bool {
        now >= self.created_ms.saturating_add(MAX_AGE.as_millis() as u64)
            || now >= self.last_ms.saturating_add(IDLE.as_millis() as u64)
    }
}

fn secret() -> Result<String, StoreError> {
    // byom's one source and policy for randomness (byom_protocol::random).
    Ok(byom_wire::hex(
        &byom_protocol::random::bytes::<SECRET_BYTES>(),
    ))
}

/// Whether `s` looks like a secret we made (so junk never reaches the store).
fn well_formed(s: &str) -> bool {
    s.len() == 2 * SECRET_BYTES && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn key(prefix: &str, secret: &str) -> String {
    format!(
        "{prefix}{}",
        byom_wire::hex(&byom_wire::sha256(secret.as_bytes()))
    )
}

/// A new login link's secret for `admin` (name and key), and when it
/// expires (after `ttl`, at most [`LINK_TTL`]). Prunes ended links and
/// sessions on the way.
pub fn create_link(
    store: &Store,
    admin: &str,
    spki: &str,
    read_only: bool,
    ttl: Duration,
    now: u64,
) -> Result<(String, u64), StoreError> {
    prune(store, now)?;
    let s = secret()?;
    let expires_ms = now + ttl.min(LINK_TTL).as_millis() as u64;
    let link = Link {
        admin: admin.to_string(),
        spki: spki.to_string(),
        read_only,
        expires_ms,
        used_ms: 0,
    };
    let v = serde_json::to_vec(&link)
        .map_err(|e| StoreError::Corrupt("console".into(), e.to_string()))?;
    if !store.create_raw(Space::Leases, &key(LINK, &s), &v)? {
        return Err(StoreError::Conflict("a login link with that secret".into()));
    }
    Ok((s, expires_ms))
}

/// Opens a login link, once: the new session's secret (the cookie) and
/// the session.
pub fn redeem(store: &Store, link: &str, now: u64) -> Result<(String, Session), LoginError> {
    if !well_formed(link) {
        return Err(LoginError::Unknown);
    }
    let k = key(LINK, link);
    let Some(old) = store.get_raw(Space::Leases, &k)? else {
        return Err(LoginError::Unknown);
    };
    let mut l: Link = serde_json::from_slice(&old).map_err(|_| LoginError::Unknown)?;
    if l.used_ms != 0 {
        return Err(LoginError::Used);
    }
    if now >= l.expires_ms {
        return Err(LoginError::Expired);
    }
    l.used_ms = now;
    let used =
        serde_json::to_vec(&l).map_err(|e| StoreError::Corrupt("console".into(), e.to_string()))?;
    // Two opening at once (or on two replicas): one wins.
    if !store.cas_raw(Space::Leases, &k, Some(&old), Some(&used))? {
        return Err(LoginError::Used);
    }
    let s = secret()?;
    let session = Session {
        admin: l.admin,
        spki: l.spki,
        read_only: l.read_only,
        created_ms: now,
        last_ms: now,
    };
    let v = serde_json::to_vec(&session)
        .map_err(|e| StoreError::Corrupt("console".into(), e.to_string()))?;
    store.put_raw(Space::Leases, &key(SESSION, &s), &v)?;
    Ok((s, session))
}

/// The live session whose secret is `cookie`, its last use recorded;
/// `None` when there is none (never was, ended, signed out).
pub fn session(store: &Store, cookie: &str, now: u64) -> Result<Option<Session>, StoreError> {
    session_at(store, cookie, now, true)
}

/// [`session`], without counting as the person's activity: what a page
/// does on its own (a live stream, its rechecks, an automatic reload) must
/// not keep an unattended session from its idle end.
pub fn session_untouched(
    store: &Store,
    cookie: &str,
    now: u64,
) -> Result<Option<Session>, StoreError> {
    session_at(store, cookie, now, false)
}

fn session_at(
    store: &Store,
    cookie: &str,
    now: u64,
    touch: bool,
) -> Result<Option<Session>, StoreError> {
    if !well_formed(cookie) {
        return Ok(None);
    }
    let k = key(SESSION, cookie);
    let Some(v) = store.get_raw(Space::Leases, &k)? else {
        return Ok(None);
    };
    let Ok(mut s) = serde_json::from_slice::<Session>(&v) else {
        return Ok(None);
    };
    if s.ended(now) {
        store.delete_raw(Space::Leases, &k)?;
        return Ok(None);
    }
    if touch && now.saturating_sub(s.last_ms) >= TOUCH_EVERY.as_millis() as u64 {
        s.last_ms = now;
        let nv = serde_json::to_vec(&s)
            .map_err(|e| StoreError::Corrupt("console".into(), e.to_string()))?;
        // Another request touched it first: as good.
        let _ = store.cas_raw(Space::Leases, &k, Some(&v), Some(&nv))?;
    }
    Ok(Some(s))
}

/// Signs out: the session is gone.
pub fn end(store: &Store, cookie: &str) -> Result<(), StoreError> {
    if well_formed(cookie) {
        store.delete_raw(Space::Leases, &key(SESSION, cookie))?;
    }
    Ok(())
}

/// The CSRF token of the session whose secret is `cookie`: what every
/// form carries; derived, never stored.
pub fn csrf(cookie: &str) -> String {
    let mut b = b"byom-console-csrf\0".to_vec();
    b.extend_from_slice(cookie.as_bytes());
    byom_wire::hex(&byom_wire::sha256(&b))
}

/// Whether `given` is the session's CSRF token (in constant time).
pub fn csrf_ok(cookie: &str, given: &str) -> bool {
    let want = csrf(cookie);
    want.len() == given.len()
        && want
            .bytes()
            .zip(given.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Deletes ended sessions and links past their TTL (used ones too), up
/// to [`PRUNE_SCAN`] looked at.
fn prune(store: &Store, now: u64) -> Result<(), StoreError> {
    for (k, v) in store.scan_prefix(Space::Leases, PREFIX, PRUNE_SCAN)? {
        let gone = if k.starts_with("link/") {
            serde_json::from_slice::<Link>(&v).map_or(true, |l| now >= l.expires_ms)
        } else if k.starts_with("session/") {
            serde_json::from_slice::<Session>(&v).map_or(true, |s| s.ended(now))
        } else {
            false
        };
        if gone {
            store.delete_raw(Space::Leases, &format!("{PREFIX}{k}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_signs_in_once_and_sessions_end() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open_sled(d.path()).unwrap();
        let (link, exp) = create_link(&store, "alice", "k", false, LINK_TTL, 1_000).unwrap();
        assert_eq!(exp, 1_000 + LINK_TTL.as_millis() as u64);
        let (cookie, s) = redeem(&store, &link, 2_000).unwrap();
        assert_eq!(s.who(), "admin:alice");
        assert!(matches!(
            redeem(&store, &link, 2_001),
            Err(LoginError::Used)
        ));
        assert!(matches!(
            redeem(&store, &"0".repeat(64), 2_001),
            Err(LoginError::Unknown)
        ));
        assert!(matches!(
            redeem(&store, "x", 2_001),
            Err(LoginError::Unknown)
        ));
        let (late, _) = create_link(&store, "bob", "k", true, LINK_TTL * 2, 3_000).unwrap();
        assert!(matches!(
            redeem(&store, &late, 3_000 + LINK_TTL.as_millis() as u64),
            Err(LoginError::Expired)
        ));
        // Only hashes are stored.
        let all = store.scan_prefix(Space::Leases, PREFIX, 100).unwrap();
        assert!(all
            .iter()
            .all(|(k, _)| !k.contains(&link) && !k.contains(&cookie)));

        assert!(session(&store, &cookie, 3_000).unwrap().is_some());
        let idle = 3_000 + IDLE.as_millis() as u64;
        assert!(session(&store, &cookie, idle).unwrap().is_none());

        let (link, _) = create_link(&store, "alice", "k", false, LINK_TTL, 10_000).unwrap();
        let (cookie, _) = redeem(&store, &link, 10_000).unwrap();
        let mut t = 10_000;
        while t < 10_000 + MAX_AGE.as_millis() as u64 - 1 {
            assert!(session(&store, &cookie, t).unwrap().is_some(), "{t}");
            t += IDLE.as_millis() as u64 / 2;
        }
        assert!(
            session(&store, &cookie, 10_000 + MAX_AGE.as_millis() as u64)
                .unwrap()
                .is_none()
        );

        assert!(csrf_ok(&cookie, &csrf(&cookie)));
        assert!(!csrf_ok(&cookie, &csrf(&link)));
        assert!(!csrf_ok(&cookie, ""));
    }

    /// What a page does on its own (a live stream's recheck every few
    /// seconds, an automatic reload) finds the session without keeping
    /// it: an unattended tab still ends 30 minutes after the person's
    /// last request.
    #[test]
    fn a_page_at_work_does_not_keep_its_session() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open_sled(d.path()).unwrap();
        let (link, _) = create_link(&store, "alice", "k", false, LINK_TTL, 1_000).unwrap();
        let (cookie, _) = redeem(&store, &link, 1_000).unwrap();
        let idle = IDLE.as_millis() as u64;
        let mut t = 1_000;
        while t < 1_000 + idle - 5_000 {
            assert!(
                session_untouched(&store, &cookie, t).unwrap().is_some(),
                "{t}"
            );
            t += 5_000;
        }
        assert!(session_untouched(&store, &cookie, 1_000 + idle)
            .unwrap()
            .is_none());
        assert!(session(&store, &cookie, 1_000 + idle).unwrap().is_none());
    }
}
