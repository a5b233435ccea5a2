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
    /// name → the owner's restrictions on it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    rules: BTreeMap<String, SecretRule>,
}

/// What the owner allows a secret to be used for. A command that leaks a
/// value on purpose can encode it beyond any scrubber, so a secret is only
/// as safe as the programs allowed to use it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRule {
    /// Only commands that run nothing but these programs (names or paths,
    /// checked on the files they resolve to) may use it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_programs: Vec<String>,
    /// Every command that uses it waits for `byomd approve`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confirm: bool,
}

impl SecretRule {
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.allow_programs.is_empty() {
            parts.push(format!("only by {}", self.allow_programs.join(", ")));
        }
        if self.confirm {
            parts.push("each use needs your approval".into());
        }
        parts.join("; ")
    }
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

pub fn set(dir: &Path, name: &str, value: &str, rule: SecretRule) -> anyhow::Result<KeyStore> {
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
    if rule == SecretRule::default() {
        f.rules.remove(name);
    } else {
        f.rules.insert(name.to_string(), rule);
    }
    save(dir, &f)?;
    Ok(kind)
}

/// Every secret's name, with its restrictions if any.
pub fn list(dir: &Path) -> anyhow::Result<Vec<(String, Option<SecretRule>)>> {
    let mut f = load(dir)?;
    Ok(f.secrets
        .into_keys()
        .map(|n| {
            let r = f.rules.remove(&n);
            (n, r)
        })
        .collect())
}

/// The owner's restrictions, by secret name. An unreadable file restricts
/// nothing here: using any secret then fails when its value is read.
pub fn restrictions(dir: &Path) -> BTreeMap<String, SecretRule> {
    load(dir).map(|f| f.rules).unwrap_or_default()
}

pub fn remove(dir: &Path, name: &str) -> anyhow::Result<bool> {
    let mut f = load(dir)?;
    let had = f.secrets.remove(name).is_some();
    f.rules.remove(name);
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
    let mut out = BTreeMap::new();
    // Read per command: with no secrets, one failed open is all it costs.
    if f.secrets.is_empty() {
        return Ok(out);
    }
    let kind = store_kind(dir);
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

/// The `{{secret:NAME}}` handles in `text`: (byte range of the handle,
/// NAME), in order.
pub fn handles(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    const OPEN: &str = "{{secret:";
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(OPEN) {
        let start = at + i;
        let name_at = start + OPEN.len();
        let Some(end) = text[name_at..].find("}}") else {
            break;
        };
        let stop = name_at + end + 2;
        out.push((start..stop, &text[name_at..name_at + end]));
        at = stop;
    }
    out
}

/// Replaces every `{{secret:NAME}}` in `text`. Unknown names are an error
/// that names them, never an empty substitution.
pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (range, name) in handles(text) {
        let Some(v) = values.get(name) else {
            return Err(format!(
                "unknown secret {name:?}: set it on this machine with `byomd secret set {name}`"
            ));
        };
        out.push_str(&text[copied..range.start]);
        out.push_str(v);
        copied = range.end;
    }
    out.push_str(&text[copied..]);
    Ok(out)
}

/// Which output stream bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out = 0,
    Err = 1,
}

/// One form of a secret to take out, and what to put instead.
struct Pattern {
    bytes: Vec<u8>,
    handle: Vec<u8>,
}

/// Shortest encoded form scrubbed (shorter ones would mangle ordinary
/// output by chance).
const MIN_FORM_LEN: usize = 8;

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64(data: &[u8], alphabet: &[u8; 64], pad: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        let chars = c.len() + 1;
        for k in 0..4 {
            if k < chars {
                out.push(alphabet[(n >> (18 - 6 * k) & 63) as usize]);
            } else if pad {
                out.push(b'=');
            }
        }
    }
    out
}

/// The forms a command can print a value in without trying hard: as is,
/// reversed, hex, and base64 (both alphabets, with and without padding, of
/// the value alone or with `echo`'s newline, and the part of any base64
/// text that the value alone determines, at each of the three alignments).
fn forms(v: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![v.to_vec(), v.iter().rev().copied().collect()];
    let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
    out.push(hex.clone().into_bytes());
    out.push(hex.to_uppercase().into_bytes());
    let mut nl = v.to_vec();
    nl.push(b'\n');
    for alphabet in [B64, B64URL] {
        for data in [v, &nl[..]] {
            out.push(base64(data, alphabet, true));
            out.push(base64(data, alphabet, false));
        }
        for k in 0..3usize {
            // The value at offset k of some larger data: only whole
            // groups of three bytes inside it encode to fixed characters.
            let mut data = vec![0u8; k];
            data.extend_from_slice(v);
            let enc = base64(&data, alphabet, false);
            let first = k.div_ceil(3);
            let last = (k + v.len()) / 3;
            if last > first {
                out.push(enc[first * 4..last * 4].to_vec());
            }
        }
    }
    out.sort();
    out.dedup();
    out.retain(|f| f == v || f.len() >= MIN_FORM_LEN);
    out
}

