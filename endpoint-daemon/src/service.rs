//! `byomd service install|uninstall|start|stop|status`: byomd as a user
//! service — a systemd user unit on Linux, a launchd LaunchAgent on macOS, a
//! Windows service on Windows — rendered from the templates in
//! `installers/`. `--dry-run` prints exactly the files and commands.
//!
//! On Linux a user unit needs a user manager, which a machine reached by
//! `ssh` as a service account, `su` or a container often lacks (no
//! `XDG_RUNTIME_DIR`, no user bus). Then the unit is still written and the
//! way on is said (lingering, a new login, or `--system`: a system unit
//! that runs byomd as its owner), and `uninstall` still removes the file.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

const SYSTEMD_TEMPLATE: &str = include_str!("../../installers/systemd/byomd.service");
const SYSTEMD_SYSTEM_TEMPLATE: &str = include_str!("../../installers/systemd/byomd-system.service");
const LAUNCHD_TEMPLATE: &str = include_str!("../../installers/launchd/dev.byom.byomd.plist");
const WINDOWS_TEMPLATE: &str = include_str!("../../installers/windows/install-service.ps1");

/// Where system units an administrator adds live.
pub const SYSTEM_UNIT_DIR: &str = "/etc/systemd/system";
const UNIT_NAME: &str = "byomd.service";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Platform {
    Linux,
    Macos,
    Windows,
}

