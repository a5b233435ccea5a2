//! The thin I/O shell both peers share, around the pure codec in
//! `byom-protocol`: reading and writing frames on QUIC streams, writing files
//! atomically, SHA-256, and facts about the host.
//!
//! It must never know about the store, the PKI, agents, or how commands
//! run: the server and the daemon each keep their own logic, and only the
//! byte-level plumbing is here so both speak it identically.
//!
//! Key items: [`read_frame`], [`write_frame`], [`write_atomic`],
//! [`load_or_create_key`], [`shutdown_signal`], [`sha256`], [`hostname`],
//! [`now_ms`], and the generic webhook's signature ([`webhook`]).

mod frames;
pub mod tunnel;
pub mod webhook;

pub use frames::{read_frame, write_frame, WireError};

use std::path::Path;

/// Writes a file atomically (temp file, fsync, rename, fsync of the dir)
/// with the given Unix mode, so a crash leaves the old or the new file,
/// never half of one.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().and_then(|s| s.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    {
        // A fresh file: never through a link someone left under the temp
        // name (create_new is O_EXCL, which follows none).
        let _ = std::fs::remove_file(&tmp);
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut f = opts.open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

pub use byom_protocol::hex;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// This host's name.
pub fn hostname() -> String {
    #[cfg(unix)]
    {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname writes a
        // NUL-terminated name into it (truncated if longer).
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc == 0 {
            let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
            let name = String::from_utf8_lossy(&buf[..end]).into_owned();
            if !name.is_empty() {
                return name;
            }
        }
    }
    std::env::var("COMPUTERNAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "localhost".into())
}

/// Bytes of randomness in a key [`load_or_create_key`] makes.
pub const KEY_BYTES: usize = 32;

/// A secret key kept in `path`: read if it holds one, else made (random,
/// written hex-encoded, owner-only). Keys written raw by older versions are
/// read as they are.
pub fn load_or_create_key(path: &Path) -> std::io::Result<Vec<u8>> {
    if let Ok(k) = std::fs::read(path) {
        let text = k.strip_suffix(b"\n").unwrap_or(&k);
        if text.len() >= 2 * KEY_BYTES && text.iter().all(u8::is_ascii_hexdigit) {
            return Ok(text.to_vec());
        }
        if k.len() >= KEY_BYTES {
            return Ok(k);
        }
    }
    let mut raw = [0u8; KEY_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
        .map_err(|_| std::io::Error::other("no randomness"))?;
    let key = hex(&raw);
    write_atomic(path, format!("{key}\n").as_bytes(), 0o600)?;
    Ok(key.into_bytes())
}

/// Resolves when the process is asked to stop: SIGTERM or SIGINT (Ctrl-C
/// where there are no Unix signals).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let dir = std::env::temp_dir().join(format!("byom-wire-test-{}", std::process::id()));
        let p = dir.join("f");
        super::write_atomic(&p, b"one", 0o600).unwrap();
        super::write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn keys_are_made_once_and_old_raw_ones_still_read() {
        let dir = std::env::temp_dir().join(format!("byom-wire-key-{}", std::process::id()));
        let p = dir.join("k.key");
        let a = super::load_or_create_key(&p).unwrap();
        assert_eq!(a.len(), 2 * super::KEY_BYTES);
        assert_eq!(super::load_or_create_key(&p).unwrap(), a);
        let raw = [7u8; 32];
        std::fs::write(&p, raw).unwrap();
        assert_eq!(super::load_or_create_key(&p).unwrap(), raw);
        std::fs::write(&p, b"short").unwrap();
        let fresh = super::load_or_create_key(&p).unwrap();
        assert_ne!(fresh, b"short");
        let _ = std::fs::remove_dir_all(dir);
    }
}
