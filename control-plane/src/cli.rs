//! The `byom` command line: verbs that read as sentences, tables for people,
//! `--json` for scripts, and errors that say what to do next.

use std::collections::HashMap;
use std::io::{IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use byom_protocol::pb::{self, CommandState};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use crate::client::{self, Client};

pub mod agents;
use crate::pki::now_ms;

#[derive(Parser, Debug)]
#[command(
    name = "byom",
    version,
    about = "byom: a super-agent in the cloud, its hands on your own machines"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Admin credentials directory (ca.pem, admin.pem, admin.key, api.json).
    /// Default: <data-dir>/admin of a server on this machine.
    #[arg(long, env = "BYOM_CREDS", global = true)]
    pub creds: Option<PathBuf>,
    /// Admin API address (HOST:PORT). Default: from the credentials dir.
    #[arg(long, env = "BYOM_API", global = true)]
    pub api: Option<String>,
    /// Log level filter for diagnostics on stderr (e.g. info, debug).
    #[arg(long, env = "BYOM_LOG", global = true, default_value = "warn")]
    pub log: String,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run the control plane (QUIC gateway for daemons, admin API).
    Server(ServerArgs),
    /// Pairing tokens for new machines.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Paired machines.
    #[command(subcommand, alias = "machine")]
    Machines(MachinesCmd),
    /// Run a command on a machine and stream its output.
    Exec(ExecArgs),
    /// Commands run or queued on machines.
    #[command(subcommand, alias = "command")]
    Commands(CommandsCmd),
    /// Events from channels (triggers): send one, list, follow.
    #[command(subcommand)]
    Events(EventsCmd),
    /// Natural-language policies the Router follows for candidate triggers.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Who ran what where: the command audit trail.
    #[command(subcommand)]
    Audit(AuditCmd),
    /// Show any object by ID (mch_, cmd_, tok_, trg_, thr_, wrk_, apr_, snp_) or a machine by name.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Start a server and a daemon in a temp dir, run commands, clean up.
    Demo(crate::demo::DemoArgs),
    /// Run JavaScript in the sandboxed code interpreter.
    #[command(subcommand)]
    Js(crate::js::JsCmd),
    /// Tasks the agent is working on (top-level workers).
    #[command(subcommand, alias = "task")]
    Tasks(agents::TasksCmd),
    /// Workers and subagents, with their transcripts.
    #[command(subcommand, alias = "worker")]
    Workers(agents::WorkersCmd),
    /// Conversations on channels, with the agent's replies.
    #[command(subcommand, alias = "thread")]
    Threads(agents::ThreadsCmd),
    /// Questions paused programs wait on: list, approve, deny.
    #[command(subcommand, alias = "approval")]
    Approvals(agents::ApprovalsCmd),
    /// The Router's figures: turns, decisions, tokens.
    Router {
        #[arg(long)]
        json: bool,
    },
    /// Talk to the agent on a chat thread from the terminal.
    Chat(agents::ChatArgs),
}

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Where the store, PKI and admin credentials live.
    #[arg(long, env = "BYOM_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// QUIC (UDP) address daemons connect to. Port 0 picks a free port.
    #[arg(long, default_value = "0.0.0.0:7443")]
    pub listen_quic: SocketAddr,
    /// Admin gRPC API address (TLS, admin certificate required).
    #[arg(long, default_value = "127.0.0.1:7444")]
    pub listen_api: SocketAddr,
    /// TCP address of the fallback for daemons whose UDP is blocked
    /// (default: the QUIC port number, on TCP).
    #[arg(long)]
    pub listen_tcp: Option<SocketAddr>,
    /// HTTP address for webhooks: POST /hooks/SOURCE with an HMAC-SHA256
    /// signature (key in <data-dir>/webhook.key).
    #[arg(long, default_value = "127.0.0.1:7445")]
    pub listen_webhook: SocketAddr,
    /// HOST:PORT daemons should dial, written into pairing tokens.
    #[arg(long)]
    pub public_addr: Option<String>,
    /// Lifetime of machine certificates (renewed automatically).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub cert_ttl: Duration,
    #[command(flatten)]
    pub models: ModelArgs,
}

