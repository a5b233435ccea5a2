use std::path::PathBuf;

use anyhow::Context;
use byom_daemon::identity::{self, Identity, KeyStoreChoice};
use clap::{CommandFactory as _, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "byomd",
    version = byom_protocol::version(),
    about = "byomd: lets the byom agent run commands on this machine"
)]
struct Cli {
    /// Where the identity (certificate, CA pin, server address, key file) lives.
    #[arg(long, env = "BYOMD_CONFIG_DIR", global = true)]
    config_dir: Option<PathBuf>,
    /// Log filter (e.g. info, debug).
    #[arg(long, env = "BYOMD_LOG", global = true, default_value = "info")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Pair this machine with a one-time token from `byom token create`.
    Pair {
        token: String,
        /// Machine name (default: the token's name, else this host's name).
        #[arg(long)]
        name: Option<String>,
        /// Dial this HOST:PORT instead of the address in the token.
        #[arg(long)]
        server: Option<String>,
        /// Where to keep the private key.
        #[arg(long, env = "BYOMD_KEY_STORE", value_enum, default_value = "auto")]
        key_store: KeyStoreChoice,
        /// Re-pair as machine M (a re-installed laptop): M is revoked and this
        /// machine takes its name and labels. Needs `byom token create --replace M`.
        #[arg(long, value_name = "M")]
        replace: Option<String>,
    },
    /// Connect to the server and run commands (use as a service).
    Run {
        /// Dial this HOST:PORT instead of the paired address; several,
        /// comma-separated (replicas of one server), are tried in turn.
        #[arg(long)]
        server: Option<String>,
        /// Label to report for this machine (k=v, repeatable); labels an
        /// admin set on the server win.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Internal: run as an upgrade's trial and write this file once
        /// connected (see `byomd upgrade`).
        #[arg(long, hide = true, value_name = "FILE")]
        upgrade_trial: Option<PathBuf>,
    },
    /// Install the byomd the server ships: checked against the manifest its
    /// CA signed, tried before it replaces this one, rolled back if it does
    /// not reconnect. Running commands finish first.
    Upgrade {
        /// Only say whether the server ships a newer byomd.
        #[arg(long)]
        check: bool,
        /// Do not wait for running commands: cancel them.
        #[arg(long)]
        now: bool,
        /// How long the new daemon has to reconnect before it is rolled back.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        within: std::time::Duration,
    },
    /// Show the identity, certificate, key store and connection state.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The local policy: what the server may run on this machine.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Secrets commands may use as {{secret:NAME}}; values never leave this machine.
    #[command(subcommand)]
    Secret(SecretCmd),
    /// What ran on this machine (the local audit log), newest last.
    Log {
        /// How many entries.
        #[arg(short = 'n', long, default_value_t = 50)]
        lines: usize,
        #[arg(long)]
        json: bool,
    },
    /// Commands waiting for your approval (policy `commands.confirm`).
    Pending {
        #[arg(long)]
        json: bool,
    },
    /// Let a waiting command run.
    Approve { id: String },
    /// Refuse a waiting command; it ends as `denied`.
    Deny { id: String },
    /// Check the config, key, certificate, policy, clock and UDP/TCP reachability.
    Doctor,
    /// Install byomd as a user service (systemd, launchd, Windows service),
    /// or with --system as a system service that runs as you.
    #[command(subcommand)]
    Service(byom_daemon::service::ServiceCmd),
    /// Kill switch: accept no new commands (queued ones wait on the server).
    Pause,
    /// Accept commands again after `byomd pause`.
    Resume,
    /// The OS sandbox every command runs in: what a command may touch.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Deregister from the server and wipe the local identity (just the
    /// wipe when the server already revoked or forgot this machine).
    Unpair {
        /// Wipe locally even if the server cannot be reached.
        #[arg(long)]
        force: bool,
    },
    /// Print the shell completion script for bash, zsh, fish, powershell
    /// or elvish (`byomd completions bash > ~/.local/share/bash-completion/completions/byomd`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print byomd's man page, or write every page into a directory
    /// (`byomd man --dir DIR`: byomd.1, byomd-service-install.1, …).
    Man {
        /// Where to write the pages (made if missing); without it, byomd.1
        /// goes to stdout.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum SecretCmd {
    /// Store a secret; the value is read from the terminal (not echoed) or stdin, never argv.
    Set {
        name: String,
        /// Only commands that run nothing but these programs may use it (repeat the flag).
        #[arg(long = "allow-program", value_name = "PROGRAM")]
        allow_program: Vec<String>,
        /// Every command that uses it waits for `byomd approve`.
        #[arg(long)]
        confirm: bool,
    },
    /// List secret names (never values).
    Ls,
    /// Delete a secret.
    Rm { name: String },
}

#[derive(Subcommand, Debug)]
enum SandboxCmd {
    /// Show what a command would be allowed to touch here (and with --run,
    /// run it in that sandbox): byomd sandbox check [--run] -- CMD ARGS
    Check {
        /// Working directory the command would get.
        #[arg(long, default_value = "")]
        cwd: String,
        /// Check a shell command line (as `byom exec --sh`).
        #[arg(long = "sh")]
        shell: Option<String>,
        /// As if an agent task sent it.
        #[arg(long = "from-agent")]
        from_agent: bool,
        /// As if an agent task that read untrusted text sent it.
        #[arg(long)]
        untrusted: bool,
        /// Run it in the sandbox here, on this terminal.
        #[arg(long)]
        run: bool,
        /// Also print the macOS Seatbelt profile of the same rules.
        #[arg(long)]
        profile: bool,
        #[arg(last = true)]
        argv: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCmd {
    /// Print the effective policy, its file and digest.
    Show,
    /// Explain what would happen to a command: byomd policy check [--cwd D] -- CMD ARGS
    Check {
        /// Working directory the command would get.
        #[arg(long, default_value = "")]
        cwd: String,
        /// Check a shell command line (as `byom exec --sh`).
        #[arg(long = "sh")]
        shell: Option<String>,
        /// Environment the command would get (repeat: --env K=V).
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// As if an agent sent it (the policy's [agents] rule applies).
        #[arg(long = "from-agent")]
        from_agent: bool,
        #[arg(last = true)]
        argv: Vec<String>,
    },
}

fn main() {
    // The sandbox helper is byomd itself, run again before anything else
    // (no threads, no runtime): see byom_daemon::sandbox::linux.
    #[cfg(target_os = "linux")]
    {
        use byom_daemon::sandbox::linux;
        match std::env::args_os().nth(1).as_ref().and_then(|a| a.to_str()) {
            Some(linux::HELPER_ARG) => linux::helper_main(),
            Some(linux::PROBE_ARG) => byom_daemon::sandbox::probe::probe_main(),
            _ => {}
        }
    }
    let cli = Cli::parse();
    if matches!(
        cli.cmd,
        Cmd::Status { .. } | Cmd::Policy(_) | Cmd::Log { .. } | Cmd::Pending { .. }
    ) {
        die_quietly_on_closed_stdout();
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let code = match real_main(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("byomd: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

/// A listing whose reader went away (`byomd log | head`) stops there, as
/// Unix tools do, instead of panicking on the closed pipe. Only for the
/// commands that just print: others write to sockets and children, where a
/// broken pipe must stay an error, not a silent death.
fn die_quietly_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: restoring the default action before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn real_main(cli: Cli) -> anyhow::Result<i32> {
    let dir = cli.config_dir.unwrap_or_else(identity::default_config_dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match cli.cmd {
        Cmd::Pair {
            token,
            name,
            server,
            key_store,
            replace,
        } => {
            let id = rt.block_on(byom_daemon::pair::pair(
                &dir,
                byom_daemon::pair::PairOptions {
                    token,
                    name,
                    server,
                    key_store,
                    replace,
                },
            ))?;
            println!(
                "paired as {} ({}) with {}",
                id.name, id.machine_id, id.server_addr
            );
            println!("key store: {}", key_store_name(&id));
            println!("start it with: byomd run{}", dir_flag(&dir));
            Ok(0)
        }
        Cmd::Upgrade { check, now, within } => rt.block_on(upgrade(&dir, check, now, within)),
        Cmd::Run {
            server,
            labels,
            upgrade_trial,
        } => {
            let shutdown = tokio_util::sync::CancellationToken::new();
            let s = shutdown.clone();
            rt.spawn(async move {
                byom_wire::shutdown_signal().await;
                s.cancel();
            });
            rt.block_on(byom_daemon::conn::run(
                byom_daemon::conn::RunOptions {
                    config_dir: dir,
                    server,
                    labels,
                    upgrade_trial,
                },
                shutdown,
            ))?;
            Ok(0)
        }
        Cmd::Status { json } => status(&dir, json),
        Cmd::Policy(p) => policy(&dir, p),
        #[cfg(unix)]
        Cmd::Sandbox(SandboxCmd::Check {
            cwd,
            shell,
            from_agent,
            untrusted,
            run,
            profile,
            argv,
        }) => {
            use byom_daemon::sandbox::Origin;
            byom_daemon::sandbox::check::check(
                &dir,
                byom_daemon::sandbox::check::Options {
                    cwd,
                    shell,
                    argv,
                    origin: match (untrusted, from_agent) {
                        (true, _) => Origin::Untrusted,
                        (false, true) => Origin::Agent,
                        _ => Origin::Admin,
                    },
                    run,
                    profile,
                },
            )
        }
        #[cfg(not(unix))]
        Cmd::Sandbox(_) => anyhow::bail!("byomd sandboxes commands on Linux only so far"),
        Cmd::Secret(c) => secret(&dir, c),
        Cmd::Log { lines, json } => {
            let recs = byom_daemon::audit::tail(&dir, lines);
            for r in recs {
                if json {
                    // Times in --json are RFC 3339, as everywhere.
                    let mut v = serde_json::to_value(&r)?;
                    if let Some(m) = v.as_object_mut() {
                        m.remove("at_ms");
                        m.insert("at".into(), byom_protocol::time::rfc3339(r.at_ms).into());
                    }
                    // Server-sent text may hide what ran: escape it.
                    println!("{}", byom_daemon::display::escape_json(&v.to_string()));
                } else {
                    let result = match (r.exit_code, r.signal) {
                        (Some(c), _) if r.state == "exited" => format!("exit {c}"),
                        (None, Some(s)) if r.state == "exited" => format!("signal {s}"),
                        _ => r.state.clone(),
                    };
                    let when = byom_protocol::time::rfc3339(r.at_ms);
                    // Server-sent text may hide what ran: escape it.
                    let e = byom_daemon::display::escape;
                    println!(
                        "{when}  {}  {:<10}  by {}  in {}  {}",
                        e(&r.id),
                        e(&result),
                        if r.requested_by.is_empty() {
                            "-".into()
                        } else {
                            e(&r.requested_by)
                        },
                        if r.cwd.is_empty() {
                            "-".into()
                        } else {
                            e(&r.cwd)
                        },
                        e(&r.command)
                    );
                }
            }
            Ok(0)
        }
        Cmd::Pending { json } => {
            let p = byom_daemon::approvals::pending(&dir);
            // Server-sent text may hide what would run: escape it.
            let e = byom_daemon::display::escape;
            if json {
                let text = serde_json::to_string_pretty(&p)?;
                println!("{}", byom_daemon::display::escape_json(&text));
            } else if p.is_empty() {
                println!("no command is waiting for approval");
            } else {
                for r in p {
                    let (id, cmd, cwd, rule) = (e(&r.id), e(&r.command), e(&r.cwd), e(&r.rule));
                    println!("{id}  {cmd}  (in {cwd}; {rule})");
                }
                println!("approve with `byomd approve ID`, refuse with `byomd deny ID`");
            }
            Ok(0)
        }
        Cmd::Approve { id } => {
            let r = byom_daemon::approvals::decide(&dir, &id, true)?;
            let e = byom_daemon::display::escape;
            println!("approved {}: {}", e(&r.id), e(&r.command));
            Ok(0)
        }
        Cmd::Deny { id } => {
            let r = byom_daemon::approvals::decide(&dir, &id, false)?;
            let e = byom_daemon::display::escape;
            println!("denied {}: {}", e(&r.id), e(&r.command));
            Ok(0)
        }
        Cmd::Service(c) => {
            let explicit = (dir != identity::default_config_dir()).then_some(dir.as_path());
            byom_daemon::service::run(explicit, c)
        }
        Cmd::Completions { shell } => {
            byom_daemon::docs::completions(Cli::command(), "byomd", shell);
            Ok(0)
        }
        Cmd::Man { dir } => byom_daemon::docs::man(Cli::command(), dir.as_deref()),
        Cmd::Doctor => {
            let checks = rt.block_on(byom_daemon::conn::doctor(&dir));
            let mut bad = 0;
            for c in &checks {
                if !c.ok {
                    bad += 1;
                }
                println!(
                    "{} {:<12} {}",
                    if c.ok { "ok  " } else { "FAIL" },
                    c.name,
                    c.detail
                );
            }
            Ok(if bad == 0 { 0 } else { 1 })
        }
        Cmd::Pause => {
            Identity::load(&dir)?;
            byom_wire::write_atomic(
                &byom_daemon::paused_flag(&dir),
                b"paused by the owner\n",
                0o644,
            )?;
            println!("paused: byomd takes no new commands; running ones go on (`byomd resume` to continue)");
            Ok(0)
        }
        Cmd::Resume => {
            match std::fs::remove_file(byom_daemon::paused_flag(&dir)) {
                Ok(()) => println!("resumed: byomd takes commands again"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    println!("byomd was not paused")
                }
                Err(e) => return Err(e.into()),
            }
            Ok(0)
        }
        Cmd::Unpair { force } => {
            use byom_daemon::unpair::Unpaired;
            let id = Identity::load(&dir)?;
            let done = match rt.block_on(byom_daemon::unpair::deregister(&dir, &id)) {
                Ok(Unpaired::Deregistered) => "deregistered from the server".to_string(),
                // Nothing left to undo there: the wipe is all unpairing is.
                Ok(Unpaired::AlreadyGone(why)) => {
                    format!("{why}, so there was nothing to deregister")
                }
                Err(e) if force => {
                    eprintln!("byomd: could not deregister from the server ({e:#}); wiping locally anyway");
                    "not deregistered (--force)".to_string()
                }
                Err(e) => {
                    return Err(e.context(
                        "could not deregister from the server; use --force to wipe locally anyway",
                    ))
                }
            };
            id.wipe(&dir)?;
            let _ = std::fs::remove_file(byom_daemon::conn::RunStatus::path(&dir));
            println!(
                "unpaired {} ({}): {done}; the local identity is wiped (pair again with `byomd pair TOKEN`)",
                id.name, id.machine_id
            );
            Ok(0)
        }
    }
}

/// `byomd upgrade`: asks the running daemon (which drains first) and
/// follows its progress, or upgrades the binary itself when none runs.
async fn upgrade(
    dir: &std::path::Path,
    check: bool,
    now: bool,
    within: std::time::Duration,
) -> anyhow::Result<i32> {
    use byom_daemon::upgrade as up;
    let id = Identity::load(dir)?;
    if check {
        let r = up::fetch_release(&id, &id.server_addr).await?;
        let mine = byom_protocol::version();
        if r.newer() {
            println!(
                "byomd {mine}; the server ships {}: `byomd upgrade` installs it",
                r.manifest.version
            );
        } else {
            println!(
                "byomd {mine} is current (the server ships {})",
                r.manifest.version
            );
        }
        return Ok(0);
    }
    let req = up::Request {
        now,
        within_ms: within.as_millis() as u64,
        at_ms: byom_daemon::now_ms(),
    };
    if !byom_daemon::conn::running(dir) {
        // No daemon to drain or restart: swap the binary after a trial,
        // which already proved the new one connects.
        if up::stage_and_try(dir, None, &req).await.is_some() {
            if let Some(mut st) = up::state(dir) {
                st.state = "done".into();
                st.detail = format!("installed byomd {}; it connected in its trial", st.to);
                up::set_state(dir, &st);
            }
        }
    } else {
        up::request(dir, &req)?;
        println!(
            "asked the running byomd to upgrade{}",
            if now {
                " now"
            } else {
                " once its commands finish"
            }
        );
    }
    // Follow the steps until one is final (bounded: a drain waits for
    // commands, which have their own limits).
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(6 * 3600);
    let mut last = None;
    while std::time::Instant::now() < give_up {
        if let Some(st) = up::state(dir).filter(|s| s.request_at_ms == req.at_ms) {
            if last.as_ref() != Some(&(st.state.clone(), st.detail.clone())) {
                println!("{}: {}", st.state.replace('_', " "), st.detail);
                last = Some((st.state.clone(), st.detail.clone()));
            }
            if st.finished() {
                return Ok(if matches!(st.state.as_str(), "done" | "up_to_date") {
                    0
                } else {
                    1
                });
            }
            // The exec'd daemon takes the lock back at once; none after
            // the deadline means no service manager restarted it.
            if st.state == "swapped"
                && byom_daemon::now_ms() > st.deadline_ms + 5_000
                && !byom_daemon::conn::running(dir)
            {
                println!("installed; start byomd again (`byomd run` or your service) to finish");
                return Ok(0);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    anyhow::bail!(
        "the upgrade did not finish; see `byomd status` and {}",
        dir.join("upgrade.json").display()
    )
}

fn dir_flag(dir: &std::path::Path) -> String {
    if dir == identity::default_config_dir() {
        String::new()
    } else {
        format!(" --config-dir {}", dir.display())
    }
}

fn key_store_name(id: &Identity) -> &'static str {
    match id.key_store {
        identity::KeyStore::Keyring => "OS keyring",
        identity::KeyStore::File => "0600 file in the config dir (no usable OS keyring)",
    }
}

fn status(dir: &std::path::Path, json: bool) -> anyhow::Result<i32> {
    let id = Identity::load(dir)?;
    let validity = byom_daemon::tls::cert_validity(&id.cert_pem);
    let run = byom_daemon::conn::RunStatus::load(dir).filter(|_| byom_daemon::conn::running(dir));
    let now = byom_daemon::now_ms();
    let paused = byom_daemon::is_paused(dir);
    let connection = match (&run, id.revoked) {
        (_, true) => "revoked by the server: run `byomd unpair`, then pair again".to_string(),
        (Some(r), _) if paused => format!(
            "paused by you (`byomd resume` to continue); {} (pid {})",
            r.state, r.pid
        ),
        (None, _) => format!(
            "stopped; start it with `byomd run`{} (or `byomd service install` to keep it running)",
            if dir == byom_daemon::identity::default_config_dir() {
                String::new()
            } else {
                format!(" --config-dir {}", dir.display())
            }
        ),
        (Some(r), _) if r.state == "connected" => format!(
            "connected since {}s (pid {})",
            (now.saturating_sub(r.since_ms)) / 1000,
            r.pid
        ),
        (Some(r), _) => format!(
            "{} (pid {}){}",
            r.state,
            r.pid,
            if r.last_error.is_empty() {
                String::new()
            } else {
                format!(": {}", r.last_error)
            }
        ),
    };
    let expiry = match validity {
        Some((na, _)) if na > now => format!(
            "valid for {}h more (renewed automatically)",
            (na - now) / 3_600_000
        ),
        Some(_) => "expired: `byomd run` renews it with the existing key on connect".to_string(),
        None => "unreadable".to_string(),
    };
    if json {
        let v = serde_json::json!({
            "machine_id": id.machine_id, "name": id.name, "server": id.server_addr,
            "cert_not_after": validity.map(|v| byom_protocol::time::rfc3339(v.0)), "key_store": id.key_store,
            "config_dir": dir.display().to_string(), "revoked": id.revoked,
            "running": run.is_some(), "state": run.as_ref().map(|r| r.state.clone()), "paused": paused,
            "last_error": run.as_ref().map(|r| r.last_error.clone()), "connection": connection,
            "version": byom_protocol::version(), "upgrade": byom_daemon::upgrade::state(dir),
            "sandbox": run.as_ref().map(|r| r.sandbox.clone()),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("machine:      {} ({})", id.name, id.machine_id);
        println!("server:       {}", id.server_addr);
        println!("certificate:  {expiry}");
        println!("key store:    {}", key_store_name(&id));
        println!("config dir:   {}", dir.display());
        println!("connection:   {connection}");
        match run.as_ref().map(|r| r.sandbox.as_str()) {
            Some(s) if !s.is_empty() => println!("sandbox:      {s}"),
            _ => {
                println!("sandbox:      (byomd is not running; `byomd doctor` checks this kernel)")
            }
        }
        if let Some(u) = byom_daemon::upgrade::state(dir) {
            println!(
                "last upgrade: {} {}: {}",
                u.state.replace('_', " "),
                byom_protocol::time::rfc3339(u.at_ms),
                u.detail
            );
        }
    }
    Ok(0)
}

/// A `--label k=v`, checked as the server checks it.
fn parse_label(s: &str) -> Result<(String, String), String> {
    let Some((k, v)) = s.split_once('=') else {
        return Err(format!("expected KEY=VALUE, got {s:?}"));
    };
    byom_protocol::names::check_label(k, v).map_err(|e| e.to_string())?;
    Ok((k.to_string(), v.to_string()))
}

fn policy(dir: &std::path::Path, cmd: PolicyCmd) -> anyhow::Result<i32> {
    use byom_daemon::policy::{Decision, Policy};
    let p = Policy::load(dir)?;
    match cmd {
        PolicyCmd::Show => {
            let source = if p.path.exists() {
                p.path.display().to_string()
            } else {
                format!("built-in default ({} does not exist)", p.path.display())
            };
            println!("# policy: {source}");
            println!("# digest: {}", p.digest);
            println!("# summary: {}", p.summary());
            print!("{}", toml::to_string(&p.file).unwrap_or_default());
            Ok(0)
        }
        PolicyCmd::Check {
            cwd,
            shell,
            env,
            from_agent,
            argv,
        } => {
            if shell.is_none() && argv.is_empty() {
                anyhow::bail!("give a command: byomd policy check -- CMD ARGS (or --sh 'LINE')");
            }
            let shell = shell.unwrap_or_default();
            let env = env
                .iter()
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => Ok((k.to_string(), v.to_string())),
                    None => Err(anyhow::anyhow!("--env wants K=V, got {kv:?}")),
                })
                .collect::<anyhow::Result<std::collections::HashMap<_, _>>>()?;
            let req = byom_daemon::policy::Request {
                argv: &argv,
                shell: &shell,
                cwd: &cwd,
                env: Some(&env),
                stdin: &[],
                timeout: None,
                requested_by: if from_agent { "wrk_policy_check" } else { "" },
                ..Default::default()
            };
            match p.check(&req) {
                Ok(Decision::Allow {
                    cwd,
                    timeout,
                    scrub,
                    confirm,
                    run_as,
                }) => {
                    match &confirm {
                        Some(rule) => println!(
                            "allowed after your approval (`byomd approve ID`): runs in {}; {rule}",
                            cwd.display()
                        ),
                        None => println!("allowed: runs in {}", cwd.display()),
                    }
                    if let Some(t) = timeout {
                        println!("  killed after {} at most", humantime::format_duration(t));
                    }
                    if !scrub.is_empty() {
                        println!("  environment scrubbed: {}", scrub.join(", "));
                    }
                    if let Some(r) = run_as {
                        println!("  runs as {} (uid {})", r.user, r.uid);
                    }
                    Ok(0)
                }
                Ok(Decision::Deny { rule }) => {
                    println!("denied: {rule}");
                    Ok(2)
                }
                Err(msg) => {
                    println!("fails: {msg}");
                    Ok(2)
                }
            }
        }
    }
}

/// Reads a line from the terminal with echo off.
#[cfg(unix)]
fn read_hidden(prompt: &str) -> anyhow::Result<String> {
    use std::io::{BufRead, Write};
    use std::os::fd::AsRawFd;
    let stdin = std::io::stdin();
    let fd = stdin.as_raw_fd();
    eprint!("{prompt}");
    std::io::stderr().flush()?;
    // SAFETY: termios calls on our own stdin; the old settings are restored.
    let mut old: libc::termios = unsafe { std::mem::zeroed() };
    let have = unsafe { libc::tcgetattr(fd, &mut old) } == 0;
    if have {
        let mut t = old;
        t.c_lflag &= !libc::ECHO;
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) };
    }
    let mut line = String::new();
    let r = stdin.lock().read_line(&mut line);
    if have {
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &old) };
    }
    eprintln!();
    r?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

#[cfg(not(unix))]
fn read_hidden(prompt: &str) -> anyhow::Result<String> {
    eprint!("{prompt}");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

fn secret(dir: &std::path::Path, cmd: SecretCmd) -> anyhow::Result<i32> {
    use std::io::{IsTerminal, Read};
    match cmd {
        SecretCmd::Set {
            name,
            allow_program,
            confirm,
        } => {
            let value = if std::io::stdin().is_terminal() {
                read_hidden(&format!("value for {name}: "))?
            } else {
                let mut v = String::new();
                std::io::stdin()
                    .take(byom_daemon::secrets::MAX_VALUE_LEN as u64 + 2)
                    .read_to_string(&mut v)?;
                v.strip_suffix('\n')
                    .map(|x| x.strip_suffix('\r').unwrap_or(x).to_string())
                    .unwrap_or(v)
            };
            let rule = byom_daemon::secrets::SecretRule {
                allow_programs: allow_program,
                confirm,
            };
            let restricted = rule.describe();
            let kind = byom_daemon::secrets::set(dir, &name, &value, rule)?;
            let store = match kind {
                identity::KeyStore::Keyring => "the OS keyring",
                identity::KeyStore::File => "a 0600 file in the config dir",
            };
            println!("stored {name} in {store}; commands can use {{{{secret:{name}}}}}");
            if !restricted.is_empty() {
                println!("  used {restricted}");
            }
            Ok(0)
        }
        SecretCmd::Ls => {
            for (n, rule) in byom_daemon::secrets::list(dir)? {
                match rule {
                    Some(r) => println!("{n}\t(used {})", r.describe()),
                    None => println!("{n}"),
                }
            }
            Ok(0)
        }
        SecretCmd::Rm { name } => {
            if byom_daemon::secrets::remove(dir, &name)? {
                println!("removed {name}");
                Ok(0)
            } else {
                anyhow::bail!("no secret named {name}: see `byomd secret ls`")
            }
        }
    }
}
