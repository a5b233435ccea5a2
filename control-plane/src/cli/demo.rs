//! `byom demo`: the whole story on one laptop, in a temp dir, on free
//! loopback ports, offline with the scripted model: a real `byom server`, a
//! real `byomd` paired with a fresh one-time token, commands streamed back,
//! one queued while the daemon is down; then the agent: a chat message
//! becomes a task on the laptop, a follow-up passes through to its worker,
//! a program spawns three subagents and asks for approval, the server is
//! killed during the pause and restarted, the approval comes from the CLI,
//! and the program continues; last, asked in chat, the worker opens a PR on
//! a simulated GitHub and watches it, and a review comment on the PR comes
//! back to it and is answered in both places. Cleans up after itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use byom_protocol::pb::{self, CommandState};

use byom_api::{Client, Seen, WatchOptions};

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
    bail!("cannot find the byomd binary next to {} or on PATH: build it with `cargo build -p byom-daemon`", me.display())
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
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let watch = byom_api::watch_to_end(c, id, WatchOptions::default(), |seen| {
        if let Seen::Output(o) = seen {
            if o.stream == pb::OutputStream::Stderr as i32 {
                err.extend_from_slice(&o.data);
            } else {
                out.extend_from_slice(&o.data);
            }
        }
    });
    let end = match tokio::time::timeout(STEP_TIMEOUT, watch).await {
        Err(_) => bail!("{id} did not finish in time"),
        Ok(r) => r?,
    };
    let Some(st) = end else {
        bail!("lost the server while waiting for {id}");
    };
    Ok((
        st,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    ))
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
    let r = byom_protocol::random::bytes::<6>();
    let p = std::env::temp_dir().join(format!("byom-demo-{}", byom_wire::hex(&r)));
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

    println!("1. start `byom server` on free loopback ports (scripted model: offline, not a language model)");
    let data = dir.join("server");
    let mut server = start_server(&me, &data, dir, None).await?;
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("server.json"))?)?;
    println!(
        "   QUIC for daemons on {}, admin API on {}",
        info["quic_addr"].as_str().unwrap_or("?"),
        info["api_addr"].as_str().unwrap_or("?")
    );
    let creds = byom_api::load_creds(Some(&data.join("admin")), None)?;
    let mut c = byom_api::connect(&creds).await?;

    println!("\n2. `byom token create --name demo-laptop --label demo=yes`");
    let tok = c
        .create_token(pb::CreateTokenRequest {
            replace: String::new(),
            ttl_ms: 600_000,
            name: "demo-laptop".into(),
            labels: [("demo".to_string(), "yes".to_string())].into(),
            idempotency_key: byom_api::new_key(),
            ..Default::default()
        })
        .await?
        .into_inner();
    println!(
        "   one-time token {} (carries the server address and the CA fingerprint)",
        tok.token.map(|t| t.id).unwrap_or_default()
    );

    println!("\n3. `byomd pair TOKEN`: key made locally, CSR sent, certificate received");
    let mut pair = Command::new(&byomd);
    pair.arg("--config-dir")
        .arg(dir.join("daemon"))
        .args(["pair", &tok.secret, "--key-store", "file"])
        .env("BYOMD_LOG", "warn");
    let out = run_ok(&mut pair, "byomd pair")?;
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
    // Beneath the policy, the kernel: byomd's own files are out of reach
    // of anything a command does.
    let sandbox = c
        .get_machine(pb::MachineRef {
            machine: "demo-laptop".into(),
        })
        .await?
        .into_inner()
        .machine
        .unwrap_or_default()
        .sandbox;
    let policy_file = dir.join("daemon").join("policy.toml");
    if sandbox.starts_with("none") {
        println!("   no OS sandbox here: {sandbox}");
    } else {
        let (cmd, o, e) = run_cmd(
        &mut c,
        "demo-laptop",
        pb::CreateCommandRequest {
            shell: format!(
                "printf '[commands]\\nallow = []\\n' > {0} || echo \"the laptop's sandbox ({sandbox}) kept {0} out of reach\"",
                policy_file.display()
            ),
            ..Default::default()
        },
    )
    .await?;
        show(
            "a command tries to rewrite the laptop's policy file",
            &cmd,
            &o,
            &e,
        );
    }

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
        "   {} commands so far, nothing lost, nothing run twice",
        cmds.len()
    );

    agent_story(&me, &data, dir, &mut server, &info).await?;
    println!("\nCleaning up.");
    Ok(())
}

