//! The byom wire protocol: protobuf messages for the daemon protocol (QUIC)
//! and the admin API (gRPC), the length-prefixed frame codec with its size
//! limits, typed object IDs, the pairing-token format and the shared limits.
//!
//! This crate does no I/O: it never knows about sockets, tokio, storage or
//! clocks. Everything here is a pure function of its input, which is what
//! lets the codec be property-tested and both peers agree by construction.
//!
//! Key items: [`pb`] (generated messages), [`frame`] (encode/decode with
//! [`limits::MAX_FRAME_BYTES`]), [`id`] (`mch_…`, `cmd_…`, `tok_…`),
//! [`token::PairingToken`], [`manifest::Manifest`] (what a server ships),
//! [`version()`] (the stamped version), [`limits`], [`names`] (one validator for names
//! and labels), [`time`] (RFC 3339), [`PROTOCOL_VERSION`] and [`ALPN`].

pub mod frame;
pub mod id;
pub mod limits;
pub mod manifest;
pub mod names;
pub mod random;
pub mod time;
pub mod token;

/// Generated protobuf messages (package `byom.v1`), committed so a build
/// needs no protobuf compiler: `tests/tests/protos.rs` fails when they are
/// not what `proto/byom.proto` gives, and rewrites them when asked.
#[allow(clippy::all, missing_docs)]
/// Lower-case hex of `bytes`: the one encoder for digests, keys and
/// fingerprints that people and files see.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

pub mod pb {
    // Generated: a oneof's variants are as large as their messages, and
    // these live only while a reply is encoded or read.
    #![allow(clippy::large_enum_variant)]
    include!("gen/byom.v1.rs");
}

impl pb::Machine {
    /// Whether it has every label in `want` (a label selector: `key=value`
    /// pairs, all required). The one place a selector is matched.
    pub fn has_labels<K: AsRef<str>, V: AsRef<str>>(
        &self,
        want: impl IntoIterator<Item = (K, V)>,
    ) -> bool {
        want.into_iter()
            .all(|(k, v)| self.labels.get(k.as_ref()).map(String::as_str) == Some(v.as_ref()))
    }
}

/// Version of the daemon protocol. Bumped on incompatible changes; the ALPN
/// carries it so mismatched peers fail in the TLS handshake with a clear error.
pub const PROTOCOL_VERSION: u32 = 1;

/// ALPN protocol ID for the QUIC and TCP transports.
pub const ALPN: &[u8] = b"byom/1";

/// TLS server name every daemon uses: the CA is private and pinned, so the
/// name only has to match the server certificate the CA issued.
pub const SERVER_NAME: &str = "byom-server";

/// Crate version, reported in Hello and by `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

const STAMP_PREFIX: &[u8] = b"byom-version-stamp:";
const STAMP_LEN: usize = 64;

/// The version this binary reports, kept where release tooling can rewrite
/// it in place (the bytes after `byom-version-stamp:`, NUL-padded), the way
/// Go's `-X` sets a string at link time: a packager stamps a build without
/// recompiling it, and the upgrade tests make a "newer" daemon that way.
#[used]
static VERSION_STAMP: [u8; STAMP_LEN] = stamp();

const fn stamp() -> [u8; STAMP_LEN] {
    let mut out = [0u8; STAMP_LEN];
    let v = VERSION.as_bytes();
    let mut i = 0;
    while i < STAMP_PREFIX.len() {
        out[i] = STAMP_PREFIX[i];
        i += 1;
    }
    let mut j = 0;
    while j < v.len() && i + j < STAMP_LEN {
        out[i + j] = v[j];
        j += 1;
    }
    out
}

/// The version this binary reports in `Hello`, `--version`-like output and
/// the upgrade logic: the stamp, or [`VERSION`] if the stamp is damaged.
pub fn version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        // black_box: the stamp must be read from the binary, never folded
        // into a constant at compile time.
        let s: &[u8; STAMP_LEN] = std::hint::black_box(&VERSION_STAMP);
        let body = &s[STAMP_PREFIX.len()..];
        let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
        std::str::from_utf8(&body[..end])
            .ok()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic()))
            .map_or_else(|| VERSION.to_string(), str::to_string)
    })
}

impl pb::CommandState {
    /// True for states a command never leaves.
    pub fn is_terminal(self) -> bool {
        use pb::CommandState::*;
        matches!(self, Exited | Failed | Cancelled | TimedOut | Lost | Denied)
    }

