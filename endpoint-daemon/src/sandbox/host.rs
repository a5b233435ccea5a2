//! byomd's side of the sandbox: what the kernel offers (probed once at
//! start), the private temp dirs, and a command's [`Spec`] from the policy
//! and the request.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::plan::{self, Context, Spec, Tmp};
use super::{Level, Support};
use crate::policy::sandbox::{Origin, SandboxRules};
use crate::policy::RunAs;

/// What byomd knows of the sandbox it can give, for every command.
#[derive(Debug, Clone)]
pub struct Host {
    pub helper: PathBuf,
    pub support: Support,
    /// byomd's own binary (kept read-only for commands).
    pub exe: Option<PathBuf>,
    /// Holds each command's private temp dir; `None`: no safe place.
    pub tmp_root: Option<PathBuf>,
}

/// Everything about one request the sandbox depends on.
pub struct Request<'a> {
    pub rules: &'a SandboxRules,
    pub origin: Origin,
    pub roots: &'a [String],
    pub cwd: &'a Path,
    pub config_dir: &'a Path,
    pub run_as: Option<&'a RunAs>,
    pub command_id: &'a str,
}

impl Host {
    /// For the daemon of `config_dir`: probes the kernel through `helper`
    /// and readies the temp dirs (one folder per config dir, so daemons
    /// of one user never touch each other's; what a daemon that died left
    /// there is removed).
    pub fn new(helper: PathBuf, config_dir: &Path) -> Host {
        let tag = byom_wire::hex(&byom_wire::sha256(
            config_dir.as_os_str().as_encoded_bytes(),
        ));
        Self::with_tmp(helper, &tag[..12], true)
    }

    /// For `byomd sandbox check`: temp dirs of its own, removed by
    /// [`Host::forget_tmp`].
    pub fn for_check(helper: PathBuf) -> Host {
        Self::with_tmp(helper, &format!("check-{}", std::process::id()), false)
    }

    fn with_tmp(helper: PathBuf, tag: &str, clean: bool) -> Host {
        let support = super::probe(&helper);
        let exe = std::env::current_exe()
            .ok()
            .and_then(|e| std::fs::canonicalize(e).ok());
        if let Some(e) = &exe {
            use std::os::unix::fs::MetadataExt;
            // Only this name of the file is kept read-only: another hard
            // link to it in a write root would let a command change it.
            if std::fs::metadata(e).is_ok_and(|m| m.nlink() > 1) {
                tracing::warn!(
                    "{} has other hard links: commands that may write where one of them is could change byomd's binary; install byomd as a file of its own",
                    e.display()
                );
            }
        }
        let tmp_root = match tmp_root(tag, clean) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!("commands get no private temp dir: {e}");
                None
            }
        };
        Host {
            helper,
            support,
            exe,
            tmp_root,
        }
    }

    pub fn level(&self, rules: &SandboxRules) -> Level {
        self.support.level(rules)
    }

    /// The private temp dir a command will get (not made yet).
    fn tmp_for(&self, id: &str) -> Option<Tmp> {
        let root = self.tmp_root.as_ref()?;
        Some(Tmp {
            cover: root.parent()?.to_path_buf(),
            own: root.join(id),
        })
    }

    /// The sandbox of one command (argv, env and cwd filled by
    /// [`Host::finish`]).
    pub fn plan(&self, r: &Request) -> Result<Spec, String> {
        make_if_missing(r.rules);
        let home = home_dir();
        // SAFETY: getuid has no preconditions.
        let uid = r.run_as.map(|u| u.uid).unwrap_or(unsafe { libc::getuid() });
        plan::build(&Context {
            rules: r.rules,
            support: &self.support,
            origin: r.origin,
            home,
            run_as_home: r.run_as.map(|u| u.home.clone()),
            uid,
            roots: r.roots,
            cwd: r.cwd,
            config_dir: r.config_dir,
            config_aliases: vec![crate::identity::default_config_dir()],
            exe: self.exe.as_deref(),
            tmp: self.tmp_for(r.command_id),
        })
    }

    /// Fills in what runs: the program and its arguments, the whole
    /// environment (byomd's, without the scrubbed variables, with the
    /// request's, `TMPDIR` the private temp dir), and makes the temp dir.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &self,
        spec: &mut Spec,
        argv: Vec<String>,
        request_env: &HashMap<String, String>,
        scrub: &[String],
        run_as: Option<&RunAs>,
        cwd: &Path,
    ) -> std::io::Result<()> {
        let mut env: BTreeMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        if let Some(r) = run_as {
            env.insert("HOME".into(), r.home.display().to_string());
            env.insert("USER".into(), r.user.clone());
            env.insert("LOGNAME".into(), r.user.clone());
        }
        for (k, v) in request_env {
            env.insert(k.clone(), v.clone());
        }
        for k in scrub {
            env.remove(k);
        }
        if let Some(t) = &spec.tmp {
            make_private_dir(&t.own, run_as.map(|r| (r.uid, r.gid)))?;
            env.entry("TMPDIR".into())
                .or_insert_with(|| t.own.display().to_string());
        }
        spec.env = env
            .into_iter()
            // A name with `=` or NUL cannot be passed as it was meant.
            .filter(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        spec.argv = argv;
        spec.cwd = cwd.to_path_buf();
        spec.user = run_as.map(|r| (r.uid, r.gid));
        Ok(())
    }

    /// Removes the temp dirs' folder (`byomd sandbox check` is done).
    pub fn forget_tmp(&self) {
        if let Some(r) = &self.tmp_root {
            let _ = std::fs::remove_dir_all(r);
        }
    }

    /// Removes a command's temp dir once it ended.
    pub fn clean(&self, spec: &Spec) {
        if let Some(t) = &spec.tmp {
            remove_tmp(t);
        }
    }
}

