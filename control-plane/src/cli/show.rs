//! `byom show ID`: any object by its ID, or a machine by name.

use anyhow::bail;
use byom_api::Client;
use byom_protocol::pb;
use serde_json::json;

use super::output::{
    ago, labels, or_dash, print_json, safe_line, time, token_json, trigger_json, trigger_line,
};

pub async fn run(c: &mut Client, id: &str, json: bool) -> anyhow::Result<i32> {
    use pb::show_response::Object;
    if id.starts_with(byom_protocol::id::Kind::Outbox.prefix()) {
        let cmd = super::connectors::OutboxCmd::Show {
            id: id.to_string(),
            json,
        };
        return super::connectors::outbox(c, cmd).await;
    }
    match c
        .show(pb::ShowRequest { id: id.to_string() })
        .await?
        .into_inner()
        .object
    {
        Some(Object::Machine(m)) => super::machines::print_machine(&m, json),
        Some(Object::Command(_)) => {
            return super::commands::run(
                c,
                super::commands::CommandsCmd::Show {
                    id: id.to_string(),
                    json,
                },
            )
            .await;
        }
        Some(Object::Trigger(t)) => {
            let fate = super::agent::fate(c, &t.id)
                .await
                .ok()
                .and_then(|v| v["fate"].as_str().map(str::to_string));
            let became = match (t.decision(), &fate) {
                (pb::TriggerDecision::Ignored, _) => {
                    format!("ignored before the agents saw it: {}", t.reason)
                }
                (_, Some(f)) => f.clone(),
                _ if t.from_bot => "the agent's own message".to_string(),
                _ => "with the Router: not decided yet".to_string(),
            };
            if json {
                let mut v = trigger_json(&t);
                v["became"] = json!(became);
                print_json(&v);
            } else {
                println!("{}", trigger_line(&t));
                println!("  thread:   {}", t.thread_id);
                println!("  decision: {}", safe_line(&t.reason));
                println!("  became:   {}", safe_line(&became));
                if !t.principal.is_empty() {
                    println!(
                        "  trust:    {} ({})",
                        if t.trusted { "trusted" } else { "untrusted" },
                        safe_line(&t.trust)
                    );
                }
                for (k, v) in [
                    ("from", &t.user_name),
                    ("replies to", &t.reply_to),
                    ("link", &t.link),
                ] {
                    if !v.is_empty() {
                        println!("  {k:<9} {}", safe_line(v));
                    }
                }
            }
        }
        Some(Object::Thread(t)) => {
            if json {
                print_json(
                    &json!({"id": t.id, "source": t.source, "external": t.external, "created_at": time(t.created_at_ms), "last_trigger_at": time(t.last_trigger_ms)}),
                );
            } else {
                println!(
                    "{} on {} ({})",
                    t.id,
                    safe_line(&t.source),
                    safe_line(&t.external)
                );
                println!("  created:      {}", ago(t.created_at_ms));
                println!("  last trigger: {}", ago(t.last_trigger_ms));
                println!("  see: byom events ls --thread {}", t.id);
            }
        }
        Some(Object::Token(t)) => {
            if json {
                print_json(&token_json(&t));
            } else {
                println!("{} {}", t.id, or_dash(&t.name));
                println!("  labels:   {}", labels(&t.labels));
                println!("  created:  {}", ago(t.created_at_ms));
                println!("  expires:  {}", ago(t.expires_at_ms));
                if t.used_at_ms != 0 {
                    println!("  used:     {} by {}", ago(t.used_at_ms), t.used_by);
                }
                if t.revoked {
                    println!("  revoked");
                }
            }
        }
        Some(Object::Worker(w)) => {
            if !json {
                return super::workers::run(
                    c,
                    super::workers::WorkersCmd::Show {
                        id: id.to_string(),
                        json,
                    },
                )
                .await;
            }
            print_json(&super::views::worker_record(&w));
        }
        // Shown as JSON either way: every field is worth reading.
        Some(Object::Approval(a)) => print_json(&super::views::approval(&a)),
        Some(Object::Snapshot(s)) => print_json(&super::views::snapshot(&s)),
        None => bail!("{id}: nothing to show"),
    }
    Ok(0)
}
