//! The forms of a secret the scrubber looks for, and for which reader.
//!
//! Two readers (see `normalise`): the *text* reader sees the output with
//! shell, C, JSON and URL escapes decoded and skips whitespace inside a
//! match in progress, so one pattern per form covers every quoting and
//! every way of wrapping it into lines; the *dump* reader sees the bytes
//! and the ASCII column that hex and octal dumps show.
//!
//! Covered, for the value and for it reversed (by characters, as `rev`
//! does, and by bytes):
//! - text reader: the value; hex (lower and upper case); base64 and
//!   base64url (padded or not, of the value alone, with `echo`'s newline,
//!   and the characters it alone determines at each of the three byte
//!   offsets inside larger data); base32 likewise (five offsets); octal
//!   per byte (zero-padded, as `od -b`, or not, as `printf '%o'`); decimal
//!   per byte; each encoded form also reversed (`xxd -p | rev`) for values
//!   up to [`LONG_VALUE_LEN`], and line by line as `rev` reverses a
//!   wrapped encoding; the value with `+` for spaces (forms); the value as
//!   Python's `ascii()` escapes it (code points up to U+00FF as bytes).
//! - dump reader: the value; its ASCII-column form (`.` for unprintable
//!   bytes); its bytes swapped in 16-bit words (`hexdump`, `od -x`).
//!
//! Not covered: a short value inside larger base64 or base32 data where
//! it alone determines fewer than [`MIN_FORM_LEN`] characters (values of
//! 4 to 6 bytes at most offsets); UTF-16 encodings, base32hex, base58 and
//! base85; compressed or encrypted output; anything a command computes on
//! purpose (see `SecretRule`: a secret is only as safe as the programs
//! allowed to use it).

use std::collections::BTreeSet;

use super::automaton::MAX_PATTERN_LEN;
use super::MIN_VALUE_LEN;

/// Shortest encoded form scrubbed: shorter runs of hex, base64 or digits
/// turn up in ordinary output by chance. The value itself, and reversed,
/// are scrubbed down to [`MIN_VALUE_LEN`] however short: a reversed value
/// is no likelier to occur by chance than the value, so scrubbing it at
/// most doubles a false-positive rate the owner accepted by choosing a
/// short value (a 4-byte value such as `pw42` also takes out `24wp`).
pub const MIN_FORM_LEN: usize = 8;

/// Values longer than this (keys, certificates) get the forms a tool
/// prints by itself but not the reversed encodings or the per-byte
/// numbers: those would multiply the patterns of a large value for forms
/// that take deliberate effort to produce.
pub const LONG_VALUE_LEN: usize = 1024;

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const B32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// The patterns for each reader: (bytes, tag of the secret).
#[derive(Default)]
pub struct Forms {
    pub text: Vec<(Vec<u8>, u16)>,
    pub dump: Vec<(Vec<u8>, u16)>,
    /// Some value has a character the text reader decodes (`\`, `%`,
    /// `'`): the raw output must be read too, or the value printed as is
    /// would be decoded into something else and missed.
    pub needs_raw: bool,
    /// Some value has a character that escaping changes (quotes,
    /// backslashes, controls, non-ASCII): the text must also be read
    /// decoded twice, for escaped text inside escaped text (a JSON string
    /// holding JSON, `set -x` output in a JSON log).
    pub needs_twice: bool,
}

/// `d` in a radix of `bits` bits per character, unpadded; the last
/// character holds the remaining bits, zero-filled.
fn radix(d: &[u8], alphabet: &[u8], bits: u32) -> Vec<u8> {
    let mask = (1u32 << bits) - 1;
    let mut out = Vec::with_capacity((d.len() * 8).div_ceil(bits as usize));
    let (mut acc, mut n) = (0u32, 0u32);
    for &b in d {
        acc = (acc << 8) | u32::from(b);
        n += 8;
        while n >= bits {
            n -= bits;
            out.push(alphabet[((acc >> n) & mask) as usize]);
        }
        acc &= (1 << n) - 1;
    }
    if n > 0 {
        out.push(alphabet[((acc << (bits - n)) & mask) as usize]);
    }
    out
}

fn padded(mut e: Vec<u8>, group: usize) -> Vec<u8> {
    while !e.len().is_multiple_of(group) {
        e.push(b'=');
    }
    e
}