/// Which model the agents use. Keys come from the environment only
/// (OPENAI_API_KEY, ANTHROPIC_API_KEY), never from flags.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model for the Router and the Workers: `scripted` (offline, rule-based,
    /// not a language model), `openai:NAME` or `anthropic:NAME`.
    #[arg(long, env = "BYOM_MODEL", default_value = "scripted")]
    pub model: String,
    /// Model for the Router only (a light, fast one), overriding --model.
    #[arg(long, env = "BYOM_ROUTER_MODEL")]
    pub router_model: Option<String>,
    /// Model for the Workers only (a strong one), overriding --model.
    #[arg(long, env = "BYOM_WORKER_MODEL")]
    pub worker_model: Option<String>,
    /// Base URL for openai: models (OpenAI, DeepSeek, vLLM, Ollama, llama.cpp).
    #[arg(
        long,
        env = "OPENAI_BASE_URL",
        default_value = "https://api.openai.com/v1"
    )]
    pub openai_base_url: String,
    /// Base URL for anthropic: models.
    #[arg(
        long,
        env = "ANTHROPIC_BASE_URL",
        default_value = "https://api.anthropic.com"
    )]
    pub anthropic_base_url: String,
    /// The scripted model's latency: BASE[,PER_NEW_INPUT_TOKEN,PER_OUTPUT_TOKEN].
    #[arg(long, env = "BYOM_SCRIPTED_LATENCY", default_value = "0ms")]
    pub scripted_latency: String,
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create a one-time pairing token.
    Create {
        #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Name for the machine that pairs with it.
        #[arg(long)]
        name: Option<String>,
        /// Labels for the machine (k=v, repeatable).
        #[arg(long = "label", value_parser = parse_kv)]
        labels: Vec<(String, String)>,
        /// Let a re-installed laptop take over machine M (`byomd pair --replace M`):
        /// the old identity is revoked, the new one gets its name and labels.
        #[arg(long, value_name = "M")]
        replace: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List tokens (unused and unexpired unless --all).
    Ls {
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Revoke an unused token.
    Revoke { id: String },
}

#[derive(Subcommand, Debug)]
pub enum MachinesCmd {
    /// List machines.
    Ls {
        /// Include revoked machines.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Show one machine (by ID or name).
    Show {
        machine: String,
        #[arg(long)]
        json: bool,
    },
    /// Rename a machine.
    Rename { machine: String, name: String },
    /// Set labels (k=v) and remove labels (--remove k).
    Label {
        machine: String,
        #[arg(value_parser = parse_kv)]
        set: Vec<(String, String)>,
        #[arg(long)]
        remove: Vec<String>,
    },
    /// Revoke a machine: closes its connection, kills its commands, refuses
    /// its certificate from now on.
    Revoke { machine: String },
}

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Machine ID or name (or use --label to pick one).
    #[arg(required_unless_present = "labels")]
    pub machine: Option<String>,
    /// Run on the least busy online machine with this label (k=v, repeatable).
    #[arg(long = "label", value_parser = parse_kv, conflicts_with = "machine")]
    pub labels: Vec<(String, String)>,
    /// Kill the command after this long (e.g. 30s, 5m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Working directory on the machine.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment variable (K=V, repeatable).
    #[arg(long = "env", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Send this process's stdin to the command.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Run a shell command line via `sh -c` instead of argv.
    #[arg(long = "sh", value_name = "COMMAND_LINE")]
    pub shell: Option<String>,
    /// Queue the command and print its ID instead of waiting.
    #[arg(long)]
    pub detach: bool,
    /// How long the command may wait for an offline machine.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub queue_ttl: Option<Duration>,
    /// Print the final command record as JSON instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Add a policy, e.g. "Ignore messages in #random unless someone asks for help".
    Add {
        text: String,
        #[arg(long)]
        json: bool,
    },
    /// List policies in the order the Router reads them.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove a policy.
    Rm { id: String },
}

fn policy_json(p: &pb::RouterPolicy) -> Value {
    json!({"id": p.id, "text": p.text, "created_at": rfc3339(p.created_at_ms), "created_by": p.created_by})
}

async fn policies(c: &mut Client, cmd: PolicyCmd) -> anyhow::Result<i32> {
    match cmd {
        PolicyCmd::Add { text, json } => {
            let p = c
                .add_policy(pb::AddPolicyRequest { text })
                .await?
                .into_inner()
                .policy
                .unwrap_or_default();
            if json {
                print_json(&policy_json(&p));
            } else {
                println!("added {}", p.id);
            }
        }
        PolicyCmd::Ls { json } => {
            let r = c
                .list_policies(pb::ListPoliciesRequest {})
                .await?
                .into_inner();
            if json {
                print_json(&Value::Array(r.policies.iter().map(policy_json).collect()));
            } else {
                table(
                    &["ID", "ADDED", "BY", "POLICY"],
                    r.policies
                        .iter()
                        .map(|p| {
                            vec![
                                p.id.clone(),
                                ago(p.created_at_ms),
                                or_dash(&p.created_by),
                                p.text.clone(),
                            ]
                        })
                        .collect(),
                );
            }
        }
        PolicyCmd::Rm { id } => {
            let p = c
                .remove_policy(pb::RemovePolicyRequest { id })
                .await?
                .into_inner()
                .policy
                .unwrap_or_default();
            println!("removed {}: {}", p.id, p.text);
        }
    }
    Ok(0)
}

#[derive(Subcommand, Debug)]
pub enum EventsCmd {
    /// Send an event as a user on a thread (a trigger).
    Send {
        #[arg(long, default_value = "cli")]
        source: String,
        #[arg(long)]
        thread: String,
        #[arg(long)]
        user: String,
        /// The agent is addressed (mention or direct message).
        #[arg(long)]
        mention: bool,
        /// The sender is a bot.
        #[arg(long)]
        bot: bool,
        text: String,
        #[arg(long)]
        json: bool,
    },
    /// Recent triggers, newest first.
    Ls {
        /// Only this thread (thr_… ID).
        #[arg(long)]
        thread: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// Follow triggers as they arrive.
    Tail {
        #[arg(long)]
        json: bool,
    },
}

pub fn trigger_json(t: &pb::Trigger) -> Value {
    let decision = match t.decision() {
        pb::TriggerDecision::Ignored => "ignored",
        pb::TriggerDecision::Candidate => "candidate",
        pb::TriggerDecision::Unspecified => "pending",
    };
    json!({
        "id": t.id, "thread_id": t.thread_id, "source": t.source, "user": t.user, "text": t.text,
        "mention": t.mention, "from_bot": t.from_bot, "created_at": rfc3339(t.created_at_ms),
        "decision": decision, "reason": t.reason,
    })
}

fn trigger_line(t: &pb::Trigger) -> String {
    let v = trigger_json(t);
    let mut text: String = t.text.chars().take(80).collect();
    if t.text.chars().count() > 80 {
        text.push('…');
    }
    format!(
        "{}  {}  {}/{}  {}{}: {}  [{}]",
        t.id,
        ago(t.created_at_ms),
        t.source,
        t.thread_id,
        t.user,
        if t.mention { " (@)" } else { "" },
        text,
        v["decision"].as_str().unwrap_or("")
    )
}

async fn events(c: &mut Client, cmd: EventsCmd) -> anyhow::Result<i32> {
    match cmd {
        EventsCmd::Send {
            source,
            thread,
            user,
            mention,
            bot,
            text,
            json,
        } => {
            let t = c
                .send_event(pb::SendEventRequest {
                    source,
                    thread,
                    user,
                    text,
                    mention,
                    from_bot: bot,
                })
                .await?
                .into_inner()
                .trigger
                .unwrap_or_default();
            if json {
                print_json(&trigger_json(&t));
            } else {
                println!(
                    "{} on {}: {} ({})",
                    t.id,
                    t.thread_id,
                    trigger_json(&t)["decision"].as_str().unwrap_or(""),
                    t.reason
                );
            }
        }
        EventsCmd::Ls {
            thread,
            limit,
            json,
        } => {
            let r = c
                .list_triggers(pb::ListTriggersRequest {
                    thread: thread.unwrap_or_default(),
                    limit,
                })
                .await?
                .into_inner();
            if json {
                print_json(&Value::Array(r.triggers.iter().map(trigger_json).collect()));
            } else {
                for t in &r.triggers {
                    println!("{}", trigger_line(t));
                }
            }
        }
        EventsCmd::Tail { json } => {
            let mut s = c
                .tail_triggers(pb::TailTriggersRequest {})
                .await?
                .into_inner();
            while let Some(t) = s.message().await? {
                if json {
                    println!("{}", trigger_json(&t));
                } else {
                    println!("{}", trigger_line(&t));
                }
                std::io::stdout().flush()?;
            }
        }
    }
    Ok(0)
}

#[derive(Subcommand, Debug)]
pub enum AuditCmd {
    /// Commands with who asked, where, what, and how it ended; newest first.
    Ls {
        #[arg(long)]
        machine: Option<String>,
        /// Only since this long ago (e.g. 1h, 7d) or this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
}

fn parse_since(s: &str) -> anyhow::Result<u64> {
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(now_ms().saturating_sub(d.as_millis() as u64));
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .with_context(|| format!("--since {s:?}: use a duration (1h, 7d) or an RFC 3339 time"))?;
    Ok((t.unix_timestamp_nanos() / 1_000_000).max(0) as u64)
}

async fn audit(c: &mut Client, cmd: AuditCmd) -> anyhow::Result<i32> {
    let AuditCmd::Ls {
        machine,
        since,
        limit,
        json,
    } = cmd;
    let since_ms = match since {
        Some(s) => parse_since(&s)?,
        None => 0,
    };
    let r = c
        .list_commands(pb::ListCommandsRequest {
            machine: machine.unwrap_or_default(),
            state: 0,
            limit,
            since_ms,
        })
        .await?
        .into_inner();
    if json {
        let v: Vec<Value> = r
            .commands
            .iter()
            .map(|x| {
                json!({
                    "id": x.id, "requested_by": x.requested_by, "machine_id": x.machine_id,
                    "command": command_line(x), "cwd": x.cwd, "created_at": rfc3339(x.created_at_ms),
                    "started_at": rfc3339(x.started_at_ms), "finished_at": rfc3339(x.finished_at_ms),
                    "state": x.state().name(), "exit_code": x.exit_code, "signal": x.signal,
                    "stdout_bytes": x.stdout_bytes, "stderr_bytes": x.stderr_bytes, "reason": x.reason,
                })
            })
            .collect();
        print_json(&Value::Array(v));
        return Ok(0);
    }
    let names = machine_names(c).await?;
    table(
        &[
            "WHEN", "WHO", "MACHINE", "RESULT", "OUT/ERR", "CWD", "COMMAND",
        ],
        r.commands
            .iter()
            .map(|x| {
                vec![
                    ago(x.created_at_ms),
                    or_dash(&x.requested_by),
                    names
                        .get(&x.machine_id)
                        .cloned()
                        .unwrap_or_else(|| x.machine_id.clone()),
                    if x.state().is_terminal() {
                        outcome(x)
                    } else {
                        x.state().name().to_string()
                    },
                    format!("{}/{}", x.stdout_bytes, x.stderr_bytes),
                    or_dash(&x.cwd),
                    command_line(x),
                ]
            })
            .collect(),
    );
    Ok(0)
}

#[derive(Subcommand, Debug)]
pub enum CommandsCmd {
    /// List commands, newest first.
    Ls {
        #[arg(long)]
        machine: Option<String>,
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// Show a command with its full output.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a queued or running command.
    Cancel { id: String },
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// One line for an error chain, with gRPC statuses shown by their message.
pub fn describe(e: &anyhow::Error) -> String {
    if let Some(s) = e.downcast_ref::<tonic::Status>() {
        return s.message().to_string();
    }
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = match cause.downcast_ref::<tonic::Status>() {
            Some(s) => s.message().to_string(),
            None => cause.to_string(),
        };
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

pub fn init_logging(filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// `byom … | head` closes stdout early; like other command-line tools,
/// stop quietly (exit 141, as for SIGPIPE) instead of reporting a panic.
/// SIGPIPE itself stays ignored so socket errors remain errors.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

pub fn main(cli: Cli) -> anyhow::Result<i32> {
    let log = match &cli.cmd {
        Cmd::Server(_) if cli.global.log == "warn" => "info".to_string(),
        _ => cli.global.log.clone(),
    };
    init_logging(&log);
    quiet_on_closed_stdout();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let g = cli.global;
    match cli.cmd {
        Cmd::Server(a) => {
            crate::server::run(crate::server::ServerOptions {
                data_dir: a.data_dir.unwrap_or_else(client::default_data_dir),
                listen_quic: a.listen_quic,
                listen_api: a.listen_api,
                listen_tcp: a.listen_tcp,
                listen_webhook: a.listen_webhook,
                public_addr: a.public_addr,
                cert_ttl: a.cert_ttl,
                models: a.models,
            })
            .await?;
            Ok(0)
        }
        Cmd::Demo(a) => crate::demo::run(a).await,
        Cmd::Js(j) => crate::js::run(j).await,
        cmd => {
            let creds = client::load_creds(g.creds.as_deref(), g.api.as_deref())?;
            let mut c = client::connect(&creds).await?;
            match cmd {
                Cmd::Token(t) => token(&mut c, t).await,
                Cmd::Machines(m) => machines(&mut c, m).await,
                Cmd::Exec(e) => exec(&mut c, e).await,
                Cmd::Commands(x) => commands(&mut c, x).await,
                Cmd::Audit(x) => audit(&mut c, x).await,
                Cmd::Events(x) => events(&mut c, x).await,
                Cmd::Policy(x) => policies(&mut c, x).await,
                Cmd::Show { id, json } => show(&mut c, &id, json).await,
                Cmd::Tasks(x) => agents::tasks(&mut c, x).await,
                Cmd::Workers(x) => agents::workers(&mut c, x).await,
                Cmd::Threads(x) => agents::threads(&mut c, x).await,
                Cmd::Approvals(x) => agents::approvals(&mut c, x).await,
                Cmd::Router { json } => agents::router(&mut c, json).await,
                Cmd::Chat(x) => agents::chat(&mut c, x).await,
                Cmd::Server(_) | Cmd::Demo(_) | Cmd::Js(_) => unreachable!("handled above"),
            }
        }
    }
}

// ───────────────────────── formatting ─────────────────────────

fn ago(ms: u64) -> String {
    if ms == 0 {
        return "never".into();
    }
    let now = now_ms();
    if ms > now {
        return format!("in {}", human(ms - now));
    }
    format!("{} ago", human(now - ms))
}

fn human(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn rfc3339(ms: u64) -> Value {
    if ms == 0 {
        return Value::Null;
    }
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000);
    match t.ok().and_then(|t| {
        t.format(&time::format_description::well_known::Rfc3339)
            .ok()
    }) {
        Some(s) => Value::String(s),
        None => Value::Null,
    }
}

fn labels(l: &HashMap<String, String>) -> String {
    let mut v: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
    v.sort();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{:width$}  ", c, width = w[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(headers.iter().map(|s| s.to_string()).collect());
    for r in rows {
        line(r);
    }
}

pub fn machine_json(m: &pb::Machine) -> Value {
    json!({
        "id": m.id, "name": m.name, "labels": m.labels, "online": m.online,
        "last_seen": rfc3339(m.last_seen_ms), "version": m.version, "os": m.os, "arch": m.arch,
        "hostname": m.hostname, "revoked": m.revoked, "revoked_at": rfc3339(m.revoked_at_ms),
        "created_at": rfc3339(m.created_at_ms), "cert_not_after": rfc3339(m.cert_not_after_ms),
        "public_key_sha256": m.public_key_sha256, "token_id": m.token_id,
        "queued_commands": m.queued_commands, "running_commands": m.running_commands,
        "remote_addr": m.remote_addr, "offline_reason": m.offline_reason,
        "policy_digest": m.policy_digest, "policy_summary": m.policy_summary, "paused": m.paused, "transport": m.transport,
    })
}

pub fn command_json(c: &pb::Command) -> Value {
    json!({
        "id": c.id, "machine_id": c.machine_id, "argv": c.argv, "shell": c.shell,
        "cwd": c.cwd, "env": c.env, "timeout_ms": c.timeout_ms, "state": c.state().name(),
        "created_at": rfc3339(c.created_at_ms), "queue_deadline": rfc3339(c.queue_deadline_ms),
        "dispatched_at": rfc3339(c.dispatched_at_ms), "started_at": rfc3339(c.started_at_ms),
        "finished_at": rfc3339(c.finished_at_ms), "exit_code": c.exit_code, "signal": c.signal,
        "reason": c.reason, "stdout_bytes": c.stdout_bytes, "stderr_bytes": c.stderr_bytes,
        "truncated": c.truncated, "duration_ms": c.duration_ms, "requested_by": c.requested_by,
        "cancel_requested": c.cancel_requested, "pid": c.pid,
    })
}

pub fn token_json(t: &pb::Token) -> Value {
    json!({
        "id": t.id, "name": t.name, "labels": t.labels, "created_at": rfc3339(t.created_at_ms),
        "expires_at": rfc3339(t.expires_at_ms), "used_at": rfc3339(t.used_at_ms),
        "used_by": t.used_by, "revoked": t.revoked,
    })
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn command_line(c: &pb::Command) -> String {
    if !c.shell.is_empty() {
        return c.shell.clone();
    }
    c.argv
        .iter()
        .map(|a| {
            if a.is_empty()
                || a.chars()
                    .any(|ch| ch.is_whitespace() || "'\"$`\\|&;<>()*?".contains(ch))
            {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn outcome(c: &pb::Command) -> String {
    match c.state() {
        CommandState::Exited => match (c.exit_code, c.signal) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(sig)) => format!("signal {sig}"),
            _ => "exited".into(),
        },
        s => s.name().to_string(),
    }
}

// ───────────────────────── verbs ─────────────────────────

async fn token(c: &mut Client, cmd: TokenCmd) -> anyhow::Result<i32> {
    match cmd {
        TokenCmd::Create {
            ttl,
            name,
            labels: l,
            replace,
            json,
        } => {
            let r = c
                .create_token(pb::CreateTokenRequest {
                    ttl_ms: ttl.as_millis() as u64,
                    name: name.unwrap_or_default(),
                    labels: l.into_iter().collect(),
                    replace: replace.clone().unwrap_or_default(),
                })
                .await?
                .into_inner();
            let t = r.token.unwrap_or_default();
            if json {
                let mut v = token_json(&t);
                v["token"] = Value::String(r.secret);
                print_json(&v);
            } else {
                println!("{}", r.secret);
                let replace = replace
                    .map(|m| format!(" --replace {m}"))
                    .unwrap_or_default();
                eprintln!(
                    "\nOne-time token {} (expires {}). On the machine, run:\n  byomd pair{replace} {}",
                    t.id,
                    ago(t.expires_at_ms),
                    r.secret
                );
            }
        }
        TokenCmd::Ls { all, json } => {
            let r = c
                .list_tokens(pb::ListTokensRequest { include_used: all })
                .await?
                .into_inner();
            if json {
                print_json(&Value::Array(r.tokens.iter().map(token_json).collect()));
            } else {
                let now = now_ms();
                table(
                    &["ID", "NAME", "LABELS", "EXPIRES", "STATUS"],
                    r.tokens
                        .iter()
                        .map(|t| {
                            let status = if t.revoked {
                                "revoked".to_string()
                            } else if t.used_at_ms != 0 {
                                format!("used by {}", t.used_by)
                            } else if t.expires_at_ms <= now {
                                "expired".to_string()
                            } else {
                                "unused".to_string()
                            };
                            vec![
                                t.id.clone(),
                                or_dash(&t.name),
                                labels(&t.labels),
                                ago(t.expires_at_ms),
                                status,
                            ]
                        })
                        .collect(),
                );
            }
        }
        TokenCmd::Revoke { id } => {
            let t = c
                .revoke_token(pb::RevokeTokenRequest { id })
                .await?
                .into_inner()
                .token
                .unwrap_or_default();
            println!("revoked {}", t.id);
        }
    }
    Ok(0)
}

/// Machine ID → name, revoked machines included, for tables.
async fn machine_names(c: &mut Client) -> anyhow::Result<HashMap<String, String>> {
    Ok(c.list_machines(pb::ListMachinesRequest {
        include_revoked: true,
    })
    .await?
    .into_inner()
    .machines
    .into_iter()
    .map(|m| (m.id, m.name))
    .collect())
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

fn status_of(m: &pb::Machine) -> String {
    if m.revoked {
        "revoked".into()
    } else if m.online && m.paused {
        "paused".into()
    } else if m.online {
        "online".into()
    } else {
        "offline".into()
    }
}

async fn machines(c: &mut Client, cmd: MachinesCmd) -> anyhow::Result<i32> {
    match cmd {
        MachinesCmd::Ls { all, json } => {
            let r = c
                .list_machines(pb::ListMachinesRequest {
                    include_revoked: all,
                })
                .await?
                .into_inner();
            if json {
                print_json(&Value::Array(r.machines.iter().map(machine_json).collect()));
            } else {
                table(
                    &[
                        "ID",
                        "NAME",
                        "LABELS",
                        "STATUS",
                        "LAST SEEN",
                        "VERSION",
                        "OS",
                        "QUEUED",
                    ],
                    r.machines
                        .iter()
                        .map(|m| {
                            vec![
                                m.id.clone(),
                                m.name.clone(),
                                labels(&m.labels),
                                status_of(m),
                                if m.online {
                                    "now".into()
                                } else {
                                    ago(m.last_seen_ms)
                                },
                                or_dash(&m.version),
                                format!("{}/{}", m.os, m.arch),
                                m.queued_commands.to_string(),
                            ]
                        })
                        .collect(),
                );
            }
        }
        MachinesCmd::Show { machine, json } => {
            let m = c
                .get_machine(pb::MachineRef { machine })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            print_machine(&m, json);
        }
        MachinesCmd::Rename { machine, name } => {
            let m = c
                .rename_machine(pb::RenameMachineRequest { machine, name })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            println!("{} is now named {}", m.id, m.name);
        }
        MachinesCmd::Label {
            machine,
            set,
            remove,
        } => {
            let m = c
                .label_machine(pb::LabelMachineRequest {
                    machine,
                    set: set.into_iter().collect(),
                    remove,
                })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            println!("{} labels: {}", m.name, labels(&m.labels));
        }
        MachinesCmd::Revoke { machine } => {
            let m = c
                .revoke_machine(pb::MachineRef { machine })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            println!("revoked {} ({}): its certificate is refused from now on; pair it again with a new token to use it", m.name, m.id);
        }
    }
    Ok(0)
}

fn print_machine(m: &pb::Machine, json: bool) {
    if json {
        print_json(&machine_json(m));
        return;
    }
    let status = if m.online && m.paused {
        format!(
            "online from {}, paused by its owner (commands wait queued)",
            m.remote_addr
        )
    } else if m.online {
        format!(
            "online over {} from {}",
            if m.transport.is_empty() {
                "quic"
            } else {
                &m.transport
            },
            m.remote_addr
        )
    } else if m.revoked {
        format!("revoked {} ({})", ago(m.revoked_at_ms), m.offline_reason)
    } else if m.offline_reason.is_empty() {
        format!("offline, last seen {}", ago(m.last_seen_ms))
    } else {
        format!(
            "offline, last seen {}: {}",
            ago(m.last_seen_ms),
            m.offline_reason
        )
    };
    println!("{} ({})", m.name, m.id);
    println!("  status:       {status}");
    println!("  labels:       {}", labels(&m.labels));
    println!(
        "  host:         {} ({}/{})",
        or_dash(&m.hostname),
        m.os,
        m.arch
    );
    println!("  version:      {}", or_dash(&m.version));
    println!(
        "  commands:     {} queued, {} running",
        m.queued_commands, m.running_commands
    );
    println!(
        "  paired:       {} with {}",
        ago(m.created_at_ms),
        or_dash(&m.token_id)
    );
    println!("  certificate:  expires {}", ago(m.cert_not_after_ms));
    println!("  key sha256:   {}", m.public_key_sha256);
    if !m.policy_digest.is_empty() {
        println!(
            "  local policy: {} (sha256 {})",
            or_dash(&m.policy_summary),
            &m.policy_digest[..m.policy_digest.len().min(12)]
        );
    }
}

async fn commands(c: &mut Client, cmd: CommandsCmd) -> anyhow::Result<i32> {
    match cmd {
        CommandsCmd::Ls {
            machine,
            state,
            limit,
            json,
        } => {
            let state = match state {
                None => CommandState::Unspecified,
                Some(s) => CommandState::parse(&s).with_context(|| {
                    format!("unknown state {s:?}: use queued, dispatched, running, exited, failed, cancelled, timed_out, lost or denied")
                })?,
            };
            let r = c
                .list_commands(pb::ListCommandsRequest {
                    machine: machine.unwrap_or_default(),
                    state: state as i32,
                    limit,
                    since_ms: 0,
                })
                .await?
                .into_inner();
            if json {
                print_json(&Value::Array(r.commands.iter().map(command_json).collect()));
            } else {
                let names = machine_names(c).await?;
                table(
                    &["ID", "MACHINE", "STATE", "RESULT", "CREATED", "COMMAND"],
                    r.commands
                        .iter()
                        .map(|x| {
                            let mut line = command_line(x);
                            if line.chars().count() > 60 {
                                line = line.chars().take(57).collect::<String>() + "...";
                            }
                            vec![
                                x.id.clone(),
                                names
                                    .get(&x.machine_id)
                                    .cloned()
                                    .unwrap_or_else(|| x.machine_id.clone()),
                                x.state().name().to_string(),
                                if x.state().is_terminal() {
                                    outcome(x)
                                } else {
                                    "-".into()
                                },
                                ago(x.created_at_ms),
                                line,
                            ]
                        })
                        .collect(),
                );
            }
        }
        CommandsCmd::Show { id, json } => {
            let cmd = c
                .get_command(pb::CommandRef { id: id.clone() })
                .await?
                .into_inner()
                .command
                .unwrap_or_default();
            let (out, err) = collect_output(c, &id).await?;
            if json {
                let mut v = command_json(&cmd);
                v["stdout"] = Value::String(String::from_utf8_lossy(&out).into_owned());
                v["stderr"] = Value::String(String::from_utf8_lossy(&err).into_owned());
                print_json(&v);
            } else {
                println!("{} on {}: {}", cmd.id, cmd.machine_id, command_line(&cmd));
                println!(
                    "  state:    {}{}",
                    cmd.state().name(),
                    if cmd.reason.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", cmd.reason)
                    }
                );
                if cmd.state().is_terminal() {
                    println!(
                        "  result:   {} after {}",
                        outcome(&cmd),
                        human(cmd.duration_ms)
                    );
                }
                println!(
                    "  created:  {} by {}",
                    ago(cmd.created_at_ms),
                    or_dash(&cmd.requested_by)
                );
                if cmd.truncated {
                    println!(
                        "  output:   truncated at {} bytes",
                        byom_protocol::limits::MAX_COMMAND_OUTPUT_BYTES
                    );
                }
                if !out.is_empty() {
                    println!("--- stdout ({} bytes)", out.len());
                    std::io::stdout().write_all(&out)?;
                    if !out.ends_with(b"\n") {
                        println!();
                    }
                }
                if !err.is_empty() {
                    println!("--- stderr ({} bytes)", err.len());
                    std::io::stdout().write_all(&err)?;
                    if !err.ends_with(b"\n") {
                        println!();
                    }
                }
            }
        }
        CommandsCmd::Cancel { id } => {
            let cmd = c
                .cancel_command(pb::CancelCommandRequest {
                    id,
                    reason: String::new(),
                })
                .await?
                .into_inner()
                .command
                .unwrap_or_default();
            if cmd.state() == CommandState::Cancelled {
                println!("cancelled {}", cmd.id);
            } else {
                println!(
                    "cancelling {}: the machine kills it when it gets the request",
                    cmd.id
                );
            }
        }
    }
    Ok(0)
}

/// All output stored so far for a finished or running command.
pub async fn collect_output(c: &mut Client, id: &str) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut stream = c
        .watch_command(pb::WatchCommandRequest {
            id: id.to_string(),
            ..Default::default()
        })
        .await?
        .into_inner();
    // A finished command's stream ends by itself; a running one's output so
    // far is enough for `show`.
    loop {
        let next = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
        match next {
            Ok(Ok(Some(ev))) => match ev.event {
                Some(pb::command_event::Event::Output(o)) => {
                    if o.stream == pb::OutputStream::Stderr as i32 {
                        err.extend(o.data);
                    } else {
                        out.extend(o.data);
                    }
                }
                Some(pb::command_event::Event::State(s)) if s.state().is_terminal() => break,
                _ => {}
            },
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => break,
        }
    }
    Ok((out, err))
}

async fn show(c: &mut Client, id: &str, json: bool) -> anyhow::Result<i32> {
    use pb::show_response::Object;
    match c
        .show(pb::ShowRequest { id: id.to_string() })
        .await?
        .into_inner()
        .object
    {
        Some(Object::Machine(m)) => print_machine(&m, json),
        Some(Object::Command(_)) => {
            return commands(
                c,
                CommandsCmd::Show {
                    id: id.to_string(),
                    json,
                },
            )
            .await;
        }
        Some(Object::Trigger(t)) => {
            if json {
                print_json(&trigger_json(&t));
            } else {
                println!("{}", trigger_line(&t));
                println!("  thread:   {}", t.thread_id);
                println!("  decision: {}", t.reason);
            }
        }
        Some(Object::Thread(t)) => {
            if json {
                print_json(
                    &json!({"id": t.id, "source": t.source, "external": t.external, "created_at": rfc3339(t.created_at_ms), "last_trigger": rfc3339(t.last_trigger_ms)}),
                );
            } else {
                println!("{} on {} ({})", t.id, t.source, t.external);
                println!("  created:      {}", ago(t.created_at_ms));
                println!("  last trigger: {}", ago(t.last_trigger_ms));
                println!("  see: byom events ls --thread {}", t.id);
            }
        }
        Some(Object::Token(t)) => {
            if json {
                print_json(&token_json(&t));
            } else {
                println!("{} {}", t.id, or_dash(&t.name));
                println!("  labels:   {}", labels(&t.labels));
                println!("  created:  {}", ago(t.created_at_ms));
                println!("  expires:  {}", ago(t.expires_at_ms));
                if t.used_at_ms != 0 {
                    println!("  used:     {} by {}", ago(t.used_at_ms), t.used_by);
                }
                if t.revoked {
                    println!("  revoked");
                }
            }
        }
        Some(Object::AgentJson(text)) => {
            if id.starts_with("wrk_") && !json {
                return agents::workers(
                    c,
                    agents::WorkersCmd::Show {
                        id: id.to_string(),
                        json,
                    },
                )
                .await;
            }
            match serde_json::from_str::<Value>(&text) {
                Ok(v) => print_json(&v),
                Err(_) => println!("{text}"),
            }
        }
        None => bail!("{id}: nothing to show"),
    }
    Ok(0)
}

/// Exit status `byom exec` returns for a finished command (like ssh and
/// timeout(1): the remote code, 128+signal, 124 for a timeout).
pub fn exit_status(c: &pb::Command) -> i32 {
    match c.state() {
        CommandState::Exited => match (c.exit_code, c.signal) {
            (Some(code), _) => code,
            (None, Some(sig)) => 128 + sig,
            _ => 0,
        },
        CommandState::TimedOut => 124,
        CommandState::Denied => 126,
        CommandState::Cancelled => 130,
        _ => 255,
    }
}

/// Reconnect attempts of `byom exec` while the server restarts.
const EXEC_RECONNECTS: u32 = 120;

async fn exec(c: &mut Client, a: ExecArgs) -> anyhow::Result<i32> {
    if a.shell.is_none() && a.argv.is_empty() {
        bail!("nothing to run: give a command after `--` (byom exec M -- CMD ARGS) or --sh 'COMMAND LINE'");
    }
    if a.shell.is_some() && !a.argv.is_empty() {
        bail!("give either --sh 'COMMAND LINE' or a command after `--`, not both");
    }
    let mut stdin = Vec::new();
    if a.stdin {
        std::io::stdin()
            .take(byom_protocol::limits::MAX_STDIN_BYTES as u64 + 1)
            .read_to_end(&mut stdin)?;
        if stdin.len() > byom_protocol::limits::MAX_STDIN_BYTES {
            bail!(
                "stdin is larger than {} bytes; copy the data to the machine another way",
                byom_protocol::limits::MAX_STDIN_BYTES
            );
        }
    }
    let cmd = c
        .create_command(pb::CreateCommandRequest {
            machine: a.machine.clone().unwrap_or_default(),
            labels: a.labels.into_iter().collect(),
            argv: a.argv,
            shell: a.shell.unwrap_or_default(),
            cwd: a.cwd.unwrap_or_default(),
            env: a.env.into_iter().collect(),
            stdin,
            timeout_ms: a.timeout.map(|d| d.as_millis() as u64).unwrap_or(0),
            queue_ttl_ms: a.queue_ttl.map(|d| d.as_millis() as u64).unwrap_or(0),
        })
        .await?
        .into_inner()
        .command
        .context("server returned no command")?;
    let m = c
        .get_machine(pb::MachineRef {
            machine: cmd.machine_id.clone(),
        })
        .await?
        .into_inner()
        .machine
        .unwrap_or_default();
    if a.detach {
        if a.json {
            print_json(&command_json(&cmd));
        } else {
            println!("{}", cmd.id);
            if !m.online {
                eprintln!(
                    "{} is offline; {} is queued and runs when it connects",
                    m.name, cmd.id
                );
            }
        }
        return Ok(0);
    }
    if !m.online {
        let why = if m.offline_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", m.offline_reason)
        };
        eprintln!(
            "byom: {} is offline (last seen {}{why}). {} is queued and will run when it connects; waiting (Ctrl-C cancels it, --detach returns at once)",
            m.name,
            ago(m.last_seen_ms),
            cmd.id
        );
    }
    let interactive = std::io::stderr().is_terminal();
    let mut offsets = [0u64, 0u64];
    let mut cancels = 0u32;
    let mut told_approval = false;
    let mut reconnects = 0u32;
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    'outer: loop {
        let stream = c
            .watch_command(pb::WatchCommandRequest {
                id: cmd.id.clone(),
                stdout_offset: offsets[0],
                stderr_offset: offsets[1],
            })
            .await;
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(e) if reconnects < EXEC_RECONNECTS && e.code() == tonic::Code::Unavailable => {
                reconnects += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = &mut ctrl_c => {
                    cancels += 1;
                    if cancels > 1 {
                        eprintln!("byom: not waiting; {} may still be cancelling", cmd.id);
                        return Ok(130);
                    }
                    if interactive { eprintln!("byom: cancelling {} (Ctrl-C again to stop waiting)", cmd.id); }
                    let _ = c.cancel_command(pb::CancelCommandRequest { id: cmd.id.clone(), reason: "cancelled with Ctrl-C".into() }).await;
                    ctrl_c = Box::pin(tokio::signal::ctrl_c());
                    continue;
                }
            };
            match msg {
                Ok(Some(ev)) => match ev.event {
                    Some(pb::command_event::Event::Output(o)) => {
                        if o.stream == pb::OutputStream::Stderr as i32 {
                            offsets[1] += o.data.len() as u64;
                            stderr.write_all(&o.data)?;
                            stderr.flush()?;
                        } else {
                            offsets[0] += o.data.len() as u64;
                            stdout.write_all(&o.data)?;
                            stdout.flush()?;
                        }
                    }
                    Some(pb::command_event::Event::State(s))
                        if s.state() == CommandState::AwaitingLocalApproval && !told_approval =>
                    {
                        told_approval = true;
                        eprintln!(
                            "byom: {} waits for the owner of {} to approve it on the machine (`byomd approve {}`)",
                            s.id, m.name, s.id
                        );
                    }
                    Some(pb::command_event::Event::State(s)) if s.state().is_terminal() => {
                        if a.json {
                            print_json(&command_json(&s));
                        }
                        if s.truncated {
                            eprintln!(
                                "byom: output truncated at {} bytes",
                                byom_protocol::limits::MAX_COMMAND_OUTPUT_BYTES
                            );
                        }
                        match s.state() {
                            CommandState::Exited => {}
                            CommandState::TimedOut => {
                                eprintln!("byom: {} timed out{}", s.id, reason(&s))
                            }
                            other => eprintln!("byom: {} {}{}", s.id, other.name(), reason(&s)),
                        }
                        return Ok(exit_status(&s));
                    }
                    _ => {}
                },
                Ok(None) => {
                    // The server went away mid-stream: resume from our offsets.
                    reconnects += 1;
                    if reconnects > EXEC_RECONNECTS {
                        break 'outer;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue 'outer;
                }
                Err(e)
                    if reconnects < EXEC_RECONNECTS
                        && matches!(
                            e.code(),
                            tonic::Code::Unavailable
                                | tonic::Code::Unknown
                                | tonic::Code::Internal
                                | tonic::Code::Cancelled
                        ) =>
                {
                    reconnects += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue 'outer;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    bail!(
        "lost the server while waiting for {}; see `byom commands show {}`",
        cmd.id,
        cmd.id
    )
}

fn reason(c: &pb::Command) -> String {
    if c.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", c.reason)
    }
}
