//! The sandbox helper on Linux. byomd re-executes itself
//! (`/proc/self/exe __byomd_sandbox`) for every command, with the
//! [`Spec`] on descriptor 3 (a memfd: never in argv or the environment)
//! and a report pipe on descriptor 4. The helper is single-threaded, so it
//! may make namespaces and allocate freely. In order:
//!
//! 1. new user, mount, PID, IPC (and, when the network is denied, network)
//!    namespaces; uid/gid maps (the caller's own ids, or the whole range
//!    when byomd is root so `[run] user` still works);
//! 2. mounts, all private to the command: the way to protected paths
//!    pinned as mount points (the kernel refuses to rename or remove them),
//!    read-only binds, empty read-only tmpfs over hidden paths, a minimal
//!    `/dev` (no disks, a devpts of its own), the private temp dir;
//! 3. fork: the child is PID 1 of the new PID namespace (`init` below). It
//!    mounts a `/proc` that shows only the command's processes and forks
//!    the command;
//! 4. in the command's process: its own process group, the user it runs
//!    as, its directory, capabilities it never needs dropped from the
//!    bounding set, `no_new_privs`, Landlock (files, TCP ports, signals
//!    and abstract sockets scoped), seccomp; then exec.
//!
//! When the command's main process ends, init exits and the kernel kills
//! everything left in the namespace: a double fork (`setsid -f`) cannot
//! outlive the command, its timeout or its cancel. Signals byomd sends
//! the helper are passed to init, and by init to the command's process
//! group. The helper ends as the command did (the same code, or the same
//! signal). Any step that fails stops the command before it runs, with
//! the reason on the report pipe: a sandbox is never silently weaker than
//! planned.

use std::ffi::{CStr, CString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Instant;

use super::plan::Spec;
use super::Report;
use super::{netwatch, seccomp};

/// argv\[1\] of the helper run for a command.
pub const HELPER_ARG: &str = "__byomd_sandbox";
/// argv\[1\] of the helper run to find what the kernel allows.
pub const PROBE_ARG: &str = "__byomd_sandbox_probe";
/// Where the helper finds its spec.
pub const SPEC_FD: RawFd = 3;
/// Where the helper reports (one JSON line; end of file once the command
/// was exec'd).
pub const REPORT_FD: RawFd = 4;
/// The read end of a pipe whose write end only byomd holds: its end of
/// file means byomd is gone, and the command is ended with it.
pub const ALIVE_FD: RawFd = 5;
/// Where the helper tells byomd whether the command used the network
/// (see [`super::netwatch`]).
pub const USAGE_FD: RawFd = 6;
/// Highest descriptor closed one by one where close_range is missing.
const MAX_INHERITED_FD: RawFd = 4096;
/// The exit code of a helper that could not set the sandbox up.
pub const SETUP_FAILED: i32 = 125;
/// Largest spec the helper reads.
pub const MAX_SPEC_BYTES: usize = 64 << 20;

/// Device nodes a command gets in its `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// The empty file bound over hidden files.
const HIDDEN_FILE: &str = "/dev/.byomd-hidden";
/// A command's own /dev/shm: bounded, since tmpfs memory counts against
/// no process and would otherwise grow to half the machine's memory.
const DEV_SHM_OPTIONS: &CStr = c"mode=1777,size=256m";

/// Capabilities a command keeps in its bounding set (chown, dac_override,
/// kill, setgid, setuid, ipc_lock, sys_nice, audit_write: what a root
/// command ordinarily uses on its own files); everything else is dropped:
/// mounts, modules, raw I/O, ptrace, device nodes, file capabilities, raw
/// sockets (which would sniff the machine's loopback), privileged ports,
/// set-id bits on others' files, the audit and MAC knobs. This is what
/// binds a command byomd runs as root, which gets no user namespace.
const KEEP_CAPS: &[u32] = &[0, 1, 5, 6, 7, 14, 23, 29];

/// Signals passed on to the command.
const FORWARDED: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGWINCH,
];

pub(super) fn err(what: impl std::fmt::Display) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} has a NUL byte", p.display()))
}

