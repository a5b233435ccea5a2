//! The one source of randomness for keys, secrets, tokens, nonces and
//! IDs, and byom's one policy when the OS random number generator fails:
//! stop what was being made. Nothing falls back to a clock or zeros, which
//! would make a key, token or ID guessable; the call that needed it fails
//! (a panic, caught as the failure of that task or request), so an error
//! while making something secret means it is not made.
//!
//! Only jitter (reconnect back-off) uses a non-cryptographic generator.

/// Fills `buf` from the OS random number generator.
///
/// # Panics
/// When the OS generator fails (see the module's policy).
pub fn fill(buf: &mut [u8]) {
    if let Err(e) = getrandom::fill(buf) {
        panic!("the OS random number generator failed ({e}): byom makes no key, token, nonce or ID without it");
    }
}

/// `N` random bytes (see [`fill`]).
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    fill(&mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_differ() {
        assert_ne!(bytes::<16>(), bytes::<16>());
    }
}
