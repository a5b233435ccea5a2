//! `byom server`: the control plane, run in this process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

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
    /// Where `/metrics` (Prometheus text format), `/healthz` and `/readyz`
    /// are served, in plain HTTP: `admin` (the admin API's port, which
    /// tells them apart from the API's TLS), HOST:PORT for a port of their
    /// own (e.g. 0.0.0.0:9464 for a Prometheus elsewhere), or `off`.
    #[arg(long, default_value = "admin", value_name = "ADDR")]
    pub listen_metrics: byom_server::MetricsListen,
    /// Where the web console is served (HTTPS with the server's
    /// certificate; sign in with `byom console`): HOST:PORT, or `off`.
    /// Default 127.0.0.1:7446, left off with a warning if that port is
    /// taken.
    #[arg(long, value_name = "ADDR")]
    pub listen_console: Option<byom_server::ConsoleListen>,
    /// How long a console login link lives (at most 5 minutes).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, hide = true)]
    pub console_link_ttl: Duration,
    /// HTTPS address for webhooks: GitHub's and Slack's endpoints, and
    /// POST /hooks/SOURCE with an HMAC-SHA256 signature (key in
    /// <data-dir>/webhook.key). Plain HTTP is accepted from this machine.
    #[arg(long, default_value = "127.0.0.1:7445")]
    pub listen_webhook: SocketAddr,
    /// Certificate chain (PEM) the webhook port shows, for a name GitHub
    /// and Slack can verify (default: the server's own certificate).
    #[arg(long, requires = "webhook_tls_key")]
    pub webhook_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --webhook-tls-cert.
    #[arg(long, requires = "webhook_tls_cert")]
    pub webhook_tls_key: Option<PathBuf>,
    /// Accept plain HTTP on the webhook port from other machines too: only
    /// behind a proxy that terminates TLS.
    #[arg(long)]
    pub webhook_plain: bool,
    /// HOST:PORT daemons should dial, written into pairing tokens.
    #[arg(long)]
    pub public_addr: Option<String>,
    /// Lifetime of machine certificates (renewed automatically).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub cert_ttl: Duration,
    /// How long a machine may stay offline after a command of its should
    /// have ended before the command is given up as lost (a laptop asleep
    /// overnight keeps its work and delivers it when it wakes).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub offline_allowance: Duration,
    /// What the store keeps of the start of each command output stream
    /// (the client attached to a command gets every byte; see
    /// `--output-tail`).
    #[arg(long, default_value = "4MiB", value_parser = crate::js::parse_size, value_name = "SIZE")]
    pub output_head: usize,
    /// What the store keeps of the end of each command output stream; the
    /// bytes in between are counted (`stdout_elided`), not kept.
    #[arg(long, default_value = "4MiB", value_parser = crate::js::parse_size, value_name = "SIZE")]
    pub output_tail: usize,
    /// Release directory whose byomd this server hands out (install.sh,
    /// the signed manifest, the artifacts) over HTTPS on its public port.
    /// Default: `dist/` beside this binary, if there is one.
    #[arg(long, env = "BYOM_DIST")]
    pub dist: Option<PathBuf>,
    /// The store: leave it out for the embedded one in the data dir, or
    /// `postgres://USER@HOST/DB` for one several replicas share (the
    /// data dir then holds nothing the server needs). TLS as libpq reads
    /// it: add `?sslmode=verify-full&sslrootcert=CA.pem` to check the
    /// database's certificate.
    #[arg(long, env = "BYOM_STORE")]
    pub store: Option<String>,
    /// With a shared store: the key its secrets (CA, server and webhook
    /// keys) are sealed with, kept apart from the database. Created by
    /// the first replica if missing; every replica needs the same file.
    #[arg(long, env = "BYOM_STORE_KEY_FILE")]
    pub store_key_file: Option<PathBuf>,
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

/// Runs the server until SIGTERM or SIGINT.
pub async fn run(a: ServerArgs) -> anyhow::Result<i32> {
    let m = a.models;
    byom_server::run(byom_server::ServerOptions {
        data_dir: a.data_dir.unwrap_or_else(byom_api::default_data_dir),
        listen_quic: a.listen_quic,
        listen_api: a.listen_api,
        listen_tcp: a.listen_tcp,
        listen_webhook: a.listen_webhook,
        webhook_tls: a.webhook_tls_cert.zip(a.webhook_tls_key),
        webhook_plain: a.webhook_plain,
        public_addr: a.public_addr,
        cert_ttl: a.cert_ttl,
        offline_allowance: a.offline_allowance,
        output_keep: byom_server::OutputKeep {
            head: a.output_head as u64,
            tail: a.output_tail as u64,
        },
        dist: a.dist,
        store: a.store,
        store_key_file: a.store_key_file,
        listen_metrics: a.listen_metrics,
        listen_console: a
            .listen_console
            .unwrap_or(byom_server::ConsoleListen::Default),
        console_link_ttl: a.console_link_ttl,
        models: byom_server::ModelOptions {
            model: m.model,
            router_model: m.router_model,
            worker_model: m.worker_model,
            openai_base_url: m.openai_base_url,
            anthropic_base_url: m.anthropic_base_url,
            scripted_latency: m.scripted_latency,
        },
    })
    .await?;
    Ok(0)
}

#[derive(clap::Subcommand, Debug)]
pub enum StoreCmd {
    /// Copy a stopped server's embedded store, CA, keys and settings into
    /// an empty PostgreSQL database, then start replicas on it with
    /// `byom server --store URL --store-key-file FILE`.
    Migrate {
        /// The stopped server's data dir.
        #[arg(long)]
        from: PathBuf,
        /// postgres://USER@HOST/DB, empty.
        #[arg(long)]
        to: String,
        /// The key the secrets are sealed with in the database (created if
        /// missing); every replica is then given it.
        #[arg(long, env = "BYOM_STORE_KEY_FILE")]
        store_key_file: PathBuf,
    },
}

pub fn store(c: StoreCmd) -> anyhow::Result<i32> {
    match c {
        StoreCmd::Migrate {
            from,
            to,
            store_key_file,
        } => {
            let r = byom_server::migrate_store(&from, &to, &store_key_file)?;
            let total: usize = r.spaces.iter().map(|s| s.1).sum();
            println!(
                "moved {total} records from {} into the shared store:",
                from.display()
            );
            for (space, n) in r.spaces.iter().filter(|s| s.1 > 0) {
                println!("  {space:<16} {n}");
            }
            println!("sealed secrets:  {}", r.secrets.join(", "));
            if !r.settings.is_empty() {
                println!("settings:        {}", r.settings.join(", "));
            }
            println!(
                "\nStart replicas with:\n  byom server --store '{}' --store-key-file {}",
                byom_server::redact_url(&to),
                store_key_file.display()
            );
            println!(
                "The old data dir is untouched; the machines keep their identities (same CA)."
            );
            Ok(0)
        }
    }
}