pub(super) fn check(rc: libc::c_int, what: impl FnOnce() -> String) -> Result<(), String> {
    if rc < 0 {
        Err(err(what()))
    } else {
        Ok(())
    }
}

fn write_file(path: &str, data: &str) -> Result<(), String> {
    std::fs::write(path, data).map_err(|e| format!("cannot write {path}: {e}"))
}

fn report(r: &Report) {
    if let Ok(mut line) = serde_json::to_vec(r) {
        line.push(b'\n');
        // SAFETY: REPORT_FD is ours (or closed, and the write fails).
        unsafe {
            libc::write(REPORT_FD, line.as_ptr().cast(), line.len());
        }
    }
}

/// The helper's `main`: never returns.
pub fn helper_main() -> ! {
    let t0 = Instant::now();
    // SAFETY: an fcntl on our own descriptor.
    unsafe {
        libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(ALIVE_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(USAGE_FD, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    // Only what byomd meant to hand over: descriptors it inherited from
    // whatever started it (a socket, say) stop here.
    // SAFETY: closing descriptors above ours.
    unsafe {
        if libc::syscall(libc::SYS_close_range, (USAGE_FD + 1) as u32, u32::MAX, 0) < 0 {
            for fd in (USAGE_FD + 1)..MAX_INHERITED_FD {
                libc::close(fd);
            }
        }
    }
    let spec = match read_spec() {
        Ok(s) => s,
        Err(e) => fail(e),
    };
    match run(spec, t0) {
        Ok(never) => match never {},
        Err(e) => fail(e),
    }
}

fn fail(e: String) -> ! {
    report(&Report {
        ok: false,
        error: format!("the sandbox could not be set up: {e}"),
        ..Default::default()
    });
    // SAFETY: _exit ends this process.
    unsafe { libc::_exit(SETUP_FAILED) }
}

fn read_spec() -> Result<Spec, String> {
    // SAFETY: SPEC_FD was placed by byomd; we take it over and close it.
    let mut f = unsafe { std::fs::File::from_raw_fd(SPEC_FD) };
    let mut buf = Vec::new();
    (&mut f)
        .take(MAX_SPEC_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read the spec: {e}"))?;
    if buf.len() > MAX_SPEC_BYTES {
        return Err(format!("spec over {MAX_SPEC_BYTES} bytes"));
    }
    let spec = serde_json::from_slice(&buf).map_err(|e| format!("bad spec: {e}"));
    buf.fill(0);
    spec
}

enum Never {}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for s in FORWARDED {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

fn run(mut spec: Spec, t0: Instant) -> Result<Never, String> {
    let set = signal_set();
    // SAFETY: blocking signals for this thread; the old mask goes back in
    // the command before exec.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    check(
        unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old) },
        || "sigprocmask".into(),
    )?;
    namespaces(&spec)?;
    // Nothing in the sandbox may read this process's memory (it holds the
    // command line, secrets included): not dumpable from here on, which
    // also makes its /proc files root's. Not before: a process writes its
    // own uid_map through them.
    // SAFETY: prctl on our own process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if spec.mount_ns {
        mounts(&spec)?;
    }
    if spec.net_ns {
        loopback_up()?;
    }
    let (status_r, status_w) = pipe()?;
    let (alive_r, alive_w) = pipe()?;
    // The way the command's process hands over its filter's listener.
    let (watch, watch_cmd) = if spec.observe_net {
        let (a, b) = netwatch::socket_pair().map_err(|e| format!("socketpair: {e}"))?;
        (Some(a), Some(b))
    } else {
        (None, None)
    };
    // SAFETY: single-threaded; the child only continues this code.
    let init = unsafe { libc::fork() };
    if init < 0 {
        return Err(err("fork"));
    }
    if init == 0 {
        drop(status_r);
        drop(alive_w);
        drop(watch);
        init_main(&mut spec, t0, &old, status_w, alive_r, watch_cmd);
    }
    drop(status_w);
    drop(alive_r);
    drop(watch_cmd);
    // SAFETY: the command holds its own copy until it execs.
    unsafe { libc::close(REPORT_FD) };
    wipe(&mut spec);
    helper_wait(init, status_r, &set, alive_w, watch)
}

/// Overwrites the command line and environment before they are freed: a
/// secret must not linger in memory that outlives its need.
fn wipe(spec: &mut Spec) {
    for s in spec.argv.iter_mut().chain(spec.env.iter_mut()) {
        // SAFETY: zero bytes are valid UTF-8.
        unsafe { s.as_mut_vec().fill(0) };
    }
}

pub(super) fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    super::pipe().map_err(|e| format!("pipe: {e}"))
}

