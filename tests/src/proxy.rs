//! A UDP relay between daemons and the server that a test can cut: while
//! cut, every datagram in both directions is dropped, like a dead Wi-Fi or
//! a laptop lid closing. Loopback only.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Flag;

pub struct UdpProxy {
    pub addr: SocketAddr,
    pub cut: Flag,
    stop: Flag,
}

/// Most client addresses the relay tracks.
const MAX_CLIENTS: usize = 64;

impl UdpProxy {
    pub fn start(upstream: SocketAddr) -> UdpProxy {
        let front = UdpSocket::bind("127.0.0.1:0").expect("bind proxy");
        front
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let addr = front.local_addr().unwrap();
        let cut = Flag::default();
        let stop = Flag::default();
        let front = Arc::new(front);
        let clients: Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>> = Arc::default();
        {
            let (cut, stop, front, clients) =
                (cut.clone(), stop.clone(), front.clone(), clients.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.get() {
                    let Ok((n, from)) = front.recv_from(&mut buf) else {
                        continue;
                    };
                    if cut.get() {
                        continue;
                    }
                    let back = {
                        let mut c = clients.lock().unwrap();
                        if !c.contains_key(&from) && c.len() < MAX_CLIENTS {
                            let s = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
                            s.set_read_timeout(Some(Duration::from_millis(100)))
                                .unwrap();
                            c.insert(from, s.clone());
                            let (cut, stop, front) = (cut.clone(), stop.clone(), front.clone());
                            let s2 = s.clone();
                            std::thread::spawn(move || {
                                let mut buf = vec![0u8; 65536];
                                while !stop.get() {
                                    let Ok((n, _)) = s2.recv_from(&mut buf) else {
                                        continue;
                                    };
                                    if !cut.get() {
                                        let _ = front.send_to(&buf[..n], from);
                                    }
                                }
                            });
                        }
                        c.get(&from).cloned()
                    };
                    if let Some(s) = back {
                        let _ = s.send_to(&buf[..n], upstream);
                    }
                }
            });
        }
        UdpProxy { addr, cut, stop }
    }
}

impl Drop for UdpProxy {
    fn drop(&mut self) {
        self.stop.set(true);
    }
}

/// A TCP forwarder on a given address (e.g. the UDP proxy's port number,
/// so one "host:port" offers blocked UDP and working TCP).
pub struct TcpForward {
    stop: Flag,
}

impl TcpForward {
    /// A UDP proxy to `udp_upstream` and a TCP forwarder to `tcp_upstream`
    /// on the same port number. Ephemeral ports are shared by outgoing TCP
    /// connections, so the proxy's number may be taken for TCP: try others.
    pub fn with_udp_proxy(
        udp_upstream: SocketAddr,
        tcp_upstream: SocketAddr,
    ) -> (UdpProxy, TcpForward) {
        for _ in 0..64 {
            let udp = UdpProxy::start(udp_upstream);
            if let Ok(tcp) = Self::try_start(udp.addr, tcp_upstream) {
                return (udp, tcp);
            }
        }
        panic!("no port free for both UDP and TCP after 64 tries");
    }

    pub fn try_start(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<TcpForward> {
        let l = std::net::TcpListener::bind(listen)?;
        l.set_nonblocking(true)?;
        let stop = Flag::default();
        let st = stop.clone();
        std::thread::spawn(move || {
            while !st.get() {
                match l.accept() {
                    Ok((a, _)) => {
                        let _ = a.set_nonblocking(false);
                        let Ok(b) = std::net::TcpStream::connect(upstream) else {
                            continue;
                        };
                        let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
                        std::thread::spawn(move || pipe(a, b));
                        std::thread::spawn(move || pipe(b2, a2));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(TcpForward { stop })
    }
}

fn pipe(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
    use std::io::{Read, Write};
    // A plain loop: each read is forwarded at once.
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

impl Drop for TcpForward {
    fn drop(&mut self) {
        self.stop.set(true);
    }
}
