//! `byom demo`: the whole machine path on one laptop, in a temp dir, on free
//! loopback ports: a real `byom server`, a real `byomd` paired with a fresh
//! one-time token, commands streamed back, one command queued while the
//! daemon is down and delivered when it returns. Cleans up after itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use byom_protocol::pb::{self, CommandState};

use crate::client::{self, Client};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Keep the temp dir (server data, daemon identity, logs) afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// How long the demo waits for any one step.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

struct Proc(Child, &'static str);

impl Proc {
    fn stop(&mut self) {
        #[cfg(unix)]
        // SAFETY: sending SIGTERM to our own child.
        unsafe {
            libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            tracing::debug!("stopping {}", self.1);
            self.stop();
        }
    }
}

fn find_byomd() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let sibling = me.with_file_name(format!("byomd{}", std::env::consts::EXE_SUFFIX));
    if sibling.exists() {
        return Ok(sibling);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let p = d.join("byomd");
            if p.exists() {
                return Ok(p);
            }
        }
    }
    bail!("cannot find the byomd binary next to {} or on PATH: build it with `cargo build --workspace`", me.display())
}

fn log_file(dir: &Path, name: &str) -> anyhow::Result<Stdio> {
    Ok(Stdio::from(std::fs::File::create(dir.join(name))?))
}

fn start_daemon(byomd: &Path, dir: &Path) -> anyhow::Result<Proc> {
    let child = Command::new(byomd)
        .args(["--config-dir"])
        .arg(dir.join("daemon"))
        .arg("run")
        .env("BYOMD_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log_file(dir, "daemon.out")?)
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("daemon.log"))?,
        ))
        .spawn()
        .context("cannot start byomd")?;
    Ok(Proc(child, "byomd"))
}

async fn wait_online(c: &mut Client, machine: &str, online: bool) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        let m = c
            .get_machine(pb::MachineRef {
                machine: machine.into(),
            })
            .await?
            .into_inner()
            .machine
            .unwrap_or_default();
        if m.online == online {
            return Ok(());
        }
        if t.elapsed() > STEP_TIMEOUT {
            bail!(
                "machine {machine} did not become {} in time",
                if online { "online" } else { "offline" }
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_cmd(
    c: &mut Client,
    machine: &str,
    req: pb::CreateCommandRequest,
) -> anyhow::Result<(pb::Command, String, String)> {
    let cmd = c
        .create_command(pb::CreateCommandRequest {
            machine: machine.into(),
            ..req
        })
        .await?
        .into_inner()
        .command
        .unwrap_or_default();
    wait_done(c, &cmd.id).await
}

async fn wait_done(c: &mut Client, id: &str) -> anyhow::Result<(pb::Command, String, String)> {
    let mut s = c
        .watch_command(pb::WatchCommandRequest {
            id: id.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let t = Instant::now();
    loop {
        let left = STEP_TIMEOUT.saturating_sub(t.elapsed());
        match tokio::time::timeout(left, s.message()).await {
            Err(_) => bail!("{id} did not finish in time"),
            Ok(m) => match m?.and_then(|e| e.event) {
                Some(pb::command_event::Event::Output(o))
                    if o.stream == pb::OutputStream::Stderr as i32 =>
                {
                    err.extend(o.data)
                }
                Some(pb::command_event::Event::Output(o)) => out.extend(o.data),
                Some(pb::command_event::Event::State(st)) if st.state().is_terminal() => {
                    return Ok((
                        st,
                        String::from_utf8_lossy(&out).into_owned(),
                        String::from_utf8_lossy(&err).into_owned(),
                    ));
                }
                Some(_) => {}
                None => bail!("lost the server while waiting for {id}"),
            },
        }
    }
}

fn show(label: &str, c: &pb::Command, out: &str, err: &str) {
    println!("  $ {label}");
    for l in out.lines() {
        println!("    | {l}");
    }
    for l in err.lines() {
        println!("    ! {l}");
    }
    let result = match (c.state(), c.exit_code) {
        (CommandState::Exited, Some(code)) => format!("exit {code}"),
        (s, _) => format!(
            "{}{}",
            s.name(),
            if c.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.reason)
            }
        ),
    };
    println!("    → {} {result} in {} ms", c.id, c.duration_ms);
}

pub async fn run(a: DemoArgs) -> anyhow::Result<i32> {
    let tmp = tempdir()?;
    let dir = tmp.path().to_path_buf();
    let result = demo(&dir).await;
    if a.keep {
        let kept = tmp.keep();
        println!("\nkept {}", kept.display());
    } else {
        drop(tmp);
    }
    result.map(|_| 0)
}

/// A temp dir removed on drop unless kept.
struct TempDir(Option<PathBuf>);
impl TempDir {
    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new("."))
    }
    fn keep(mut self) -> PathBuf {
        self.0.take().unwrap_or_default()
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}
fn tempdir() -> anyhow::Result<TempDir> {
    let mut r = [0u8; 6];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut r);
    let p = std::env::temp_dir().join(format!("byom-demo-{}", crate::pki::hex(&r)));
    std::fs::create_dir_all(&p)?;
    Ok(TempDir(Some(p)))
}

