//! Whether a command used the network, as the kernel saw it.
//!
//! A command whose sandbox lets it reach other machines gets a seccomp
//! filter that sends every `socket()` that could reach one (any family
//! but unix and netlink: IP, and VSOCK, Bluetooth, SMC…) to a listener
//! before it goes on (`seccomp::Options::notify_ip`). The command's
//! process installs the filter and hands the listener to the sandbox
//! helper over a socket pair made for it; the helper answers each
//! notification ("go on", it only watches) and writes what it learnt to
//! byomd on [`super::linux::USAGE_FD`]: [`WATCHING`] once it holds the
//! listener, [`USED`] at the first such socket, before letting it be
//! made. byomd reads that when the command ends ([`read_usage`]); only a
//! watch that was in place and saw nothing says "no network": anything
//! else (no watch) counts as used, the safe side for the server, which
//! treats what such a command printed as anyone's words. A helper that
//! dies closes the listener, and every later such socket fails.
//!
//! A loopback connection counts too: a local service can relay anything.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The helper holds the listener: from here on, silence means no IP socket.
pub const WATCHING: u8 = b'w';
/// The command made an IP socket.
pub const USED: u8 = b'n';

/// The helper's side: the socket the command's process hands its
/// listener over, then the listener, and whether an IP socket was seen.
pub struct Watch {
    handover: Option<OwnedFd>,
    listener: Option<OwnedFd>,
    used: bool,
    usage: RawFd,
}

impl Watch {
    /// `handover`: None when the command is not watched. `usage`: where
    /// byomd reads what the watch learnt.
    pub fn new(handover: Option<OwnedFd>, usage: RawFd) -> Watch {
        Watch {
            handover,
            listener: None,
            used: false,
            usage,
        }
    }

    /// The poll entry for the hand-over socket (0) or the listener (1);
    /// a negative descriptor (ignored by poll) when absent.
    pub fn pollfd(&self, which: usize) -> libc::pollfd {
        let fd = if which == 0 {
            &self.handover
        } else {
            &self.listener
        };
        libc::pollfd {
            fd: fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        }
    }

    /// After a poll: the poll's results for the two entries.
    pub fn ready(&mut self, handover: libc::c_short, listener: libc::c_short) {
        if handover != 0 {
            self.take_listener();
        }
        if listener & libc::POLLIN != 0 {
            if let Some(l) = &self.listener {
                use std::os::fd::AsFd;
                // Told before the call goes on: a helper killed (a
                // timeout's SIGKILL) after answering but before telling
                // would leave a socket byomd never heard of; killed
                // before answering, the call fails (no listener). A
                // process that died meanwhile leaves nothing to answer.
                let (used, usage) = (&mut self.used, self.usage);
                let _ = super::seccomp::answer_one(l.as_fd(), || {
                    if !*used {
                        *used = true;
                        tell(usage, USED);
                    }
                });
            }
        } else if listener != 0 {
            // Every process under the filter is gone.
            self.listener = None;
        }
    }

    /// Takes the listener if it was handed over (also when the command
    /// ended before the helper polled for it: still watched, it made no
    /// IP socket unanswered, since one would have kept it waiting).
    pub fn take_listener(&mut self) {
        let Some(h) = self.handover.take() else {
            return;
        };
        match recv_fd(h.as_raw_fd()) {
            Ok(Some(l)) => {
                self.listener = Some(l);
                tell(self.usage, WATCHING);
            }
            // Not yet: keep waiting for it.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.handover = Some(h),
            // Closed without one: no watch (byomd counts it as used).
            _ => {}
        }
    }
}

/// Sends `fd` over the unix socket `sock` (SCM_RIGHTS). Raw syscalls
/// only: called between fork and exec.
pub fn send_fd(sock: RawFd, fd: RawFd) -> std::io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one descriptor, aligned as cmsghdr needs.
    let mut space = [0u64; 4];
    // SAFETY: msghdr and its control buffer are local and sized by
    // CMSG_SPACE; the kernel copies them.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives a descriptor sent by [`send_fd`]; `None` when the other end
/// closed without sending one.
pub fn recv_fd(sock: RawFd) -> std::io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut space = [0u64; 4];
    // SAFETY: as in send_fd; a descriptor the kernel passes is new and
    // ours (MSG_CMSG_CLOEXEC keeps it from any exec).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&space) as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n == 0 || c.is_null() {
            return Ok(None);
        }
        if (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS {
            return Ok(None);
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
        Ok(Some(OwnedFd::from_raw_fd(fd)))
    }
}

