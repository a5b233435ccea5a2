//! Admission before authentication. Every listener that accepts strangers
//! (QUIC handshakes, TCP-fallback tunnels, the admin API's TLS handshakes,
//! webhook connections) takes a [`Ticket`] from its [`Gate`] per
//! connection: at most `per_address` at once from one IP address, at most
//! `total` in all. When the gate is full, the oldest connection that has
//! not finished its handshake yet is evicted to make room, never the new
//! one: a flood of slow strangers cannot keep a real client out.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its address already holds `per_address` connections.
    PerAddress,
    /// Full of connections that finished their handshakes.
    Full,
}

pub struct Gate {
    /// Its label in metrics (`quic`, `tunnel`, `api`, `webhook`, `metrics`).
    name: &'static str,
    what: &'static str,
    total: usize,
    per_address: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    per_ip: HashMap<IpAddr, usize>,
    held: usize,
    next: u64,
    /// Unfinished tickets, oldest first: what to evict.
    unfinished: BTreeMap<u64, (IpAddr, CancellationToken)>,
}

impl Inner {
    fn release(&mut self, ip: IpAddr, per_address: bool) {
        self.held = self.held.saturating_sub(1);
        if !per_address {
            return;
        }
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
    }
}

/// One admitted connection; dropping it frees its place.
pub struct Ticket {
    gate: Arc<Gate>,
    ip: IpAddr,
    seq: u64,
    evict: CancellationToken,
    /// Counted against its address until established: many machines
    /// behind one NAT may all stay connected, but only so many may be
    /// mid-handshake at once.
    per_address: std::sync::atomic::AtomicBool,
}

impl Gate {
    pub fn new(
        name: &'static str,
        what: &'static str,
        total: usize,
        per_address: usize,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            name,
            what,
            total: total.max(1),
            per_address: per_address.max(1),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.inner.lock().map(|i| i.held).unwrap_or(0)
    }

    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, Refused> {
        let mut i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if i.per_ip.get(&ip).copied().unwrap_or(0) >= self.per_address {
            crate::metrics::gate_refused(self.name, "per_address");
            return Err(Refused::PerAddress);
        }
        if i.held >= self.total {
            let Some((_, (old_ip, token))) = i.unfinished.pop_first() else {
                crate::metrics::gate_refused(self.name, "full");
                return Err(Refused::Full);
            };
            crate::metrics::gate_refused(self.name, "evicted");
            // Uncounted now; its holder sees the token and hangs up.
            token.cancel();
            i.release(old_ip, true);
            tracing::debug!(gate = self.what, %old_ip, "full: the oldest unfinished connection makes room");
        }
        let seq = i.next;
        i.next += 1;
        i.held += 1;
        *i.per_ip.entry(ip).or_default() += 1;
        let evict = CancellationToken::new();
        i.unfinished.insert(seq, (ip, evict.clone()));
        Ok(Ticket {
            gate: self.clone(),
            ip,
            seq,
            evict,
            per_address: std::sync::atomic::AtomicBool::new(true),
        })
    }
}

impl Ticket {
    /// The handshake is done: it is a client now, no longer evictable,
    /// and no longer counted against its address (still in the total).
    pub fn established(&self) {
        let mut i = self.gate.inner.lock().unwrap_or_else(|p| p.into_inner());
        i.unfinished.remove(&self.seq);
        if self
            .per_address
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            if let Some(n) = i.per_ip.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    i.per_ip.remove(&self.ip);
                }
            }
        }
    }

    /// Completes when the gate evicted this connection to make room.
    pub fn evicted(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.evict.cancelled()
    }

    /// `step` (a handshake), unless it takes longer than `limit` or this
    /// connection is evicted first.
    pub async fn within<F: std::future::Future>(
        &self,
        limit: Duration,
        step: F,
    ) -> Option<F::Output> {
        tokio::select! {
            r = tokio::time::timeout(limit, step) => r.ok(),
            _ = self.evicted() => None,
        }
    }
}

/// Completes when `ticket` is evicted; never without one.
pub async fn evicted(ticket: &Option<Ticket>) {
    match ticket {
        Some(t) => t.evicted().await,
        None => std::future::pending().await,
    }
}

/// The next TCP connection `gate` admits, or None at shutdown. Refused
/// connections are closed at once; accept errors (out of files, say) are
/// logged and waited out, never spun on.
pub async fn accept(
    listener: &TcpListener,
    gate: &Arc<Gate>,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, SocketAddr, Ticket)> {
    loop {
        let (tcp, remote) = tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(gate = gate.what, "accept failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        if let Ok(ticket) = gate.admit(remote.ip()) {
            let _ = tcp.set_nodelay(true);
            return Some((tcp, remote, ticket));
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut i = self.gate.inner.lock().unwrap_or_else(|p| p.into_inner());
        i.unfinished.remove(&self.seq);
        // An evicted ticket's place was freed when it was evicted.
        if !self.evict.is_cancelled() {
            let per_address = self.per_address.load(std::sync::atomic::Ordering::SeqCst);
            i.release(self.ip, per_address);
        }
    }
}

/// Raises this process's open-file limit to its hard limit (as Go does):
/// every connection is a file, and the common soft limit of 1,024 is far
/// below what the kernel allows. Returns the limit now in force.
pub fn raise_open_files() -> u64 {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit on this process with a valid struct.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return 1024;
            }
            if lim.rlim_cur < lim.rlim_max {
                let want = libc::rlimit {
                    rlim_cur: lim.rlim_max,
                    rlim_max: lim.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                    lim.rlim_cur = lim.rlim_max;
                }
            }
        }
        lim.rlim_cur
    }
    #[cfg(not(unix))]
    {
        8192
    }
}