/// Removes a command's temp dir once it ended.
pub fn remove_tmp(t: &Tmp) {
    let _ = std::fs::remove_dir_all(&t.own);
}

/// `<temp dir>/byomd-UID/TAG`: both made 0700 by us, or refused
/// (another user could have made them first to read or plant files in
/// commands' temp dirs). One folder per user, so a command's sandbox hides
/// every daemon's temp dirs at once (`Tmp::cover`). With `clean`,
/// leftovers from a daemon that died are removed.
fn tmp_root(tag: &str, clean: bool) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let parent = std::env::temp_dir().join(format!("byomd-{me}"));
    let root = parent.join(tag);
    for d in [&parent, &root] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot make {}: {e}", d.display())),
        }
        let m = std::fs::symlink_metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
        if !m.is_dir() || m.uid() != me || m.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "{} is not a directory of this user's with mode 0700",
                d.display()
            ));
        }
    }
    if clean {
        if let Ok(rd) = std::fs::read_dir(&root) {
            for e in rd.flatten() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(root)
}

fn make_private_dir(p: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(p) {
        Ok(()) => {}
        // The same command ID again (it was attached to, not run twice):
        // start it empty.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_dir_all(p)?;
            std::fs::DirBuilder::new().mode(0o700).create(p)?;
        }
        Err(e) => return Err(e),
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(p, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Makes the missing directories of [`MADE_IF_MISSING`] that the owner's
/// lists still name, so they can be covered (see there).
fn make_if_missing(rules: &SandboxRules) {
    use crate::policy::sandbox::MADE_IF_MISSING;
    use std::os::unix::fs::DirBuilderExt;
    let Some(home) = home_dir().filter(|h| h.is_dir()) else {
        return;
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    for entry in MADE_IF_MISSING {
        let named = rules
            .deny_read
            .iter()
            .chain(&rules.read_only)
            .any(|e| e == entry || (entry.starts_with("/tmp/tmux-") && e == "/tmp/tmux-*"));
        if !named {
            continue;
        }
        let text = entry.replace("{uid}", &uid.to_string());
        let Some(p) = crate::policy::rules::expand(&text, Some(&home)) else {
            continue;
        };
        if std::fs::symlink_metadata(&p).is_ok() {
            continue;
        }
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&p)
        {
            Ok(()) => tracing::info!("made {} (empty) so commands cannot use it", p.display()),
            Err(e) => tracing::warn!("cannot make {} to keep it from commands: {e}", p.display()),
        }
    }
}

/// The home `~` means: `$HOME`, else the user's entry in the password
/// database (an unset HOME must not make every `~` rule vanish).
pub fn home_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    // SAFETY: getpwuid_r writes into the struct and buffer it is given only.
    crate::policy::passwd_entry(|pw, buf, len, result| unsafe {
        libc::getpwuid_r(libc::geteuid(), pw, buf, len, result)
    })
    .map(|(_, _, home)| home)
}
