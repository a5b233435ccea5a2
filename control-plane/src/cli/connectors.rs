//! `byom connectors …`, `byom outbox …` and `byom sources …`: where the
//! agent lives (Matrix, Slack, GitHub), what it has still to say there,
//! and the routing rules per channel. Secrets are read from files (`-`:
//! stdin) and never printed back.

use std::path::{Path, PathBuf};

use anyhow::Context;
use byom_api::Client;
use clap::{Args, Subcommand};
use serde_json::Value;

use super::agent::{self, s};
use super::output::{or_dash, print_json, safe, table};
use byom_protocol::pb;

#[derive(Subcommand, Debug)]
pub enum ConnectorsCmd {
    /// Connect a chat or code-review service.
    #[command(subcommand)]
    Add(AddCmd),
    /// List connectors.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// One connector (secrets are never shown).
    Show {
        /// The connector's name: lower-case letters, digits, '-' or '_' (its webhook path and its threads' source).
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove a connector (its unsent replies stay in the outbox).
    Rm {
        /// The connector's name.
        name: String,
    },
    /// Check a connector's credentials against the provider.
    Test {
        /// The connector's name: lower-case letters, digits, '-' or '_' (its webhook path and its threads' source).
        name: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct Common {
    /// Channels (rooms, Slack channels, repositories) the Router may post
    /// in without being asked there; `*` for any.
    #[arg(long = "post-to")]
    post_to: Vec<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
pub enum AddCmd {
    /// A Matrix bot account: `--homeserver https://matrix.example.org --user-id @byom:example.org --access-token-file token`.
    Matrix {
        /// The connector's name: lower-case letters, digits, '-' or '_' (its webhook path and its threads' source).
        name: String,
        #[arg(long)]
        homeserver: String,
        #[arg(long = "user-id")]
        user_id: String,
        /// The bot's access token (`-`: stdin).
        #[arg(long = "access-token-file")]
        access_token_file: PathBuf,
        /// Rooms to join (IDs or aliases); repeat.
        #[arg(long = "room")]
        rooms: Vec<String>,
        /// Users whose invitations the bot accepts (`*`: anyone's); repeat.
        #[arg(long = "invite-from")]
        invite_from: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// A Slack app: Events API to `POST /slack/NAME/events` on the webhook port.
    Slack {
        /// The connector's name: lower-case letters, digits, '-' or '_' (its webhook path and its threads' source).
        name: String,
        /// The bot token, `xoxb-…` (`-`: stdin).
        #[arg(long = "bot-token-file")]
        bot_token_file: PathBuf,
        /// The app's signing secret.
        #[arg(long = "signing-secret-file")]
        signing_secret_file: PathBuf,
        /// Slack's Web API (default https://slack.com/api).
        #[arg(long = "api-url")]
        api_url: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// GitHub, with a token or as a GitHub App: webhooks to `POST /github/NAME`.
    Github {
        /// The connector's name: lower-case letters, digits, '-' or '_' (its webhook path and its threads' source).
        name: String,
        /// The webhook's secret.
        #[arg(long = "webhook-secret-file")]
        webhook_secret_file: PathBuf,
        /// A personal or fine-grained token (or use --app-id and --private-key-file).
        #[arg(long = "token-file", conflicts_with_all = ["app_id", "private_key_file"])]
        token_file: Option<PathBuf>,
        /// The GitHub App's ID (with --private-key-file).
        #[arg(long = "app-id", requires = "private_key_file")]
        app_id: Option<u64>,
        /// The App's private key (PEM, as GitHub gives it).
        #[arg(long = "private-key-file", requires = "app_id")]
        private_key_file: Option<PathBuf>,
        /// GitHub's REST API (GitHub Enterprise: https://HOST/api/v3).
        #[arg(long = "api-url")]
        api_url: Option<String>,
        /// The bot's login, for `@LOGIN` mentions.
        #[arg(long = "bot-login")]
        bot_login: Option<String>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Subcommand, Debug)]
pub enum OutboxCmd {
    /// Replies on their way out (newest first).
    Ls {
        /// Only those that failed.
        #[arg(long)]
        failed: bool,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// One item, with its text and last error.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Send a failed item again.
    Retry { id: String },
}

#[derive(Subcommand, Debug)]
pub enum SourcesCmd {
    /// The routing rules in force and the last refused edit.
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Replace the rules with FILE's (TOML); a bad file is refused and the rules stay.
    Set { file: PathBuf },
    /// Check FILE without changing anything.
    Check { file: PathBuf },
}

/// A secret from a file (`-`: stdin), trimmed.
fn secret(path: &Path, what: &str) -> anyhow::Result<String> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("cannot read stdin")?
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the {what} from {}", path.display()))?
    };
    let t = text.trim().to_string();
    if t.is_empty() {
        anyhow::bail!("the {what} file {} is empty", path.display());
    }
    Ok(t)
}

fn add_body(cmd: AddCmd) -> anyhow::Result<(pb::Connector, bool)> {
    Ok(match cmd {
        AddCmd::Matrix {
            name,
            homeserver,
            user_id,
            access_token_file,
            rooms,
            invite_from,
            common,
        } => (
            pb::Connector {
                kind: "matrix".into(),
                name,
                api_url: homeserver,
                user_id,
                token: secret(&access_token_file, "access token")?,
                rooms,
                invite_from,
                post_to: common.post_to,
                ..Default::default()
            },
            common.json,
        ),
        AddCmd::Slack {
            name,
            bot_token_file,
            signing_secret_file,
            api_url,
            common,
        } => (
            pb::Connector {
                kind: "slack".into(),
                name,
                api_url: api_url.unwrap_or_default(),
                token: secret(&bot_token_file, "bot token")?,
                secret: secret(&signing_secret_file, "signing secret")?,
                post_to: common.post_to,
                ..Default::default()
            },
            common.json,
        ),
        AddCmd::Github {
            name,
            webhook_secret_file,
            token_file,
            app_id,
            private_key_file,
            api_url,
            bot_login,
            common,
        } => {
            if token_file.is_none() && app_id.is_none() {
                anyhow::bail!("give --token-file F, or --app-id N with --private-key-file F");
            }
            let token = token_file
                .map(|f| secret(&f, "token"))
                .transpose()?
                .unwrap_or_default();
            let key = private_key_file
                .map(|f| secret(&f, "private key"))
                .transpose()?
                .unwrap_or_default();
            (
                pb::Connector {
                    kind: "github".into(),
                    name,
                    api_url: api_url.unwrap_or_default(),
                    secret: secret(&webhook_secret_file, "webhook secret")?,
                    token,
                    app_id: app_id.unwrap_or(0),
                    private_key: key,
                    bot_login: bot_login.unwrap_or_default(),
                    post_to: common.post_to,
                    ..Default::default()
                },
                common.json,
            )
        }
    })
}

fn list(v: &Value, k: &str) -> String {
    let items: Vec<&str> = v[k]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if items.is_empty() {
        "-".into()
    } else {
        items.join(", ")
    }
}

fn print_connector(v: &Value) {
    println!("{} ({})", s(v, "name"), s(v, "kind"));
    let rows = [
        ("api", s(v, "api_url").to_string()),
        ("user", s(v, "user_id").to_string()),
        ("bot login", s(v, "bot_login").to_string()),
        ("rooms", list(v, "rooms")),
        ("invites from", list(v, "invite_from")),
        ("posts unprompted to", list(v, "post_to")),
        ("webhook", {
            let url = s(v, "webhook_url");
            if url.is_empty() {
                s(v, "webhook_path")
            } else {
                url
            }
            .to_string()
        }),
        (
            "credentials",
            ["token", "secret", "private_key"]
                .iter()
                .filter(|k| v[format!("has_{k}")] == true)
                .map(|k| k.replace('_', " "))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("outbox", format!("{} waiting", v["outbox_pending"])),
    ];
    for (k, val) in rows {
        if !val.is_empty() && val != "-" {
            println!("  {k:<20} {}", safe(&val));
        }
    }
}

pub async fn run(c: &mut Client, cmd: ConnectorsCmd) -> anyhow::Result<i32> {
    match cmd {
        ConnectorsCmd::Add(add) => {
            let (body, json) = add_body(add)?;
            let v = agent::add_connector(c, body).await?;
            if json {
                print_json(&v);
            } else {
                print_connector(&v);
                let url = s(&v, "webhook_url");
                if !url.is_empty() {
                    let peer = if s(&v, "kind") == "slack" {
                        "Slack's Event Subscriptions Request URL"
                    } else {
                        "the GitHub webhook's Payload URL (content type application/json)"
                    };
                    println!("register {url} as {peer}");
                    let buttons = s(&v, "interactive_url");
                    if !buttons.is_empty() {
                        println!(
                            "and {buttons} as its Interactivity Request URL (approvers' buttons)"
                        );
                    }
                    let note = s(&v, "webhook_note");
                    if !note.is_empty() {
                        println!("  note: {}", safe(note));
                    }
                }
                println!(
                    "check its credentials with `byom connectors test {}`",
                    s(&v, "name")
                );
            }
        }
        ConnectorsCmd::Ls { json } => {
            let v = agent::connectors(c).await?;
            if json {
                print_json(&v);
            } else {
                let rows = v
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|c| {
                                vec![
                                    s(c, "name").to_string(),
                                    s(c, "kind").to_string(),
                                    or_dash(match s(c, "kind") {
                                        "matrix" => s(c, "user_id"),
                                        "github" => s(c, "bot_login"),
                                        _ => s(c, "webhook_path"),
                                    }),
                                    c["outbox_pending"].to_string(),
                                ]
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                table(&["NAME", "KIND", "IDENTITY", "UNSENT"], rows);
            }
        }
        ConnectorsCmd::Show { name, json } => {
            let v = agent::connector(c, &name).await?;
            if json {
                print_json(&v);
            } else {
                print_connector(&v);
            }
        }
        ConnectorsCmd::Rm { name } => {
            let v = agent::remove_connector(c, &name).await?;
            println!("removed {name}");
            if let Some(n) = v["note"].as_str() {
                println!("  {n}");
            }
        }
        ConnectorsCmd::Test { name, json } => {
            let v = agent::test_connector(c, &name).await?;
            if json {
                print_json(&v);
            } else if v["ok"] == true {
                println!("{name}: ok, {}", s(&v, "identity"));
            } else {
                println!("{name}: FAILED: {}", s(&v, "error"));
            }
            return Ok(if v["ok"] == true { 0 } else { 1 });
        }
    }
    Ok(0)
}

pub async fn outbox(c: &mut Client, cmd: OutboxCmd) -> anyhow::Result<i32> {
    match cmd {
        OutboxCmd::Ls {
            failed,
            limit,
            json,
        } => {
            let v = agent::outbox(c, failed, limit).await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            let rows = v
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|it| {
                            let mut state = s(it, "state").to_string();
                            if it["maybe_duplicate"] == true {
                                state.push_str(" (may be posted twice)");
                            }
                            vec![
                                s(it, "id").to_string(),
                                s(it, "connector").to_string(),
                                safe(s(it, "external")),
                                state,
                                it["attempts"].to_string(),
                                or_dash(&safe(s(it, "last_error"))),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            table(
                &["ID", "CONNECTOR", "WHERE", "STATE", "TRIES", "LAST ERROR"],
                rows,
            );
        }
        OutboxCmd::Show { id, json } => {
            let v = agent::outbox_item(c, &id).await?;
            if json {
                print_json(&v);
            } else {
                println!(
                    "{} to {} {} ({})",
                    s(&v, "id"),
                    s(&v, "connector"),
                    safe(s(&v, "external")),
                    s(&v, "state")
                );
                for k in [
                    "thread",
                    "reply",
                    "receipt",
                    "last_error",
                    "created_at",
                    "sent_at",
                ] {
                    let val = match &v[k] {
                        Value::String(x) => x.clone(),
                        _ => String::new(),
                    };
                    if !val.is_empty() {
                        println!("  {k:<12} {}", safe(&val));
                    }
                }
                if v["maybe_duplicate"] == true {
                    println!("  a send was cut by a server restart: this reply may have been posted twice");
                }
                println!("\n{}", safe(s(&v, "text")));
            }
        }
        OutboxCmd::Retry { id } => {
            let v = agent::retry_outbox(c, &id).await?;
            println!("{} is queued again for {}", s(&v, "id"), s(&v, "connector"));
        }
    }
    Ok(0)
}

pub async fn sources(c: &mut Client, cmd: SourcesCmd) -> anyhow::Result<i32> {
    match cmd {
        SourcesCmd::Show { json } => {
            let v = agent::sources(c).await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            match s(&v, "rules") {
                "" => println!("no routing rules: every source is `candidate` (bots ignored)"),
                r => println!("{}", r.trim_end()),
            }
            if !s(&v, "last_refused_edit").is_empty() {
                println!(
                    "\nlast edit refused (these rules stayed): {}",
                    s(&v, "last_refused_edit")
                );
            }
        }
        SourcesCmd::Set { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            agent::set_sources(c, &text).await?;
            println!("routing rules replaced from {}", file.display());
        }
        SourcesCmd::Check { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let v = agent::check_sources(c, &text).await?;
            if v["ok"] == true {
                println!("{}: ok", file.display());
            } else {
                eprintln!("{}: {}", file.display(), s(&v, "error"));
                return Ok(1);
            }
        }
    }
    Ok(0)
}
