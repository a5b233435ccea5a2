//! `byom status`: the admin side on one screen: the server, machines,
//! commands, tasks, approvals and replies that failed to go out.

use byom_api::Client;
use byom_protocol::pb::{self, CommandState};
use serde_json::json;

use super::output::print_json;

/// Commands looked at for the queued/running counts (the newest).
const RECENT_COMMANDS: u32 = 1000;

pub async fn run(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let info = c.server_info(pb::ServerInfoRequest {}).await?.into_inner();
    let machines = c
        .list_machines(pb::ListMachinesRequest {
            include_revoked: false,
        })
        .await?
        .into_inner()
        .machines;
    let online = machines.iter().filter(|m| m.online && !m.paused).count();
    let paused = machines.iter().filter(|m| m.paused).count();
    let offline = machines.iter().filter(|m| !m.online && !m.paused).count();
    let commands = c
        .list_commands(pb::ListCommandsRequest {
            machine: String::new(),
            state: 0,
            limit: RECENT_COMMANDS,
            since_ms: 0,
        })
        .await?
        .into_inner()
        .commands;
    let count = |s: &[CommandState]| commands.iter().filter(|c| s.contains(&c.state())).count();
    let queued = count(&[CommandState::Queued]);
    let running = count(&[
        CommandState::Dispatched,
        CommandState::Running,
        CommandState::AwaitingLocalApproval,
    ]);
    let tasks = super::agent::workers(c, false).await?;
    let open_tasks = tasks
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|t| matches!(t["status"].as_str(), Some("running" | "waiting")))
                .count()
        })
        .unwrap_or(0);
    let approvals = super::agent::approvals(c, false).await?;
    let waiting = approvals.as_array().map(Vec::len).unwrap_or(0);
    let failed = super::agent::outbox(c, true, 1000)
        .await
        .ok()
        .and_then(|v| v.as_array().map(Vec::len))
        .unwrap_or(0);
    let v = json!({
        "server": {"version": info.version, "public_addr": info.public_addr, "quic_addr": info.quic_addr,
                   "ca_sha256": info.ca_sha256},
        "machines": {"online": online, "offline": offline, "paused": paused, "total": machines.len()},
        "commands": {"queued": queued, "running": running},
        "tasks": {"open": open_tasks},
        "approvals": {"waiting": waiting},
        "outbox": {"failed": failed},
    });
    if json {
        print_json(&v);
        return Ok(0);
    }
    println!("server     byom {} at {}", info.version, info.public_addr);
    println!(
        "machines   {online} online, {offline} offline, {paused} paused{}",
        if machines.is_empty() {
            " (pair one: `byom token create --name NAME`)"
        } else {
            ""
        }
    );
    println!("commands   {queued} queued, {running} running");
    println!("tasks      {open_tasks} open");
    println!(
        "approvals  {waiting} waiting{}",
        if waiting > 0 {
            " (`byom approvals ls`)"
        } else {
            ""
        }
    );
    println!(
        "outbox     {failed} failed{}",
        if failed > 0 {
            " (`byom outbox ls --failed`)"
        } else {
            ""
        }
    );
    Ok(0)
}