/// Starts `byom server` on `addrs` (quic, api, webhook) or free ports, and
/// waits until it serves.
async fn start_server(
    me: &Path,
    data: &Path,
    dir: &Path,
    addrs: Option<(String, String, String)>,
) -> anyhow::Result<Proc> {
    let (q, a, w) = addrs.unwrap_or_else(|| {
        (
            "127.0.0.1:0".into(),
            "127.0.0.1:0".into(),
            "127.0.0.1:0".into(),
        )
    });
    let _ = std::fs::remove_file(data.join("server.json"));
    let server = Command::new(me)
        .arg("server")
        .arg("--data-dir")
        .arg(data)
        .args([
            "--listen-quic",
            &q,
            "--listen-api",
            &a,
            "--listen-webhook",
            &w,
        ])
        .args([
            "--model",
            "scripted",
            "--scripted-latency",
            "150ms,10us,2ms",
        ])
        .stdin(Stdio::null())
        .stdout(log_file(dir, "server.out")?)
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("server.log"))?,
        ))
        .spawn()
        .context("cannot start byom server")?;
    let p = Proc(server, "byom server");
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
    Ok(p)
}

/// The chat thread as the demo watches it: prints each new message once.
struct Timeline {
    start: Instant,
    seen: std::collections::HashSet<String>,
    bot_replies: usize,
}

impl Timeline {
    async fn poll(&mut self, c: &mut Client) -> anyhow::Result<()> {
        let v = super::agent::thread(c, "demo").await?;
        for m in v["messages"].as_array().cloned().unwrap_or_default() {
            let id = m["id"].as_str().unwrap_or("").to_string();
            if !self.seen.insert(id) {
                continue;
            }
            let bot = m["from_bot"].as_bool() == Some(true);
            if bot {
                self.bot_replies += 1;
            }
            let who = if bot {
                "byom"
            } else {
                m["user"].as_str().unwrap_or("?")
            };
            let text = crate::cli::safe(m["text"].as_str().unwrap_or(""));
            println!(
                "   [{:>6.2}s] {who:>4} › {}",
                self.start.elapsed().as_secs_f64(),
                text.replace('\n', "\n                     ")
            );
        }
        Ok(())
    }

