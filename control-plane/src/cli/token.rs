//! `byom token create|ls|revoke`: one-time pairing tokens.

use std::time::Duration;

use byom_api::Client;
use byom_protocol::pb;
use clap::Subcommand;
use serde_json::Value;

use super::output::{ago, labels, or_dash, print_json, table, token_json};
use super::parse_kv;

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create a pairing token: one-time by default, or for a fleet
    /// (`--reusable`, `--max-uses N`).
    Create {
        /// How long it may be used (at most 7d).
        #[arg(long, default_value = "15m", value_parser = super::parse_token_ttl)]
        ttl: Duration,
        /// Name for the machine that pairs with it (a reusable token's
        /// machines are named from their hostnames, made unique; the name
        /// then names the token).
        #[arg(long)]
        name: Option<String>,
        /// Pair any number of machines until it expires or is revoked
        /// (for images and fleets), each named from its hostname.
        #[arg(long)]
        reusable: bool,
        /// With --reusable (implied): pair at most N machines.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_uses: Option<u32>,
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

pub async fn run(c: &mut Client, cmd: TokenCmd) -> anyhow::Result<i32> {
    match cmd {
        TokenCmd::Create {
            ttl,
            name,
            reusable,
            max_uses,
            labels: l,
            replace,
            json,
        } => {
            let reusable = reusable || max_uses.is_some();
            // A second machine by an existing name would be called name-2:
            // say so, and how to re-pair the existing one instead.
            if let (Some(n), None, false) = (&name, &replace, reusable) {
                let existing = c
                    .get_machine(pb::MachineRef { machine: n.clone() })
                    .await
                    .ok()
                    .and_then(|r| r.into_inner().machine)
                    .filter(|m| !m.revoked && &m.name == n);
                if existing.is_some() {
                    eprintln!(
                        "byom: a machine named {n} is already paired; the machine that uses this token will get another name ({n}-2). To re-pair {n} itself (a reinstalled laptop), use `byom token create --replace {n}`."
                    );
                }
            }
            let req = pb::CreateTokenRequest {
                ttl_ms: ttl.as_millis() as u64,
                name: name.unwrap_or_default(),
                labels: l.into_iter().collect(),
                replace: replace.clone().unwrap_or_default(),
                idempotency_key: byom_api::new_key(),
                reusable,
                max_uses: max_uses.unwrap_or(0),
            };
            let r = byom_api::until_answered(|| {
                let (mut c, req) = (c.clone(), req.clone());
                async move { c.create_token(req).await }
            })
            .await?
            .into_inner();
            let t = r.token.unwrap_or_default();
            if json {
                let mut v = token_json(&t);
                v["token"] = Value::String(r.secret);
                if !r.install_command.is_empty() {
                    v["install_command"] = Value::String(r.install_command);
                }
                if !r.install_command_windows.is_empty() {
                    v["install_command_windows"] = Value::String(r.install_command_windows);
                }
                print_json(&v);
            } else {
                println!("{}", r.secret);
                let replace = replace
                    .map(|m| format!(" --replace {m}"))
                    .unwrap_or_default();
                let kind = match (t.reusable, t.max_uses) {
                    (false, _) => "One-time token".to_string(),
                    (true, 0) => "Reusable token (any number of machines)".to_string(),
                    (true, n) => format!("Reusable token (up to {n} machines)"),
                };
                eprintln!("\n{kind} {} (expires {}).", t.id, ago(t.expires_at_ms));
                if r.install_command.is_empty() {
                    eprintln!(
                        "On a machine with byomd, run:\n  byomd pair{replace} {}\n(To install byomd with one line from this server, start it with --dist: see README, \"Install byomd\".)",
                        r.secret
                    );
                } else {
                    eprintln!(
                        "Install, pair and start byomd on a Linux or macOS machine with:\n  {}{replace}",
                        r.install_command
                    );
                    if !r.install_command_windows.is_empty() {
                        eprintln!(
                            "On Windows, in PowerShell:\n  {}",
                            r.install_command_windows
                        );
                    }
                    eprintln!(
                        "Or, where byomd is already installed:\n  byomd pair{replace} {}",
                        r.secret
                    );
                }
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
                let now = byom_wire::now_ms();
                table(
                    &["ID", "NAME", "LABELS", "EXPIRES", "STATUS"],
                    r.tokens
                        .iter()
                        .map(|t| {
                            let status = if t.revoked {
                                "revoked".to_string()
                            } else if t.reusable {
                                let uses = match t.max_uses {
                                    0 => format!("{} uses", t.uses),
                                    n => format!("{}/{n} uses", t.uses),
                                };
                                if t.expires_at_ms <= now {
                                    format!("expired, {uses}")
                                } else {
                                    format!("reusable, {uses}")
                                }
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