pub(super) fn namespaces(spec: &Spec) -> Result<(), String> {
    // SAFETY: id getters have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut flags = 0;
    if spec.user_ns {
        flags |= libc::CLONE_NEWUSER;
    }
    if spec.mount_ns {
        flags |= libc::CLONE_NEWNS | libc::CLONE_NEWIPC;
    }
    if spec.pid_ns {
        flags |= libc::CLONE_NEWPID;
    }
    if spec.net_ns {
        flags |= libc::CLONE_NEWNET;
    }
    if flags == 0 {
        return Ok(());
    }
    // SAFETY: unshare on a single-threaded process.
    check(unsafe { libc::unshare(flags) }, || "unshare".into())?;
    if spec.user_ns {
        // Our own ids only: a process in a new user namespace may map
        // just those itself.
        write_file("/proc/self/setgroups", "deny")?;
        write_file("/proc/self/uid_map", &format!("{uid} {uid} 1\n"))?;
        write_file("/proc/self/gid_map", &format!("{gid} {gid} 1\n"))?;
    }
    Ok(())
}

pub(super) fn mount(
    src: Option<&CStr>,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> Result<(), String> {
    let t = cstr(target)?;
    let p = |c: Option<&CStr>| c.map(CStr::as_ptr).unwrap_or(std::ptr::null());
    // SAFETY: all pointers are NUL-terminated strings alive for the call.
    let rc = unsafe { libc::mount(p(src), t.as_ptr(), p(fstype), flags, p(data).cast()) };
    check(rc, || format!("mount {}", target.display()))
}

fn mounts(spec: &Spec) -> Result<(), String> {
    use super::mount::{self as m, make_readonly, open_exact, open_path};
    // Nothing done here may reach the rest of the machine.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    // Every planned path is opened once, with no symlink on the way, and
    // used by descriptor from then on (see mount.rs).
    //
    // Everything read-only, then the write roots writable again: what
    // Landlock does not judge (chmod, chown, times, extended attributes)
    // cannot change a file outside them either.
    let rw: Vec<(&std::path::PathBuf, OwnedFd)> = spec
        .rw
        .iter()
        .map(|p| Ok((p, open_exact(p, 0)?)))
        .collect::<Result<_, String>>()?;
    make_readonly(Path::new("/"), true)?;
    for (p, fd) in &rw {
        m::bind(fd, fd, false, p)?;
    }
    drop(rw);
    for p in &spec.pin {
        let fd = open_exact(p, 0)?;
        m::bind(&fd, &fd, false, p)?;
    }
    for p in &spec.read_only {
        let fd = open_exact(p, 0)?;
        m::bind(&fd, &fd, true, p)?;
    }
    // What the private temp dir and /dev are made of, taken before they
    // are covered.
    let tmp = match &spec.tmp {
        Some(t) => {
            let rel = t
                .own
                .strip_prefix(&t.cover)
                .map_err(|_| format!("{} is not in {}", t.own.display(), t.cover.display()))?;
            Some((
                t,
                rel.to_path_buf(),
                open_exact(&t.own, libc::O_DIRECTORY)?,
                open_exact(&t.cover, libc::O_DIRECTORY)?,
            ))
        }
        None => None,
    };
    let devices: Vec<(&str, OwnedFd)> = DEVICES
        .iter()
        .filter_map(|d| Some((*d, open_path(&Path::new("/dev").join(d), 0).ok()?)))
        .collect();
    let dev = Path::new("/dev");
    let tmpfs = c"tmpfs";
    mount(
        Some(tmpfs),
        dev,
        Some(tmpfs),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"mode=0755,size=64k"),
    )?;
    for (name, fd) in &devices {
        let target = dev.join(name);
        std::fs::File::create(&target).map_err(|e| format!("{}: {e}", target.display()))?;
        m::bind(fd, &open_path(&target, 0)?, false, &target)?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link)).map_err(|e| format!("/dev/{link}: {e}"))?;
    }
    for d in ["pts", "shm"] {
        std::fs::create_dir(dev.join(d)).map_err(|e| format!("/dev/{d}: {e}"))?;
    }
    // A terminal namespace of its own: the ptys of the machine's own
    // terminals are not there to be read or written.
    let _ = mount(
        Some(c"devpts"),
        &dev.join("pts"),
        Some(c"devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=0620"),
    );
    mount(
        Some(tmpfs),
        &dev.join("shm"),
        Some(tmpfs),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(DEV_SHM_OPTIONS),
    )?;
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o000)
            .open(HIDDEN_FILE)
            .map_err(|e| format!("{HIDDEN_FILE}: {e}"))?;
    }
    let hidden_file = open_path(Path::new(HIDDEN_FILE), 0)?;
    make_readonly(dev, false)?;
    for p in &spec.hide {
        let fd = open_exact(p, 0)?;
        if is_dir(&fd) {
            m::cover(&fd, p)?;
        } else {
            m::bind(&hidden_file, &fd, true, p)?;
        }
    }
    if let Some((t, rel, own, cover)) = tmp {
        m::private_tmp(&cover, &own, &rel, &t.cover)?;
    }
    Ok(())
}