    /// Waits until the thread has `n` replies from the agent in all.
    async fn replies(&mut self, c: &mut Client, n: usize) -> anyhow::Result<()> {
        let t = Instant::now();
        while self.bot_replies < n {
            if t.elapsed() > STEP_TIMEOUT {
                bail!(
                    "the agent did not reply in time (had {} of {n} replies)",
                    self.bot_replies
                );
            }
            self.poll(c).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

async fn say(c: &mut Client, text: &str) -> anyhow::Result<()> {
    c.send_event(pb::SendEventRequest {
        source: "chat".into(),
        thread: "demo".into(),
        user: "ada".into(),
        text: text.into(),
        mention: true,
        from_bot: false,
        idempotency_key: byom_api::new_key(),
        kind: "chat".into(),
        ..Default::default()
    })
    .await?;
    Ok(())
}

async fn agent_story(
    me: &Path,
    data: &Path,
    dir: &Path,
    server: &mut Proc,
    info: &serde_json::Value,
) -> anyhow::Result<()> {
    use super::agent;
    let creds = byom_api::load_creds(Some(&data.join("admin")), None)?;
    let mut c = byom_api::connect(&creds).await?;
    let mut tl = Timeline {
        start: Instant::now(),
        seen: Default::default(),
        bot_replies: 0,
    };

    println!("\n9. the agent: a chat message asks for work on the paired laptop (`byom chat`)");
    say(&mut c, "please run `uname -s` on demo-laptop").await?;
    tl.replies(&mut c, 2).await?;
    let tasks = agent::workers(&c, false).await?;
    let task = tasks[0]["id"].as_str().unwrap_or("").to_string();
    println!("   the Router made worker {task}; it ran the command on demo-laptop and reported");

    println!("\n10. a follow-up in the same thread passes straight through to that worker");
    say(&mut c, "also run `date +%A` on demo-laptop").await?;
    tl.replies(&mut c, 3).await?;
    let r = agent::router(&c).await?;
    println!(
        "   router: {} events, {} passed through without a Router decision",
        r["stats"]["events"], r["stats"]["passed_through"]
    );

    println!("\n11. a program: three subagents in parallel, then a human's approval");
    say(
        &mut c,
        "check `uptime`, `df -h /` and `uname -r` in parallel, then ask me before running `echo cleaned up`",
    )
    .await?;
    tl.replies(&mut c, 4).await?;
    let workers = agent::workers(&c, true).await?;
    for w in workers.as_array().cloned().unwrap_or_default() {
        if w["parent"].as_str() == Some(task.as_str()) {
            println!(
                "   subagent {} ({}): {}",
                w["id"].as_str().unwrap_or(""),
                w["status"].as_str().unwrap_or(""),
                w["task"].as_str().unwrap_or("")
            );
        }
    }
    let approvals = agent::approvals(&c, false).await?;
    let apr = approvals[0]["id"].as_str().unwrap_or("").to_string();
    println!("   the program is paused on {apr}; its interpreter is a snapshot in the store");

    println!("\n12. kill -9 the server during the pause, start it again");
    let _ = server.0.kill();
    let _ = server.0.wait();
    let addrs = (
        info["quic_addr"]
            .as_str()
            .unwrap_or("127.0.0.1:0")
            .to_string(),
        info["api_addr"]
            .as_str()
            .unwrap_or("127.0.0.1:0")
            .to_string(),
        info["webhook_addr"]
            .as_str()
            .unwrap_or("127.0.0.1:0")
            .to_string(),
    );
    *server = start_server(me, data, dir, Some(addrs)).await?;
    let mut c = byom_api::connect(&creds).await?;
    let open = agent::approvals(&c, false).await?;
    println!(
        "   back up; `byom approvals ls` still shows {} open approval(s)",
        open.as_array().map(|a| a.len()).unwrap_or(0)
    );

    println!("\n13. `byom approvals approve {apr}`: the program is restored and continues");
    // Through the real CLI, as a person would.
    let mut approve = Command::new(me);
    approve
        .args(["approvals", "approve", &apr])
        .env("BYOM_CREDS", data.join("admin"))
        .env_remove("BYOM_API")
        .stdin(Stdio::null());
    let out = run_ok(&mut approve, "byom approvals approve")?;
    print!("   {}", String::from_utf8_lossy(&out.stdout));
    tl.replies(&mut c, 5).await?;

    pr_story(&mut c, &mut tl, info).await?;

    let tasks = agent::workers(&c, false).await?;
    let workers = agent::workers(&c, true).await?;
    let r = agent::router(&c).await?;
    let st = &r["stats"];
    let mut tokens = (0u64, 0u64, 0u64);
    for w in workers.as_array().cloned().unwrap_or_default() {
        tokens.0 += w["usage"]["input_tokens"].as_u64().unwrap_or(0);
        tokens.1 += w["usage"]["cache_read_tokens"].as_u64().unwrap_or(0);
        tokens.2 += w["usage"]["output_tokens"].as_u64().unwrap_or(0);
    }
    println!("\nsummary");
    println!(
        "   tasks {}, workers {} (subagents included), router turns {}, decisions {}, replies {}",
        tasks.as_array().map(|a| a.len()).unwrap_or(0),
        workers.as_array().map(|a| a.len()).unwrap_or(0),
        st["turns"],
        st["decisions"],
        st["replies"]
    );
    println!(
        "   router tokens {} in ({} from the prefix cache), {} out; workers {} in ({} cached), {} out",
        st["usage"]["input_tokens"],
        st["usage"]["cache_read_tokens"],
        st["usage"]["output_tokens"],
        tokens.0,
        tokens.1,
        tokens.2
    );
    println!("   the server was killed once mid-task; nothing was lost and nothing ran twice");
    println!("   see it yourself: byom threads show demo | byom tasks show {task}  (with --keep)");
    Ok(())
}

/// (path, body) of each comment the simulated GitHub took.
type Comments = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A stand-in for GitHub's REST API on loopback: it takes comments and
/// keeps them for the demo to show.
fn simulated_github() -> anyhow::Result<(String, Comments)> {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", l.local_addr()?);
    let comments: Comments = Default::default();
    let keep = comments.clone();
    std::thread::spawn(move || {
        for mut conn in l.incoming().flatten() {
            let Ok(clone) = conn.try_clone() else {
                continue;
            };
            let mut r = BufReader::new(clone);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0).min(1 << 20);
                }
            }
            let mut body = vec![0u8; len];
            let _ = r.read_exact(&mut body);
            let text = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["body"].as_str().map(str::to_string))
                .unwrap_or_default();
            let id = if let Ok(mut c) = keep.lock() {
                c.push((path, text));
                c.len()
            } else {
                0
            };
            let reply = format!("{{\"id\": {id}}}");
            let _ = write!(
                conn,
                "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    Ok((url, comments))
}

/// Waits until the simulated GitHub has `n` comments; prints the new ones.
async fn github_comments(
    comments: &std::sync::Mutex<Vec<(String, String)>>,
    shown: &mut usize,
    n: usize,
) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        let now: Vec<(String, String)> = comments.lock().map(|c| c.clone()).unwrap_or_default();
        for (path, text) in now.iter().skip(*shown) {
            let first = text
                .lines()
                .find(|l| !l.starts_with('#') && !l.starts_with("**") && !l.is_empty());
            println!(
                "   [GitHub] comment via {path}: {}",
                crate::cli::safe(first.unwrap_or(""))
            );
        }
        *shown = now.len();
        if now.len() >= n {
            return Ok(());
        }
        if t.elapsed() > STEP_TIMEOUT {
            bail!("no comment reached the simulated GitHub in time");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The channels story, offline: asked in chat, the worker opens a PR (on a
/// simulated GitHub) and watches it; a review comment on the PR comes back
/// to the same worker, which answers in both places.
async fn pr_story(
    c: &mut Client,
    tl: &mut Timeline,
    info: &serde_json::Value,
) -> anyhow::Result<()> {
    let (url, comments) = simulated_github()?;
    let secret = "demo-webhook-secret";
    c.connectors()
        .add_connector(pb::Connector {
            kind: "github".into(),
            name: "gh".into(),
            api_url: url,
            secret: secret.into(),
            token: "demo-token".into(),
            bot_login: "byom-bot".into(),
            // The owner lets the bot post on their repository unprompted
            // (`--post-to`): its results from the laptop may go there.
            post_to: vec!["acme/app".into()],
            ..Default::default()
        })
        .await?;
    println!("\n14. GitHub joins (`byom connectors add github gh --post-to acme/app …`, a simulated GitHub on loopback): asked in chat, the worker opens a PR and watches it");
    say(c, "please fix the README typo: run `echo opened https://github.com/acme/app/pull/7` on demo-laptop").await?;
    tl.replies(c, 6).await?;
    let mut shown = 0;
    github_comments(&comments, &mut shown, 1).await?;

    println!("\n15. a reviewer comments on the PR (a signed webhook to /github/gh): it reaches the same worker, which answers in both places");
    let review = serde_json::json!({"action": "created", "repository": {"full_name": "acme/app"},
        "pull_request": {"number": 7, "title": "Fix README typo"},
        "comment": {"id": 9001, "path": "README.md", "body": "please also run `echo review addressed` on demo-laptop",
                    "html_url": "https://github.com/acme/app/pull/7#discussion_r9001",
                    "user": {"login": "reviewer", "type": "User"}, "author_association": "MEMBER"},
        "sender": {"login": "reviewer", "type": "User"}})
    .to_string();
    let tag = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes()),
        review.as_bytes(),
    );
    let addr = info["webhook_addr"].as_str().unwrap_or("127.0.0.1:7445");
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "POST /github/gh HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nX-GitHub-Event: pull_request_review_comment\r\nX-GitHub-Delivery: demo-1\r\nX-Hub-Signature-256: sha256={}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{review}",
        byom_wire::hex(tag.as_ref()),
        review.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes()).await?;
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut s, &mut answer).await?;
    if !answer.starts_with("HTTP/1.1 202") {
        bail!(
            "the webhook was refused: {}",
            answer.lines().next().unwrap_or("")
        );
    }
    tl.replies(c, 7).await?;
    github_comments(&comments, &mut shown, 2).await?;
    let threads = super::agent::threads(c).await?;
    let pr = threads
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .find(|t| t["external"] == "acme/app#7");
    if let Some(pr) = pr {
        println!(
            "   thread {} (acme/app#7) is watched by {}: no new task, no Router decision for the review",
            pr["id"].as_str().unwrap_or("?"),
            crate::cli::safe(
                &pr["workers"]
                    .as_array()
                    .map(|w| w.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            )
        );
    }
    Ok(())
}

/// Runs a step of the demo as its own process; its stderr is the error.
fn run_ok(cmd: &mut Command, what: &str) -> anyhow::Result<std::process::Output> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out)
}
