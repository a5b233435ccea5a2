//! `byom machines ls|show|rename|label|revoke`.

use std::collections::HashMap;

use byom_api::Client;
use byom_protocol::pb;
use clap::Subcommand;
use serde_json::Value;

use super::output::{ago, labels, machine_json, or_dash, print_json, safe_line, table};
use super::parse_kv;

#[derive(Subcommand, Debug)]
pub enum MachinesCmd {
    /// List machines.
    Ls {
        /// Include revoked machines.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Show one machine (by ID or name).
    Show {
        machine: String,
        #[arg(long)]
        json: bool,
    },
    /// Rename a machine.
    Rename { machine: String, name: String },
    /// Set labels (k=v) and remove labels (--remove k).
    Label {
        machine: String,
        #[arg(value_parser = parse_kv)]
        set: Vec<(String, String)>,
        #[arg(long)]
        remove: Vec<String>,
    },
    /// Revoke a machine: closes its connection, kills its commands, refuses
    /// its certificate from now on.
    Revoke { machine: String },
    /// Forget a revoked machine (its commands stay in the audit trail).
    Rm { machine: String },
}

/// Machine ID → name, revoked machines included, for tables.
pub async fn machine_names(c: &mut Client) -> anyhow::Result<HashMap<String, String>> {
    Ok(c.list_machines(pb::ListMachinesRequest {
        include_revoked: true,
    })
    .await?
    .into_inner()
    .machines
    .into_iter()
    .map(|m| (m.id, m.name))
    .collect())
}

fn status_of(m: &pb::Machine) -> String {
    if m.revoked {
        "revoked".into()
    } else if m.online && m.paused {
        "paused".into()
    } else if m.online {
        "online".into()
    } else if m.asleep_since_ms != 0 {
        "asleep".into()
    } else {
        "offline".into()
    }
}

pub async fn run(c: &mut Client, cmd: MachinesCmd) -> anyhow::Result<i32> {
    match cmd {
        MachinesCmd::Ls { all, json } => {
            let r = c
                .list_machines(pb::ListMachinesRequest {
                    include_revoked: all,
                })
                .await?
                .into_inner();
            if json {
                let shipped = &r.shipped_version;
                print_json(&Value::Array(
                    r.machines
                        .iter()
                        .map(|m| {
                            let mut v = machine_json(m);
                            v["behind"] = Value::Bool(behind(&m.version, shipped));
                            v
                        })
                        .collect(),
                ));
            } else {
                table(
                    &[
                        "ID",
                        "NAME",
                        "LABELS",
                        "STATUS",
                        "LAST SEEN",
                        "VERSION",
                        "OS",
                        "QUEUED",
                    ],
                    r.machines
                        .iter()
                        .map(|m| {
                            vec![
                                m.id.clone(),
                                m.name.clone(),
                                labels(&m.labels),
                                status_of(m),
                                if m.online {
                                    "now".into()
                                } else {
                                    ago(m.last_seen_ms)
                                },
                                safe_line(&if behind(&m.version, &r.shipped_version) {
                                    format!("{} (behind {})", m.version, r.shipped_version)
                                } else {
                                    or_dash(&m.version)
                                }),
                                safe_line(&format!("{}/{}", m.os, m.arch)),
                                m.queued_commands.to_string(),
                            ]
                        })
                        .collect(),
                );
            }
        }
        MachinesCmd::Show { machine, json } => {
            let m = c
                .get_machine(pb::MachineRef { machine })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            print_machine(&m, json);
        }
        MachinesCmd::Rename { machine, name } => {
            let m = c
                .rename_machine(pb::RenameMachineRequest { machine, name })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            println!("{} is now named {}", m.id, m.name);
        }
        MachinesCmd::Label {
            machine,
            set,
            remove,
        } => {
            let m = c
                .label_machine(pb::LabelMachineRequest {
                    machine,
                    set: set.into_iter().collect(),
                    remove,
                })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            println!("{} labels: {}", m.name, labels(&m.labels));
        }
        MachinesCmd::Revoke { machine } => {
            let m = c
                .revoke_machine(pb::MachineRef { machine })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            println!("revoked {} ({}): its certificate is refused from now on, and its name is free; pair it again with a new token to use it", m.name, m.id);
        }
        MachinesCmd::Rm { machine } => {
            let m = c
                .remove_machine(pb::MachineRef { machine })
                .await?
                .into_inner()
                .machine
                .unwrap_or_default();
            println!("forgot {} ({})", m.name, m.id);
        }
    }
    Ok(0)
}

pub fn print_machine(m: &pb::Machine, json: bool) {
    if json {
        print_json(&machine_json(m));
        return;
    }
    let status = if m.online && m.paused {
        format!(
            "online from {}, paused by its owner (commands wait queued)",
            m.remote_addr
        )
    } else if m.online {
        format!(
            "online over {} from {}",
            if m.transport.is_empty() {
                "quic"
            } else {
                &m.transport
            },
            m.remote_addr
        )
    } else if m.revoked {
        format!(
            "revoked {} ({})",
            ago(m.revoked_at_ms),
            safe_line(&m.offline_reason)
        )
    } else if m.asleep_since_ms != 0 {
        format!(
            "asleep since {} (it said it was going to sleep; its commands wait for it)",
            ago(m.asleep_since_ms)
        )
    } else if m.offline_reason.is_empty() {
        format!("offline, last seen {}", ago(m.last_seen_ms))
    } else {
        format!(
            "offline, last seen {}: {}",
            ago(m.last_seen_ms),
            safe_line(&m.offline_reason)
        )
    };
    println!("{} ({})", m.name, m.id);
    println!("  status:       {status}");
    println!("  labels:       {}", labels(&m.labels));
    println!(
        "  host:         {} ({}/{})",
        safe_line(&or_dash(&m.hostname)),
        safe_line(&m.os),
        safe_line(&m.arch)
    );
    println!("  version:      {}", safe_line(&or_dash(&m.version)));
    println!(
        "  commands:     {} queued, {} running",
        m.queued_commands, m.running_commands
    );
    println!(
        "  paired:       {} with {}",
        ago(m.created_at_ms),
        or_dash(&m.token_id)
    );
    println!("  certificate:  expires {}", ago(m.cert_not_after_ms));
    println!("  key sha256:   {}", m.public_key_sha256);
    if !m.sandbox.is_empty() {
        println!("  sandbox:      {}", safe_line(&m.sandbox));
    }
    if !m.policy_digest.is_empty() {
        println!(
            "  local policy: {} (sha256 {})",
            safe_line(&or_dash(&m.policy_summary)),
            &m.policy_digest[..m.policy_digest.len().min(12)]
        );
    }
}

/// Whether a daemon runs an older version than the server ships (an
/// upgrade waits for it: `byomd upgrade`, or `auto_upgrade` in its policy).
fn behind(version: &str, shipped: &str) -> bool {
    !version.is_empty()
        && !shipped.is_empty()
        && byom_protocol::manifest::version_cmp(version, shipped).is_lt()
}
