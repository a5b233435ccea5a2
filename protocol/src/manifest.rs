//! The release manifest: which artifacts a server ships, for which platform,
//! with their SHA-256. It is plain text, one artifact per line, so the
//! installer script can read it with `awk` on a laptop that has nothing
//! but a POSIX shell and curl, and so `sha256sum`-minded people can read it
//! too. The server signs its exact bytes with its CA key; the daemon and
//! the installer check that signature against the CA the token pinned.
//!
//! ```text
//! byom-manifest 1
//! version 0.2.0
//! artifact byomd-0.2.0-linux-x86_64 byomd linux x86_64 bin 8114688 <sha256 hex>
//! ```

use std::fmt::Write as _;

const MAGIC: &str = "byom-manifest 1";
/// Largest manifest accepted (a few dozen artifacts fit in a few KiB).
pub const MAX_MANIFEST_BYTES: usize = 64 << 10;
/// Most artifacts one manifest may list.
pub const MAX_ARTIFACTS: usize = 256;
const MAX_FIELD: usize = 128;

/// Kinds of artifact: a bare executable, a Debian or RPM package, a zip.
pub const KINDS: &[&str] = &["bin", "exe", "deb", "rpm", "tar.gz", "zip", "rb"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// File name in the dist directory (no path separators).
    pub file: String,
    /// `byomd` or `byom`.
    pub program: String,
    /// `linux`, `darwin`, `windows` (lower-case `uname -s`).
    pub os: String,
    /// `x86_64` or `aarch64`.
    pub arch: String,
    pub kind: String,
    pub size: u64,
    pub sha256: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub version: String,
    pub artifacts: Vec<Artifact>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("the manifest is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge,
    #[error("the manifest is not UTF-8")]
    NotUtf8,
    #[error("not a byom manifest: its first line must be {MAGIC:?}")]
    BadMagic,
    #[error("manifest line {line}: {why}")]
    Line { line: usize, why: String },
    #[error("the manifest has no version line")]
    NoVersion,
    #[error("the manifest lists more than {MAX_ARTIFACTS} artifacts")]
    TooMany,
}

fn token_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_FIELD
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
        && !s.starts_with('.')
}

/// True for a name safe to use as a file name in the dist directory and in
/// a URL path: no separators, no leading dot, nothing a shell expands.
pub fn file_name_ok(s: &str) -> bool {
    token_ok(s)
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub use crate::hex;

impl Manifest {
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge);
        }
        let text = std::str::from_utf8(bytes).map_err(|_| ManifestError::NotUtf8)?;
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, l)) if l.trim_end() == MAGIC => {}
            _ => return Err(ManifestError::BadMagic),
        }
        let mut version = None;
        let mut artifacts: Vec<Artifact> = Vec::new();
        for (i, raw) in lines {
            let line = i + 1;
            let bad = |why: &str| ManifestError::Line {
                line,
                why: why.to_string(),
            };
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = l.split_ascii_whitespace().collect();
            match f.as_slice() {
                ["version", v] if token_ok(v) => {
                    if version.replace(v.to_string()).is_some() {
                        return Err(bad("a second version line"));
                    }
                }
                ["version", ..] => return Err(bad("the version must be one plain word")),
                ["artifact", file, program, os, arch, kind, size, sha] => {
                    if artifacts.len() >= MAX_ARTIFACTS {
                        return Err(ManifestError::TooMany);
                    }
                    if ![file, program, os, arch].iter().all(|s| token_ok(s)) {
                        return Err(bad("a name has characters other than A-Z a-z 0-9 . _ - +"));
                    }
                    if !KINDS.contains(kind) {
                        return Err(bad(&format!("unknown kind {kind:?}")));
                    }
                    let size = size.parse().map_err(|_| bad("the size is not a number"))?;
                    let sha256 =
                        hex32(sha).ok_or_else(|| bad("the SHA-256 is not 64 hex digits"))?;
                    if artifacts.iter().any(|a| a.file == *file) {
                        return Err(bad(&format!("{file} is listed twice")));
                    }
                    artifacts.push(Artifact {
                        file: file.to_string(),
                        program: program.to_string(),
                        os: os.to_string(),
                        arch: arch.to_string(),
                        kind: kind.to_string(),
                        size,
                        sha256,
                    });
                }
                _ => {
                    return Err(bad(
                        "expected `version V` or `artifact FILE PROGRAM OS ARCH KIND SIZE SHA256`",
                    ))
                }
            }
        }
        Ok(Manifest {
            version: version.ok_or(ManifestError::NoVersion)?,
            artifacts,
        })
    }

    pub fn encode(&self) -> String {
        let mut s = format!("{MAGIC}\nversion {}\n", self.version);
        for a in &self.artifacts {
            let _ = writeln!(
                s,
                "artifact {} {} {} {} {} {} {}",
                a.file,
                a.program,
                a.os,
                a.arch,
                a.kind,
                a.size,
                hex(&a.sha256)
            );
        }
        s
    }

    /// The executable of `program` for a platform (`kind` bin or exe).
    pub fn binary(&self, program: &str, os: &str, arch: &str) -> Option<&Artifact> {
        self.artifacts.iter().find(|a| {
            a.program == program
                && a.os == os
                && a.arch == arch
                && matches!(a.kind.as_str(), "bin" | "exe")
        })
    }
}

