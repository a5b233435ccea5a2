//! QUIC over a byte stream, for networks that block UDP.
//!
//! [`StreamSocket`] is a virtual UDP socket for quinn: each datagram goes
//! over a stream connection (TLS 1.3 over TCP, set up by the caller) as a
//! 2-byte big-endian length and the bytes. QUIC then runs unchanged on top —
//! the same certificates, the same frames, many streams on one connection —
//! so the fallback is the protocol, not a second implementation of it.
//!
//! Each attached stream gets a synthetic peer address (`[fd00::N]:1`) that
//! quinn uses to route datagrams back to it.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use tokio::sync::{mpsc, oneshot, watch};

/// Datagrams queued per direction and peer before new ones are dropped
/// (QUIC treats a drop as loss and retransmits).
pub const TUNNEL_QUEUE: usize = 1024;
/// Largest datagram carried (QUIC's are far smaller).
pub const MAX_DATAGRAM: usize = u16::MAX as usize;

static NEXT_PEER: AtomicU64 = AtomicU64::new(1);

pub struct StreamSocket {
    local: SocketAddr,
    inbox_tx: mpsc::Sender<(SocketAddr, Vec<u8>)>,
    inbox: Mutex<mpsc::Receiver<(SocketAddr, Vec<u8>)>>,
    peers: Mutex<HashMap<SocketAddr, Peer>>,
    /// Real addresses of the streams, for logs and status.
    real: Mutex<HashMap<SocketAddr, String>>,
}

/// One attached stream, as the socket sees it.
struct Peer {
    out: mpsc::Sender<Vec<u8>>,
    /// A QUIC connection was established over it.
    established: watch::Sender<bool>,
    /// Close it now.
    kill: watch::Sender<bool>,
}

/// Bounds on a stream from a stranger (the server's side).
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamLimits {
    /// Closed unless [`StreamSocket::established`] is called this soon.
    pub establish_within: Option<Duration>,
    /// Closed after this long without a datagram from the other side.
    pub idle: Option<Duration>,
}

/// What [`StreamSocket::attach_limited`] hands back.
pub struct Attached {
    /// The synthetic peer address quinn sees.
    pub addr: SocketAddr,
    /// Becomes true once a QUIC connection is established over it.
    pub established: watch::Receiver<bool>,
    /// Resolves when the stream is closed.
    pub closed: oneshot::Receiver<()>,
}

impl fmt::Debug for StreamSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSocket")
            .field("local", &self.local)
            .finish()
    }
}

impl Default for StreamSocket {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamSocket {
    pub fn new() -> StreamSocket {
        let (inbox_tx, inbox) = mpsc::channel(TUNNEL_QUEUE);
        StreamSocket {
            local: SocketAddr::new(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0).into(), 1),
            inbox_tx,
            inbox: Mutex::new(inbox),
            peers: Mutex::new(HashMap::new()),
            real: Mutex::new(HashMap::new()),
        }
    }

    /// The real address behind a synthetic peer address.
    pub fn real_addr(&self, peer: &SocketAddr) -> Option<String> {
        self.real.lock().ok()?.get(peer).cloned()
    }

