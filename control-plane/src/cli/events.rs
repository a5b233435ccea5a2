//! `byom events send|ls|tail`: triggers from channels.

use std::io::Write;

use byom_api::Client;
use byom_protocol::pb;
use clap::Subcommand;
use serde_json::Value;

use super::output::{print_json, trigger_json, trigger_line};

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
        /// The kind of channel, which sets how replies are written: `chat`
        /// (short) or `cli` (structured). Default: `chat` for the source
        /// `chat`, else `cli`.
        #[arg(long, value_parser = ["chat", "cli", "webhook"])]
        kind: Option<String>,
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

pub async fn run(c: &mut Client, cmd: EventsCmd) -> anyhow::Result<i32> {
    match cmd {
        EventsCmd::Send {
            source,
            thread,
            user,
            mention,
            bot,
            kind,
            text,
            json,
        } => {
            let req = pb::SendEventRequest {
                source,
                thread,
                user,
                text,
                mention,
                from_bot: bot,
                idempotency_key: byom_api::new_key(),
                kind: kind.unwrap_or_default(),
                ..Default::default()
            };
            let t = byom_api::until_answered(|| {
                let (mut c, req) = (c.clone(), req.clone());
                async move { c.send_event(req).await }
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
                    t.decision().name(),
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
