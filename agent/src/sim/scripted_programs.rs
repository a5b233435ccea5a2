//! A stand-in interpreter for the programs the scripted model writes
//! ([`crate::scripted::parallel_program`]), for simulations that must not
//! link wasmtime. It is not JavaScript: it recognises that one program's
//! shape and follows the same protocol the real interpreter does (calls
//! numbered in order, every unsettled call listed at each pause, one result
//! per resume, a rejected `Promise.all` throwing). Anything else fails with
//! an `Exception` that says so. The server's tests run the simulator with
//! the real interpreter.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value};

use crate::event::{JsCallReq, JsOutcome};
use crate::programs::{ProgramStep, Programs};

/// A paused program: what it was written to do, and what it has heard.
#[derive(Debug, Clone)]
struct Paused {
    machine: String,
    cmds: Vec<String>,
    ask: Option<String>,
    settled: BTreeMap<u32, Result<Value, String>>,
}

#[derive(Debug, Default)]
pub struct ScriptedPrograms {
    kept: HashMap<String, Paused>,
}

impl ScriptedPrograms {
    pub fn new() -> ScriptedPrograms {
        ScriptedPrograms::default()
    }
}

fn error(kind: &str, message: impl Into<String>) -> JsOutcome {
    JsOutcome::Error {
        kind: kind.into(),
        message: message.into(),
    }
}

/// The JSON value of `const NAME = VALUE;` in the program.
fn constant(code: &str, name: &str) -> Option<Value> {
    let head = format!("const {name} = ");
    let line = code.lines().find_map(|l| l.strip_prefix(&head))?;
    serde_json::from_str(line.trim_end().trim_end_matches(';')).ok()
}

fn parse(code: &str) -> Option<Paused> {
    let machine = constant(code, "machine")?.as_str()?.to_string();
    let cmds = constant(code, "cmds")?
        .as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()?;
    let ask = constant(code, "next").and_then(|v| v.as_str().map(str::to_string));
    Some(Paused {
        machine,
        cmds,
        ask,
        settled: BTreeMap::new(),
    })
}

impl Paused {
    /// Where the program stands now: paused on calls, done, or thrown.
    fn advance(self, snapshot_id: String, kept: &mut HashMap<String, Paused>) -> JsOutcome {
        let n = self.cmds.len() as u32;
        let spawn = |i: u32| JsCallReq {
            id: i,
            capability: "agents.spawn".into(),
            args: json!({"task": format!("run `{}`", self.cmds[(i - 1) as usize]), "machine": self.machine}),
        };
        let pending: Vec<JsCallReq> = (1..=n)
            .filter(|i| !self.settled.contains_key(i))
            .map(spawn)
            .collect();
        // Promise.all rejects at the first rejection it sees.
        if let Some((_, Err(e))) = self.settled.iter().find(|(i, r)| **i <= n && r.is_err()) {
            return error("Exception", format!("Error: {e}"));
        }
        if !pending.is_empty() {
            return self.pause(pending, snapshot_id, kept);
        }
        let mut out = Map::new();
        for (i, c) in self.cmds.iter().enumerate() {
            let text = match self.settled.get(&(i as u32 + 1)) {
                Some(Ok(v)) => v["text"].clone(),
                _ => Value::Null,
            };
            out.insert(c.clone(), text);
        }
        let Some(next) = self.ask.clone() else {
            return done(out);
        };
        let (ask, exec) = (n + 1, n + 2);
        match self.settled.get(&ask) {
            None => {
                let q = format!("May I run `{next}` on {}?", self.machine);
                let call = JsCallReq {
                    id: ask,
                    capability: "human.ask".into(),
                    args: Value::String(q),
                };
                self.pause(vec![call], snapshot_id, kept)
            }
            Some(Err(e)) => error("Exception", format!("Error: {e}")),
            Some(Ok(a)) if a["approved"].as_bool() != Some(true) => {
                out.insert(next, json!("skipped: not approved"));
                done(out)
            }
            Some(Ok(_)) => match self.settled.get(&exec) {
                None => {
                    let call = JsCallReq {
                        id: exec,
                        capability: "tools.exec".into(),
                        args: json!({"machine": self.machine, "command": next}),
                    };
                    self.pause(vec![call], snapshot_id, kept)
                }
                Some(Err(e)) => error("Exception", format!("Error: {e}")),
                Some(Ok(r)) => {
                    let stdout = r["stdout"].as_str().unwrap_or("").trim().to_string();
                    out.insert(next, Value::String(stdout));
                    done(out)
                }
            },
        }
    }

