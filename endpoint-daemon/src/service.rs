//! `byomd service install|uninstall|start|stop|status`: byomd as a user
//! service — a systemd user unit on Linux, a launchd LaunchAgent on macOS, a
//! Windows service on Windows — rendered from the templates in
//! `installers/`. `--dry-run` prints exactly the files and commands.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

const SYSTEMD_TEMPLATE: &str = include_str!("../../installers/systemd/byomd.service");
const LAUNCHD_TEMPLATE: &str = include_str!("../../installers/launchd/dev.byom.byomd.plist");
const WINDOWS_TEMPLATE: &str = include_str!("../../installers/windows/install-service.ps1");

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

/// What installing means on a platform: files to write, commands to run.
pub struct Plan {
    pub files: Vec<(PathBuf, String)>,
    pub commands: Vec<Vec<String>>,
    pub notes: Vec<String>,
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

pub fn install_plan(
    platform: Platform,
    exe: &Path,
    config_dir: Option<&Path>,
    start: bool,
) -> anyhow::Result<Plan> {
    let args = run_args(exe, config_dir);
    Ok(match platform {
        Platform::Linux => {
            let unit = SYSTEMD_TEMPLATE.replace(
                "{{EXEC}}",
                &args
                    .iter()
                    .map(|a| systemd_quote(a))
                    .collect::<Vec<_>>()
                    .join(" "),
            );
            let path = home()?.join(".config/systemd/user/byomd.service");
            let mut commands = vec![vec![
                "systemctl".into(),
                "--user".into(),
                "daemon-reload".into(),
            ]];
            commands.push(if start {
                vec![
                    "systemctl".into(),
                    "--user".into(),
                    "enable".into(),
                    "--now".into(),
                    "byomd".into(),
                ]
            } else {
                vec![
                    "systemctl".into(),
                    "--user".into(),
                    "enable".into(),
                    "byomd".into(),
                ]
            });
            Plan {
                files: vec![(path, unit)],
                commands,
                notes: vec![format!(
                    "to keep byomd running after you log out: loginctl enable-linger {}",
                    std::env::var("USER").unwrap_or_else(|_| "$USER".into())
                )],
            }
        }
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

pub fn control_commands(platform: Platform, action: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    Ok(match (platform, action) {
        (Platform::Linux, "start" | "stop" | "status") => {
            vec![s(&["systemctl", "--user", action, "byomd"])]
        }
        (Platform::Linux, "uninstall") => {
            vec![s(&["systemctl", "--user", "disable", "--now", "byomd"])]
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
        Platform::Linux => Some(home()?.join(".config/systemd/user/byomd.service")),
        Platform::Macos => Some(home()?.join("Library/LaunchAgents/dev.byom.byomd.plist")),
        Platform::Windows => None,
    })
}

/// Prints (dry run) or carries out a plan.
pub fn execute(plan: &Plan, dry_run: bool) -> anyhow::Result<()> {
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
    for c in &plan.commands {
        if dry_run {
            println!("# would run: {}", c.join(" "));
        } else {
            let status = Command::new(&c[0])
                .args(&c[1..])
                .status()
                .with_context(|| format!("cannot run {}", c[0]))?;
            if !status.success() {
                bail!("`{}` failed ({status})", c.join(" "));
            }
        }
    }
    for n in &plan.notes {
        println!("{}{n}", if dry_run { "# " } else { "" });
    }
    Ok(())
}