    /// Carries datagrams over `stream` until it closes; returns the peer
    /// address quinn will see for it.
    pub fn attach<S>(self: &Arc<Self>, stream: S, real: String) -> SocketAddr
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        self.attach_limited(stream, real, StreamLimits::default())
            .addr
    }

    /// Marks the stream behind `peer` as carrying an established QUIC
    /// connection (it is no longer closed for failing to establish one).
    pub fn established(&self, peer: &SocketAddr) {
        self.signal(peer, |p| &p.established);
    }

    /// Closes the stream behind `peer` (its QUIC connection ended).
    pub fn detach(&self, peer: &SocketAddr) {
        self.signal(peer, |p| &p.kill);
    }

    fn signal(&self, peer: &SocketAddr, which: fn(&Peer) -> &watch::Sender<bool>) {
        if let Ok(p) = self.peers.lock() {
            if let Some(p) = p.get(peer) {
                let _ = which(p).send(true);
            }
        }
    }

    /// [`Self::attach`] for a stream from a stranger: closed if no QUIC
    /// connection is established over it in time, or when it goes idle.
    pub fn attach_limited<S>(
        self: &Arc<Self>,
        stream: S,
        real: String,
        limits: StreamLimits,
    ) -> Attached
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let n = NEXT_PEER.fetch_add(1, Ordering::Relaxed);
        let addr = SocketAddr::new(
            Ipv6Addr::new(
                0xfd00,
                0,
                0,
                0,
                (n >> 32) as u16,
                (n >> 16) as u16,
                n as u16,
                1,
            )
            .into(),
            1,
        );
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(TUNNEL_QUEUE);
        let (est_tx, est_rx) = watch::channel(false);
        let (kill_tx, mut kill_rx) = watch::channel(false);
        let (closed_tx, closed_rx) = oneshot::channel();
        let mut est_wait = est_rx.clone();
        if let Ok(mut p) = self.peers.lock() {
            p.insert(
                addr,
                Peer {
                    out: out_tx,
                    established: est_tx,
                    kill: kill_tx,
                },
            );
        }
        if let Ok(mut r) = self.real.lock() {
            r.insert(addr, real);
        }
        let (mut rd, mut wr) = tokio::io::split(stream);
        let me = self.clone();
        let inbox = self.inbox_tx.clone();
        tokio::spawn(async move {
            let reader = async {
                let mut len = [0u8; 2];
                loop {
                    let read = rd.read_exact(&mut len);
                    let got = match limits.idle {
                        Some(idle) => match tokio::time::timeout(idle, read).await {
                            Ok(r) => r,
                            Err(_) => return,
                        },
                        None => read.await,
                    };
                    if got.is_err() {
                        return;
                    }
                    let n = u16::from_be_bytes(len) as usize;
                    let mut buf = vec![0u8; n];
                    if rd.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    if inbox.send((addr, buf)).await.is_err() {
                        return;
                    }
                }
            };
            let writer = async {
                // Everything already queued goes out in one buffer, one flush.
                let mut buf = Vec::new();
                while let Some(d) = out_rx.recv().await {
                    buf.clear();
                    let mut next = Some(d);
                    while let Some(d) = next {
                        buf.extend_from_slice(&(d.len() as u16).to_be_bytes());
                        buf.extend_from_slice(&d);
                        next = out_rx.try_recv().ok();
                    }
                    if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
                        return;
                    }
                }
            };
            let deadline = async {
                if let Some(d) = limits.establish_within {
                    if tokio::time::timeout(d, est_wait.wait_for(|e| *e))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                std::future::pending::<()>().await
            };
            tokio::select! {
                _ = reader => {}
                _ = writer => {}
                _ = deadline => {}
                _ = kill_rx.wait_for(|k| *k) => {}
            }
            if let Ok(mut p) = me.peers.lock() {
                p.remove(&addr);
            }
            if let Ok(mut r) = me.real.lock() {
                r.remove(&addr);
            }
            let _ = closed_tx.send(());
        });
        Attached {
            addr,
            established: est_rx,
            closed: closed_rx,
        }
    }
}

#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for StreamSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, t: &Transmit) -> io::Result<()> {
        let Some(tx) = self
            .peers
            .lock()
            .ok()
            .and_then(|p| p.get(&t.destination).map(|x| x.out.clone()))
        else {
            // The stream is gone: like a datagram to a dead host.
            return Ok(());
        };
        let seg = t.segment_size.unwrap_or(t.contents.len()).max(1);
        for d in t.contents.chunks(seg) {
            if d.len() <= MAX_DATAGRAM {
                let _ = tx.try_send(d.to_vec());
            }
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let Ok(mut inbox) = self.inbox.lock() else {
            return Poll::Ready(Err(io::Error::other("tunnel state poisoned")));
        };
        match inbox.poll_recv(cx) {
            Poll::Ready(Some((addr, data))) => {
                let (Some(buf), Some(m)) = (bufs.first_mut(), meta.first_mut()) else {
                    return Poll::Ready(Ok(0));
                };
                let n = data.len().min(buf.len());
                buf[..n].copy_from_slice(&data[..n]);
                *m = RecvMeta {
                    addr,
                    len: n,
                    stride: n,
                    ecn: None,
                    dst_ip: None,
                };
                Poll::Ready(Ok(1))
            }
            Poll::Ready(None) => Poll::Ready(Err(io::Error::other("tunnel closed"))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(ms: u64) -> StreamLimits {
        StreamLimits {
            establish_within: Some(Duration::from_millis(ms)),
            idle: Some(Duration::from_secs(60)),
        }
    }

    #[tokio::test]
    async fn a_stream_without_quic_is_closed_after_the_deadline() {
        let sock = Arc::new(StreamSocket::new());
        let (a, _b) = tokio::io::duplex(1024);
        let att = sock.attach_limited(a, "x".into(), limits(50));
        tokio::time::timeout(Duration::from_secs(5), att.closed)
            .await
            .expect("closed in time")
            .unwrap();
        assert!(sock.real_addr(&att.addr).is_none());
    }

    #[tokio::test]
    async fn an_established_stream_stays_until_detached() {
        let sock = Arc::new(StreamSocket::new());
        let (a, _b) = tokio::io::duplex(1024);
        let mut att = sock.attach_limited(a, "x".into(), limits(50));
        sock.established(&att.addr);
        assert!(*att.established.borrow_and_update());
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut att.closed)
                .await
                .is_err(),
            "still open past the deadline"
        );
        sock.detach(&att.addr);
        tokio::time::timeout(Duration::from_secs(5), att.closed)
            .await
            .expect("closed")
            .unwrap();
    }

    #[tokio::test]
    async fn an_idle_stream_is_closed() {
        let sock = Arc::new(StreamSocket::new());
        let (a, _b) = tokio::io::duplex(1024);
        let att = sock.attach_limited(
            a,
            "x".into(),
            StreamLimits {
                establish_within: None,
                idle: Some(Duration::from_millis(50)),
            },
        );
        tokio::time::timeout(Duration::from_secs(5), att.closed)
            .await
            .expect("closed when idle")
            .unwrap();
    }
}
