//! `byom tasks|workers|threads|approvals|router|chat`: the agents from the
//! command line. Tables for people, `--json` for scripts.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use byom_protocol::pb;
use clap::Subcommand;
use serde_json::{json, Value};

use super::{ago, or_dash, print_json};
use crate::client::Client;

#[derive(Subcommand, Debug)]
pub enum TasksCmd {
    /// Tasks (top-level workers), newest first.
    Ls {
        /// Include ended tasks' subagents too (all workers).
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

#[derive(Subcommand, Debug)]
pub enum WorkersCmd {
    /// Every worker, subagents included, newest first.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// A worker's transcript.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

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

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    /// The thread to talk on (the chat's own name for it).
    #[arg(long, default_value = "general")]
    pub thread: String,
    /// Who you are on the channel.
    #[arg(long, env = "USER", default_value = "me")]
    pub user: String,
    #[arg(long, default_value = "chat")]
    pub source: String,
    /// Send these messages instead of reading lines from stdin.
    #[arg(short, long = "message")]
    pub messages: Vec<String>,
    /// After the last message, wait this long for replies.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
    /// Stop once this many replies arrived (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub replies: usize,
}

pub async fn agent(c: &mut Client, op: &str, id: &str, body: Value) -> anyhow::Result<Value> {
    let r = c
        .agent(pb::AgentRequest {
            op: op.into(),
            id: id.into(),
            json: if body.is_null() {
                String::new()
            } else {
                body.to_string()
            },
        })
        .await?
        .into_inner();
    serde_json::from_str(&r.json).context("the server sent a reply that is not JSON")
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn one_line(t: &str, max: usize) -> String {
    let t: String = t.split_whitespace().collect::<Vec<_>>().join(" ");
    if t.chars().count() > max {
        format!("{}…", t.chars().take(max).collect::<String>())
    } else {
        t
    }
}

fn worker_table(rows: &Value) {
    let rows = rows.as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        println!("no tasks yet: send one with `byom chat` or `byom events send`");
        return;
    }
    println!(
        "{:<31} {:<9} {:<10} {:>4} {:<12} TASK",
        "ID", "STATUS", "MACHINE", "CMDS", "UPDATED"
    );
    for w in rows {
        println!(
            "{:<31} {:<9} {:<10} {:>4} {:<12} {}",
            s(&w, "id"),
            s(&w, "status"),
            or_dash(s(&w, "machine")),
            w["commands"].as_u64().unwrap_or(0),
            ago(w["updated_ms"].as_u64().unwrap_or(0)),
            one_line(s(&w, "task"), 60)
        );
    }
}

fn print_worker(v: &Value) {
    let sm = &v["summary"];
    println!("{} ({})", s(sm, "id"), s(sm, "status"));
    if let Some(p) = sm["parent"].as_str() {
        println!("  subagent of: {p}");
    }
    println!("  task:     {}", one_line(s(sm, "task"), 200));
    println!(
        "  threads:  {}",
        or_dash(
            &sm["threads"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" "))
                .unwrap_or_default()
        )
    );
    println!("  machine:  {}", or_dash(s(sm, "machine")));
    println!(
        "  created:  {}",
        ago(sm["created_ms"].as_u64().unwrap_or(0))
    );
    let u = &sm["usage"];
    println!(
        "  model:    {} calls, {} input tokens ({} cached), {} output",
        sm["model_calls"], u["input_tokens"], u["cache_read_tokens"], u["output_tokens"]
    );
    if let Some(cmds) = v["commands"].as_object() {
        for (id, c) in cmds {
            println!(
                "  command:  {id} on {}: `{}`{}",
                s(c, "machine"),
                one_line(s(c, "command"), 80),
                if c["done"].as_bool() == Some(true) {
                    ""
                } else {
                    " (running)"
                }
            );
        }
    }
    if let Some(ch) = v["children"].as_array() {
        for c in ch {
            println!(
                "  subagent: {} ({}) {}",
                s(c, "id"),
                s(c, "status"),
                one_line(s(c, "task"), 60)
            );
        }
    }
    if !s(sm, "last_report").is_empty() {
        println!("  report:   {}", one_line(s(sm, "last_report"), 300));
    }
    println!("\ntranscript:");
    for m in v["conversation"].as_array().cloned().unwrap_or_default() {
        let role = s(&m, "role");
        let text = s(&m, "text");
        match role {
            "assistant" => {
                if !text.is_empty() {
                    println!("  worker: {}", one_line(text, 300));
                }
                for c in m["tool_calls"].as_array().cloned().unwrap_or_default() {
                    println!(
                        "  worker → {}({})",
                        s(&c, "name"),
                        one_line(&c["arguments"].to_string(), 200)
                    );
                }
            }
            "tool" => println!("    ← {}", one_line(text, 200)),
            _ => {
                for l in text.lines() {
                    println!("  » {}", one_line(l, 300));
                }
            }
        }
    }
}

pub async fn tasks(c: &mut Client, cmd: TasksCmd) -> anyhow::Result<i32> {
    match cmd {
        TasksCmd::Ls { json } => {
            let v = agent(c, "tasks", "", Value::Null).await?;
            if json {
                print_json(&v);
            } else {
                worker_table(&v);
            }
        }
        TasksCmd::Show { id, json } => return workers(c, WorkersCmd::Show { id, json }).await,
        TasksCmd::Cancel { id } => {
            agent(c, "cancel", &id, Value::Null).await?;
            println!("cancelling {id}: its worker, subagents and running commands stop");
        }
    }
    Ok(0)
}

pub async fn workers(c: &mut Client, cmd: WorkersCmd) -> anyhow::Result<i32> {
    match cmd {
        WorkersCmd::Ls { json } => {
            let v = agent(c, "workers", "", Value::Null).await?;
            if json {
                print_json(&v);
            } else {
                worker_table(&v);
            }
        }
        WorkersCmd::Show { id, json } => {
            let v = agent(c, "worker", &id, Value::Null).await?;
            if json {
                print_json(&v);
            } else {
                print_worker(&v);
            }
        }
    }
    Ok(0)
}

pub async fn threads(c: &mut Client, cmd: ThreadsCmd) -> anyhow::Result<i32> {
    match cmd {
        ThreadsCmd::Ls { json } => {
            let v = agent(c, "threads", "", Value::Null).await?;
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
                    s(&t, "source"),
                    one_line(s(&t, "external"), 20),
                    ago(t["last_trigger_ms"].as_u64().unwrap_or(0)),
                    or_dash(&w.join(" "))
                );
            }
        }
        ThreadsCmd::Show { id, json } => {
            let v = agent(c, "thread", &id, Value::Null).await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            println!(
                "{} on {} ({})",
                s(&v, "id"),
                s(&v, "source"),
                s(&v, "external")
            );
            for m in v["messages"].as_array().cloned().unwrap_or_default() {
                let who = if m["from_bot"].as_bool() == Some(true) && s(&m, "user") == "byom" {
                    "byom".to_string()
                } else {
                    s(&m, "user").to_string()
                };
                println!(
                    "  {who:>8}: {}",
                    s(&m, "text").replace('\n', "\n            ")
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

pub async fn approvals(c: &mut Client, cmd: ApprovalsCmd) -> anyhow::Result<i32> {
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
                    ago(a["created_ms"].as_u64().unwrap_or(0)),
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

pub async fn router(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let v = agent(c, "router", "", Value::Null).await?;
    if json {
        print_json(&v);
        return Ok(0);
    }
    let st = &v["stats"];
    println!("router");
    println!("  turns:          {}", st["turns"]);
    println!("  model calls:    {}", st["model_calls"]);
    println!("  decisions:      {}", st["decisions"]);
    println!(
        "  events:         {} ({} passed through to workers)",
        st["events"], st["passed_through"]
    );
    println!("  replies:        {}", st["replies"]);
    println!("  queued now:     {}", v["queued"]);
    let u = &st["usage"];
    println!(
        "  tokens:         {} input ({} cached), {} output",
        u["input_tokens"], u["cache_read_tokens"], u["output_tokens"]
    );
    Ok(0)
}

/// Bot lines `byom chat` keeps while it does not yet know its thread's ID.
const CHAT_EARLY_REPLIES: usize = 256;

/// `byom chat`: you type as a user on a thread; the agent's replies on that
/// thread appear as they are posted.
pub async fn chat(c: &mut Client, a: ChatArgs) -> anyhow::Result<i32> {
    let mut tail = c
        .tail_triggers(pb::TailTriggersRequest {})
        .await?
        .into_inner();
    let (thread_tx, mut thread_rx) = tokio::sync::watch::channel(String::new());
    let max = a.replies;
    let printer = tokio::spawn(async move {
        let mut seen = 0usize;
        // The thread's ID comes back with the first send, and a fast reply
        // can arrive before it: keep the bot's lines until we know it.
        let mut early: std::collections::VecDeque<pb::Trigger> = Default::default();
        let mut thread = String::new();
        let mut print = |t: &pb::Trigger| {
            println!("byom: {}", t.text.replace('\n', "\n      "));
            let _ = std::io::stdout().flush();
            seen += 1;
            max != 0 && seen >= max
        };
        loop {
            tokio::select! {
                m = tail.message() => {
                    let Ok(Some(t)) = m else { return };
                    if !(t.from_bot && t.user == "byom") {
                        continue;
                    }
                    if thread.is_empty() {
                        if early.len() >= CHAT_EARLY_REPLIES {
                            early.pop_front();
                        }
                        early.push_back(t);
                    } else if t.thread_id == thread && print(&t) {
                        return;
                    }
                }
                r = thread_rx.changed(), if thread.is_empty() => {
                    if r.is_err() {
                        // The sender is gone without a thread: nothing to show.
                        return;
                    }
                    thread = thread_rx.borrow_and_update().clone();
                    for t in early.drain(..) {
                        if t.thread_id == thread && print(&t) {
                            return;
                        }
                    }
                }
            }
        }
    });
    let interactive = a.messages.is_empty();
    if interactive {
        eprintln!(
            "chatting on {}/{} as {} (Ctrl-D to end)",
            a.source, a.thread, a.user
        );
    }
    let send = |text: String| {
        let mut c = c.clone();
        let (source, thread, user) = (a.source.clone(), a.thread.clone(), a.user.clone());
        async move {
            c.send_event(pb::SendEventRequest {
                source,
                thread,
                user,
                text,
                mention: true,
                from_bot: false,
            })
            .await
            .map(|r| {
                r.into_inner()
                    .trigger
                    .map(|t| t.thread_id)
                    .unwrap_or_default()
            })
        }
    };
    if interactive {
        // Lines from a blocking reader thread; the channel bounds how far it
        // reads ahead.
        let (line_tx, mut lines) = tokio::sync::mpsc::channel::<String>(16);
        std::thread::spawn(move || {
            for line in std::io::stdin().lines() {
                let Ok(l) = line else { return };
                if line_tx.blocking_send(l).is_err() {
                    return;
                }
            }
        });
        while let Some(line) = lines.recv().await {
            if line.trim().is_empty() {
                continue;
            }
            let th = send(line).await?;
            let _ = thread_tx.send(th);
        }
    } else {
        for m in a.messages.clone() {
            println!("{}: {m}", a.user);
            let th = send(m).await?;
            let _ = thread_tx.send(th);
        }
    }
    let _ = tokio::time::timeout(a.wait, printer).await;
    Ok(0)
}