/// Takes secret values (and their common encodings) out of a command's
/// output before it leaves the machine: within stdout, within stderr, and
/// across the two as the command interleaves them (half a value on each).
/// Bytes that could be the start of a value are held back until the next
/// bytes show whether they are; every byte is emitted once.
pub struct Scrubber {
    patterns: Vec<Pattern>,
    /// First byte → patterns starting with it, longest first.
    first: BTreeMap<u8, Vec<usize>>,
    next_seq: u64,
    /// Bytes not emitted yet, per stream: (sequence, byte).
    pending: [std::collections::VecDeque<(u64, u8)>; 2],
    /// The unresolved tails of the three views: both streams in arrival
    /// order, stdout alone, stderr alone.
    views: [std::collections::VecDeque<(u64, u8)>; 3],
    /// Where each view is held: the first byte that may still begin a value.
    holds: [Option<u64>; 3],
    /// Bytes a match took: the first carries the handle, the rest vanish.
    taken: BTreeMap<u64, Option<usize>>,
    ended: [bool; 2],
}

impl Scrubber {
    pub fn new(values: &BTreeMap<String, String>) -> Scrubber {
        let mut patterns: Vec<Pattern> = Vec::new();
        for (k, v) in values.iter().filter(|(_, v)| v.len() >= MIN_VALUE_LEN) {
            let handle = format!("{{{{secret:{k}}}}}").into_bytes();
            for f in forms(v.as_bytes()) {
                patterns.push(Pattern {
                    bytes: f,
                    handle: handle.clone(),
                });
            }
        }
        // Longest first, so a value containing another is replaced whole.
        patterns.sort_by_key(|p| std::cmp::Reverse(p.bytes.len()));
        let mut first: BTreeMap<u8, Vec<usize>> = BTreeMap::new();
        for (i, p) in patterns.iter().enumerate() {
            first.entry(p.bytes[0]).or_default().push(i);
        }
        Scrubber {
            patterns,
            first,
            next_seq: 0,
            pending: Default::default(),
            views: Default::default(),
            holds: [None; 3],
            taken: BTreeMap::new(),
            ended: [false; 2],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether more bytes may still come into view `v`.
    fn open(&self, v: usize) -> bool {
        match v {
            0 => !(self.ended[0] && self.ended[1]),
            v => !self.ended[v - 1],
        }
    }

    /// Finds every match in view `v` that can be decided now, and where
    /// the view must wait.
    fn resolve(&mut self, v: usize) {
        let open = self.open(v);
        let view: Vec<(u64, u8)> = self.views[v].iter().copied().collect();
        let mut i = 0;
        let mut hold = None;
        'scan: while i < view.len() {
            let rest = &view[i..];
            if let Some(cands) = self.first.get(&rest[0].1) {
                for &p in cands {
                    let pat = &self.patterns[p].bytes;
                    let n = pat.len().min(rest.len());
                    if !rest[..n].iter().zip(pat).all(|((_, b), c)| b == c) {
                        continue;
                    }
                    if n == pat.len() {
                        let seqs: Vec<u64> = rest[..n].iter().map(|(s, _)| *s).collect();
                        if !seqs.iter().any(|s| self.taken.contains_key(s)) {
                            self.taken.insert(seqs[0], Some(p));
                            for s in &seqs[1..] {
                                self.taken.insert(*s, None);
                            }
                        } else {
                            // Overlaps a match another view found: take
                            // the rest too, so no part of it leaves, and
                            // mark where it was if its start is free.
                            self.taken.entry(seqs[0]).or_insert(Some(p));
                            for s in &seqs[1..] {
                                self.taken.entry(*s).or_insert(None);
                            }
                        }
                        i += n;
                        continue 'scan;
                    }
                    if open {
                        // A value may be starting here: wait for more.
                        hold = Some(rest[0].0);
                        break 'scan;
                    }
                }
            }
            i += 1;
        }
        let keep_from = hold.unwrap_or(u64::MAX);
        self.views[v].retain(|(s, _)| *s >= keep_from);
        self.holds[v] = hold;
    }

    /// Emits what all views have decided, per stream.
    fn emit(&mut self) -> [Vec<u8>; 2] {
        let mut out: [Vec<u8>; 2] = Default::default();
        for (st, out) in out.iter_mut().enumerate() {
            let hold = [self.holds[0], self.holds[1 + st]]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(u64::MAX);
            while let Some(&(seq, b)) = self.pending[st].front() {
                if seq >= hold {
                    break;
                }
                self.pending[st].pop_front();
                match self.taken.remove(&seq) {
                    Some(Some(p)) => out.extend_from_slice(&self.patterns[p].handle),
                    Some(None) => {}
                    None => out.push(b),
                }
            }
        }
        out
    }

    /// A chunk of `stream`; returns what may be sent now of each stream
    /// (stdout, stderr).
    pub fn push(&mut self, stream: Stream, chunk: &[u8]) -> [Vec<u8>; 2] {
        let st = stream as usize;
        if self.patterns.is_empty() {
            let mut out: [Vec<u8>; 2] = Default::default();
            out[st] = chunk.to_vec();
            return out;
        }
        for &b in chunk {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.pending[st].push_back((seq, b));
            self.views[0].push_back((seq, b));
            self.views[1 + st].push_back((seq, b));
        }
        // Each stream on its own first: a value whole in one stream gets
        // its handle there, whatever the other stream did meanwhile.
        for v in [1, 2, 0] {
            self.resolve(v);
        }
        self.emit()
    }

    /// `stream` ended: what is held for it (and, once both ended, all the
    /// rest) is decided and sent.
    pub fn finish(&mut self, stream: Stream) -> [Vec<u8>; 2] {
        self.ended[stream as usize] = true;
        // Each stream on its own first: a value whole in one stream gets
        // its handle there, whatever the other stream did meanwhile.
        for v in [1, 2, 0] {
            self.resolve(v);
        }
        self.emit()
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

    /// One stream through a scrubber, split into three chunks.
    fn through(s: &mut Scrubber, text: &[u8], a: usize, b: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in [&text[..a], &text[a..b], &text[b..]] {
            out.extend(s.push(Stream::Out, part)[0].clone());
        }
        out.extend(s.finish(Stream::Out)[0].clone());
        out.extend(s.finish(Stream::Err)[0].clone());
        out
    }

    #[test]
    fn scrubbing_across_every_split() {
        let text = b"x s3cr3t-value y hunter22 z hunter2 s3cr3t-valu".to_vec();
        let want = b"x {{secret:TOKEN}} y {{secret:PW}} z hunter2 s3cr3t-valu".to_vec();
        for a in 0..text.len() {
            for b in a..text.len() {
                let mut s = Scrubber::new(&vals());
                assert_eq!(through(&mut s, &text, a, b), want, "split at {a},{b}");
            }
        }
    }

    /// Chunks through one scrubber, both streams ended at the end.
    fn both(s: &mut Scrubber, parts: &[(Stream, &[u8])]) -> [Vec<u8>; 2] {
        let mut out: [Vec<u8>; 2] = Default::default();
        for (st, part) in parts {
            let o = s.push(*st, part);
            out[0].extend(&o[0]);
            out[1].extend(&o[1]);
        }
        for st in [Stream::Out, Stream::Err] {
            let o = s.finish(st);
            out[0].extend(&o[0]);
            out[1].extend(&o[1]);
        }
        out
    }

    #[test]
    fn a_value_split_between_stdout_and_stderr_is_taken_out() {
        let v = b"s3cr3t-value";
        for cut in 1..v.len() {
            let mut s = Scrubber::new(&vals());
            let out = both(
                &mut s,
                &[
                    (Stream::Out, b"a "),
                    (Stream::Out, &v[..cut]),
                    (Stream::Err, &v[cut..]),
                    (Stream::Err, b" b"),
                ],
            );
            assert_eq!(out[0], b"a {{secret:TOKEN}}", "cut {cut}");
            assert_eq!(out[1], b" b", "cut {cut}");
        }
    }

    #[test]
    fn a_value_interleaved_with_the_other_stream_is_still_whole_in_its_own() {
        let mut s = Scrubber::new(&vals());
        let out = both(
            &mut s,
            &[
                (Stream::Out, b"hunt"),
                (Stream::Err, b"noise"),
                (Stream::Out, b"er22\n"),
            ],
        );
        assert_eq!(out[0], b"{{secret:PW}}\n");
        assert_eq!(out[1], b"noise");
    }

    /// Both streams print the value in halves and the chunks interleave:
    /// each stream still shows one handle where its value was.
    #[test]
    fn the_same_value_split_in_both_streams_keeps_a_handle_in_each() {
        let mut s = Scrubber::new(&vals());
        let out = both(
            &mut s,
            &[
                (Stream::Out, b"hunt"),
                (Stream::Err, b"hunt"),
                (Stream::Out, b"er22\n"),
                (Stream::Err, b"er22\n"),
            ],
        );
        assert_eq!(out[0], b"{{secret:PW}}\n");
        assert_eq!(out[1], b"{{secret:PW}}\n");
    }

    #[test]
    fn encoded_values_are_taken_out_too() {
        let v = "s3cr3t-value";
        let b64 = base64(v.as_bytes(), B64, true);
        let with_nl = base64(format!("{v}\n").as_bytes(), B64, true);
        let hex: String = v.bytes().map(|b| format!("{b:02x}")).collect();
        let rev: String = v.chars().rev().collect();
        let embedded = base64(format!("Authorization: {v}!").as_bytes(), B64, false);
        for text in [
            String::from_utf8(b64).unwrap(),
            String::from_utf8(with_nl).unwrap(),
            hex.clone(),
            hex.to_uppercase(),
            rev,
            String::from_utf8(embedded).unwrap(),
        ] {
            let mut s = Scrubber::new(&vals());
            let out = through(&mut s, text.as_bytes(), 0, text.len() / 2);
            assert!(
                String::from_utf8_lossy(&out).contains("{{secret:TOKEN}}"),
                "{text} came out as {}",
                String::from_utf8_lossy(&out)
            );
        }
        assert_eq!(base64(b"hello", B64, true), b"aGVsbG8=");
        assert_eq!(base64(b"hello", B64URL, false), b"aGVsbG8");
    }
}