/// Files kept for the store, logs, daemons' sockets and the process.
const RESERVED_FILES: u64 = 256;

/// The gates of one server, sized to its open-file limit so that strangers
/// can never take the files authenticated clients need.
pub struct Gates {
    pub quic: Arc<Gate>,
    pub tunnels: Arc<Gate>,
    pub api: Arc<Gate>,
    pub webhooks: Arc<Gate>,
}

/// QUIC handshakes in flight at once (UDP: no file each).
pub const MAX_QUIC_HANDSHAKES: usize = 1024;
/// From one address.
pub const MAX_QUIC_HANDSHAKES_PER_ADDRESS: usize = 32;
/// Above this many handshakes in flight, new ones from addresses not yet
/// validated get a stateless Retry first.
pub const QUIC_RETRY_ABOVE: usize = 64;
/// TCP-fallback tunnels, admin API and webhook connections: most at once
/// (before the open-file limit cuts them) and from one address.
pub const MAX_TUNNELS: usize = 4096;
pub const MAX_TUNNELS_PER_ADDRESS: usize = 64;
pub const MAX_API_CONNECTIONS: usize = 1024;
pub const MAX_API_CONNECTIONS_PER_ADDRESS: usize = 64;
pub const MAX_WEBHOOK_CONNECTIONS: usize = 1024;
pub const MAX_WEBHOOK_CONNECTIONS_PER_ADDRESS: usize = 64;

impl Gates {
    pub fn new(open_files: u64) -> Gates {
        // A third of what is left each, so together they cannot exhaust it.
        let share = (open_files.saturating_sub(RESERVED_FILES) / 3).max(16) as usize;
        Gates {
            quic: Gate::new(
                "quic",
                "QUIC handshakes",
                MAX_QUIC_HANDSHAKES,
                MAX_QUIC_HANDSHAKES_PER_ADDRESS,
            ),
            tunnels: Gate::new(
                "tunnel",
                "TCP fallback tunnels",
                MAX_TUNNELS.min(share),
                MAX_TUNNELS_PER_ADDRESS,
            ),
            api: Gate::new(
                "api",
                "admin API connections",
                MAX_API_CONNECTIONS.min(share),
                MAX_API_CONNECTIONS_PER_ADDRESS,
            ),
            webhooks: Gate::new(
                "webhook",
                "webhook connections",
                MAX_WEBHOOK_CONNECTIONS.min(share),
                MAX_WEBHOOK_CONNECTIONS_PER_ADDRESS,
            ),
        }
    }
}

/// How long an accept loop waits after an error (out of files, say), so
/// it backs off instead of spinning.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    #[test]
    fn per_address_and_total_limits() {
        let g = Gate::new("t", "t", 4, 2);
        let a1 = g.admit(ip(1)).unwrap();
        let _a2 = g.admit(ip(1)).unwrap();
        assert_eq!(g.admit(ip(1)).err(), Some(Refused::PerAddress));
        drop(a1);
        let _a3 = g.admit(ip(1)).unwrap();
        assert_eq!(g.held(), 2);
    }

    #[test]
    fn established_connections_leave_their_address_free_but_count_in_all() {
        let g = Gate::new("t", "t", 4, 2);
        let a = g.admit(ip(1)).unwrap();
        let b = g.admit(ip(1)).unwrap();
        assert_eq!(g.admit(ip(1)).err(), Some(Refused::PerAddress));
        // Many machines behind one NAT: established ones do not count.
        a.established();
        b.established();
        let c = g.admit(ip(1)).unwrap();
        let _d = g.admit(ip(1)).unwrap();
        assert_eq!(g.held(), 4);
        drop((a, b));
        c.established();
        assert_eq!(g.held(), 2);
        let _e = g.admit(ip(1)).unwrap();
        assert_eq!(g.admit(ip(1)).err(), Some(Refused::PerAddress));
    }

    #[test]
    fn when_full_the_oldest_unfinished_makes_room() {
        let g = Gate::new("t", "t", 3, 3);
        let old = g.admit(ip(2)).unwrap();
        let done = g.admit(ip(2)).unwrap();
        done.established();
        let mid = g.admit(ip(3)).unwrap();
        // Full: the new one gets in, the oldest unfinished is told to go.
        let new = g.admit(ip(4)).unwrap();
        assert!(old.evict.is_cancelled());
        assert!(!mid.evict.is_cancelled() && !done.evict.is_cancelled());
        assert_eq!(g.held(), 3);
        drop(old);
        assert_eq!(g.held(), 3, "an evicted ticket was already uncounted");
        mid.established();
        new.established();
        // All established: nothing to evict, the newcomer is refused.
        assert_eq!(g.admit(ip(5)).err(), Some(Refused::Full));
        drop(done);
        assert!(g.admit(ip(5)).is_ok());
    }

    #[test]
    fn gates_fit_in_the_open_file_limit() {
        let g = Gates::new(1024);
        let files = g.tunnels.total + g.api.total + g.webhooks.total;
        assert!(files as u64 <= 1024 - RESERVED_FILES, "{files}");
        let g = Gates::new(1 << 20);
        assert_eq!(g.tunnels.total, MAX_TUNNELS);
    }
}