impl Platform {
    pub fn current() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::Macos
        } else if cfg!(windows) {
            Platform::Windows
        } else {
            Platform::Linux
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ServiceOpts {
    /// Print exactly what would be written and run, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Render for another platform (with --dry-run).
    #[arg(long, value_enum)]
    pub platform: Option<Platform>,
    /// Linux: a system service (/etc/systemd/system/byomd.service; as
    /// root, e.g. with sudo) that runs byomd from boot as the machine's
    /// owner (the user who ran sudo) with the owner's config dir: for a
    /// machine where the owner has no user session.
    #[arg(long)]
    pub system: bool,
}

#[derive(clap::Args, Debug)]
pub struct UnitDir {
    /// Linux: write the unit into DIR instead and run no systemctl (image
    /// builds, packaging, tests).
    #[arg(long, value_name = "DIR")]
    pub unit_dir: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
pub enum ServiceCmd {
    /// Write the service definition and enable it (and start it unless --no-start).
    Install {
        #[command(flatten)]
        opts: ServiceOpts,
        #[command(flatten)]
        unit: UnitDir,
        #[arg(long)]
        no_start: bool,
    },
    /// Stop and remove the service.
    Uninstall {
        #[command(flatten)]
        opts: ServiceOpts,
        #[command(flatten)]
        unit: UnitDir,
    },
    Start {
        #[command(flatten)]
        opts: ServiceOpts,
    },
    Stop {
        #[command(flatten)]
        opts: ServiceOpts,
    },
    Status {
        #[command(flatten)]
        opts: ServiceOpts,
    },
}

/// A user service or a system service (Linux).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    User,
    System,
}

/// What installing means on a platform: files to write, commands to run.
pub struct Plan {
    pub files: Vec<(PathBuf, String)>,
    pub commands: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

/// Who a system unit runs byomd as, and where that user's config is.
#[derive(Debug, Clone)]
pub struct Owner {
    pub user: String,
    pub config_dir: PathBuf,
}

fn home() -> anyhow::Result<PathBuf> {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .map(PathBuf::from)
        .context("HOME is not set")
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Quotes one argument for a systemd ExecStart line.
fn systemd_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-=:".contains(c))
    {
        s.to_string()
    } else {
        format!(
            "\"{}\"",
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('%', "%%")
        )
    }
}

fn run_args(exe: &Path, config_dir: Option<&Path>) -> Vec<String> {
    let mut a = vec![exe.display().to_string()];
    if let Some(d) = config_dir {
        a.push("--config-dir".into());
        a.push(d.display().to_string());
    }
    a.push("run".into());
    a
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// `systemctl` or `systemctl --user`, then `args`.
fn systemctl(scope: Scope, args: &[&str]) -> Vec<String> {
    let mut c = vec!["systemctl".to_string()];
    if scope == Scope::User {
        c.push("--user".into());
    }
    c.extend(strings(args));
    c
}

/// The unit file of `scope`, in `unit_dir` if given.
pub fn unit_path(scope: Scope, unit_dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    Ok(match (unit_dir, scope) {
        (Some(d), _) => d.join(UNIT_NAME),
        (None, Scope::System) => Path::new(SYSTEM_UNIT_DIR).join(UNIT_NAME),
        (None, Scope::User) => home()?.join(".config/systemd/user").join(UNIT_NAME),
    })
}

/// The systemd unit that runs `exe`: a user unit, or a system unit that
/// runs it as `owner` with the owner's config dir.
fn systemd_unit(exe: &Path, config_dir: Option<&Path>, owner: Option<&Owner>) -> String {
    let exec = |dir| {
        run_args(exe, dir)
            .iter()
            .map(|a| systemd_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    };
    match owner {
        None => SYSTEMD_TEMPLATE.replace("{{EXEC}}", &exec(config_dir)),
        Some(o) => SYSTEMD_SYSTEM_TEMPLATE
            .replace("{{USER}}", &systemd_quote(&o.user))
            .replace("{{EXEC}}", &exec(Some(&o.config_dir))),
    }
}

/// Installing on Linux: the unit, then (unless `unit_dir` says only to
/// write it) reloading systemd and enabling (and starting) the unit.
fn linux_plan(
    exe: &Path,
    config_dir: Option<&Path>,
    owner: Option<&Owner>,
    unit_dir: Option<&Path>,
    start: bool,
) -> anyhow::Result<Plan> {
    let scope = if owner.is_some() {
        Scope::System
    } else {
        Scope::User
    };
    let path = unit_path(scope, unit_dir)?;
    let unit = systemd_unit(exe, config_dir, owner);
    let enable = if start {
        systemctl(scope, &["enable", "--now", "byomd"])
    } else {
        systemctl(scope, &["enable", "byomd"])
    };
    let mut notes = Vec::new();
    let commands = if unit_dir.is_some() {
        notes.push(format!(
            "only wrote the unit (--unit-dir): once it is where systemd looks, `{}`",
            enable.join(" ")
        ));
        Vec::new()
    } else {
        vec![systemctl(scope, &["daemon-reload"]), enable]
    };
    match owner {
        None => notes.push(format!(
            "to keep byomd running after you log out: loginctl enable-linger {}",
            user_name()
        )),
        Some(o) => notes.push(format!(
            "byomd runs as {} with the config in {}; logs: journalctl -u byomd",
            o.user,
            o.config_dir.display()
        )),
    }
    Ok(Plan {
        files: vec![(path, unit)],
        commands,
        notes,
    })
}

pub fn install_plan(
    platform: Platform,
    exe: &Path,
    config_dir: Option<&Path>,
    start: bool,
) -> anyhow::Result<Plan> {
    let args = run_args(exe, config_dir);
    Ok(match platform {
        Platform::Linux => linux_plan(exe, config_dir, None, None, start)?,
        Platform::Macos => {
            let h = home()?;
            let log = h.join("Library/Logs/byomd.log").display().to_string();
            let arg_xml = args
                .iter()
                .map(|a| format!("    <string>{}</string>", xml_escape(a)))
                .collect::<Vec<_>>()
                .join("\n");
            let plist = LAUNCHD_TEMPLATE
                .replace("{{ARGS}}", &arg_xml)
                .replace("{{LOG}}", &xml_escape(&log));
            let path = h.join("Library/LaunchAgents/dev.byom.byomd.plist");
            let uid = uid();
            let mut commands = Vec::new();
            if start {
                commands.push(vec![
                    "launchctl".into(),
                    "bootstrap".into(),
                    format!("gui/{uid}"),
                    path.display().to_string(),
                ]);
            }
            Plan {
                files: vec![(path, plist)],
                commands,
                notes: vec![format!("logs: {log}")],
            }
        }
        Platform::Windows => {
            let cmd = args
                .iter()
                .map(|a| format!("\"{a}\""))
                .collect::<Vec<_>>()
                .join(" ");
            let script = WINDOWS_TEMPLATE.replace(
                "'\"{{BYOMD}}\" run'",
                &format!("'{}'", cmd.replace('\'', "''")),
            );
            let path = std::env::temp_dir().join("byomd-install-service.ps1");
            Plan {
                files: vec![(path.clone(), script)],
                commands: vec![vec![
                    "powershell".into(),
                    "-ExecutionPolicy".into(),
                    "Bypass".into(),
                    "-File".into(),
                    path.display().to_string(),
                ]],
                notes: vec!["run from an elevated prompt; logs go to the Windows Event Log".into()],
            }
        }
    })
}

fn uid() -> u32 {
    #[cfg(unix)]
    {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    }
    #[cfg(not(unix))]
    {
        0
    }
}

fn is_root() -> bool {
    #[cfg(unix)]
    {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
    #[cfg(not(unix))]
    {
        false
    }
}

/// This user's name, for messages.
fn user_name() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| if is_root() { "root" } else { "$USER" }.into())
}

/// The machine's owner a system unit runs byomd as: the user who ran
/// `sudo` (their home from the password database: sudo's own HOME is
/// root's), else this user. `config_dir` is the one given on the command
/// line, if any; else the owner's default.
pub fn owner(config_dir: Option<&Path>) -> anyhow::Result<Owner> {
    let sudo_user = std::env::var("SUDO_USER")
        .ok()
        .filter(|u| is_root() && !u.is_empty() && u != "root");
    let Some(user) = sudo_user else {
        return Ok(Owner {
            user: user_name(),
            config_dir: config_dir
                .map(Path::to_path_buf)
                .unwrap_or_else(crate::identity::default_config_dir),
        });
    };
    let config_dir = match config_dir {
        Some(d) => d.to_path_buf(),
        None => home_of(&user)?.join(".config/byomd"),
    };
    Ok(Owner { user, config_dir })
}

#[cfg(unix)]
fn home_of(user: &str) -> anyhow::Result<PathBuf> {
    let name = std::ffi::CString::new(user).context("bad SUDO_USER")?;
    // SAFETY: getpwnam_r writes into the struct and buffer it is given only.
    crate::policy::passwd_entry(|pw, buf, len, result| unsafe {
        libc::getpwnam_r(name.as_ptr(), pw, buf, len, result)
    })
    .map(|(_, _, home)| home)
    .with_context(|| format!("no local user {user:?} (SUDO_USER): give --config-dir"))
}

#[cfg(not(unix))]
fn home_of(user: &str) -> anyhow::Result<PathBuf> {
    bail!("no home for {user}: give --config-dir")
}

/// Why systemd cannot be asked to do anything for `scope` here, if it
/// cannot. A user manager is reached through `XDG_RUNTIME_DIR` (its
/// private socket or the user bus) or `DBUS_SESSION_BUS_ADDRESS`; the
/// system manager runs only when systemd booted the machine.
pub fn manager_missing(scope: Scope) -> Option<String> {
    match scope {
        Scope::System => (!Path::new("/run/systemd/system").exists())
            .then(|| "systemd is not running on this machine (no /run/systemd/system)".to_string()),
        Scope::User => {
            if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some_and(|a| !a.is_empty()) {
                return None;
            }
            match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
                None => Some(
                    "XDG_RUNTIME_DIR and DBUS_SESSION_BUS_ADDRESS are not set: this shell has no user session (su, sudo, cron, a container?)"
                        .into(),
                ),
                Some(d) => {
                    let d = PathBuf::from(d);
                    let found = ["systemd/private", "bus"].iter().any(|s| d.join(s).exists());
                    (!found).then(|| {
                        format!(
                            "no user manager is listening in {} (XDG_RUNTIME_DIR)",
                            d.display()
                        )
                    })
                }
            }
        }
    }
}

/// What to do when `scope`'s manager cannot be reached: said in full,
/// since the person reading it is stuck until they do one of these.
fn advice(scope: Scope, why: &str, flags: &str) -> String {
    let user = user_name();
    match scope {
        Scope::User => format!(
            "there is no systemd user manager here for a user service ({why}).\n\
             To give {user} one that runs without a login, from boot:\n  \
             sudo loginctl enable-linger {user}\n\
             then log in again (a new ssh session; or export XDG_RUNTIME_DIR=/run/user/$(id -u)) and run:\n  \
             systemctl --user daemon-reload && systemctl --user enable --now byomd\n\
             Or install a system service that runs byomd as {user}:\n  \
             sudo byomd{flags} service install --system\n\
             Or run it now, until the next reboot:\n  \
             nohup byomd{flags} run >byomd.log 2>&1 &"
        ),
        Scope::System => format!(
            "{why}: the unit is in place for when it is, or run byomd some other way (nohup byomd{flags} run &)"
        ),
    }
}

pub fn control_commands(
    platform: Platform,
    scope: Scope,
    action: &str,
) -> anyhow::Result<Vec<Vec<String>>> {
    let s = strings;
    Ok(match (platform, action) {
        (Platform::Linux, "start" | "stop" | "status") => {
            vec![systemctl(scope, &[action, "byomd"])]
        }
        (Platform::Linux, "uninstall") => {
            vec![systemctl(scope, &["disable", "--now", "byomd"])]
        }
        (Platform::Macos, "start") => vec![s(&[
            "launchctl",
            "kickstart",
            &format!("gui/{}/dev.byom.byomd", uid()),
        ])],
        (Platform::Macos, "stop" | "uninstall") => vec![s(&[
            "launchctl",
            "bootout",
            &format!("gui/{}/dev.byom.byomd", uid()),
        ])],
        (Platform::Macos, "status") => vec![s(&[
            "launchctl",
            "print",
            &format!("gui/{}/dev.byom.byomd", uid()),
        ])],
        (Platform::Windows, "start") => vec![s(&["sc.exe", "start", "byomd"])],
        (Platform::Windows, "stop") => vec![s(&["sc.exe", "stop", "byomd"])],
        (Platform::Windows, "status") => vec![s(&["sc.exe", "query", "byomd"])],
        (Platform::Windows, "uninstall") => vec![
            s(&["sc.exe", "stop", "byomd"]),
            s(&["sc.exe", "delete", "byomd"]),
        ],
        _ => bail!("unknown service action {action}"),
    })
}

pub fn service_file(platform: Platform) -> anyhow::Result<Option<PathBuf>> {
    Ok(match platform {
        Platform::Linux => Some(unit_path(Scope::User, None)?),
        Platform::Macos => Some(home()?.join("Library/LaunchAgents/dev.byom.byomd.plist")),
        Platform::Windows => None,
    })
}

/// A command that failed because no service manager answered it.
#[derive(Debug, thiserror::Error)]
#[error("`{command}` could not reach systemd: {stderr}")]
pub struct NoManager {
    command: String,
    stderr: String,
}

/// Runs one command, its stderr read and then passed on; a failure to reach the
/// manager ("Failed to connect to bus", "not been booted with systemd")
/// comes back as [`NoManager`], so the caller can say what to do.
fn run_command(c: &[String]) -> anyhow::Result<()> {
    let (prog, args) = c.split_first().context("empty command")?;
    use std::process::Stdio;
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|c| c.wait_with_output())
        .with_context(|| format!("cannot run {prog}"))?;
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.status.success() {
        if !err.is_empty() {
            eprintln!("{err}");
        }
        return Ok(());
    }
    let unreachable = ["connect to bus", "not been booted with systemd"];
    if prog == "systemctl" && unreachable.iter().any(|w| err.contains(w)) {
        return Err(NoManager {
            command: c.join(" "),
            stderr: err,
        }
        .into());
    }
    if !err.is_empty() {
        eprintln!("{err}");
    }
    bail!("`{}` failed ({})", c.join(" "), out.status)
}

fn write_files(plan: &Plan, dry_run: bool) -> anyhow::Result<()> {
    for (path, contents) in &plan.files {
        if dry_run {
            println!("# would write {}:", path.display());
            print!("{contents}");
            if !contents.ends_with('\n') {
                println!();
            }
        } else {
            byom_wire::write_atomic(path, contents.as_bytes(), 0o644)
                .with_context(|| format!("cannot write {}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// Prints (dry run) or carries out a plan.
pub fn execute(plan: &Plan, dry_run: bool) -> anyhow::Result<()> {
    write_files(plan, dry_run)?;
    for c in &plan.commands {
        if dry_run {
            println!("# would run: {}", c.join(" "));
        } else {
            run_command(c)?;
        }
    }
    for n in &plan.notes {
        println!("{}{n}", if dry_run { "# " } else { "" });
    }
    Ok(())
}

/// `byomd service …`. `config_dir` is the one given on the command line
/// (None for the default).
pub fn run(config_dir: Option<&Path>, cmd: ServiceCmd) -> anyhow::Result<i32> {
    let (opts, action, unit_dir) = match &cmd {
        ServiceCmd::Install { opts, unit, .. } => (opts, "install", unit.unit_dir.as_deref()),
        ServiceCmd::Uninstall { opts, unit } => (opts, "uninstall", unit.unit_dir.as_deref()),
        ServiceCmd::Start { opts } => (opts, "start", None),
        ServiceCmd::Stop { opts } => (opts, "stop", None),
        ServiceCmd::Status { opts } => (opts, "status", None),
    };
    let platform = opts.platform.unwrap_or_else(Platform::current);
    if !opts.dry_run && platform != Platform::current() {
        bail!("--platform other than this machine's only works with --dry-run");
    }
    if platform != Platform::Linux {
        if opts.system || unit_dir.is_some() {
            bail!("--system and --unit-dir are for Linux's systemd");
        }
        let plan = match cmd {
            ServiceCmd::Install { no_start, .. } => {
                install_plan(platform, &std::env::current_exe()?, config_dir, !no_start)?
            }
            _ => Plan {
                files: Vec::new(),
                commands: control_commands(platform, Scope::User, action)?,
                notes: Vec::new(),
            },
        };
        execute(&plan, opts.dry_run)?;
        if action == "uninstall" && !opts.dry_run {
            if let Some(f) = service_file(platform)? {
                let _ = std::fs::remove_file(&f);
                println!("removed {}", f.display());
            }
        }
        return Ok(0);
    }
    let scope = if opts.system {
        Scope::System
    } else {
        Scope::User
    };
    if scope == Scope::System && unit_dir.is_none() && !opts.dry_run && !is_root() {
        bail!(
            "a system service is installed and controlled by root: run `sudo byomd{} service {action} --system` (the service then runs byomd as you, not as root)",
            dir_flag(config_dir),
        );
    }
    let flags = dir_flag(config_dir);
    match cmd {
        ServiceCmd::Install { no_start, .. } => {
            let owner = match scope {
                Scope::System => Some(owner(config_dir)?),
                Scope::User => None,
            };
            let exe = std::env::current_exe()?;
            let plan = linux_plan(&exe, config_dir, owner.as_ref(), unit_dir, !no_start)?;
            if let Some(o) = &owner {
                warn_about_owner(o);
            }
            install(&plan, scope, opts.dry_run, no_start, &flags)
        }
        ServiceCmd::Uninstall { .. } => uninstall(scope, unit_dir, opts.dry_run),
        _ => {
            let plan = Plan {
                files: Vec::new(),
                commands: control_commands(platform, scope, action)?,
                notes: Vec::new(),
            };
            if !opts.dry_run {
                if let Some(why) = manager_missing(scope) {
                    bail!("{}", advice(scope, &why, &flags));
                }
            }
            match execute(&plan, opts.dry_run) {
                Err(e) if e.is::<NoManager>() => bail!("{}", advice(scope, &e.to_string(), &flags)),
                r => r.map(|_| 0),
            }
        }
    }
}

fn dir_flag(config_dir: Option<&Path>) -> String {
    config_dir
        .map(|d| format!(" --config-dir {}", d.display()))
        .unwrap_or_default()
}

/// A system unit runs without the owner's session: a key in the owner's
/// keyring is out of its reach, and an unpaired dir gives it nothing to do.
fn warn_about_owner(o: &Owner) {
    match crate::identity::Identity::load(&o.config_dir) {
        Ok(id) if id.key_store == crate::identity::KeyStore::Keyring => eprintln!(
            "byomd: warning: this machine's key is in {}'s OS keyring, which a system service cannot open without their session; pair again with `byomd pair --key-store file …` for a system service",
            o.user
        ),
        Ok(_) => {}
        Err(_) => eprintln!(
            "byomd: note: {} holds no pairing yet: pair as {} first (`byomd pair TOKEN`), or the service has nothing to connect with",
            o.config_dir.display(),
            o.user
        ),
    }
}

fn install(
    plan: &Plan,
    scope: Scope,
    dry_run: bool,
    no_start: bool,
    flags: &str,
) -> anyhow::Result<i32> {
    if dry_run || plan.commands.is_empty() {
        execute(plan, dry_run)?;
        return Ok(0);
    }
    // The unit is written either way: once a manager is there (lingering,
    // a new login), enabling it is all that is left.
    write_files(plan, false)?;
    let why = match manager_missing(scope) {
        Some(why) => why,
        None => match plan.commands.iter().try_for_each(|c| run_command(c)) {
            Ok(()) => {
                for n in &plan.notes {
                    println!("{n}");
                }
                return Ok(0);
            }
            Err(e) if e.is::<NoManager>() => e.to_string(),
            Err(e) => return Err(e),
        },
    };
    let text = advice(scope, &why, flags);
    if no_start {
        // Asked only to have the unit in place: done, and what is left is said.
        println!("the unit is written but not enabled: {text}");
        Ok(0)
    } else {
        bail!("the unit is written, but byomd is not started: {text}")
    }
}

fn uninstall(scope: Scope, unit_dir: Option<&Path>, dry_run: bool) -> anyhow::Result<i32> {
    let path = unit_path(scope, unit_dir)?;
    let disable = control_commands(Platform::Linux, scope, "uninstall")?;
    let reload = systemctl(scope, &["daemon-reload"]);
    let missing = if unit_dir.is_some() {
        Some("--unit-dir: no systemctl is run".to_string())
    } else {
        manager_missing(scope)
    };
    if dry_run {
        for c in disable.iter().chain([&reload]) {
            println!("# would run: {}", c.join(" "));
        }
        println!("# would remove {}", path.display());
        return Ok(0);
    }
    // Stopping needs the manager; removing the file does not, and a unit
    // left behind would start byomd again with the next session.
    let mut stopped = missing.is_none();
    if missing.is_none() {
        for c in &disable {
            if let Err(e) = run_command(c) {
                eprintln!("byomd: {e:#}; removing the unit anyway");
                stopped = false;
            }
        }
    }
    match std::fs::remove_file(&path) {
        Ok(()) => println!("removed {}", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("no unit at {}: nothing to remove", path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
    if missing.is_none() {
        let _ = run_command(&reload);
    }
    if !stopped {
        println!(
            "nothing was stopped ({}): if a byomd of this service still runs, stop it yourself",
            missing.as_deref().unwrap_or("systemctl failed")
        );
    }
    Ok(0)
}