fn is_dir(fd: &OwnedFd) -> bool {
    // SAFETY: fstat on our descriptor into a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd.as_raw_fd(), &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR
    }
}

pub(super) fn loopback_up() -> Result<(), String> {
    // SAFETY: a socket for one ioctl on the interface named "lo".
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(err("socket for lo"));
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        let rc = libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr);
        libc::close(s);
        check(rc, || "bring lo up".into())
    }
}

/// The helper after the fork: passes signals to init and ends as the
/// command did.
fn helper_wait(
    init: libc::pid_t,
    status_r: OwnedFd,
    set: &libc::sigset_t,
    _alive: OwnedFd,
    watch: Option<OwnedFd>,
) -> Result<Never, String> {
    let mut status_r = Some(status_r);
    let mut watch = netwatch::Watch::new(watch, USAGE_FD);
    // SAFETY: a signalfd for the signals this thread blocked.
    let sigfd = unsafe { libc::signalfd(-1, set, libc::SFD_CLOEXEC) };
    if sigfd < 0 {
        return Err(err("signalfd"));
    }
    // SAFETY: fcntl on a descriptor number: fails if it is not open.
    let watch_byomd = unsafe { libc::fcntl(ALIVE_FD, libc::F_GETFD) } >= 0;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sigfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative fd is ignored by poll.
                fd: if watch_byomd { ALIVE_FD } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            watch.pollfd(0),
            watch.pollfd(1),
        ];
        // SAFETY: polling our own descriptors.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) } < 0 {
            continue;
        }
        if fds[1].revents != 0 {
            // byomd is gone (its end of the pipe closed): nothing would
            // ever time this command out or cancel it. End it.
            // SAFETY: killing our own child, whose death ends the
            // namespace; then we follow.
            unsafe {
                libc::kill(init, libc::SIGKILL);
                libc::_exit(SETUP_FAILED);
            }
        }
        watch.ready(fds[2].revents, fds[3].revents);
        if fds[0].revents == 0 {
            continue;
        }
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        // SAFETY: reading one siginfo record into a struct of its size.
        let n = unsafe {
            libc::read(
                sigfd,
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                std::mem::size_of::<libc::signalfd_siginfo>(),
            )
        };
        if n != std::mem::size_of::<libc::signalfd_siginfo>() as isize {
            continue;
        }
        let sig = info.ssi_signo as i32;
        if sig != libc::SIGCHLD {
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(init, sig) };
            continue;
        }
        let mut st = 0;
        // SAFETY: reaping our own child.
        let r = unsafe { libc::waitpid(init, &mut st, libc::WNOHANG) };
        if r != init {
            continue;
        }
        // A command that ended before its listener was read: still
        // watched, it made no IP socket unanswered (one would have kept it
        // waiting for us).
        watch.take_listener();
        let mut buf = [0u8; 4];
        let read = status_r
            .take()
            .map(|fd| std::fs::File::from(fd).read_exact(&mut buf));
        let status = match read {
            Some(Ok(())) => i32::from_ne_bytes(buf),
            // init died before the command ended (killed): that is how
            // the command ended too.
            _ => st,
        };
        end_as(status);
    }
}

