//! From the owner's rules and what the kernel offers to the exact sandbox
//! one command gets ([`Spec`]): the data the helper applies, computed here
//! so it can be tested without a kernel and shown by `byomd sandbox check`.
//!
//! Two shapes, by what the kernel allows:
//! - **mounts** (user and mount namespaces): hidden paths are covered by
//!   empty read-only tmpfs, read-only paths are read-only bind mounts, and
//!   every directory above them that a command could rename (its parent is
//!   writable) is made a mount point, which the kernel refuses to rename or
//!   remove; Landlock then allows reads everywhere and writes under the
//!   write roots.
//! - **Landlock alone**: Landlock only grants, so the grants are carved
//!   around what must stay out of reach: every sibling of the way down to a
//!   hidden path is granted, the way itself only listed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Support;
use crate::policy::glob;
use crate::policy::sandbox::{Net, Origin, SandboxRules};

/// Most directory entries a carve may grant one by one (Landlock alone):
/// beyond it the plan fails rather than grant the whole directory.
pub const MAX_CARVED: usize = 8192;
/// Most paths a `*` in a sandbox path may match.
pub const MAX_GLOB_MATCHES: usize = 256;

/// A command's private temp dir: `own` is its `TMPDIR`; with mounts,
/// `cover` (which holds every command's) is hidden around it (the helper
/// covers it only in a mount namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tmp {
    pub cover: PathBuf,
    pub own: PathBuf,
}

/// Everything the helper needs, and nothing it must decide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// The program (name or path) and its arguments.
    pub argv: Vec<String>,
    /// The whole environment, `K=V`.
    pub env: Vec<String>,
    pub cwd: PathBuf,
    /// Run as this uid and gid (byomd runs as root with `[run] user`).
    pub user: Option<(u32, u32)>,
    pub user_ns: bool,
    pub mount_ns: bool,
    pub pid_ns: bool,
    pub net_ns: bool,
    pub landlock: bool,
    pub seccomp: bool,
    /// No IP sockets at all (seccomp): the network denied where no network
    /// namespace can be made.
    pub deny_sockets: bool,
    /// Directories made mount points so they cannot be renamed.
    pub pin: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
    pub hide: Vec<PathBuf>,
    /// Mounts: writable beneath these, read-only everywhere else.
    pub rw: Vec<PathBuf>,
    /// Landlock: full access beneath these.
    pub write: Vec<PathBuf>,
    /// Landlock: read access beneath these.
    pub read: Vec<PathBuf>,
    /// Landlock: listing only (directories on the way to a hidden path).
    pub list: Vec<PathBuf>,
    pub tmp: Option<Tmp>,
    /// Landlock: TCP connections only to these ports (empty: any).
    pub ports: Vec<u16>,
    /// Its stdin is a terminal to make its controlling one (a session
    /// of its own, `TIOCSCTTY`), for `byom exec -t`.
    #[serde(default)]
    pub tty: bool,
    /// The helper watches for IP sockets (a seccomp notification) and
    /// tells byomd whether the command made one: set when its network
    /// reaches other machines, so the server knows whether its output
    /// may have come from anyone's words.
    #[serde(default)]
    pub observe_net: bool,
}

/// What a command's sandbox depends on besides the rules.
pub struct Context<'a> {
    pub rules: &'a SandboxRules,
    pub support: &'a Support,
    pub origin: Origin,
    /// The home `~` means in the policy (byomd's).
    pub home: Option<PathBuf>,
    /// The home of the user commands run as, when not byomd's.
    pub run_as_home: Option<PathBuf>,
    /// The uid commands run as (for `{runtime}`).
    pub uid: u32,
    /// `dirs.roots` as written.
    pub roots: &'a [String],
    pub cwd: &'a Path,
    /// byomd's config dir: identity, policy, secrets, approvals, audit,
    /// pause switch, run files.
    pub config_dir: &'a Path,
    /// Other names of the config dir (as the owner's `byomd` finds it by
    /// default): the symlinks on the way to it need guarding too.
    pub config_aliases: Vec<PathBuf>,
    /// byomd's own binary.
    pub exe: Option<&'a Path>,
    pub tmp: Option<Tmp>,
}

