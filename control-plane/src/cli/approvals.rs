//! `byom approvals ls|approve|deny`: questions paused programs wait on.

use anyhow::Context;
use byom_api::Client;
use clap::Subcommand;
use serde_json::{json, Value};

use super::agent::{agent, s};
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
            let v = agent(c, "approvals", "", json!({"all": all})).await?;
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
                "{:<31} {:<9} {:<31} {:<12} QUESTION",
                "ID", "STATE", "WORKER", "ASKED"
            );
            for a in rows {
                println!(
                    "{:<31} {:<9} {:<31} {:<12} {}",
                    s(&a, "id"),
                    s(&a, "state"),
                    s(&a, "worker"),
                    ago_at(&a["created_at"]),
                    one_line(s(&a, "question"), 80)
                );
            }
        }
        ApprovalsCmd::Approve { id, answer } => {
            let answer = parse_answer(answer)?;
            agent(
                c,
                "answer",
                &id,
                json!({"approved": true, "answer": answer}),
            )
            .await?;
            println!("approved {id}: the program continues");
        }
        ApprovalsCmd::Deny { id, answer } => {
            let answer = parse_answer(answer)?;
            agent(
                c,
                "answer",
                &id,
                json!({"approved": false, "answer": answer}),
            )
            .await?;
            println!("denied {id}: the program continues without it");
        }
    }
    Ok(0)
}
