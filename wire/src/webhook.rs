//! The generic webhook's signature, as its senders make it and the server
//! checks it: `X-Byom-Timestamp: UNIX_SECONDS` and `X-Byom-Signature:
//! sha256=HEX`, the HMAC-SHA256 of `TIMESTAMP.BODY`. Here so that `byom
//! webhook sign` and the server agree byte for byte, also on what a key
//! file's bytes mean as a key.

use ring::hmac;

/// The header with the signing time (Unix seconds).
pub const TIMESTAMP_HEADER: &str = "X-Byom-Timestamp";
/// The header with `sha256=HEX`.
pub const SIGNATURE_HEADER: &str = "X-Byom-Signature";

/// The keys a key file's bytes may stand for, the likeliest first: the
/// file without its trailing whitespace (what `byom webhook sign` uses),
/// without only its trailing newlines (what a shell's `"$(cat FILE)"`
/// gives, the way people sign with `openssl dgst -hmac`), and the bytes
/// as they are (a program that reads the file whole). Each is the same
/// secret, so accepting any of them gives a sender without it nothing.
pub fn key_candidates(file: &[u8]) -> Vec<&[u8]> {
    let trimmed = file.trim_ascii_end();
    let mut no_newlines = file;
    while let Some(rest) = no_newlines.strip_suffix(b"\n") {
        no_newlines = rest;
    }
    let mut out: Vec<&[u8]> = Vec::with_capacity(3);
    for k in [trimmed, no_newlines, file] {
        if !k.is_empty() && !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// The bytes a signature covers: `TIMESTAMP.BODY`.
pub fn signed_bytes(timestamp: u64, body: &[u8]) -> Vec<u8> {
    let mut signed = format!("{timestamp}.").into_bytes();
    signed.extend_from_slice(body);
    signed
}

/// `sha256=HEX` for `body` sent at `timestamp`, keyed with a key file's
/// bytes as [`key_candidates`] reads them first.
pub fn sign(key_file: &[u8], timestamp: u64, body: &[u8]) -> String {
    let key = key_file.trim_ascii_end();
    let tag = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        &signed_bytes(timestamp, body),
    );
    format!("sha256={}", crate::hex(tag.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_stands_for_what_its_users_sign_with() {
        assert_eq!(key_candidates(b"abc\n"), vec![&b"abc"[..], &b"abc\n"[..]]);
        assert_eq!(
            key_candidates(b"abc \r\n\n"),
            vec![&b"abc"[..], &b"abc \r"[..], &b"abc \r\n\n"[..]]
        );
        assert_eq!(key_candidates(b"abc"), vec![&b"abc"[..]]);
        assert!(key_candidates(b"\n\n").iter().all(|k| !k.is_empty()));
    }

    #[test]
    fn sign_matches_an_hmac_over_timestamp_dot_body() {
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, b"k3y"), b"17.{}");
        assert_eq!(
            sign(b"k3y\n", 17, b"{}"),
            format!("sha256={}", crate::hex(tag.as_ref()))
        );
    }
}
