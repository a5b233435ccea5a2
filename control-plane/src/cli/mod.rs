//! The `byom` command line: verbs that read as sentences, tables for
//! people, `--json` for scripts, and errors that say what to do next. One
//! verb per file; all of them but `server`, `demo` and `js` speak to a
//! server through `byom-api`.

mod admins;
mod agent;
mod approvals;
mod audit;
mod chat;
mod commands;
mod connectors;
mod console;
mod cp;
mod demo;
mod docs;
mod events;
mod exec;
mod exec_all;
mod exec_notes;
mod machines;
mod output;
mod policy;
mod router;
mod server;
mod show;
mod status;
mod tasks;
mod terminal;
mod threads;
mod token;
mod trust;
mod views;
mod webhook;
mod workers;

use std::path::PathBuf;

use anyhow::Context;
use byom_api::Client;
use clap::{Args, Parser, Subcommand};

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
    /// Default: $BYOM_DATA_DIR/admin (set BYOM_DATA_DIR to the --data-dir
    /// of a server on this machine), else ~/.local/share/byom/admin.
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
    Server(Box<server::ServerArgs>),
    /// The server's store: move an embedded one into PostgreSQL.
    #[command(subcommand)]
    Store(server::StoreCmd),
    /// Pairing tokens for new machines.
    #[command(subcommand)]
    Token(token::TokenCmd),
    /// Paired machines.
    #[command(subcommand, alias = "machine")]
    Machines(machines::MachinesCmd),
    /// Run a command on a machine and stream its output.
    Exec(exec::ExecArgs),
    /// Copy files to or from a machine (`byom cp [-r] SRC DST`, one side
    /// MACHINE:PATH): streamed, checksummed, written atomically, checked
    /// by the machine's policy and sandbox.
    Cp(cp::CpArgs),
    /// A login shell on a machine (`byom exec -t MACHINE`).
    Shell {
        /// Machine ID or name.
        machine: String,
    },
    /// Commands run or queued on machines.
    #[command(subcommand, alias = "command")]
    Commands(commands::CommandsCmd),
    /// Events from channels (triggers): send one, list, follow.
    #[command(subcommand)]
    Events(events::EventsCmd),
    /// Chat and code-review services the agent lives in (Matrix, Slack, GitHub).
    #[command(subcommand, alias = "connector")]
    Connectors(connectors::ConnectorsCmd),
    /// The agent's replies on their way out to connectors.
    #[command(subcommand)]
    Outbox(connectors::OutboxCmd),
    /// Fast-path routing rules per source and channel, changed at runtime.
    #[command(subcommand)]
    Sources(connectors::SourcesCmd),
    /// Natural-language policies the Router follows for candidate triggers.
    #[command(subcommand)]
    Policy(policy::PolicyCmd),
    /// The admin side on one screen: server, machines, commands, tasks,
    /// approvals and failed replies.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Print a one-time link (5 minutes) that signs you in to the web
    /// console as yourself.
    Console(console::ConsoleArgs),
    /// People who may use the API, each with a personal certificate.
    #[command(subcommand)]
    Admins(admins::AdminsCmd),
    /// Who is trusted and who may approve what untrusted input asks for.
    #[command(subcommand)]
    Trust(trust::TrustCmd),
    /// Who ran what where: the command audit trail.
    #[command(subcommand)]
    Audit(audit::AuditCmd),
    /// Show any object by ID (mch_, cmd_, tok_, trg_, thr_, wrk_, apr_, snp_, out_) or a machine by name.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Start a server and a daemon in a temp dir, run commands, clean up.
    Demo(demo::DemoArgs),
    /// Run JavaScript in the sandboxed code interpreter.
    #[command(subcommand)]
    Js(crate::js::JsCmd),
    /// Tasks the agent is working on (top-level workers).
    #[command(subcommand, alias = "task")]
    Tasks(tasks::TasksCmd),
    /// Workers and subagents, with their transcripts.
    #[command(subcommand, alias = "worker")]
    Workers(workers::WorkersCmd),
    /// Conversations on channels, with the agent's replies.
    #[command(subcommand, alias = "thread")]
    Threads(threads::ThreadsCmd),
    /// Questions paused programs wait on: list, approve, deny.
    #[command(subcommand, alias = "approval")]
    Approvals(approvals::ApprovalsCmd),
    /// The Router's figures: turns, decisions, tokens.
    Router {
        #[arg(long)]
        json: bool,
    },
    /// Talk to the agent on a chat thread from the terminal.
    Chat(chat::ChatArgs),
    /// The generic webhook (POST /hooks/SOURCE): sign a body as the server
    /// checks it.
    #[command(subcommand)]
    Webhook(webhook::WebhookCmd),
    /// Print the shell completion script for bash, zsh, fish, powershell
    /// or elvish (`byom completions bash > ~/.local/share/bash-completion/completions/byom`).
    Completions(docs::CompletionsArgs),
    /// Print byom's man page, or write every page into a directory
    /// (`byom man --dir DIR`: byom.1, byom-token-create.1, …).
    Man(docs::ManArgs),
}