/// Exits with the command's status: its code, or dies of its signal.
fn end_as(status: i32) -> ! {
    // SAFETY: ending this process, with the disposition of one signal
    // reset so it takes effect; no core file (it would be the helper's).
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(sig, libc::SIG_DFL);
            let mut one: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut one);
            libc::sigaddset(&mut one, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

/// PID 1 of the command's namespace.
fn init_main(
    spec: &mut Spec,
    t0: Instant,
    old: &libc::sigset_t,
    status_w: OwnedFd,
    alive_r: OwnedFd,
    watch: Option<OwnedFd>,
) -> ! {
    // SAFETY: process setup in a single-threaded child.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // The helper may have died before the line above: then nobody
        // would ever kill this namespace.
        let mut p = libc::pollfd {
            fd: alive_r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut p, 1, 0) > 0 {
            libc::_exit(SETUP_FAILED);
        }
    }
    if spec.pid_ns && spec.mount_ns {
        let proc_ = c"proc";
        if let Err(e) = mount(
            Some(proc_),
            Path::new("/proc"),
            Some(proc_),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        ) {
            fail(e);
        }
    }
    // SAFETY: single-threaded; the child execs or exits.
    let cmd = unsafe { libc::fork() };
    if cmd < 0 {
        fail(err("fork"));
    }
    if cmd == 0 {
        drop(status_w);
        drop(alive_r);
        match command(&*spec, t0, old, watch) {
            Ok(never) => match never {},
            Err(e) => fail(e),
        }
    }
    drop(watch);
    // SAFETY: closing our copy of the report pipe.
    unsafe { libc::close(REPORT_FD) };
    wipe(spec);
    let set = signal_set();
    let mut status_w = Some(status_w);
    loop {
        // SAFETY: waiting for signals this thread blocked.
        let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if sig < 0 {
            continue;
        }
        if sig != libc::SIGCHLD {
            // SAFETY: signalling the command's group (or, gone, itself).
            unsafe {
                if libc::kill(-cmd, sig) < 0 {
                    libc::kill(cmd, sig);
                }
            }
            continue;
        }
        loop {
            let mut st = 0;
            // SAFETY: reaping children (orphans are ours in the namespace).
            let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if r <= 0 {
                break;
            }
            if r == cmd {
                if let Some(fd) = status_w.take() {
                    let _ = std::fs::File::from(fd).write_all(&st.to_ne_bytes());
                }
                // SAFETY: init's end takes the namespace down with it.
                unsafe { libc::_exit(0) };
            }
        }
    }
}

/// Leaves the command only [`KEEP_CAPS`]: dropped from the bounding set
/// (which is what root gets at exec), and no inheritable or ambient
/// capabilities (which root would get on top). As root a drop that fails
/// stops the command: it would run with more than planned. Otherwise
/// (no capabilities to begin with) there is nothing to drop.
fn drop_capabilities() -> Result<(), String> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    // SAFETY: geteuid and prctl/capget/capset on this process only, with
    // structs of the kernel's layout.
    unsafe {
        let root = libc::geteuid() == 0;
        for cap in 0..64u32 {
            if KEEP_CAPS.contains(&cap) {
                continue;
            }
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) < 0 {
                match std::io::Error::last_os_error().raw_os_error() {
                    // Past the last capability this kernel knows.
                    Some(libc::EINVAL) => break,
                    _ if root => return Err(err(format!("drop capability {cap}"))),
                    _ => {}
                }
            }
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        let mut h = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut d = [Data::default(); 2];
        if libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()) == 0
            && (d[0].inheritable != 0 || d[1].inheritable != 0)
        {
            d[0].inheritable = 0;
            d[1].inheritable = 0;
            if libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr()) < 0 {
                return Err(err("clear inheritable capabilities"));
            }
        }
    }
    Ok(())
}