fn expand_home(p: &str, home: Option<&Path>) -> Option<PathBuf> {
    crate::policy::rules::expand(p, home)
}

/// Paths a glob in its last part matches now (bounded); a plain path as is.
/// Directory listings a plan reads once however many patterns look in
/// the same directory (`/tmp` holds several, and may hold many entries).
type Listings = std::cell::RefCell<std::collections::HashMap<PathBuf, Vec<std::ffi::OsString>>>;

fn glob_paths(p: PathBuf, listings: &Listings) -> Result<Vec<PathBuf>, String> {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !name.contains('*') && !name.contains('?') {
        return Ok(vec![p]);
    }
    let Some(parent) = p.parent() else {
        return Ok(Vec::new());
    };
    let names = listings.borrow().get(parent).cloned();
    let names = match names {
        Some(n) => n,
        None => {
            let rd = match std::fs::read_dir(parent) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(unreadable(parent, &e)),
            };
            let mut n = Vec::new();
            for e in rd {
                n.push(e.map_err(|e| unreadable(parent, &e))?.file_name());
            }
            listings
                .borrow_mut()
                .insert(parent.to_path_buf(), n.clone());
            n
        }
    };
    let mut out = Vec::new();
    for n in names {
        if n.to_str().is_some_and(|n| glob(name, n)) {
            // Past the bound, refuse: dropping matches silently would let
            // a command hide the real one among decoys.
            if out.len() == MAX_GLOB_MATCHES {
                return Err(format!(
                    "more than {MAX_GLOB_MATCHES} paths match {}: remove them (a command may have made them to crowd out one it should not reach)",
                    p.display()
                ));
            }
            out.push(parent.join(n));
        }
    }
    Ok(out)
}

/// Planning stops at a path it cannot look at: what it would protect
/// there must not silently go unprotected (a command can `chmod 000` a
/// directory byomd would look into).
fn unreadable(p: &Path, e: &std::io::Error) -> String {
    format!(
        "cannot look at {} to plan the sandbox ({e}): fix its permissions",
        p.display()
    )
}

/// The runtime directory of `uid` (`{runtime}`).
fn runtime_dir(uid: u32) -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(format!("/run/user/{uid}")),
    }
}