async fn demo(dir: &Path) -> anyhow::Result<()> {
    let me = std::env::current_exe()?;
    let byomd = find_byomd()?;
    println!(
        "byom demo: everything lives in {} and goes away at the end\n",
        dir.display()
    );

    println!("1. start `byom server` on free loopback ports");
    let data = dir.join("server");
    let server = Command::new(&me)
        .arg("server")
        .arg("--data-dir")
        .arg(&data)
        .args([
            "--listen-quic",
            "127.0.0.1:0",
            "--listen-api",
            "127.0.0.1:0",
            "--listen-webhook",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(log_file(dir, "server.out")?)
        .stderr(log_file(dir, "server.log")?)
        .spawn()
        .context("cannot start byom server")?;
    let _server = Proc(server, "byom server");
    let t = Instant::now();
    while !data.join("admin/api.json").exists() || !data.join("server.json").exists() {
        if t.elapsed() > STEP_TIMEOUT {
            bail!(
                "the server did not start; see {}",
                dir.join("server.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("server.json"))?)?;
    println!(
        "   QUIC for daemons on {}, admin API on {}",
        info["quic_addr"].as_str().unwrap_or("?"),
        info["api_addr"].as_str().unwrap_or("?")
    );
    let creds = client::load_creds(Some(&data.join("admin")), None)?;
    let mut c = client::connect(&creds).await?;

    println!("\n2. `byom token create --name demo-laptop --label demo=yes`");
    let tok = c
        .create_token(pb::CreateTokenRequest {
            replace: String::new(),
            ttl_ms: 600_000,
            name: "demo-laptop".into(),
            labels: [("demo".to_string(), "yes".to_string())].into(),
        })
        .await?
        .into_inner();
    println!(
        "   one-time token {} (carries the server address and the CA fingerprint)",
        tok.token.map(|t| t.id).unwrap_or_default()
    );

    println!("\n3. `byomd pair TOKEN`: key made locally, CSR sent, certificate received");
    let out = Command::new(&byomd)
        .arg("--config-dir")
        .arg(dir.join("daemon"))
        .args(["pair", &tok.secret, "--key-store", "file"])
        .env("BYOMD_LOG", "warn")
        .output()
        .context("cannot run byomd pair")?;
    if !out.status.success() {
        bail!(
            "byomd pair failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for l in String::from_utf8_lossy(&out.stdout).lines().take(2) {
        println!("   {l}");
    }
    let reuse = Command::new(&byomd)
        .arg("--config-dir")
        .arg(dir.join("daemon-2"))
        .args(["pair", &tok.secret, "--key-store", "file"])
        .env("BYOMD_LOG", "warn")
        .output()?;
    println!(
        "   pairing again with the same token: {}",
        String::from_utf8_lossy(&reuse.stderr)
            .trim()
            .trim_start_matches("byomd: ")
    );

    println!("\n4. `byomd run`: dials out over mutual-TLS QUIC");
    let mut daemon = start_daemon(&byomd, dir)?;
    wait_online(&mut c, "demo-laptop", true).await?;
    println!("   demo-laptop is online");

    println!("\n5. run commands on it");
    let (cmd, o, e) = run_cmd(
        &mut c,
        "demo-laptop",
        pb::CreateCommandRequest {
            argv: vec!["uname".into(), "-sm".into()],
            ..Default::default()
        },
    )
    .await?;
    show("uname -sm", &cmd, &o, &e);
    let (cmd, o, e) = run_cmd(
        &mut c,
        "demo-laptop",
        pb::CreateCommandRequest {
            shell: "echo to stdout; echo to stderr >&2; exit 3".into(),
            ..Default::default()
        },
    )
    .await?;
    show(
        "sh -c 'echo to stdout; echo to stderr >&2; exit 3'",
        &cmd,
        &o,
        &e,
    );
    let (cmd, o, e) = run_cmd(
        &mut c,
        "demo-laptop",
        pb::CreateCommandRequest {
            shell: "echo \"cwd=$(pwd) GREETING=$GREETING\"; cat".into(),
            cwd: "/tmp".into(),
            env: [("GREETING".to_string(), "hello".to_string())].into(),
            stdin: b"stdin reaches the command\n".to_vec(),
            ..Default::default()
        },
    )
    .await?;
    show(
        "cd /tmp; GREETING=hello sh -c '...; cat' <<< 'stdin reaches the command'",
        &cmd,
        &o,
        &e,
    );
    let (cmd, o, e) = run_cmd(
        &mut c,
        "demo-laptop",
        pb::CreateCommandRequest {
            argv: vec!["sleep".into(), "30".into()],
            timeout_ms: 500,
            ..Default::default()
        },
    )
    .await?;
    show("sleep 30 (with --timeout 500ms)", &cmd, &o, &e);

    let (cmd, o, e) = run_cmd(
        &mut c,
        "demo-laptop",
        pb::CreateCommandRequest {
            argv: vec!["sudo".into(), "id".into()],
            ..Default::default()
        },
    )
    .await?;
    show(
        "sudo id (the laptop's own policy says no; the server cannot change it)",
        &cmd,
        &o,
        &e,
    );

    println!("\n6. stop the daemon, queue a command for the offline machine");
    daemon.stop();
    wait_online(&mut c, "demo-laptop", false).await?;
    let queued = c
        .create_command(pb::CreateCommandRequest {
            machine: "demo-laptop".into(),
            shell: "echo delivered after the daemon came back at $(date +%T)".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .command
        .unwrap_or_default();
    let now = c
        .get_command(pb::CommandRef {
            id: queued.id.clone(),
        })
        .await?
        .into_inner()
        .command
        .unwrap_or_default();
    println!(
        "   {} is {} while demo-laptop is offline",
        now.id,
        now.state().name()
    );

    println!("\n7. start the daemon again: the queue is delivered");
    let _daemon = start_daemon(&byomd, dir)?;
    let (cmd, o, e) = wait_done(&mut c, &queued.id).await?;
    show(
        "echo delivered after the daemon came back ...",
        &cmd,
        &o,
        &e,
    );

    println!("\n8. `byom machines ls`");
    let ms = c
        .list_machines(pb::ListMachinesRequest::default())
        .await?
        .into_inner()
        .machines;
    for m in ms {
        println!(
            "   {}  {}  {}  {}/{}  labels: {:?}",
            m.id,
            m.name,
            if m.online { "online" } else { "offline" },
            m.os,
            m.arch,
            m.labels
        );
    }
    let cmds = c
        .list_commands(pb::ListCommandsRequest {
            limit: 20,
            ..Default::default()
        })
        .await?
        .into_inner()
        .commands;
    println!(
        "\n{} commands run, nothing lost, nothing run twice. Cleaning up.",
        cmds.len()
    );
    Ok(())
}