/// A connected pair of unix sockets, close-on-exec.
pub fn socket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills fds.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes one usage byte to `fd` (the helper's report to byomd).
pub fn tell(fd: RawFd, what: u8) {
    // SAFETY: a one-byte write to a descriptor that may be closed (then it
    // fails, and byomd reads "unknown").
    unsafe {
        libc::write(fd, (&what as *const u8).cast(), 1);
    }
}

/// What byomd learns from the usage pipe once the command ended: whether
/// the command may have used the network. Only a watch that was in place
/// and saw no IP socket says no.
pub fn read_usage(fd: &OwnedFd) -> bool {
    let mut buf = [0u8; 16];
    let mut seen = Vec::new();
    // SAFETY: non-blocking reads into a local buffer from our own pipe.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        for _ in 0..4 {
            let n = libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n as usize]);
        }
    }
    seen.contains(&USED) || !seen.contains(&WATCHING)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::seccomp;

    /// A child under the watching filter makes sockets; this process
    /// answers as the helper does. IP sockets are told (and still work),
    /// others are not.
    #[test]
    fn ip_sockets_are_told_and_still_made() {
        for sockets in [seccomp::Sockets::Any, seccomp::Sockets::Ports] {
            let prog = seccomp::program(seccomp::Options {
                sockets,
                notify_ip: true,
                ..Default::default()
            });
            let (ours, theirs) = socket_pair().unwrap();
            // The child writes a byte here each time a told call returned.
            let (progress_r, progress_w) = crate::sandbox::pipe().unwrap();
            // SAFETY: the child makes raw syscalls and exits.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                // SAFETY: raw syscalls in the child.
                unsafe {
                    libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                    let Ok(l) = seccomp::install_listener(&prog) else {
                        libc::_exit(100);
                    };
                    if send_fd(theirs.as_raw_fd(), l.as_raw_fd()).is_err() {
                        libc::_exit(101);
                    }
                    drop(l);
                    let step = || tell(progress_w.as_raw_fd(), b'.');
                    if libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) < 0 {
                        libc::_exit(1);
                    }
                    if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) < 0 {
                        libc::_exit(2);
                    }
                    step();
                    if libc::socket(libc::AF_INET6, libc::SOCK_DGRAM, 0) < 0 {
                        libc::_exit(3);
                    }
                    step();
                    if libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) < 0 {
                        libc::_exit(4);
                    }
                    // Other machines are reached by more than IP: VSOCK
                    // (the hypervisor's host), Bluetooth, SMC, RDS…
                    // Told whether or not this kernel has the family
                    // (seccomp sees the call before the kernel does).
                    libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0);
                    step();
                    libc::socket(libc::AF_BLUETOOTH, libc::SOCK_STREAM, 0);
                    step();
                    libc::_exit(0);
                }
            }
            drop(theirs);
            drop(progress_w);
            let mut progress = 0;
            let listener = (0..200)
                .find_map(|_| match recv_fd(ours.as_raw_fd()) {
                    Ok(Some(l)) => Some(l),
                    _ => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        None
                    }
                })
                .expect("the listener");
            let mut told = 0;
            for _ in 0..100 {
                let mut p = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: polling our descriptor.
                unsafe { libc::poll(&mut p, 1, 100) };
                if p.revents & libc::POLLIN != 0 {
                    use std::os::fd::AsFd;
                    // Told while the call still waits: the child has not
                    // gone on past it.
                    let mut returned = usize::MAX;
                    if seccomp::answer_one(listener.as_fd(), || {
                        progress += drain(&progress_r);
                        returned = progress;
                    })
                    .is_ok()
                    {
                        assert_eq!(returned, told, "told after the call went on");
                        told += 1;
                    }
                } else if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    break;
                }
            }
            let mut st = 0;
            // SAFETY: reaping our child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            assert!(libc::WIFEXITED(st), "{st}");
            assert_eq!(libc::WEXITSTATUS(st), 0, "{sockets:?}");
            // In Ports mode only local, netlink and IP families are made
            // at all: the others are refused before anything is told.
            let want = if sockets == seccomp::Sockets::Any {
                4
            } else {
                2
            };
            assert_eq!(told, want, "{sockets:?}");
        }
    }

    /// Bytes waiting in a pipe, read without blocking.
    fn drain(fd: &OwnedFd) -> usize {
        let mut buf = [0u8; 16];
        let mut n = 0;
        // SAFETY: non-blocking reads into a local buffer from our pipe.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
            for _ in 0..16 {
                let r = libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len());
                if r <= 0 {
                    break;
                }
                n += r as usize;
            }
        }
        n
    }

    #[test]
    fn only_a_watch_that_saw_nothing_says_no_network() {
        let cases: [(&[u8], bool); 4] = [(b"", true), (b"w", false), (b"wn", true), (b"n", true)];
        for (bytes, used) in cases {
            let (r, w) = crate::sandbox::pipe().unwrap();
            for b in bytes {
                tell(w.as_raw_fd(), *b);
            }
            assert_eq!(read_usage(&r), used, "{bytes:?}");
        }
    }
}