impl Context<'_> {
    /// Every path an entry names, tokens and `~` expanded, globs matched,
    /// resolved on disk; entries that name nothing existing are dropped
    /// (there is nothing there to protect or grant).
    fn resolve(&self, entry: &str, both_homes: bool, l: &Listings) -> Result<Vec<PathBuf>, String> {
        let mut out = Vec::new();
        for p in self.raw(entry, both_homes, l)? {
            match std::fs::canonicalize(&p) {
                Ok(c) => out.push(c),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(unreadable(&p, &e)),
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// An entry's paths as written (tokens, `~` and globs expanded), before
    /// any symlink on the way is followed.
    fn raw(&self, entry: &str, both_homes: bool, l: &Listings) -> Result<Vec<PathBuf>, String> {
        let mut raw: Vec<PathBuf> = Vec::new();
        let no_home =
            || format!("{entry:?} names the home directory, and none is known (HOME is unset)");
        if let Some(rest) = entry.strip_prefix("{roots}") {
            for r in self.roots {
                let p = expand_home(r, self.home.as_deref()).ok_or_else(no_home)?;
                raw.push(join_rest(p, rest));
            }
        } else if let Some(rest) = entry.strip_prefix("{cwd}") {
            raw.push(join_rest(self.cwd.to_path_buf(), rest));
        } else if let Some(rest) = entry.strip_prefix("{runtime}") {
            raw.push(join_rest(runtime_dir(self.uid), rest));
        } else {
            raw.push(expand_home(entry, self.home.as_deref()).ok_or_else(no_home)?);
            if both_homes && entry.starts_with('~') {
                if let Some(p) = expand_home(entry, self.run_as_home.as_deref()) {
                    raw.push(p);
                }
            }
        }
        let mut out = Vec::new();
        for p in raw {
            out.extend(glob_paths(p, l)?);
        }
        Ok(out)
    }

    /// The symlinks on the way to each path the entries name.
    fn links_all(&self, entries: &[String], l: &Listings) -> Result<Vec<PathBuf>, String> {
        let mut out = Vec::new();
        for e in entries {
            for p in self.raw(e, true, l)? {
                out.extend(links_on_the_way(&p)?);
            }
        }
        Ok(out)
    }

    fn resolve_all(
        &self,
        entries: &[String],
        both_homes: bool,
        l: &Listings,
    ) -> Result<Vec<PathBuf>, String> {
        let mut out = Vec::new();
        for e in entries {
            out.extend(self.resolve(e, both_homes, l)?);
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// Most symlinks followed on the way to one path (the kernel's own bound).
const MAX_LINK_HOPS: usize = 40;

/// The symlinks met on the way to `p` (each as its canonical directory
/// and its name): a protection put on where they lead is only as good as
/// the links themselves, which whoever may write beside them can replace.
pub fn links_on_the_way(p: &Path) -> Result<Vec<PathBuf>, String> {
    use std::collections::VecDeque;
    use std::path::Component;
    let mut out = Vec::new();
    let mut cur = PathBuf::from("/");
    let mut pending: VecDeque<std::ffi::OsString> = VecDeque::new();
    let push_all = |q: &mut VecDeque<std::ffi::OsString>, path: &Path, front: bool| {
        let parts: Vec<std::ffi::OsString> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect();
        if front {
            for c in parts.into_iter().rev() {
                q.push_front(c);
            }
        } else {
            q.extend(parts);
        }
    };
    if !p.is_absolute() {
        return Ok(out);
    }
    push_all(&mut pending, p, false);
    let mut hops = 0;
    while let Some(c) = pending.pop_front() {
        if c == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&c);
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                let target = std::fs::read_link(&next).map_err(|e| unreadable(&next, &e))?;
                if hops > MAX_LINK_HOPS {
                    return Err(format!("too many symlinks on the way to {}", p.display()));
                }
                out.push(next);
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                push_all(&mut pending, &target, true);
            }
            Ok(_) => cur = next,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(unreadable(&next, &e)),
        }
    }
    Ok(out)
}

fn join_rest(base: PathBuf, rest: &str) -> PathBuf {
    match rest.trim_start_matches('/') {
        "" => base,
        r => base.join(r),
    }
}

/// Drops paths that lie under another in the list (the outer one covers
/// them), keeping the list sorted.
fn outermost(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.sort();
    paths.dedup();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        if !out.iter().any(|o| p.starts_with(o)) {
            out.push(p);
        }
    }
    out
}

fn under_any(p: &Path, list: &[PathBuf]) -> bool {
    list.iter().any(|l| p.starts_with(l))
}

/// Grants beneath `root` that reach everything but `protected`: `root`
/// itself when nothing protected lies in it, nothing when it is protected,
/// else each entry in it, carved the same way, and `root` goes to
/// `listed` (it may be listed, not changed).
fn carve(
    root: &Path,
    protected: &[PathBuf],
    granted: &mut Vec<PathBuf>,
    listed: &mut Vec<PathBuf>,
    budget: &mut usize,
) -> Result<(), String> {
    if under_any(root, protected) {
        return Ok(());
    }
    if !protected.iter().any(|p| p.starts_with(root)) {
        granted.push(root.to_path_buf());
        return Ok(());
    }
    listed.push(root.to_path_buf());
    let rd = std::fs::read_dir(root)
        .map_err(|e| format!("cannot list {} to carve the sandbox: {e}", root.display()))?;
    for e in rd {
        let e = e.map_err(|e| format!("cannot list {}: {e}", root.display()))?;
        *budget = budget.checked_sub(1).ok_or_else(|| {
            format!(
                "more than {MAX_CARVED} entries to grant one by one around {}: the sandbox needs user namespaces here",
                root.display()
            )
        })?;
        let child = e.path();
        // A symlink is never granted: a rule is taken on what it points
        // to (which may be the very thing protected), and a path through
        // it is judged where it lands anyway.
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_symlink() {
            continue;
        }
        if kind.is_dir() {
            carve(&child, protected, granted, listed, budget)?;
        } else if !under_any(&child, protected) {
            granted.push(child);
        }
    }
    Ok(())
}

/// The sandbox of one command: argv, env and cwd are filled by the
/// caller.
pub fn build(cx: &Context) -> Result<Spec, String> {
    let s = cx.support;
    let rules = cx.rules;
    let mut spec = Spec {
        // Root makes namespaces without one (see linux.rs).
        user_ns: s.user_ns && !s.root,
        mount_ns: s.mount_ns,
        pid_ns: s.pid_ns,
        landlock: s.landlock_abi > 0,
        seccomp: s.seccomp,
        tmp: cx.tmp.clone(),
        ..Default::default()
    };
    let config = std::fs::canonicalize(cx.config_dir).unwrap_or_else(|_| cx.config_dir.into());
    let listings = Listings::default();
    let mut hide = cx.resolve_all(&rules.deny_read, true, &listings)?;
    hide.push(config);
    let hide = outermost(hide);
    if under_any(cx.cwd, &hide) {
        return Err(format!(
            "working directory {} is hidden by the sandbox (sandbox.deny_read, or byomd's own config dir)",
            cx.cwd.display()
        ));
    }
    let mut read_only = cx.resolve_all(&rules.read_only, true, &listings)?;
    if let Some(exe) = cx.exe {
        read_only.push(exe.to_path_buf());
    }
    let read_only: Vec<PathBuf> = outermost(read_only)
        .into_iter()
        .filter(|p| !under_any(p, &hide))
        .collect();
    let write_entries: Vec<String> = match &rules.write {
        Some(w) => w.clone(),
        None => vec!["{roots}".into(), "{cwd}".into()],
    };
    let mut write: Vec<PathBuf> = cx
        .resolve_all(&write_entries, false, &listings)?
        .into_iter()
        .filter(|p| !under_any(p, &hide))
        .collect();
    if let Some(t) = &cx.tmp {
        write.push(t.own.clone());
    }
    let write = outermost(write);
    // The symlinks on the way to what is protected, where a command could
    // replace them (their directory is writable): a write root holding one
    // is granted around it (what is in that directory stays writable; the
    // directory itself gets no new or removed entries).
    let mut links = cx.links_all(&rules.deny_read, &listings)?;
    links.extend(cx.links_all(&rules.read_only, &listings)?);
    for c in std::iter::once(cx.config_dir).chain(cx.config_aliases.iter().map(PathBuf::as_path)) {
        links.extend(links_on_the_way(c)?);
    }
    links.sort();
    links.dedup();
    let links: Vec<PathBuf> = links
        .into_iter()
        .filter(|l| l.parent().is_some_and(|d| under_any(d, &write)))
        .collect();

    if spec.mount_ns {
        // Every directory between a write root and something protected
        // could be renamed away (taking the protection with it) unless it
        // is a mount point.
        let mut guarded: Vec<&PathBuf> = hide
            .iter()
            .chain(read_only.iter())
            .chain(links.iter())
            .collect();
        if let Some(t) = &cx.tmp {
            guarded.push(&t.cover);
        }
        let mut pin: Vec<PathBuf> = Vec::new();
        for p in guarded {
            for a in p.ancestors().skip(1) {
                let Some(parent) = a.parent() else { break };
                if under_any(parent, &write) && !pin.iter().any(|x| x == a) {
                    pin.push(a.to_path_buf());
                }
            }
        }
        // Shallowest first: a bind of a directory over itself would hide
        // mounts already made beneath it.
        pin.sort_by_key(|p| p.components().count());
        spec.pin = pin;
        spec.hide = hide;
        spec.read_only = read_only;
        spec.read = vec![PathBuf::from("/")];
        spec.rw = write.clone();
        if links.is_empty() {
            spec.write = write;
        } else {
            let mut budget = MAX_CARVED;
            let (mut granted, mut listed) = (Vec::new(), Vec::new());
            for w in &write {
                carve(w, &links, &mut granted, &mut listed, &mut budget)?;
            }
            if let Some(t) = &cx.tmp {
                granted.push(t.own.clone());
            }
            spec.write = outermost(granted);
            spec.list = listed;
        }
    } else {
        // Landlock alone: carve reads around what is hidden, writes
        // around everything protected. The temp dir stays the command's
        // own only by its name and mode (no mount hides the others).
        let mut budget = MAX_CARVED;
        let (mut read, mut list) = (Vec::new(), Vec::new());
        carve(Path::new("/"), &hide, &mut read, &mut list, &mut budget)?;
        let protected: Vec<PathBuf> = outermost(
            hide.iter()
                .chain(&read_only)
                .chain(&links)
                .cloned()
                .collect(),
        );
        let mut granted = Vec::new();
        let mut w_list = Vec::new();
        for w in &write {
            carve(w, &protected, &mut granted, &mut w_list, &mut budget)?;
        }
        if let Some(t) = &cx.tmp {
            granted.push(t.own.clone());
        }
        spec.read = read;
        spec.list = list;
        spec.write = outermost(granted);
        spec.hide = Vec::new();
        spec.read_only = Vec::new();
    }

    match cx.rules.network(cx.origin) {
        Net::Allow => {}
        Net::Deny if s.net_ns => spec.net_ns = true,
        Net::Deny => spec.deny_sockets = true,
        Net::Ports(p) if s.landlock_abi >= 4 => spec.ports = p.clone(),
        // Ports cannot be limited here: fail closed, no network at all.
        Net::Ports(_) if s.net_ns => spec.net_ns = true,
        Net::Ports(_) => spec.deny_sockets = true,
    }
    if spec.deny_sockets && !spec.seccomp {
        return Err(format!(
            "sandbox.network.{} denies the network, and this kernel offers neither a network namespace nor seccomp to deny it",
            cx.origin.name()
        ));
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Support {
        Support::everything()
    }

    struct Home {
        dir: tempfile::TempDir,
    }

    impl Home {
        fn new() -> Home {
            let dir = tempfile::tempdir().unwrap();
            for d in [".ssh", ".config/byomd", "src/app", ".config/gh"] {
                std::fs::create_dir_all(dir.path().join(d)).unwrap();
            }
            std::fs::write(dir.path().join(".bashrc"), "").unwrap();
            std::fs::write(dir.path().join("notes"), "").unwrap();
            Home { dir }
        }
        fn p(&self, rel: &str) -> PathBuf {
            std::fs::canonicalize(self.dir.path())
                .unwrap()
                .join(rel)
                .components()
                .collect()
        }
    }

    fn build_in(h: &Home, support: &Support, origin: Origin) -> Result<Spec, String> {
        let rules = SandboxRules::default();
        let roots = vec!["~".to_string()];
        let cwd = h.p("src/app");
        let config = h.p(".config/byomd");
        build(&Context {
            rules: &rules,
            support,
            origin,
            home: Some(h.p("")),
            run_as_home: None,
            uid: 1000,
            roots: &roots,
            cwd: &cwd,
            config_dir: &config,
            config_aliases: Vec::new(),
            exe: None,
            tmp: None,
        })
    }

    #[test]
    fn mounts_hide_the_config_and_pin_the_way_to_it() {
        let h = Home::new();
        let s = build_in(&h, &full(), Origin::Admin).unwrap();
        assert!(s.hide.contains(&h.p(".config/byomd")), "{s:?}");
        assert!(s.hide.contains(&h.p(".ssh")), "{s:?}");
        assert!(s.read_only.contains(&h.p(".bashrc")), "{s:?}");
        // ~/.config lies in a write root: renaming it would carry the
        // cover away, so it must be a mount point. ~ itself is the root
        // (its parent is not writable).
        assert!(s.pin.contains(&h.p(".config")), "{s:?}");
        assert!(!s.pin.contains(&h.p("")), "{s:?}");
        assert_eq!(s.write, vec![h.p("")]);
        assert_eq!(s.read, vec![PathBuf::from("/")]);
        assert!(!s.net_ns && !s.deny_sockets);
    }

    #[test]
    fn untrusted_tasks_get_no_network() {
        let h = Home::new();
        let s = build_in(&h, &full(), Origin::Untrusted).unwrap();
        assert!(s.net_ns);
        let mut no_ns = full();
        no_ns.net_ns = false;
        let s = build_in(&h, &no_ns, Origin::Untrusted).unwrap();
        assert!(s.deny_sockets && !s.net_ns);
        let mut nothing = no_ns.clone();
        nothing.seccomp = false;
        assert!(build_in(&h, &nothing, Origin::Untrusted).is_err());
    }

    #[test]
    fn landlock_alone_carves_around_the_config() {
        let h = Home::new();
        let mut ll = full();
        ll.user_ns = false;
        ll.mount_ns = false;
        ll.pid_ns = false;
        let s = build_in(&h, &ll, Origin::Admin).unwrap();
        // Nothing granted reaches the config dir or ~/.ssh, for reading
        // or writing; their siblings are granted.
        for p in s.read.iter().chain(&s.write) {
            assert!(
                !h.p(".config/byomd").starts_with(p) && !p.starts_with(h.p(".config/byomd")),
                "{p:?} reaches the config dir"
            );
            assert!(!h.p(".ssh").starts_with(p), "{p:?} reaches ~/.ssh");
            assert!(!p.starts_with(h.p(".bashrc")) || !s.write.contains(p));
        }
        assert!(s.write.contains(&h.p("src")), "{:?}", s.write);
        assert!(s.write.contains(&h.p("notes")), "{:?}", s.write);
        assert!(s.read.contains(&h.p(".config/gh")) || s.read.contains(&h.p("src")));
        assert!(s.list.contains(&h.p(".config")), "{:?}", s.list);
    }

    #[test]
    fn a_hidden_working_directory_is_refused() {
        let h = Home::new();
        let rules = SandboxRules::default();
        let roots = vec!["~".to_string()];
        let cwd = h.p(".config/byomd");
        let e = build(&Context {
            rules: &rules,
            support: &full(),
            origin: Origin::Admin,
            home: Some(h.p("")),
            run_as_home: None,
            uid: 0,
            roots: &roots,
            cwd: &cwd,
            config_dir: &cwd,
            config_aliases: Vec::new(),
            exe: None,
            tmp: None,
        })
        .unwrap_err();
        assert!(e.contains("hidden"), "{e}");
    }

    /// Decoys past the bound refuse the plan rather than drop a real match.
    #[test]
    fn a_glob_crowded_with_decoys_stops_the_plan() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..=MAX_GLOB_MATCHES {
            std::fs::create_dir(d.path().join(format!("ssh-{i}"))).unwrap();
        }
        let e = glob_paths(d.path().join("ssh-*"), &Listings::default()).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        assert_eq!(
            glob_paths(d.path().join("other-*"), &Listings::default()).unwrap(),
            Vec::<PathBuf>::new()
        );
    }

    #[test]
    fn outermost_keeps_only_covering_paths() {
        let v = outermost(vec![
            PathBuf::from("/a/b"),
            PathBuf::from("/a"),
            PathBuf::from("/ab"),
            PathBuf::from("/a/b/c"),
        ]);
        assert_eq!(v, vec![PathBuf::from("/a"), PathBuf::from("/ab")]);
    }
}
