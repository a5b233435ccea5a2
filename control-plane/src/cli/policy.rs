//! `byom policy add|ls|rm`: natural-language policies the Router follows.

use byom_api::Client;
use byom_protocol::pb;
use clap::Subcommand;
use serde_json::{json, Value};

use super::output::{ago, or_dash, print_json, table, time};

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Add a policy, e.g. "Ignore messages in #random unless someone asks for help".
    Add {
        text: String,
        #[arg(long)]
        json: bool,
    },
    /// List policies in the order the Router reads them.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove a policy.
    Rm { id: String },
}

fn policy_json(p: &pb::RouterPolicy) -> Value {
    json!({"id": p.id, "text": p.text, "created_at": time(p.created_at_ms), "created_by": p.created_by,
           "enforced": if p.enforced.is_empty() { "by the agents' judgement" } else { p.enforced.as_str() }})
}

pub async fn run(c: &mut Client, cmd: PolicyCmd) -> anyhow::Result<i32> {
    match cmd {
        PolicyCmd::Add { text, json } => {
            let req = pb::AddPolicyRequest {
                text,
                idempotency_key: byom_api::new_key(),
            };
            let p = byom_api::until_answered(|| {
                let (mut c, req) = (c.clone(), req.clone());
                async move { c.add_policy(req).await }
            })
            .await?
            .into_inner()
            .policy
            .unwrap_or_default();
            if json {
                print_json(&policy_json(&p));
            } else {
                println!("added {}", p.id);
                if p.enforced.is_empty() {
                    println!(
                        "  the Router (and workers on subscribed threads) follow it with judgement"
                    );
                } else {
                    println!("  {} (before any agent sees it)", p.enforced);
                }
            }
        }
        PolicyCmd::Ls { json } => {
            let r = c
                .list_policies(pb::ListPoliciesRequest {})
                .await?
                .into_inner();
            if json {
                print_json(&Value::Array(r.policies.iter().map(policy_json).collect()));
            } else {
                table(
                    &["ID", "ADDED", "BY", "ENFORCED", "POLICY"],
                    r.policies
                        .iter()
                        .map(|p| {
                            vec![
                                p.id.clone(),
                                ago(p.created_at_ms),
                                or_dash(&p.created_by),
                                if p.enforced.is_empty() {
                                    "judgement"
                                } else {
                                    "code"
                                }
                                .into(),
                                super::output::safe(&p.text),
                            ]
                        })
                        .collect(),
                );
            }
        }
        PolicyCmd::Rm { id } => {
            let p = c
                .remove_policy(pb::RemovePolicyRequest { id })
                .await?
                .into_inner()
                .policy
                .unwrap_or_default();
            println!("removed {}: {}", p.id, p.text);
        }
    }
    Ok(0)
}
