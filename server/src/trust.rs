//! Trust as the server keeps it: the `byom trust` configuration in the
//! store (so every restart and, later, every replica sees the same), and
//! who a message's author is to containment.

use byom_agent::trust::Trust;
use byom_store::{Op, Store, StoreError};

/// Server-wide setting under which the configuration is stored.
const TRUST_KEY: &str = "trust";

/// The configuration in force: the stored one, or the defaults when none
/// was ever stored. A store that cannot be read is an error (whoever asks
/// decides nothing until it can be); a stored one that no longer parses
/// is reported and replaced by [`Trust::closed`], which trusts only
/// admins: failing closed, never open.
pub fn load(store: &Store) -> Result<Trust, StoreError> {
    Ok(match store.channel_state("", TRUST_KEY)? {
        Some(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
            tracing::error!(
                "the stored trust configuration does not parse ({e}); trusting only admins until `byom trust` replaces it"
            );
            Trust::closed()
        }),
        None => Trust::default(),
    })
}

pub fn save(store: &Store, t: &Trust) -> Result<(), StoreError> {
    let json = serde_json::to_vec(t).unwrap_or_default();
    store.batch(&[Op::channel_state("", TRUST_KEY, &json)])?;
    store.flush()
}

/// Who the author of an event is to containment. Connectors name their
/// principals (`github:…`, `matrix:…`, `slack:…`); a generic webhook's
/// sender is whoever its body says, vouched for by nobody
/// (`webhook:SOURCE/USER`); an admin sending through the API under a
/// plain name (`byom chat`, `byom events send`) speaks as themselves,
/// while a namespaced name is a claim they make for someone else (and is
/// judged as that someone).
pub fn principal(kind: &str, source: &str, user: &str, admin: Option<&str>) -> String {
    // Another admin's name is not theirs to claim: approvals name people.
    let namespaced = ["github:", "matrix:", "slack:", "webhook:"]
        .iter()
        .any(|p| user.starts_with(p));
    match admin {
        Some(a) if !namespaced => a.to_string(),
        Some(_) => user.to_string(),
        None if kind == "webhook" => format!("webhook:{source}/{user}"),
        None => user.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_that_does_not_parse_trusts_only_admins() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open_sled(d.path()).unwrap();
        assert_eq!(load(&store).unwrap(), Trust::default());
        store
            .batch(&[Op::channel_state("", TRUST_KEY, b"{not json")])
            .unwrap();
        let t = load(&store).unwrap();
        assert_eq!(t, Trust::closed());
        assert!(!t.judge("github:octocat", "OWNER").trusted);
        assert!(t.judge("admin:ada", "").trusted);
    }

    #[test]
    fn principals() {
        assert_eq!(
            principal("chat", "chat", "ada", Some("admin:ada")),
            "admin:ada"
        );
        assert_eq!(
            principal("cli", "gh", "github:mallory", Some("admin:ada")),
            "github:mallory"
        );
        assert_eq!(
            principal("cli", "x", "admin:root", Some("admin:ada")),
            "admin:ada"
        );
        assert_eq!(principal("webhook", "ci", "bot", None), "webhook:ci/bot");
        // A webhook body cannot claim to be an admin.
        assert_eq!(
            principal("webhook", "ci", "admin:root", None),
            "webhook:ci/admin:root"
        );
        assert_eq!(
            principal("github", "gh", "github:octocat", None),
            "github:octocat"
        );
    }
}