/// A duration that must mean something: at least 1 ms (0 would silently
/// mean "none" or "the default") and at most `max`, the same everywhere.
fn bounded(s: &str, max: std::time::Duration) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (say e.g. 30s, 5m, 2h)"))?;
    if d < std::time::Duration::from_millis(1) {
        return Err("must be at least 1ms".into());
    }
    if d > max {
        return Err(format!("at most {}", humantime::format_duration(max)));
    }
    Ok(d)
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    bounded(s, byom_protocol::limits::MAX_COMMAND_TIMEOUT)
}

fn parse_queue_ttl(s: &str) -> Result<std::time::Duration, String> {
    bounded(s, byom_protocol::limits::MAX_QUEUE_TTL)
}

fn parse_token_ttl(s: &str) -> Result<std::time::Duration, String> {
    bounded(s, byom_protocol::limits::MAX_TOKEN_TTL)
}

/// `KEY=VALUE` (the value may be empty or contain `=`).
fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// A watch's error as the CLI reports it (a gRPC status by its message).
fn watch_err(e: byom_api::WatchError) -> anyhow::Error {
    match e {
        byom_api::WatchError::Status(s) => anyhow::Error::new(s),
        other => other.into(),
    }
}

/// One line for an error chain, with gRPC statuses shown by their message.
pub fn describe(e: &anyhow::Error) -> String {
    if let Some(s) = e.downcast_ref::<tonic::Status>() {
        return status_text(s);
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

/// A status as people should read it. A connection the server dropped
/// mid-call carries only "transport error": its causes say why, and the
/// usual one (the server refused the admin certificate) is named.
fn status_text(s: &tonic::Status) -> String {
    let mut causes = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(c) = cur {
        causes.push(c.to_string());
        cur = c.source();
    }
    let all = causes.join(": ");
    if !matches!(
        s.code(),
        tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Cancelled
    ) {
        return s.message().to_string();
    }
    let refused = [
        "alert",
        "certificate",
        "Certificate",
        "reset by peer",
        "broken pipe",
    ]
    .iter()
    .any(|w| all.contains(w));
    // h2 reports a connection the server dropped during the first call as
    // either of these, depending on which side noticed first.
    let dropped =
        s.message().contains("transport error") || s.message().contains("operation was canceled");
    if dropped && (refused || causes.is_empty() || all.contains("canceled")) {
        return format!(
            "the server closed the connection{}: it most likely refused this admin certificate (issued by another byom server's CA, or expired); use the credentials in that server's <data-dir>/admin, or a bundle from `byom admins add` (--creds / BYOM_CREDS)",
            if all.is_empty() { String::new() } else { format!(" ({all})") }
        );
    }
    if all.is_empty() {
        s.message().to_string()
    } else {
        format!("{}: {all}", s.message())
    }
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

/// Runs a parsed command line; the exit status.
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

/// A client of the server the credentials name.
async fn connect(g: &Global) -> anyhow::Result<Client> {
    let creds = byom_api::load_creds(g.creds.as_deref(), g.api.as_deref())?;
    Ok(byom_api::connect(&creds).await?)
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let g = &cli.global;
    match cli.cmd {
        Cmd::Server(a) => server::run(*a).await,
        Cmd::Store(c) => server::store(c),
        Cmd::Demo(a) => demo::run(a).await,
        Cmd::Js(j) => crate::js::run(j).await,
        Cmd::Webhook(x) => webhook::run(x),
        Cmd::Completions(a) => docs::completions(a),
        Cmd::Man(a) => docs::man(a),
        Cmd::Token(t) => token::run(&mut connect(g).await?, t).await,
        Cmd::Machines(m) => machines::run(&mut connect(g).await?, m).await,
        Cmd::Exec(e) => exec::run(&mut connect(g).await?, e).await,
        Cmd::Cp(a) => cp::run(&mut connect(g).await?, a).await,
        Cmd::Shell { machine } => {
            let a = exec::ExecArgs::shell(machine);
            exec::run(&mut connect(g).await?, a).await
        }
        Cmd::Commands(x) => commands::run(&mut connect(g).await?, x).await,
        Cmd::Audit(x) => audit::run(&mut connect(g).await?, x).await,
        Cmd::Trust(x) => trust::run(&mut connect(g).await?, x).await,
        Cmd::Admins(x) => admins::run(g, x).await,
        Cmd::Status { json } => status::run(&mut connect(g).await?, json).await,
        Cmd::Console(x) => console::run(&mut connect(g).await?, x).await,
        Cmd::Events(x) => events::run(&mut connect(g).await?, x).await,
        Cmd::Policy(x) => policy::run(&mut connect(g).await?, x).await,
        Cmd::Connectors(x) => connectors::run(&mut connect(g).await?, x).await,
        Cmd::Outbox(x) => connectors::outbox(&mut connect(g).await?, x).await,
        Cmd::Sources(x) => connectors::sources(&mut connect(g).await?, x).await,
        Cmd::Show { id, json } => show::run(&mut connect(g).await?, &id, json).await,
        Cmd::Tasks(x) => tasks::run(&mut connect(g).await?, x).await,
        Cmd::Workers(x) => workers::run(&mut connect(g).await?, x).await,
        Cmd::Threads(x) => threads::run(&mut connect(g).await?, x).await,
        Cmd::Approvals(x) => approvals::run(&mut connect(g).await?, x).await,
        Cmd::Router { json } => router::run(&mut connect(g).await?, json).await,
        Cmd::Chat(x) => chat::run(&mut connect(g).await?, x).await,
    }
}

pub use output::safe;
