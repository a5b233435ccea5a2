//! `byom threads ls|show`: conversations on channels, with the agent's
//! replies.

use byom_api::Client;
use clap::Subcommand;
use serde_json::Value;

use super::agent::{self, s};
use super::output::{ago_at, one_line, or_dash, print_json, safe, safe_line};

#[derive(Subcommand, Debug)]
pub enum ThreadsCmd {
    /// Threads, most recent first, with the workers subscribed to each.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// A thread's messages (people's and the agent's) and its workers.
    Show {
        /// thr_… ID or the channel's own thread name.
        id: String,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(c: &mut Client, cmd: ThreadsCmd) -> anyhow::Result<i32> {
    match cmd {
        ThreadsCmd::Ls { json } => {
            let v = agent::threads(c).await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            println!(
                "{:<31} {:<8} {:<20} {:<12} WORKERS",
                "ID", "SOURCE", "NAME", "LAST"
            );
            for t in v.as_array().cloned().unwrap_or_default() {
                let w: Vec<&str> = t["workers"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                println!(
                    "{:<31} {:<8} {:<20} {:<12} {}",
                    s(&t, "id"),
                    safe_line(s(&t, "source")),
                    one_line(s(&t, "external"), 20),
                    ago_at(&t["last_trigger_at"]),
                    or_dash(&w.join(" "))
                );
            }
        }
        ThreadsCmd::Show { id, json } => {
            let v = agent::thread(c, &id).await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            println!(
                "{} on {} ({})",
                s(&v, "id"),
                safe_line(s(&v, "source")),
                safe_line(s(&v, "external"))
            );
            for m in v["messages"].as_array().cloned().unwrap_or_default() {
                let who = if m["from_bot"].as_bool() == Some(true) && s(&m, "user") == "byom" {
                    "byom".to_string()
                } else {
                    safe_line(s(&m, "user"))
                };
                println!(
                    "  {who:>8}: {}",
                    safe(s(&m, "text")).replace('\n', "\n            ")
                );
            }
            for w in v["workers"].as_array().cloned().unwrap_or_default() {
                println!(
                    "  worker {} ({}): {}",
                    s(&w, "id"),
                    s(&w, "status"),
                    one_line(s(&w, "task"), 60)
                );
            }
        }
    }
    Ok(0)
}
