//! Workers' programs in the real interpreter (QuickJS in wasmtime, from
//! `byom-sandbox`): the capabilities the agents define, one step of a
//! program to its end or its next pause ([`run_program_step`]: the server's
//! driver keeps snapshots in the store), and [`SandboxPrograms`], the same
//! with snapshots in memory, for the simulator.

use std::collections::HashMap;

use byom_agent::event::{JsCallReq, JsOutcome};
use byom_agent::programs::{capability_specs, ProgramStep, Programs};
use byom_agent::Budgets;
use byom_sandbox::{Capability, Engine, ErrorKind, Interpreter, Limits, Outcome, Snapshot};
use serde_json::Value;

/// A step as the interpreter takes it: a snapshot's bytes, not its ID.
pub enum Step {
    Run {
        code: String,
        clock_ms: u64,
    },
    Resume {
        snapshot: Vec<u8>,
        call: u32,
        result: Result<Value, String>,
    },
}

pub fn error(kind: ErrorKind, message: impl Into<String>) -> JsOutcome {
    JsOutcome::Error {
        kind: kind.name().into(),
        message: message.into(),
    }
}

/// The agents' capabilities as the interpreter knows them.
pub fn capabilities(b: &Budgets) -> Vec<Capability> {
    capability_specs(b)
        .into_iter()
        .map(|c| {
            Capability::durable(c.namespace, c.name)
                .with_schema(c.schema)
                .with_policy(c.max_concurrent, c.max_calls)
        })
        .collect()
}

/// Runs one program step to its end or next pause. A pause hands the
/// snapshot to `keep`, which makes it durable and names it.
pub async fn run_program_step(
    limits: Limits,
    key: &[u8],
    budgets: &Budgets,
    step: Step,
    keep: impl FnOnce(Snapshot) -> Result<String, String>,
) -> JsOutcome {
    let engine = match Engine::shared() {
        Ok(e) => e,
        Err(e) => {
            return error(
                ErrorKind::Internal,
                format!("the interpreter is unavailable: {e}"),
            )
        }
    };
    let caps = capabilities(budgets);
    let (out, logs) = match step {
        Step::Run { code, clock_ms } => {
            let mut it = match Interpreter::new_at(&engine, limits, caps, key, clock_ms) {
                Ok(it) => it,
                Err(e) => return error(ErrorKind::Internal, e.to_string()),
            };
            let out = it.eval(&code).await;
            (out, it.take_logs())
        }
        Step::Resume {
            snapshot,
            call,
            result,
        } => {
            let snap = Snapshot::from_bytes(snapshot);
            let mut it = match Interpreter::restore(&engine, limits, caps, &snap, key) {
                Ok(it) => it,
                Err((kind, message)) => return error(kind, message),
            };
            let out = it.resume(call, result).await;
            (out, it.take_logs())
        }
    };
    match out {
        Outcome::Done(result) => JsOutcome::Done { result, logs },
        Outcome::Error(kind, message) => error(kind, message),
        Outcome::Paused(snap) => {
            let pending = match snap.pending_unverified() {
                Ok(p) => p,
                Err(e) => return error(ErrorKind::BadSnapshot, e.to_string()),
            };
            match keep(snap) {
                Ok(snapshot) => JsOutcome::Paused {
                    snapshot,
                    pending: pending
                        .into_iter()
                        .map(|p| JsCallReq {
                            id: p.id,
                            capability: p.capability,
                            args: p.args,
                        })
                        .collect(),
                },
                Err(e) => error(
                    ErrorKind::Internal,
                    format!("cannot keep the snapshot: {e}"),
                ),
            }
        }
    }
}

/// The real interpreter with snapshots kept in memory: what simulations
/// run programs in.
pub struct SandboxPrograms {
    limits: Limits,
    key: Vec<u8>,
    budgets: Budgets,
    kept: HashMap<String, Vec<u8>>,
}

impl SandboxPrograms {
    pub fn new(budgets: Budgets) -> SandboxPrograms {
        SandboxPrograms {
            limits: Limits::default(),
            key: b"simulation-snapshot-key-0123456789".to_vec(),
            budgets,
            kept: HashMap::new(),
        }
    }

    /// Compiles (or loads) the interpreter now, so the first program step
    /// of a timed run does not pay for it.
    pub fn warm_up() -> Result<(), String> {
        Engine::shared().map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Programs for SandboxPrograms {
    async fn step(&mut self, step: ProgramStep, snapshot_id: String) -> JsOutcome {
        let step = match step {
            ProgramStep::Run { code, clock_ms } => Step::Run { code, clock_ms },
            ProgramStep::Resume {
                snapshot,
                call,
                result,
            } => match self.kept.get(&snapshot) {
                Some(bytes) => Step::Resume {
                    snapshot: bytes.clone(),
                    call,
                    result,
                },
                None => return error(ErrorKind::BadSnapshot, format!("no snapshot {snapshot}")),
            },
        };
        let kept = &mut self.kept;
        let keep = |snap: Snapshot| {
            kept.insert(snapshot_id.clone(), snap.into_bytes());
            Ok(snapshot_id.clone())
        };
        run_program_step(self.limits.clone(), &self.key, &self.budgets, step, keep).await
    }

    fn drop_snapshot(&mut self, id: &str) {
        self.kept.remove(id);
    }

    fn snapshots(&self) -> usize {
        self.kept.len()
    }
}
