//! The seccomp filter every sandboxed command runs under: the calls a
//! shell command never needs and an escape would (mounts, namespaces,
//! kernel keyrings, modules, BPF, io_uring, pushing keystrokes into a
//! terminal) fail with `EPERM`; where no network namespace can be made,
//! IP sockets too.
//!
//! Written as BPF by hand rather than through a crate: it is short, and
//! the details that make filters leak are explicit here: the architecture
//! is checked first (another ABI's numbers mean other calls), x32 calls on
//! x86_64 are refused, and `ioctl` requests are compared on their low 32
//! bits, as the kernel reads them (a request with high bits set is still
//! TIOCSTI to the tty driver).

/// Which socket families a command may make.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Sockets {
    #[default]
    Any,
    /// A list of TCP ports (Landlock): only local, IP and netlink sockets,
    /// none of the IP protocols Landlock's TCP rules do not see (MPTCP,
    /// SCTP, SMC), and no `listen`.
    Ports,
    /// The network denied, in a network namespace of its own: IP sockets
    /// (the namespace confines them) and netlink, but no unix sockets (a
    /// socket file reaches programs outside: credential caches, DNS
    /// resolvers, terminal multiplexers…) and none of the families a
    /// namespace does not confine (VSOCK to the hypervisor, Bluetooth…).
    /// `socketpair` and pipes still work.
    Namespaced,
    /// The network denied where no namespace could be made: netlink only.
    Local,
}

/// What the filter refuses besides the fixed list.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub sockets: Sockets,
    /// No ptrace or cross-process memory access: there is no PID
    /// namespace to keep it among the command's own processes.
    pub deny_ptrace: bool,
    /// No owner or extended-attribute changes: there are no read-only
    /// mounts to keep them inside the write roots (Landlock does not
    /// judge them).
    pub deny_owner_changes: bool,
    /// Every socket the command makes that could reach another machine
    /// (any family but unix and netlink) is told to the filter's listener
    /// first (which lets it go on): how byomd learns, from the kernel, that
    /// a command used the network. Install with [`install_listener`].
    pub notify_ip: bool,
}

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;

/// Offsets in `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// The low 32 bits of argument `i` (little-endian).
const fn off_arg(i: u32) -> u32 {
    16 + 8 * i
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// Whether this build has a filter for its architecture.
pub const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

const TIOCSTI: u32 = 0x5412;
/// S_ISUID | S_ISGID.
const SET_ID_BITS: u32 = 0o6000;

/// Calls that take a file mode, and which argument it is.
fn mode_args() -> Vec<(libc::c_long, u32)> {
    let mut v = vec![
        (libc::SYS_fchmod, 1),
        (libc::SYS_fchmodat, 2),
        // fchmodat2 (Linux 6.6)
        (452, 2),
        (libc::SYS_openat, 3),
        (libc::SYS_mknodat, 2),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_chmod, 1),
        (libc::SYS_open, 2),
        (libc::SYS_creat, 1),
        (libc::SYS_mknod, 1),
    ]);
    v
}
const TIOCLINUX: u32 = 0x541C;

const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP
    | 0x80/* CLONE_NEWTIME */) as u32;