    /// Lower-case name used by the CLI and JSON output.
    pub fn name(self) -> &'static str {
        use pb::CommandState::*;
        match self {
            Unspecified => "unspecified",
            Queued => "queued",
            Dispatched => "dispatched",
            Running => "running",
            Exited => "exited",
            Failed => "failed",
            Cancelled => "cancelled",
            TimedOut => "timed_out",
            Lost => "lost",
            Denied => "denied",
            AwaitingLocalApproval => "awaiting_local_approval",
        }
    }

    /// Parses a name produced by [`Self::name`].
    pub fn parse(s: &str) -> Option<Self> {
        use pb::CommandState::*;
        [
            Queued,
            Dispatched,
            Running,
            Exited,
            Failed,
            Cancelled,
            TimedOut,
            Lost,
            Denied,
            AwaitingLocalApproval,
        ]
        .into_iter()
        .find(|st| st.name() == s)
    }

    /// The command state machine. Every store write of a state goes through
    /// this check, so an impossible transition is an error, not a silent bug.
    pub fn can_become(self, next: Self) -> bool {
        use pb::CommandState::*;
        match (self, next) {
            (a, b) if a == b => false,
            (a, _) if a.is_terminal() => false,
            (_, Unspecified) => false,
            (a, Queued) if a != Dispatched => false,
            (Queued, Dispatched) => true,
            // A queued command can be cancelled or expire without running.
            (Queued, Cancelled | Failed) => true,
            (Queued, _) => false,
            (Dispatched, Running) => true,
            // The daemon refused it before starting (paused): queue again.
            (Dispatched, Queued) => true,
            (Dispatched | Running, Exited | Failed | Cancelled | TimedOut | Lost) => true,
            (Dispatched, Denied) => true,
            (Dispatched, AwaitingLocalApproval) => true,
            (AwaitingLocalApproval, Running | Denied | Cancelled | Failed | TimedOut | Lost) => {
                true
            }
            _ => false,
        }
    }
}

impl pb::TriggerDecision {
    /// Lower-case name used by the CLI, JSON output and the agents.
    pub fn name(self) -> &'static str {
        match self {
            pb::TriggerDecision::Unspecified => "pending",
            pb::TriggerDecision::Ignored => "ignored",
            pb::TriggerDecision::Candidate => "candidate",
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_label_selector_needs_every_label() {
        let m = crate::pb::Machine {
            labels: [
                ("team".to_string(), "web".to_string()),
                ("os".into(), "linux".into()),
            ]
            .into(),
            ..Default::default()
        };
        assert!(m.has_labels([("team", "web")]));
        assert!(m.has_labels([("team", "web"), ("os", "linux")]));
        assert!(m.has_labels(std::iter::empty::<(&str, &str)>()));
        assert!(!m.has_labels([("team", "web"), ("os", "mac")]));
        assert!(
            !m.has_labels([("gpu", "")]),
            "a missing label is not an empty one"
        );
    }

    use super::pb::CommandState;

    #[test]
    fn terminal_states_are_final() {
        for s in [
            CommandState::Exited,
            CommandState::Failed,
            CommandState::Cancelled,
            CommandState::TimedOut,
            CommandState::Lost,
            CommandState::Denied,
        ] {
            for n in [
                CommandState::Queued,
                CommandState::Running,
                CommandState::Exited,
            ] {
                assert!(!s.can_become(n), "{s:?} -> {n:?}");
            }
        }
        assert!(CommandState::Queued.can_become(CommandState::Dispatched));
        assert!(!CommandState::Queued.can_become(CommandState::Running));
        assert!(CommandState::Running.can_become(CommandState::Lost));
        assert!(CommandState::Dispatched.can_become(CommandState::Queued));
        assert!(!CommandState::Running.can_become(CommandState::Queued));
        assert!(CommandState::AwaitingLocalApproval.can_become(CommandState::Running));
        assert!(!CommandState::AwaitingLocalApproval.can_become(CommandState::Queued));
    }

    #[test]
    fn names_round_trip() {
        for s in [
            "queued",
            "running",
            "exited",
            "timed_out",
            "lost",
            "denied",
            "awaiting_local_approval",
        ] {
            assert_eq!(CommandState::parse(s).map(|x| x.name()), Some(s));
        }
        assert_eq!(CommandState::parse("bogus"), None);
    }
}

/// QUIC application close codes the server uses, so a daemon knows whether
/// to reconnect.
pub mod close {
    /// Normal close (shutdown, daemon gone); reconnect.
    pub const NORMAL: u32 = 0;
    /// Bad request or unknown certificate role; reconnect later.
    pub const PROTOCOL: u32 = 1;
    /// A newer connection of the same machine replaced this one.
    pub const REPLACED: u32 = 3;
    /// The machine was revoked: stop, kill running commands, never retry.
    pub const REVOKED: u32 = 0x52;
    /// The server does not know this machine (or its key): pair again.
    pub const UNKNOWN_MACHINE: u32 = 0x53;
}
