//! `byom tasks ls|show|cancel`: what the agent is working on.

use byom_api::Client;
use clap::Subcommand;

use super::agent;
use super::output::print_json;
use super::workers::{worker_table, WorkersCmd};

#[derive(Subcommand, Debug)]
pub enum TasksCmd {
    /// Tasks (top-level workers), newest first.
    Ls {
        /// Print JSON (RFC 3339 times) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A task: its status, threads, commands, subagents and transcript.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop a task: its worker, subagents and running commands.
    Cancel { id: String },
}

pub async fn run(c: &mut Client, cmd: TasksCmd) -> anyhow::Result<i32> {
    match cmd {
        TasksCmd::Ls { json } => {
            let v = agent::workers(c, false).await?;
            if json {
                print_json(&v);
            } else {
                worker_table(&v);
            }
        }
        TasksCmd::Show { id, json } => {
            return super::workers::run(c, WorkersCmd::Show { id, json }).await
        }
        TasksCmd::Cancel { id } => {
            agent::cancel(c, &id).await?;
            println!("cancelling {id}: its worker, subagents and running commands stop");
        }
    }
    Ok(0)
}
