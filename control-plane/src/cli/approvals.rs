//! `byom approvals ls|approve|deny`: questions paused programs wait on.

use anyhow::Context;
use byom_api::Client;
use clap::Subcommand;
use serde_json::Value;

use super::agent::{self, s};
use super::output::{ago_at, one_line, print_json};

#[derive(Subcommand, Debug)]
pub enum ApprovalsCmd {
    /// Questions programs are waiting on (open ones unless --all).
    Ls {
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Approve: the paused program continues.
    Approve {
        id: String,
        /// The answer the program receives, as JSON (default: null).
        #[arg(long)]
        answer: Option<String>,
    },
    /// Deny: the program continues knowing it was refused.
    Deny {
        id: String,
        #[arg(long)]
        answer: Option<String>,
    },
}

fn parse_answer(a: Option<String>) -> anyhow::Result<Value> {
    match a {
        None => Ok(Value::Null),
        Some(t) => serde_json::from_str(&t).with_context(|| {
            format!(
                "--answer must be JSON; for text, quote it: --answer '{}'",
                serde_json::to_string(&t).unwrap_or_default()
            )
        }),
    }
}

pub async fn run(c: &mut Client, cmd: ApprovalsCmd) -> anyhow::Result<i32> {
    match cmd {
        ApprovalsCmd::Ls { all, json } => {
            let v = agent::approvals(c, all).await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            let rows = v.as_array().cloned().unwrap_or_default();
            if rows.is_empty() {
                println!("no {}approvals", if all { "" } else { "open " });
                return Ok(0);
            }
            println!(
                "{:<31} {:<7} {:<9} {:<31} {:<12} {:<20} ACTION",
                "ID", "CODE", "STATE", "WORKER", "ASKED", "WHO MAY ANSWER"
            );
            for a in rows {
                // Open: who may answer; answered: who did.
                let who = if s(&a, "state") == "open" {
                    let v: Vec<&str> = a["approvers"]
                        .as_array()
                        .map(|v| v.iter().filter_map(|x| x.as_str()).collect())
                        .unwrap_or_default();
                    if v.is_empty() {
                        "any admin".to_string()
                    } else {
                        v.join(",")
                    }
                } else {
                    format!("by {}", s(&a, "by"))
                };
                // The exact action approved (the request's text for old
                // records).
                let action = if s(&a, "action").is_empty() {
                    s(&a, "question")
                } else {
                    s(&a, "action")
                };
                println!(
                    "{:<31} {:<7} {:<9} {:<31} {:<12} {:<20} {}",
                    s(&a, "id"),
                    s(&a, "code"),
                    s(&a, "state"),
                    s(&a, "worker"),
                    ago_at(&a["created_at"]),
                    who,
                    one_line(action, 80)
                );
                for r in a["refused"].as_array().cloned().unwrap_or_default() {
                    if let Some(r) = r.as_str() {
                        println!("    refused: {}", one_line(r, 200));
                    }
                }
            }
        }
        ApprovalsCmd::Approve { id, answer } => {
            let answer = parse_answer(answer)?;
            agent::answer(c, &id, true, &answer).await?;
            println!("approved {id}: the program continues");
        }
        ApprovalsCmd::Deny { id, answer } => {
            let answer = parse_answer(answer)?;
            agent::answer(c, &id, false, &answer).await?;
            println!("denied {id}: the program continues without it");
        }
    }
    Ok(0)
}