pub fn base64(d: &[u8]) -> Vec<u8> {
    padded(radix(d, B64, 6), 4)
}

/// The characters that `d` alone determines when it sits at byte offset
/// `k` (of a group) inside larger data: those whose bits all come from it.
fn determined(d: &[u8], k: usize, alphabet: &[u8], bits: u32) -> Vec<u8> {
    let mut data = vec![0u8; k];
    data.extend_from_slice(d);
    let e = radix(&data, alphabet, bits);
    let bits = bits as usize;
    let first = (8 * k).div_ceil(bits);
    let last = 8 * (k + d.len()) / bits;
    e.get(first..last).map(<[u8]>::to_vec).unwrap_or_default()
}

/// The encoded forms of `d` a tool prints by itself.
fn encodings(d: &[u8], extras: bool) -> Vec<Vec<u8>> {
    let lower: Vec<u8> = radix(d, b"0123456789abcdef", 4);
    let mut out = vec![lower.to_ascii_uppercase(), lower];
    let mut nl = d.to_vec();
    nl.push(b'\n');
    for (alphabet, bits, group, offsets) in [
        (&B64[..], 6, 4, 3),
        (&B64URL[..], 6, 4, 3),
        (&B32[..], 5, 8, 5),
    ] {
        for data in [d, &nl[..]] {
            let e = radix(data, alphabet, bits);
            out.push(padded(e.clone(), group));
            out.push(e);
        }
        for k in 0..offsets {
            out.push(determined(d, k, alphabet, bits));
        }
    }
    if extras {
        out.push(
            d.iter()
                .flat_map(|b| format!("{b:03o}").into_bytes())
                .collect(),
        );
        out.push(
            d.iter()
                .flat_map(|b| format!("{b:o}").into_bytes())
                .collect(),
        );
        out.push(d.iter().flat_map(|b| b.to_string().into_bytes()).collect());
    }
    out
}

/// Widths tools wrap encodings at: `xxd -p` 60; `base64`, `base32` and
/// `basenc` 76.
const WRAP_WIDTHS: [usize; 2] = [60, 76];

/// `rev` reverses each line on its own: the value's whole encodings
/// (as `xxd -p`, `base64`, `base32` print them for the value alone),
/// wrapped at each tool width, each line reversed.
fn reversed_lines(d: &[u8]) -> Vec<Vec<u8>> {
    let lower = radix(d, b"0123456789abcdef", 4);
    let mut nl = d.to_vec();
    nl.push(b'\n');
    let whole = [
        lower.to_ascii_uppercase(),
        lower,
        base64(d),
        base64(&nl),
        padded(radix(d, B32, 5), 8),
        padded(radix(&nl, B32, 5), 8),
    ];
    let mut out = Vec::new();
    for e in whole {
        for w in WRAP_WIDTHS.into_iter().filter(|&w| e.len() > w) {
            out.extend(e.chunks(w).map(|c| c.iter().rev().copied().collect()));
        }
    }
    out
}

