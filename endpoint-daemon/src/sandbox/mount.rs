//! Mounts by descriptor, never by path twice. byomd plans with canonical
//! paths; a command already running (or racing with another) may swap a
//! component of one for a symlink between the plan and the helper's
//! mount, and a mount or Landlock rule taken by path would then land on
//! the symlink's target. So every planned path is opened once, with no
//! symlink allowed anywhere on the way (`openat2` `RESOLVE_NO_SYMLINKS`,
//! which is right because the plan's paths are canonical), and everything
//! after (mounts, Landlock rules, the working directory) uses that
//! descriptor. A bind mount is cloned, made read-only while detached and
//! only then attached, so there is no moment it is writable and no second
//! lookup of where it went.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

fn err(what: impl std::fmt::Display) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} has a NUL byte"))
}

fn owned(fd: libc::c_long, what: impl FnOnce() -> String) -> Result<OwnedFd, String> {
    if fd < 0 {
        return Err(err(what()));
    }
    // SAFETY: a new descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Opens a planned path as `O_PATH`, refusing any symlink (or magic
/// link) on the way: a symlink in a canonical path means it was swapped
/// since byomd planned.
pub fn open_exact(p: &Path, flags: libc::c_int) -> Result<OwnedFd, String> {
    open_exact_io(p, flags).map_err(|e| {
        format!(
            "{} (it must be reached without symlinks, as it was planned): {e}",
            p.display()
        )
    })
}

/// [`open_exact`], with the error as the kernel gave it.
pub fn open_exact_io(p: &Path, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    let c = CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC | flags) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `how` is a valid open_how of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

const AT_EMPTY_PATH: libc::c_int = 0x1000;
const AT_RECURSIVE: libc::c_int = 0x8000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;

/// Sets mount attributes on the mount `fd` is the root of.
fn set_attr(fd: &OwnedFd, attr: u64, recursive: bool) -> Result<(), String> {
    change_attr(fd, attr, 0, recursive)
}

fn change_attr(fd: &OwnedFd, set: u64, clear: u64, recursive: bool) -> Result<(), String> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let a = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = AT_EMPTY_PATH | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: a valid mount_attr of the size given, on our descriptor.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &a as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(err("mount_setattr"));
    }
    Ok(())
}

/// Attaches the detached mount `mnt` on what `target` is.
fn attach(mnt: &OwnedFd, target: &OwnedFd, what: &Path) -> Result<(), String> {
    // SAFETY: both descriptors are ours; empty paths mean "this fd".
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(err(format!("mount on {}", what.display())));
    }
    Ok(())
}

/// Binds what `src` is (with what is mounted below it) onto what
/// `target` is, read-only before it is attached if asked.
pub fn bind(src: &OwnedFd, target: &OwnedFd, readonly: bool, what: &Path) -> Result<(), String> {
    // SAFETY: cloning the tree at our descriptor into a detached mount.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            src.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE
                | libc::O_CLOEXEC as libc::c_uint
                | (AT_EMPTY_PATH | AT_RECURSIVE) as libc::c_uint,
        )
    };
    let tree = owned(tree, || format!("clone the mount at {}", what.display()))?;
    if readonly {
        set_attr(&tree, MOUNT_ATTR_RDONLY, true)?;
    } else {
        // Writable again where the sandbox made everything read-only. A
        // mount that was read-only before the sandbox (locked so in a user
        // namespace) stays so: that refusal only takes rights away.
        let _ = change_attr(&tree, 0, MOUNT_ATTR_RDONLY, false);
    }
    attach(&tree, target, what)
}

/// A new tmpfs, detached, with `options` (`mode`, `size`); its root fd.
pub fn tmpfs(options: &[(&str, &str)], readonly: bool) -> Result<OwnedFd, String> {
    // SAFETY: fsopen/fsconfig/fsmount with NUL-terminated strings we own.
    unsafe {
        let fs = owned(
            libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC),
            || "fsopen tmpfs".into(),
        )?;
        for (k, v) in options {
            let (k, v) = (cstr(k)?, cstr(v)?);
            if libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            ) < 0
            {
                return Err(err(format!("tmpfs option {k:?}")));
            }
        }
        if libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        ) < 0
        {
            return Err(err("create tmpfs"));
        }
        let mut attr = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
        if readonly {
            attr |= MOUNT_ATTR_RDONLY;
        }
        owned(
            libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attr),
            || "fsmount tmpfs".into(),
        )
    }
}

/// Covers what `target` is with an empty, read-only tmpfs (mode 000).
pub fn cover(target: &OwnedFd, what: &Path) -> Result<(), String> {
    let m = tmpfs(&[("mode", "000"), ("size", "4k")], true)?;
    attach(&m, target, what)
}

/// The private temp dir: a tmpfs over `cover` (hiding every other
/// command's and every other daemon's), holding the directories of `rel`
/// down to the one onto which `own` is bound.
pub fn private_tmp(
    cover_fd: &OwnedFd,
    own: &OwnedFd,
    rel: &Path,
    what: &Path,
) -> Result<(), String> {
    let m = tmpfs(&[("mode", "0755"), ("size", "64k")], false)?;
    let names: Vec<CString> = rel
        .components()
        .map(|c| match c {
            std::path::Component::Normal(n) => CString::new(n.as_encoded_bytes())
                .map_err(|_| format!("{} has a NUL byte", rel.display())),
            _ => Err(format!("{} is not a plain relative path", rel.display())),
        })
        .collect::<Result<_, _>>()?;
    if names.is_empty() {
        return Err("the temp dir is its own cover".into());
    }
    // SAFETY: mkdirat/openat relative to descriptors of our own mount.
    let target = unsafe {
        let mut cur = owned(
            libc::openat(
                m.as_raw_fd(),
                c".".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            ) as libc::c_long,
            || "open the temp cover".into(),
        )?;
        for n in &names {
            // Only mount points live here: open to whoever the command
            // runs as, so it can reach its own dir.
            if libc::mkdirat(cur.as_raw_fd(), n.as_ptr(), 0o755) < 0 {
                return Err(err(format!("mkdir {n:?} in the temp cover")));
            }
            cur = owned(
                libc::openat(
                    cur.as_raw_fd(),
                    n.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                ) as libc::c_long,
                || format!("open {n:?} in the temp cover"),
            )?;
        }
        cur
    };
    attach(&m, cover_fd, what)?;
    bind(own, &target, false, what)?;
    set_attr(&m, MOUNT_ATTR_RDONLY, false)
}

/// Opens a system path (`/`, `/dev/null`) as `O_PATH`, following links:
/// for the paths byomd itself names, not the plan's.
pub fn open_path(p: &Path, flags: libc::c_int) -> Result<OwnedFd, String> {
    let c = CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} has a NUL byte", p.display()))?;
    // SAFETY: opening a path; the descriptor becomes an OwnedFd.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | flags) };
    owned(fd as libc::c_long, || format!("open {}", p.display()))
}

/// Makes the mount at a system path read-only (with what is mounted
/// below it, if `recursive`).
pub fn make_readonly(target: &Path, recursive: bool) -> Result<(), String> {
    set_attr(&open_path(target, 0)?, MOUNT_ATTR_RDONLY, recursive)
        .map_err(|e| format!("read-only {}: {e}", target.display()))
}
