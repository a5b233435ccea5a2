//! The pairing token string: everything `byomd pair` needs, and nothing it
//! must trust blindly. It carries the server's QUIC address, the SHA-256 of
//! the CA certificate (pinned: the daemon trusts no other CA) and a random
//! secret the server stores only as a hash.
//!
//! Format: `byom1-` + base64url (no padding) of
//! `[32-byte CA SHA-256][32-byte secret][UTF-8 host:port]`.

use base64::Engine;

const PREFIX: &str = "byom1-";
const FP_LEN: usize = 32;
const SECRET_LEN: usize = 32;
const MAX_ADDR_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairingToken {
    pub ca_sha256: [u8; FP_LEN],
    pub secret: [u8; SECRET_LEN],
    pub server_addr: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("not a byom pairing token (it should start with {PREFIX:?}); copy the whole token printed by `byom token create`")]
    BadPrefix,
    #[error("the pairing token is damaged ({0}); copy it again from `byom token create`")]
    Damaged(&'static str),
}

impl PairingToken {
    /// A token with a fresh random secret.
    pub fn generate(ca_sha256: [u8; FP_LEN], server_addr: String) -> Self {
        let secret = crate::random::bytes::<SECRET_LEN>();
        Self {
            ca_sha256,
            secret,
            server_addr,
        }
    }

    pub fn encode(&self) -> String {
        let mut raw = Vec::with_capacity(FP_LEN + SECRET_LEN + self.server_addr.len());
        raw.extend_from_slice(&self.ca_sha256);
        raw.extend_from_slice(&self.secret);
        raw.extend_from_slice(self.server_addr.as_bytes());
        format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
        )
    }

    pub fn parse(s: &str) -> Result<Self, TokenError> {
        let body = s.trim().strip_prefix(PREFIX).ok_or(TokenError::BadPrefix)?;
        if body.len() > 4 * (FP_LEN + SECRET_LEN + MAX_ADDR_LEN) / 3 + 4 {
            return Err(TokenError::Damaged("too long"));
        }
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| TokenError::Damaged("not base64url"))?;
        if raw.len() <= FP_LEN + SECRET_LEN {
            return Err(TokenError::Damaged("too short"));
        }
        let addr = std::str::from_utf8(&raw[FP_LEN + SECRET_LEN..])
            .map_err(|_| TokenError::Damaged("address is not UTF-8"))?;
        if addr.len() > MAX_ADDR_LEN || !addr.contains(':') || addr.chars().any(char::is_control) {
            return Err(TokenError::Damaged("bad server address"));
        }
        let mut ca_sha256 = [0u8; FP_LEN];
        ca_sha256.copy_from_slice(&raw[..FP_LEN]);
        let mut secret = [0u8; SECRET_LEN];
        secret.copy_from_slice(&raw[FP_LEN..FP_LEN + SECRET_LEN]);
        Ok(Self {
            ca_sha256,
            secret,
            server_addr: addr.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let t = PairingToken::generate([7; 32], "127.0.0.1:7443".into());
        assert_eq!(PairingToken::parse(&t.encode()).unwrap(), t);
        assert_eq!(PairingToken::parse("nope"), Err(TokenError::BadPrefix));
        assert!(PairingToken::parse("byom1-!!!").is_err());
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,600}") {
            let _ = PairingToken::parse(&s);
            let _ = PairingToken::parse(&format!("byom1-{s}"));
        }
    }
}
