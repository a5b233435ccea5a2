//! byomd, the byom endpoint daemon: pairs a machine once with a one-time
//! token, then dials out to the server over mutual-TLS QUIC and runs the
//! commands it is sent, streaming their output back.
//!
//! It must never know about wasmtime, sled or models: it stays small. It
//! keeps only its identity on disk (key in the OS keyring or a 0600 file,
//! certificate, CA pin, server address); command state lives in memory,
//! bounded, so a restart forgets it and the server marks those commands lost.
//!
//! Key types: [`identity::Identity`], [`exec::Runner`] (runs and holds
//! commands), [`conn::run`] (the reconnecting client), [`pair::pair`].

pub mod conn;
pub mod exec;
pub mod identity;
pub mod pair;
pub mod tls;
pub mod wire;

/// This host's name, reported at pairing and in Hello.
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
    std::env::var("COMPUTERNAME").unwrap_or_else(|_| "localhost".into())
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
