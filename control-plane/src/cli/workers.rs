//! `byom workers ls|show`: every worker and subagent, with transcripts.

use byom_api::Client;
use clap::Subcommand;
use serde_json::Value;

use super::agent::{self, s};
use super::output::{ago_at, one_line, or_dash, print_json};

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

pub fn worker_table(rows: &Value) {
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
            ago_at(&w["updated_at"]),
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
    println!("  machine:  {}", one_line(&or_dash(s(sm, "machine")), 80));
    if !s(v, "model").is_empty() {
        println!("  model:    {}", one_line(s(v, "model"), 300));
    }
    println!("  created:  {}", ago_at(&sm["created_at"]));
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
                } else if c["held"].is_string() {
                    " (waiting for approval)"
                } else {
                    " (running)"
                }
            );
            if !s(c, "approved_by").is_empty() {
                println!("            approved by {}", s(c, "approved_by"));
            }
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
    // The Rule of Two: what this worker holds, and which objects gave it.
    println!(
        "  rule of two: {} (A untrusted input, B sensitive access, C changes or communicates)",
        s(sm, "rule_of_two")
    );
    for line in s(sm, "containment").lines() {
        println!("    {}", one_line(line, 300));
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

pub async fn run(c: &mut Client, cmd: WorkersCmd) -> anyhow::Result<i32> {
    match cmd {
        WorkersCmd::Ls { json } => {
            let v = agent::workers(c, true).await?;
            if json {
                print_json(&v);
            } else {
                worker_table(&v);
            }
        }
        WorkersCmd::Show { id, json } => {
            let v = agent::worker(c, &id).await?;
            if json {
                print_json(&v);
            } else {
                print_worker(&v);
            }
        }
    }
    Ok(0)
}