    fn pause(
        self,
        pending: Vec<JsCallReq>,
        snapshot_id: String,
        kept: &mut HashMap<String, Paused>,
    ) -> JsOutcome {
        kept.insert(snapshot_id.clone(), self);
        JsOutcome::Paused {
            snapshot: snapshot_id,
            pending,
        }
    }
}

fn done(out: Map<String, Value>) -> JsOutcome {
    JsOutcome::Done {
        result: Value::Object(out),
        logs: Vec::new(),
    }
}

impl Programs for ScriptedPrograms {
    async fn step(&mut self, step: ProgramStep, snapshot_id: String) -> JsOutcome {
        match step {
            ProgramStep::Run { code, .. } => match parse(&code) {
                Some(p) => p.advance(snapshot_id, &mut self.kept),
                None => error(
                    "Exception",
                    "the scripted interpreter runs only the scripted model's programs; the server runs any JavaScript",
                ),
            },
            ProgramStep::Resume {
                snapshot,
                call,
                result,
            } => {
                let Some(mut p) = self.kept.get(&snapshot).cloned() else {
                    return error("BadSnapshot", format!("no snapshot {snapshot}"));
                };
                if p.settled.insert(call, result).is_some() {
                    return error("BadSnapshot", format!("call {call} was already settled"));
                }
                p.advance(snapshot_id, &mut self.kept)
            }
        }
    }

    fn drop_snapshot(&mut self, id: &str) {
        self.kept.remove(id);
    }

    fn snapshots(&self) -> usize {
        self.kept.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::block_on;

    #[test]
    fn follows_the_parallel_program() {
        let code = crate::scripted::parallel_program(
            &["uptime".into(), "df -h /".into()],
            Some("echo cleaned"),
            "lap",
        );
        let mut p = ScriptedPrograms::new();
        let run = ProgramStep::Run { code, clock_ms: 0 };
        let JsOutcome::Paused { snapshot, pending } = block_on(p.step(run, "snp_1".into())) else {
            panic!("pauses on its spawns");
        };
        assert_eq!(pending.len(), 2);
        assert_eq!(pending[1].args["task"], "run `df -h /`");
        let mut snap = snapshot;
        for (i, call) in [1u32, 2].into_iter().enumerate() {
            let step = ProgramStep::Resume {
                snapshot: snap.clone(),
                call,
                result: Ok(json!({"text": format!("out {call}")})),
            };
            let out = block_on(p.step(step, format!("snp_r{i}")));
            let JsOutcome::Paused { snapshot, pending } = out else {
                panic!("still paused: {out:?}");
            };
            snap = snapshot;
            let want = if call == 1 {
                "agents.spawn"
            } else {
                "human.ask"
            };
            assert_eq!(pending[0].capability, want);
        }
        let approve = ProgramStep::Resume {
            snapshot: snap,
            call: 3,
            result: Ok(json!({"approved": true})),
        };
        let JsOutcome::Paused { snapshot, pending } = block_on(p.step(approve, "snp_x".into()))
        else {
            panic!("runs the command");
        };
        assert_eq!(pending[0].capability, "tools.exec");
        let exec = ProgramStep::Resume {
            snapshot,
            call: 4,
            result: Ok(json!({"stdout": "cleaned\n"})),
        };
        let JsOutcome::Done { result, .. } = block_on(p.step(exec, "snp_y".into())) else {
            panic!("finishes");
        };
        assert_eq!(result["echo cleaned"], "cleaned");
        assert_eq!(result["uptime"], "out 1");
    }

    #[test]
    fn other_code_fails_plainly() {
        let mut p = ScriptedPrograms::new();
        let run = ProgramStep::Run {
            code: "1 + 1".into(),
            clock_ms: 0,
        };
        let JsOutcome::Error { kind, message } = block_on(p.step(run, "snp_1".into())) else {
            panic!("an error");
        };
        assert_eq!(kind, "Exception");
        assert!(message.contains("server runs any JavaScript"));
    }
}
