//! The tools a Worker's model may call: commands on machines (started
//! now, finished later as events), a program in the code interpreter,
//! reports to the Router, thread routing, recall. Arguments come from a
//! model and are treated as hostile: missing ones are errors the model
//! reads, numbers saturate.

use std::collections::{BTreeMap, VecDeque};

use byom_protocol::id::Kind;
use serde_json::Value;

use super::router::{opt_str, str_arg};
use super::{push_bounded, Core, DEFAULT_COMMAND_TIMEOUT_MS};
use crate::event::{Effect, RouterItem, TriggerInfo};
use crate::llm::ToolCall;
use crate::state::{JsRun, JsStep};
use crate::world::World;

impl Core {
    pub(super) fn worker_tool(
        &mut self,
        world: &mut dyn World,
        id: &str,
        call: &ToolCall,
    ) -> Result<String, String> {
        let a = &call.arguments;
        match call.name.as_str() {
            "shell_start" => {
                let command = str_arg(a, "command")?;
                let machine = opt_str(a, "machine");
                let cmd = self.start_command(world, id, machine, command, timeout_ms(a), None)?;
                Ok(format!(
                    "started {cmd}; its result arrives as an event (shell_stop(\"{cmd}\") stops it)"
                ))
            }
            "shell_stop" => {
                let h = str_arg(a, "handle")?;
                let w = self.records.worker(id).ok_or("no such worker")?;
                match w.commands.get(&h) {
                    Some(c) if !c.done => {
                        self.out.push(Effect::StopCommand {
                            cmd: h.clone(),
                            reason: format!("stopped by {id}"),
                        });
                        Ok(format!("stopping {h}; its end arrives as an event"))
                    }
                    Some(_) => Err(format!("{h} already finished")),
                    None => Err(format!("{h} is not one of your commands")),
                }
            }
            "run_js" => {
                let code = str_arg(a, "code")?;
                let now = self.now;
                let w = self.records.worker_mut(id).ok_or("no such worker")?;
                if w.js.is_some() {
                    return Err("a program is already running; wait for its result".into());
                }
                w.js_runs += 1;
                let run = w.js_runs;
                w.js = Some(JsRun {
                    run,
                    code: code.clone(),
                    started_ms: now,
                    snapshot: None,
                    step: JsStep::Eval,
                    ready: VecDeque::new(),
                    calls: BTreeMap::new(),
                    spawned: 0,
                });
                self.out.push(Effect::RunJs {
                    worker: id.to_string(),
                    run,
                    code,
                    clock_ms: now,
                });
                Ok(format!(
                    "program {id}/js{run} started; its result arrives as an event"
                ))
            }
            "report" => {
                let status = str_arg(a, "status")?;
                let text = str_arg(a, "text")?;
                self.report(world, id, &status, &text);
                Ok("reported".into())
            }
            "unsubscribe" => {
                let threads: Vec<String> = match a.get("thread").and_then(Value::as_str) {
                    Some(t) => vec![t.to_string()],
                    None => self
                        .records
                        .worker(id)
                        .map(|w| w.threads.clone())
                        .unwrap_or_default(),
                };
                for t in &threads {
                    self.unsubscribe(t, id);
                }
                Ok(format!("unsubscribed from {}", threads.join(", ")))
            }
            "watch" => {
                let name = str_arg(a, "thread")?;
                let known = name.starts_with(Kind::Thread.prefix())
                    && self.read(world.thread(&name), None).is_some();
                let thread = if known {
                    name.clone()
                } else {
                    let found = world.find_thread(&name);
                    self.read(found, None).ok_or_else(|| {
                        format!("no thread {name}: give a thread ID or SOURCE:NAME on a connector")
                    })?
                };
                self.subscribe(&thread, id);
                Ok(format!("now watching {thread} ({name})"))
            }
            "bounce" => {
                let trg = str_arg(a, "trigger")?;
                let info = self
                    .read(world.lookup(&trg), None)
                    .ok_or_else(|| format!("no trigger {trg}"))?;
                let t = parse_trigger_lookup(&trg, &info)
                    .ok_or_else(|| format!("{trg} is not a trigger"))?;
                let flags = self
                    .records
                    .worker(id)
                    .map(|w| w.flags.clone())
                    .unwrap_or_default();
                push_bounded(
                    self.records.router_mut(),
                    RouterItem::Bounced {
                        worker: id.to_string(),
                        trigger: t,
                        flags,
                    },
                );
                Ok(format!("{trg} handed back to the router"))
            }
            "recall" | "read" => {
                let obj = str_arg(a, "id")?;
                let off = a.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
                let text = self.recall(world, &obj, off)?;
                self.read_object(world, id, &obj);
                Ok(text)
            }
            other => Err(format!("no tool {other:?}")),
        }
    }
}

/// `timeout_s` of a `shell_start` or `tools.exec` call, in ms (saturating:
/// the value comes from a model).
pub(super) fn timeout_ms(a: &Value) -> u64 {
    a.get("timeout_s")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_COMMAND_TIMEOUT_MS, |s| s.saturating_mul(1000))
}

/// A trigger from `World::lookup` text (JSON of the stored trigger).
fn parse_trigger_lookup(id: &str, text: &str) -> Option<TriggerInfo> {
    let v: Value = serde_json::from_str(text).ok()?;
    Some(TriggerInfo {
        id: id.to_string(),
        thread: v.get("thread_id")?.as_str()?.to_string(),
        source: v.get("source")?.as_str()?.to_string(),
        // The author as judged when it arrived, never the name the
        // message claimed: a trigger without one speaks for nobody.
        user: match v.get("principal").and_then(Value::as_str) {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => format!("unjudged:{}", v.get("user")?.as_str()?),
        },
        text: v.get("text")?.as_str()?.to_string(),
        mention: v.get("mention").and_then(Value::as_bool).unwrap_or(false),
        user_name: String::new(),
        context: Vec::new(),
        trusted: v.get("trusted").and_then(Value::as_bool).unwrap_or(false),
        trust: v
            .get("trust")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        at_ms: v.get("created_at_ms").and_then(Value::as_u64).unwrap_or(0),
        // Whatever it said when it arrived, a bounced message is not an
        // answer now.
        claimed: true,
        direct: false,
    })
}