/// How Python's `ascii()` (and `\xHH` or octal escapes of code points)
/// writes `v` once decoded: characters up to U+00FF as one byte each.
fn latin1(v: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    for c in v.chars() {
        match u8::try_from(u32::from(c)) {
            Ok(b) => out.push(b),
            Err(_) => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

/// `d`'s bytes swapped in 16-bit words, for the words wholly inside it
/// when it starts at byte offset `k` of a word.
fn swapped_words(d: &[u8], k: usize) -> Vec<u8> {
    d[k.min(d.len())..]
        .chunks_exact(2)
        .flat_map(|w| [w[1], w[0]])
        .collect()
}

/// `p` cut into pieces of at most [`MAX_PATTERN_LEN`], each as long as
/// possible, the last ending where `p` ends: a long value printed whole
/// is taken out piece by piece, and nothing waits on more than a piece.
fn pieces(p: &[u8]) -> impl Iterator<Item = &[u8]> {
    let n = p.len().div_ceil(MAX_PATTERN_LEN).max(1);
    (0..n).map(move |i| {
        let start = (i * MAX_PATTERN_LEN).min(p.len().saturating_sub(MAX_PATTERN_LEN));
        &p[start..(start + MAX_PATTERN_LEN).min(p.len())]
    })
}

fn add(to: &mut Vec<(Vec<u8>, u16)>, p: &[u8], tag: u16) {
    for piece in pieces(p) {
        to.push((piece.to_vec(), tag));
    }
}

/// Every secret's forms; tags index `values`.
pub fn forms<'a>(values: impl IntoIterator<Item = &'a str>) -> Forms {
    let mut f = Forms::default();
    for (tag, v) in values.into_iter().enumerate() {
        let Ok(tag) = u16::try_from(tag) else { break };
        if v.len() < MIN_VALUE_LEN {
            continue;
        }
        f.needs_raw |= v.bytes().any(|b| matches!(b, b'\\' | b'%' | b'\''));
        f.needs_twice |= v
            .bytes()
            .any(|b| matches!(b, b'\\' | b'"' | b'\'') || b.is_ascii_control() || !b.is_ascii());
        let long = v.len() > LONG_VALUE_LEN;
        let by_chars: Vec<u8> = v.chars().rev().collect::<String>().into_bytes();
        let by_bytes: Vec<u8> = v.bytes().rev().collect();
        let mut datas = vec![v.as_bytes().to_vec(), by_chars, by_bytes];
        datas.dedup();
        let mut text: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut dump: BTreeSet<Vec<u8>> = BTreeSet::new();
        text.insert(latin1(v));
        if !long {
            let lines = reversed_lines(v.as_bytes());
            text.extend(lines.into_iter().filter(|l| l.len() >= MIN_FORM_LEN));
        }
        for (i, d) in datas.iter().enumerate() {
            text.insert(d.clone());
            if d.contains(&b' ') {
                text.insert(
                    d.iter()
                        .map(|&b| if b == b' ' { b'+' } else { b })
                        .collect(),
                );
            }
            dump.insert(d.clone());
            dump.insert(d.iter().map(|&b| printable(b)).collect());
            for k in 0..2 {
                dump.insert(swapped_words(d, k));
            }
            if long && i > 0 {
                continue;
            }
            for e in encodings(d, !long) {
                if e.len() < MIN_FORM_LEN {
                    continue;
                }
                if !long {
                    text.insert(e.iter().rev().copied().collect());
                }
                text.insert(e);
            }
        }
        for p in text.iter().filter(|p| p.len() >= MIN_VALUE_LEN) {
            add(&mut f.text, p, tag);
        }
        for p in dump.iter().filter(|p| p.len() >= MIN_VALUE_LEN) {
            add(&mut f.dump, p, tag);
        }
    }
    f
}

/// How an ASCII column shows a byte.
pub fn printable(b: u8) -> u8 {
    if (0x20..0x7f).contains(&b) {
        b
    } else {
        b'.'
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_tools() {
        assert_eq!(base64(b"hello"), b"aGVsbG8=");
        assert_eq!(radix(b"hello", B64URL, 6), b"aGVsbG8");
        assert_eq!(padded(radix(b"hello", B32, 5), 8), b"NBSWY3DP");
        assert_eq!(radix(b"\xfb\xff", B64URL, 6), b"-_8");
        // "xhello" encodes as eGhlbGxv: "hello" at offset 1 fixes "hlbGxv".
        assert_eq!(determined(b"hello", 1, B64, 6), b"hlbGxv");
        assert_eq!(swapped_words(b"abcde", 1), b"cbed");
    }

    #[test]
    fn long_forms_are_cut_into_pieces_that_cover_them() {
        let p: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
        let cut: Vec<&[u8]> = pieces(&p).collect();
        assert_eq!(cut.len(), 3);
        assert!(cut.iter().all(|c| c.len() == MAX_PATTERN_LEN));
        assert_eq!(cut[2], &p[600 - MAX_PATTERN_LEN..]);
        assert_eq!(pieces(b"abcd").collect::<Vec<_>>(), vec![b"abcd"]);
    }

    #[test]
    fn short_values_keep_the_value_and_its_reverse_only() {
        let f = forms(["pw42"]);
        let text: Vec<&[u8]> = f.text.iter().map(|(p, _)| p.as_slice()).collect();
        assert!(text.contains(&b"pw42".as_slice()));
        assert!(text.contains(&b"24wp".as_slice()));
        assert!(text.contains(&b"70773432".as_slice()));
        // Base64 of 4 bytes is 6 characters: too short to scrub alone.
        assert!(!text.contains(&b"cHc0Mg".as_slice()));
        assert!(text.contains(&b"cHc0Mg==".as_slice()));
    }
}
