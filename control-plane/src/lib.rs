//! The byom control plane: `byom server` (QUIC gateway for daemons, admin
//! gRPC API, store, PKI) and the `byom` command line that talks to it.
//!
//! It must never know how the daemon runs processes: it sends ExecRequests
//! and records what comes back. The server keeps nothing in memory it cannot
//! rebuild from the [`store::Store`] and from daemons reconnecting.
//!
//! Key types: [`server::Shared`] (state shared by all tasks),
//! [`store::Store`] over a [`store::Backend`], [`pki::Pki`],
//! [`gateway::LiveMachine`], and the CLI in [`cli`].

pub mod api;
pub mod cli;
pub mod client;
pub mod demo;
pub mod gateway;
pub mod pki;
pub mod server;
pub mod store;
pub mod tls;
pub mod wire;

/// This host's name, for defaults.
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
