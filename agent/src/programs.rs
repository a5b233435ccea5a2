//! What the core needs from a code interpreter, without knowing one: the
//! capabilities a worker's program gets ([`capability_specs`]: names,
//! argument schemas, bounds) and one step of a program ([`Programs`]). The
//! server implements it with QuickJS in wasmtime; [`crate::sim`] takes any
//! implementation, so the simulator runs with the real interpreter in the
//! server's tests and with [`crate::sim::ScriptedPrograms`] here.

use std::future::Future;

use serde_json::{json, Value};

use crate::budgets::Budgets;
use crate::event::JsOutcome;

/// One capability a program may call, all durable: the program pauses on
/// each call and the core decides what happens.
#[derive(Debug, Clone, PartialEq)]
pub struct CapabilitySpec {
    pub namespace: &'static str,
    pub name: &'static str,
    /// JSON Schema the call's argument must satisfy.
    pub schema: Value,
    /// Calls of it in flight at once.
    pub max_concurrent: usize,
    /// Calls of it in one run.
    pub max_calls: usize,
}

/// The capabilities a worker's program has: `tools.exec`, `agents.spawn`
/// and `human.ask`.
pub fn capability_specs(b: &Budgets) -> Vec<CapabilitySpec> {
    vec![
        CapabilitySpec {
            namespace: "tools",
            name: "exec",
            schema: json!({"type": "object", "properties": {
                "machine": {"type": "string", "maxLength": 200},
                "command": {"type": "string", "maxLength": 8192},
                "timeout_s": {"type": "integer", "minimum": 1, "maximum": 86400}
            }, "required": ["command"], "additionalProperties": false}),
            max_concurrent: 16,
            max_calls: 64,
        },
        CapabilitySpec {
            namespace: "agents",
            name: "spawn",
            schema: json!({"type": "object", "properties": {
                "task": {"type": "string", "maxLength": 8000},
                "machine": {"type": "string", "maxLength": 200}
            }, "required": ["task"], "additionalProperties": false}),
            max_concurrent: b.max_subagents,
            max_calls: b.max_subagents,
        },
        CapabilitySpec {
            namespace: "human",
            name: "ask",
            schema: json!({"type": "string", "maxLength": 2000}),
            max_concurrent: 1,
            max_calls: 4,
        },
    ]
}

/// One interpreter step of a worker's program.
#[derive(Debug, Clone, PartialEq)]
pub enum ProgramStep {
    /// The first eval of the code, with the virtual clock starting there.
    Run { code: String, clock_ms: u64 },
    /// Restore snapshot `snapshot` and settle call `call` with `result`.
    Resume {
        snapshot: String,
        call: u32,
        result: Result<Value, String>,
    },
}

/// A code interpreter with a place to keep paused programs.
pub trait Programs {
    /// Runs one step to the program's end or its next pause. A pause keeps
    /// the program's state under `snapshot_id` (a fresh `snp_…`) and names
    /// it in [`JsOutcome::Paused`].
    fn step(&mut self, step: ProgramStep, snapshot_id: String) -> impl Future<Output = JsOutcome>;
    /// The core no longer needs this snapshot.
    fn drop_snapshot(&mut self, id: &str);
    /// Snapshots kept now (to check that none leak).
    fn snapshots(&self) -> usize;
}