/// The command's own process, from the fork to exec.
fn command(
    spec: &Spec,
    t0: Instant,
    old: &libc::sigset_t,
    watch: Option<OwnedFd>,
) -> Result<Never, String> {
    // SAFETY: process attribute changes in a single-threaded child.
    unsafe {
        if spec.tty {
            // Its terminal's session leader, so ^C and ^Z on it reach
            // its foreground job.
            check(libc::setsid(), || "setsid".into())?;
            check(libc::ioctl(0, libc::TIOCSCTTY as _, 0), || {
                "make the terminal its controlling one".into()
            })?;
        } else {
            libc::setpgid(0, 0);
        }
        if let Some((uid, gid)) = spec.user {
            check(libc::setgroups(0, std::ptr::null()), || "setgroups".into())?;
            check(libc::setgid(gid), || format!("setgid {gid}"))?;
            check(libc::setuid(uid), || format!("setuid {uid}"))?;
        }
    }
    // By descriptor, with no symlink on the way: what was planned.
    let cwd = super::mount::open_exact(&spec.cwd, libc::O_DIRECTORY)
        .map_err(|e| format!("working directory {e}"))?;
    // SAFETY: fchdir to our descriptor.
    check(unsafe { libc::fchdir(cwd.as_raw_fd()) }, || {
        format!("working directory {}", spec.cwd.display())
    })?;
    drop(cwd);
    // No core files: the machine's core handler (apport, systemd-coredump)
    // runs outside the sandbox.
    // SAFETY: setrlimit on this process.
    unsafe {
        // 1, not 0: the kernel skips piped core handlers only then.
        let none = libc::rlimit {
            rlim_cur: 1,
            rlim_max: 1,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
    }
    // SAFETY: prctl calls on this process only.
    unsafe {
        drop_capabilities()?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), || {
            "no_new_privs".into()
        })?;
    }
    if spec.landlock {
        landlock(spec)?;
    }
    if spec.seccomp {
        let opts = seccomp::Options {
            sockets: if spec.deny_sockets {
                seccomp::Sockets::Local
            } else if spec.net_ns {
                seccomp::Sockets::Namespaced
            } else if !spec.ports.is_empty() {
                seccomp::Sockets::Ports
            } else {
                seccomp::Sockets::Any
            },
            deny_ptrace: !spec.pid_ns,
            deny_owner_changes: !spec.mount_ns,
            notify_ip: false,
        };
        let watched = watch.as_ref().and_then(|w| {
            let prog = seccomp::program(seccomp::Options {
                notify_ip: true,
                ..opts
            });
            let l = seccomp::install_listener(&prog).ok()?;
            // Handed over or not, the filter is in place: a listener
            // nobody holds makes every IP socket fail (ENOSYS), closed.
            let _ = netwatch::send_fd(w.as_raw_fd(), l.as_raw_fd());
            Some(())
        });
        if watched.is_none() {
            // No watch here (a kernel without user notifications, or a
            // listener already above us): byomd hears nothing and counts
            // the network as used.
            seccomp::install(&seccomp::program(opts)).map_err(|e| format!("seccomp: {e}"))?;
        }
    }
    drop(watch);
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| "an argument has a NUL byte".to_string())?;
    let env: Vec<CString> = spec
        .env
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| "an environment variable has a NUL byte".to_string())?;
    let Some(program) = spec.argv.first() else {
        return Err("empty command".into());
    };
    let candidates = candidates(program, &spec.env);
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    env_p.push(std::ptr::null());
    // SAFETY: signal state for the new program: byomd's mask back, every
    // disposition default (Rust ignores SIGPIPE in its processes).
    unsafe {
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        libc::sigprocmask(libc::SIG_SETMASK, old, std::ptr::null_mut());
    }
    report(&Report {
        ok: true,
        setup_us: t0.elapsed().as_micros() as u64,
        ..Default::default()
    });
    // execvp's search, with the command's own PATH (glibc's reads the
    // caller's environment, which here is empty).
    let mut first_err = 0;
    for c in &candidates {
        // SAFETY: argv and envp are NULL-terminated arrays of C strings.
        unsafe { libc::execve(c.as_ptr(), argv_p.as_ptr(), env_p.as_ptr()) };
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if first_err == 0 || (first_err == libc::ENOENT && e != libc::ENOENT && e != libc::ENOTDIR)
        {
            first_err = e;
        }
    }
    let e = std::io::Error::from_raw_os_error(first_err);
    report(&Report {
        ok: false,
        exec_errno: first_err,
        error: format!("cannot start {program:?}: {e}"),
        ..Default::default()
    });
    // SAFETY: ending the child that failed to exec.
    unsafe { libc::_exit(if first_err == libc::ENOENT { 127 } else { 126 }) }
}

