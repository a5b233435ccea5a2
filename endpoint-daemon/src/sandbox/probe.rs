//! What this kernel lets byomd build, found by trying each layer in a
//! child process of the helper (`byomd __byomd_sandbox_probe`): a layer is
//! reported only once it was made to work here, never assumed.

use std::io::{Read, Write};
use std::path::Path;

use super::linux::{check, err, loopback_up, mount, namespaces, pipe};
use super::mount::make_readonly;
use super::plan::Spec;
use super::seccomp;
use super::Support;

/// Finds what this kernel allows, by trying each layer in a child process
/// (so nothing here changes). Run as `byomd __byomd_sandbox_probe`: it
/// prints the [`Support`] as JSON.
pub fn probe_main() -> ! {
    let s = probe();
    println!("{}", serde_json::to_string(&s).unwrap_or_default());
    std::process::exit(0)
}

fn probe() -> Support {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut s = Support {
        root,
        landlock_abi: landlock_abi(),
        ..Default::default()
    };
    let try_step = |f: fn() -> Result<(), String>| -> Result<(), String> { in_child(f) };
    // Root needs no user namespace to make the others, and keeps its
    // capabilities out of the command's reach by the bounding set instead
    // (a user namespace would leave root unable to map the users
    // `[run] user` needs).
    if !root {
        match try_step(|| namespaces_probe(true)) {
            Ok(()) => s.user_ns = true,
            Err(e) => s.errors.push(format!("user namespaces: {e}")),
        }
    }
    if s.user_ns || root {
        let step = if s.user_ns {
            (|| mount_probe(true)) as fn() -> Result<(), String>
        } else {
            || mount_probe(false)
        };
        match try_step(step) {
            Ok(()) => {
                s.mount_ns = true;
                s.pid_ns = true;
            }
            Err(e) => s.errors.push(format!("mount and PID namespaces: {e}")),
        }
        let step = if s.user_ns {
            (|| net_probe(true)) as fn() -> Result<(), String>
        } else {
            || net_probe(false)
        };
        match try_step(step) {
            Ok(()) => s.net_ns = true,
            Err(e) => s.errors.push(format!("network namespaces: {e}")),
        }
    }
    if seccomp::SUPPORTED {
        match try_step(|| {
            // SAFETY: prctl in the probe's child.
            check(
                unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) },
                || "no_new_privs".into(),
            )?;
            seccomp::install(&seccomp::program(seccomp::Options::default()))
                .map_err(|e| format!("seccomp: {e}"))
        }) {
            Ok(()) => s.seccomp = true,
            Err(e) => s.errors.push(e),
        }
    } else {
        s.errors
            .push("seccomp: no filter for this architecture".into());
    }
    s
}

fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: the version query takes no ruleset.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).unwrap_or(0)
}

fn namespaces_probe(user: bool) -> Result<(), String> {
    namespaces(&Spec {
        user_ns: user,
        ..Default::default()
    })
}

fn mount_probe(user: bool) -> Result<(), String> {
    namespaces(&Spec {
        user_ns: user,
        mount_ns: true,
        pid_ns: true,
        ..Default::default()
    })?;
    let tmpfs = c"tmpfs";
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    mount(
        Some(tmpfs),
        Path::new("/tmp"),
        Some(tmpfs),
        0,
        Some(c"size=4k"),
    )?;
    make_readonly(Path::new("/tmp"), false)?;
    // PID 1 of the new namespace mounts its /proc.
    in_child(|| {
        let p = c"proc";
        mount(
            Some(p),
            Path::new("/proc"),
            Some(p),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        )
    })
}

fn net_probe(user: bool) -> Result<(), String> {
    namespaces(&Spec {
        user_ns: user,
        net_ns: true,
        ..Default::default()
    })?;
    loopback_up()
}

/// Runs `f` in a forked child; its error comes back through a pipe.
fn in_child(f: fn() -> Result<(), String>) -> Result<(), String> {
    let (r, w) = pipe()?;
    // SAFETY: the probe is single-threaded; the child runs `f` and exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(err("fork"));
    }
    if pid == 0 {
        drop(r);
        let msg = match f() {
            Ok(()) => String::new(),
            Err(e) => e,
        };
        let mut w = std::fs::File::from(w);
        let _ = w.write_all(msg.as_bytes());
        // SAFETY: the child ends here.
        unsafe { libc::_exit(if msg.is_empty() { 0 } else { 1 }) };
    }
    drop(w);
    let mut msg = String::new();
    let _ = std::fs::File::from(r).read_to_string(&mut msg);
    let mut st = 0;
    // SAFETY: reaping our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 {
        Ok(())
    } else if msg.is_empty() {
        Err(format!("the probe died (status {st})"))
    } else {
        Err(msg)
    }
}