/// Compares dotted versions numerically (`0.10.0` > `0.9.1`); a suffix
/// after `-` sorts before the plain version, as in semver.
pub fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn split(v: &str) -> (Vec<u64>, Option<&str>) {
        let v = v.trim_start_matches('v');
        let (core, pre) = match v.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (v, None),
        };
        (
            core.split('.').map(|p| p.parse().unwrap_or(0)).collect(),
            pre,
        )
    }
    let (ca, pa) = split(a);
    let (cb, pb) = split(b);
    let n = ca.len().max(cb.len());
    for i in 0..n {
        let (x, y) = (
            ca.get(i).copied().unwrap_or(0),
            cb.get(i).copied().unwrap_or(0),
        );
        if x != y {
            return x.cmp(&y);
        }
    }
    match (pa, pb) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(x), Some(y)) => x.cmp(y),
    }
}

/// This machine's platform as the manifest names it.
pub fn this_platform() -> (&'static str, &'static str) {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        o => o,
    };
    (os, std::env::consts::ARCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        Manifest {
            version: "0.2.0".into(),
            artifacts: vec![Artifact {
                file: "byomd-0.2.0-linux-x86_64".into(),
                program: "byomd".into(),
                os: "linux".into(),
                arch: "x86_64".into(),
                kind: "bin".into(),
                size: 8_114_688,
                sha256: [7; 32],
            }],
        }
    }

    #[test]
    fn round_trips_and_finds_the_binary() {
        let m = sample();
        let back = Manifest::parse(m.encode().as_bytes()).unwrap();
        assert_eq!(back, m);
        assert!(back.binary("byomd", "linux", "x86_64").is_some());
        assert!(back.binary("byomd", "linux", "aarch64").is_none());
    }

    #[test]
    fn refuses_what_a_shell_or_a_path_could_misread() {
        let good = sample().encode();
        for (from, to) in [
            ("byomd-0.2.0-linux-x86_64 ", "../../etc/passwd "),
            ("byomd-0.2.0-linux-x86_64 ", "$(reboot) "),
            (" bin ", " exe; "),
            ("8114688", "-1"),
            ("version 0.2.0", "version 0.2.0 extra"),
        ] {
            let bad = good.replacen(from, to, 1);
            assert!(Manifest::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        assert_eq!(Manifest::parse(b"hello"), Err(ManifestError::BadMagic),);
        let dup = format!("{good}{}", good.lines().nth(2).unwrap());
        assert!(Manifest::parse(dup.as_bytes()).is_err());
    }

    #[test]
    fn versions_compare_numerically() {
        use std::cmp::Ordering::*;
        assert_eq!(version_cmp("0.10.0", "0.9.1"), Greater);
        assert_eq!(version_cmp("0.1.0", "0.1.0"), Equal);
        assert_eq!(version_cmp("0.1.0-rc1", "0.1.0"), Less);
        assert_eq!(version_cmp("1", "0.9"), Greater);
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Manifest::parse(&bytes);
        }

        #[test]
        fn encode_parse_round_trip(
            version in "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
            names in proptest::collection::btree_set("[a-z][a-z0-9._-]{0,20}", 0..8),
            size in any::<u64>(),
            sha in any::<[u8; 32]>(),
        ) {
            let m = Manifest {
                version,
                artifacts: names.into_iter().map(|file| Artifact {
                    file,
                    program: "byomd".into(),
                    os: "linux".into(),
                    arch: "aarch64".into(),
                    kind: "deb".into(),
                    size,
                    sha256: sha,
                }).collect(),
            };
            prop_assert_eq!(Manifest::parse(m.encode().as_bytes()).unwrap(), m);
        }
    }
}