/// Calls refused outright.
fn refused() -> Vec<libc::c_long> {
    let mut v = vec![
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_vhangup,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_lookup_dcookie,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_chroot,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([libc::SYS_iopl, libc::SYS_ioperm, libc::SYS_uselib]);
    v
}

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// `if A == k { return ret }`.
fn refuse_if(p: &mut Vec<libc::sock_filter>, k: u32, ret: u32) {
    p.push(jump(JEQ_K, k, 0, 1));
    p.push(stmt(RET_K, ret));
}

fn errno(e: i32) -> u32 {
    RET_ERRNO | (e as u32 & 0xffff)
}

/// `if nr == syscall { body }` where `body` ends in a return; the body is
/// skipped otherwise (with `nr` still in A).
fn block(p: &mut Vec<libc::sock_filter>, nr: libc::c_long, body: Vec<libc::sock_filter>) {
    let len = u8::try_from(body.len()).expect("seccomp block longer than a jump");
    p.push(jump(JEQ_K, nr as u32, 0, len));
    p.extend(body);
}

/// The end of `socket`'s rules: allowed, and, when `notify`, told to the
/// listener first unless it stays on this machine (unix and netlink
/// sockets). Not only IP reaches other machines: VSOCK reaches the
/// hypervisor's host, Bluetooth a device nearby, SMC and RDS run over
/// TCP; a family named here is one that cannot, everything else is told.
fn allow_socket(notify: bool) -> Vec<libc::sock_filter> {
    if !notify {
        return vec![stmt(RET_K, RET_ALLOW)];
    }
    vec![
        stmt(LD_W_ABS, off_arg(0)),
        jump(JEQ_K, libc::AF_UNIX as u32, 1, 0),
        jump(JEQ_K, libc::AF_NETLINK as u32, 0, 1),
        stmt(RET_K, RET_ALLOW),
        stmt(RET_K, RET_USER_NOTIF),
    ]
}

/// The filter program.
pub fn program(opts: Options) -> Vec<libc::sock_filter> {
    let mut p = Vec::with_capacity(128);
    p.push(stmt(LD_W_ABS, OFF_ARCH));
    p.push(jump(JEQ_K, AUDIT_ARCH, 1, 0));
    p.push(stmt(RET_K, RET_KILL_PROCESS));
    p.push(stmt(LD_W_ABS, OFF_NR));
    #[cfg(target_arch = "x86_64")]
    {
        // x32 calls: the same architecture, other numbers.
        p.push(jump(JGE_K, 0x4000_0000, 0, 1));
        p.push(stmt(RET_K, errno(libc::EPERM)));
    }
    for nr in refused() {
        refuse_if(&mut p, nr as u32, errno(libc::EPERM));
    }
    if opts.deny_owner_changes {
        let mut calls = vec![
            libc::SYS_fchown,
            libc::SYS_fchownat,
            libc::SYS_setxattr,
            libc::SYS_lsetxattr,
            libc::SYS_fsetxattr,
            libc::SYS_removexattr,
            libc::SYS_lremovexattr,
            libc::SYS_fremovexattr,
        ];
        #[cfg(target_arch = "x86_64")]
        calls.extend([libc::SYS_chown, libc::SYS_lchown]);
        for nr in calls {
            refuse_if(&mut p, nr as u32, errno(libc::EPERM));
        }
    }
    if opts.deny_ptrace {
        for nr in [
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_pidfd_getfd,
            libc::SYS_kcmp,
        ] {
            refuse_if(&mut p, nr as u32, errno(libc::EPERM));
        }
    }
    // glibc falls back to clone when clone3 is missing; clone3's flags sit
    // behind a pointer the filter cannot read.
    refuse_if(&mut p, libc::SYS_clone3 as u32, errno(libc::ENOSYS));
    // openat2 takes its mode behind a pointer; callers fall back to openat.
    refuse_if(&mut p, libc::SYS_openat2 as u32, errno(libc::ENOSYS));
    block(
        &mut p,
        libc::SYS_clone,
        vec![
            stmt(LD_W_ABS, off_arg(0)),
            jump(JSET_K, NAMESPACE_FLAGS, 0, 1),
            stmt(RET_K, errno(libc::EPERM)),
            stmt(RET_K, RET_ALLOW),
        ],
    );
    block(
        &mut p,
        libc::SYS_ioctl,
        vec![
            stmt(LD_W_ABS, off_arg(1)),
            jump(JEQ_K, TIOCSTI, 1, 0),
            jump(JEQ_K, TIOCLINUX, 0, 1),
            stmt(RET_K, errno(libc::EPERM)),
            stmt(RET_K, RET_ALLOW),
        ],
    );
    // Netlink reads, and without CAP_NET_ADMIN cannot change, the network
    // it is in.
    let families: &[i32] = match opts.sockets {
        Sockets::Any => &[],
        Sockets::Ports => &[
            libc::AF_UNIX,
            libc::AF_NETLINK,
            libc::AF_INET,
            libc::AF_INET6,
        ],
        Sockets::Namespaced => &[libc::AF_NETLINK, libc::AF_INET, libc::AF_INET6],
        Sockets::Local => &[libc::AF_NETLINK],
    };
    if !families.is_empty() {
        let n = families.len() as u8;
        let mut body = vec![stmt(LD_W_ABS, off_arg(0))];
        for (i, f) in families.iter().enumerate() {
            // Found: jump over the rest and the refusal to the protocol
            // check.
            body.push(jump(JEQ_K, *f as u32, n - i as u8, 0));
        }
        body.push(stmt(RET_K, errno(libc::EPERM)));
        // Only the protocols Landlock's TCP rules (or the namespace) see
        // as what they are: the default, TCP, UDP, ping. Not MPTCP, SCTP,
        // SMC and whatever comes next.
        body.push(stmt(LD_W_ABS, off_arg(2)));
        let protocols = [
            0,
            libc::IPPROTO_TCP,
            libc::IPPROTO_UDP,
            libc::IPPROTO_ICMP,
            libc::IPPROTO_ICMPV6,
        ];
        let k = protocols.len() as u8;
        for (i, proto) in protocols.iter().enumerate() {
            body.push(jump(JEQ_K, *proto as u32, k - i as u8, 0));
        }
        body.push(stmt(RET_K, errno(libc::EPERM)));
        body.extend(allow_socket(opts.notify_ip));
        block(&mut p, libc::SYS_socket, body);
    } else if opts.notify_ip {
        block(&mut p, libc::SYS_socket, allow_socket(true));
    }
    if opts.sockets == Sockets::Ports {
        // Connections to the listed ports, not a server for anyone: an
        // unbound socket's listen would take a port Landlock never saw
        // bound.
        refuse_if(&mut p, libc::SYS_listen as u32, errno(libc::EPERM));
    }
    // No set-user-ID or set-group-ID files: a root command would leave one
    // for anyone outside the sandbox to run as root.
    for (nr, arg) in mode_args() {
        block(
            &mut p,
            nr,
            vec![
                stmt(LD_W_ABS, off_arg(arg)),
                jump(JSET_K, SET_ID_BITS, 0, 1),
                stmt(RET_K, errno(libc::EPERM)),
                stmt(RET_K, RET_ALLOW),
            ],
        );
    }
    p.push(stmt(RET_K, RET_ALLOW));
    p
}

/// [`install`], returning the descriptor on which the kernel tells of the
/// calls `prog` sends to user space (`notify_ip`).
pub fn install_listener(prog: &[libc::sock_filter]) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: fprog points at a live program for the call; the kernel
    // copies it and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just made this descriptor for us.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Answers one notification on `listener`: the call goes on as the
/// process made it (the filter only watches). `received` runs once a
/// notification is in hand and before the call goes on, so what it
/// records is written before the socket exists (a watcher killed between
/// the two leaves a call that fails, never a socket nobody told of).
/// Whether one came, or an error (the process died meanwhile: nothing to
/// answer).
pub fn answer_one(
    listener: std::os::fd::BorrowedFd<'_>,
    received: impl FnOnce(),
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the kernel requires a zeroed buffer of its size.
    let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: an ioctl filling req.
    if unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut req,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    received();
    let mut resp = libc::seccomp_notif_resp {
        id: req.id,
        val: 0,
        error: 0,
        flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
    };
    // SAFETY: an ioctl reading resp. ENOENT: the process is gone.
    if unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut resp,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Installs `prog` on the calling thread, for good. `no_new_privs` must be
/// set already. Only raw syscalls: safe between fork and exec.
pub fn install(prog: &[libc::sock_filter]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: fprog points at a live program for the duration of the call;
    // the kernel copies it.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &fprog as *const libc::sock_fprog as libc::c_ulong,
            0,
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child under the filter; the child's exit code
    /// is what `f` returned.
    fn in_child(opts: Options, f: impl FnOnce() -> i32) -> i32 {
        let prog = program(opts);
        // SAFETY: the child only makes raw syscalls and exits.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if install(&prog).is_err() {
                    libc::_exit(100);
                }
                libc::_exit(f());
            }
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
            assert!(libc::WIFEXITED(st), "child died: {st}");
            libc::WEXITSTATUS(st)
        }
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn escapes_are_refused_and_ordinary_calls_pass() {
        // mount, unshare, TIOCSTI (also with high bits set), keyrings.
        let code = in_child(Options::default(), || unsafe {
            let src = c"none".as_ptr();
            if libc::mount(src, c"/".as_ptr(), src, 0, std::ptr::null()) != -1
                || errno() != libc::EPERM
            {
                return 1;
            }
            if libc::unshare(libc::CLONE_NEWUSER) != -1 || errno() != libc::EPERM {
                return 2;
            }
            let c = 0u8;
            if libc::ioctl(0, TIOCSTI as libc::c_ulong, &c) != -1 || errno() != libc::EPERM {
                return 3;
            }
            let high = (1u64 << 32) | TIOCSTI as u64;
            if libc::syscall(libc::SYS_ioctl, 0, high, &c) != -1 || errno() != libc::EPERM {
                return 4;
            }
            if libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) != -1 || errno() != libc::EPERM {
                return 5;
            }
            if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                return 6;
            }
            // Ordinary work goes on: files, sockets, processes.
            if libc::getpid() <= 0 {
                return 7;
            }
            let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            if s < 0 {
                return 8;
            }
            libc::close(s);
            let pid = libc::fork();
            if pid == 0 {
                libc::_exit(0);
            }
            if pid < 0 {
                return 9;
            }
            0
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn sockets_can_be_denied_but_socketpairs_stay() {
        let code = in_child(
            Options {
                sockets: Sockets::Local,
                deny_ptrace: true,
                deny_owner_changes: true,
                notify_ip: false,
            },
            || unsafe {
                if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) != -1 || errno() != libc::EPERM
                {
                    return 1;
                }
                if libc::socket(libc::AF_INET6, libc::SOCK_DGRAM, 0) != -1 {
                    return 2;
                }
                if libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) != -1 {
                    return 5;
                }
                if libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) != -1 {
                    return 3;
                }
                let mut pair = [0; 2];
                if libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) != 0 {
                    return 6;
                }
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) != -1 || errno() != libc::EPERM {
                    return 4;
                }
                0
            },
        );
        assert_eq!(code, 0);
    }

    #[test]
    fn a_namespaced_network_keeps_ip_but_not_vsock() {
        let opts = Options {
            sockets: Sockets::Namespaced,
            deny_ptrace: false,
            deny_owner_changes: false,
            notify_ip: false,
        };
        let code = in_child(opts, || unsafe {
            let ip = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            let unix = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let vsock = libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0);
            let packet = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            let mptcp = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 262);
            i32::from(!(ip >= 0 && unix == -1 && vsock == -1 && packet == -1 && mptcp == -1))
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn no_set_id_files_and_ports_mode_refuses_mptcp() {
        let opts = Options {
            sockets: Sockets::Ports,
            deny_ptrace: false,
            deny_owner_changes: false,
            notify_ip: false,
        };
        let dir = tempfile::tempdir().unwrap();
        let name = |n: &str| {
            std::ffi::CString::new(dir.path().join(n).as_os_str().as_encoded_bytes()).unwrap()
        };
        let (f, g) = (name("f"), name("g"));
        let code = in_child(opts, || unsafe {
            let create = libc::O_CREAT | libc::O_WRONLY;
            let fd = libc::openat(libc::AT_FDCWD, f.as_ptr(), create, 0o644);
            if fd < 0 {
                return 1;
            }
            if libc::fchmod(fd, 0o4755) != -1
                || libc::fchmodat(libc::AT_FDCWD, f.as_ptr(), 0o2755, 0) != -1
            {
                return 2;
            }
            if libc::fchmod(fd, 0o755) != 0 {
                return 3;
            }
            if libc::openat(libc::AT_FDCWD, g.as_ptr(), create, 0o4755) != -1 {
                return 4;
            }
            if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 262) != -1 {
                return 5;
            }
            if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) < 0
                || libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) < 0
            {
                return 6;
            }
            0
        });
        assert_eq!(code, 0);
    }
}
