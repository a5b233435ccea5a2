//! Stable, prefixed object IDs: `mch_`, `tok_`, `cmd_`, … followed by 26
//! Crockford base32 characters of 128 bits (48-bit millisecond time, then 80
//! random bits), so IDs sort by creation time and never collide in practice.

use std::fmt;

/// Kinds of object with an ID, by prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Machine,
    Token,
    Command,
    Trigger,
    Thread,
    Worker,
    Snapshot,
    Policy,
    Approval,
    Outbox,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Machine,
        Kind::Token,
        Kind::Command,
        Kind::Trigger,
        Kind::Thread,
        Kind::Worker,
        Kind::Snapshot,
        Kind::Policy,
        Kind::Approval,
        Kind::Outbox,
    ];

    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Machine => "mch_",
            Kind::Token => "tok_",
            Kind::Command => "cmd_",
            Kind::Trigger => "trg_",
            Kind::Thread => "thr_",
            Kind::Worker => "wrk_",
            Kind::Snapshot => "snp_",
            Kind::Policy => "pol_",
            Kind::Approval => "apr_",
            Kind::Outbox => "out_",
        }
    }

    /// The kind an ID string claims by its prefix, if it is well formed.
    pub fn of(id: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| id.starts_with(k.prefix()) && valid_body(&id[k.prefix().len()..]))
    }
}

const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
const BODY_LEN: usize = 26;

fn valid_body(body: &str) -> bool {
    body.len() == BODY_LEN && body.bytes().all(|b| ALPHABET.contains(&b))
}

/// Makes a new ID body from a millisecond timestamp and 10 random bytes.
pub fn encode_body(time_ms: u64, random: [u8; 10]) -> String {
    let mut value: u128 = ((time_ms as u128) & 0xffff_ffff_ffff) << 80;
    for (i, b) in random.iter().enumerate() {
        value |= (*b as u128) << (8 * (9 - i));
    }
    let mut out = [0u8; BODY_LEN];
    // 26 * 5 = 130 bits: the top two bits are always zero.
    for i in (0..BODY_LEN).rev() {
        out[i] = ALPHABET[(value & 31) as usize];
        value >>= 5;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Error for a malformed ID string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a valid {1} ID (expected {2} followed by 26 base32 characters)")]
pub struct BadId(pub String, pub &'static str, pub &'static str);

macro_rules! typed_id {
    ($name:ident, $kind:expr, $what:literal) => {
        #[doc = concat!("ID of a ", $what, ".")]
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// A fresh ID for the given time. Randomness comes from the OS.
            pub fn new(time_ms: u64) -> Self {
                let random = crate::random::bytes::<10>();
                Self(format!(
                    "{}{}",
                    $kind.prefix(),
                    encode_body(time_ms, random)
                ))
            }

            pub fn parse(s: &str) -> Result<Self, BadId> {
                if Kind::of(s) == Some($kind) {
                    Ok(Self(s.to_string()))
                } else {
                    Err(BadId(s.to_string(), $what, $kind.prefix()))
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = BadId;
            fn from_str(s: &str) -> Result<Self, BadId> {
                Self::parse(s)
            }
        }
    };
}

typed_id!(MachineId, Kind::Machine, "machine");
typed_id!(TokenId, Kind::Token, "token");
typed_id!(CommandId, Kind::Command, "command");
typed_id!(TriggerId, Kind::Trigger, "trigger");
typed_id!(ThreadId, Kind::Thread, "thread");
typed_id!(PolicyId, Kind::Policy, "policy");
typed_id!(WorkerId, Kind::Worker, "worker");
typed_id!(SnapshotId, Kind::Snapshot, "snapshot");
typed_id!(ApprovalId, Kind::Approval, "approval");
typed_id!(OutboxId, Kind::Outbox, "outbox item");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_sort_by_time() {
        let a = CommandId::new(1_000);
        let b = CommandId::new(2_000);
        assert!(a < b);
        assert_eq!(CommandId::parse(a.as_str()).unwrap(), a);
        assert_eq!(Kind::of(a.as_str()), Some(Kind::Command));
        assert!(MachineId::parse(a.as_str()).is_err());
        assert!(MachineId::parse("mch_").is_err());
        assert!(MachineId::parse("mch_ILLEGALILLEGALILLEGAL1234").is_err());
    }

    #[test]
    fn body_encoding_is_fixed_width() {
        assert_eq!(encode_body(0, [0; 10]), "0".repeat(26));
        assert_eq!(encode_body(u64::MAX, [0xff; 10]).len(), 26);
    }
}