/// The files `program` may be, in PATH order.
fn candidates(program: &str, env: &[String]) -> Vec<CString> {
    if program.contains('/') {
        return CString::new(program).into_iter().collect();
    }
    let path = env
        .iter()
        .find_map(|kv| kv.strip_prefix("PATH="))
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .map(|d| if d.is_empty() { "." } else { d })
        .filter_map(|d| CString::new(format!("{d}/{program}")).ok())
        .collect()
}

/// Landlock rules for planned paths, each opened once with no symlink on
/// the way (see mount.rs); a file gets only the rights a file can have.
fn beneath(
    paths: &[std::path::PathBuf],
    access: enumflags2::BitFlags<landlock::AccessFs>,
    abi: landlock::ABI,
) -> Result<Vec<landlock::PathBeneath<OwnedFd>>, String> {
    use landlock::AccessFs;
    let mut out = Vec::new();
    for p in paths {
        // Gone since the plan (a carve enumerates directories commands
        // change): nothing there to grant. Anything else stops the
        // command.
        let fd = match super::mount::open_exact_io(p, 0) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(format!(
                    "{} (it must be reached without symlinks, as it was planned): {e}",
                    p.display()
                ))
            }
        };
        let rights = if is_dir(&fd) {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        out.push(landlock::PathBeneath::new(fd, rights));
    }
    Ok(out)
}

fn landlock(spec: &Spec) -> Result<(), String> {
    use landlock::{
        path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset,
        RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
    };
    let abi = ABI::V6;
    let e = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(e)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(e)?;
    if !spec.ports.is_empty() {
        // Connections to the listed ports only, and no TCP server at all.
        rs = rs
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessNet::ConnectTcp | AccessNet::BindTcp)
            .map_err(e)?
            .set_compatibility(CompatLevel::BestEffort);
    }
    let mut created = rs
        .create()
        .map_err(e)?
        .add_rules(
            beneath(&spec.read, AccessFs::from_read(abi), abi)?
                .into_iter()
                .map(Ok::<_, landlock::RulesetError>),
        )
        .map_err(e)?
        .add_rules(
            beneath(&spec.list, AccessFs::ReadDir.into(), abi)?
                .into_iter()
                .map(Ok::<_, landlock::RulesetError>),
        )
        .map_err(e)?
        .add_rules(
            beneath(&spec.write, AccessFs::from_all(abi), abi)?
                .into_iter()
                .map(Ok::<_, landlock::RulesetError>),
        )
        .map_err(e)?;
    let devices: Vec<std::path::PathBuf> = if spec.mount_ns {
        // The command's own /dev (no disks, its own ptys).
        vec!["/dev".into()]
    } else {
        DEVICES
            .iter()
            .map(|d| Path::new("/dev").join(d))
            .chain(std::iter::once("/dev/shm".into()))
            .collect()
    };
    created = created
        .add_rules(path_beneath_rules(&devices, AccessFs::from_all(abi)))
        .map_err(e)?;
    for p in &spec.ports {
        created = created
            .add_rule(NetPort::new(*p, AccessNet::ConnectTcp))
            .map_err(e)?;
    }
    let status = created.restrict_self().map_err(e)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("landlock is not enforced by this kernel".into());
    }
    Ok(())
}
