//! `byom js run|resume`: the code interpreter from the command line, with
//! `console.log` and one durable capability, `human.ask(question)`. A script
//! that asks pauses: its snapshot goes to a file and a later `byom js
//! resume` (any process) answers and continues it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use byom_sandbox::{Capability, Engine, Interpreter, Limits, Outcome, Snapshot};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// Exit status when the script paused waiting for an answer.
pub const EXIT_PAUSED: i32 = 3;

#[derive(Subcommand, Debug)]
pub enum JsCmd {
    /// Run a script (FILE, or - for stdin).
    Run {
        file: String,
        #[command(flatten)]
        limits: LimitArgs,
        /// Print {status, result, logs, error_kind, error, pending} as JSON.
        #[arg(long)]
        json: bool,
        /// Where to write the snapshot if the script pauses on human.ask.
        #[arg(long, default_value = "byom-js.snapshot")]
        snapshot_out: PathBuf,
    },
    /// Answer a paused script's pending call and continue it.
    Resume {
        snapshot: PathBuf,
        /// The pending call to answer (printed when the script paused).
        #[arg(long)]
        call: u32,
        /// The answer, as JSON (e.g. '"yes"', '42', '{"ok": true}').
        #[arg(long)]
        answer: String,
        #[command(flatten)]
        limits: LimitArgs,
        #[arg(long)]
        json: bool,
        /// Where to write the next snapshot if it pauses again (default: overwrite SNAPSHOT).
        #[arg(long)]
        snapshot_out: Option<PathBuf>,
    },
}

#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// JS heap limit (e.g. 64MiB).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub memory: usize,
    /// Wall-clock limit, including time spent waiting on capabilities.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// CPU limit in wasmtime fuel units (about one per wasm instruction).
    #[arg(long, default_value_t = 10_000_000_000)]
    pub cpu_fuel: u64,
    /// console output limit in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_output: usize,
}

pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: usize = n
        .parse()
        .map_err(|_| format!("bad size {s:?}: use e.g. 64MiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("bad size unit in {s:?}: use B, KiB, MiB or GiB")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} too large"))
}

fn limits(a: &LimitArgs) -> Limits {
    Limits {
        memory_bytes: a.memory,
        wall_clock: a.timeout,
        cpu_fuel: a.cpu_fuel,
        max_output_bytes: a.max_output,
        ..Limits::default()
    }
}

fn capabilities() -> Vec<Capability> {
    vec![Capability::durable("human", "ask")
        .with_schema(json!({"type": "string", "maxLength": 4096}))]
}

/// The key that signs snapshots: `BYOM_JS_KEY`, else a random key kept
/// (0600) in the data dir, made on first use.
fn snapshot_key() -> anyhow::Result<Vec<u8>> {
    if let Ok(k) = std::env::var("BYOM_JS_KEY") {
        anyhow::ensure!(k.len() >= 16, "BYOM_JS_KEY must be at least 16 characters");
        return Ok(k.into_bytes());
    }
    let path = byom_api::default_data_dir().join("js-snapshot.key");
    byom_wire::load_or_create_key(&path)
        .with_context(|| format!("cannot read or write {}", path.display()))
}

fn read_script(file: &str) -> anyhow::Result<String> {
    if file == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        return Ok(s);
    }
    std::fs::read_to_string(file).with_context(|| format!("cannot read {file}"))
}

pub async fn run(cmd: JsCmd) -> anyhow::Result<i32> {
    let engine = Engine::shared()?;
    let key = snapshot_key()?;
    match cmd {
        JsCmd::Run {
            file,
            limits: l,
            json,
            snapshot_out,
        } => {
            let code = read_script(&file)?;
            let mut it = Interpreter::new(&engine, limits(&l), capabilities(), &key)?;
            let out = it.eval(&code).await;
            report(out, it.take_logs(), json, &snapshot_out)
        }
        JsCmd::Resume {
            snapshot,
            call,
            answer,
            limits: l,
            json,
            snapshot_out,
        } => {
            let answer: Value = serde_json::from_str(&answer).with_context(|| {
                format!(
                    "--answer must be JSON; for text, quote it: --answer '{}'",
                    serde_json::to_string(&answer).unwrap_or_default()
                )
            })?;
            let bytes = std::fs::read(&snapshot)
                .with_context(|| format!("cannot read {}", snapshot.display()))?;
            let snap = Snapshot::from_bytes(bytes);
            let mut it =
                match Interpreter::restore(&engine, limits(&l), capabilities(), &snap, &key) {
                    Ok(it) => it,
                    Err((kind, msg)) => {
                        return report(Outcome::Error(kind, msg), Vec::new(), json, &snapshot)
                    }
                };
            let out = it.resume(call, Ok(answer)).await;
            report(
                out,
                it.take_logs(),
                json,
                snapshot_out.as_deref().unwrap_or(&snapshot),
            )
        }
    }
}

fn report(out: Outcome, logs: Vec<String>, json: bool, snapshot_out: &Path) -> anyhow::Result<i32> {
    match out {
        Outcome::Done(v) => {
            if json {
                println!(
                    "{}",
                    json!({"status": "done", "result": v, "logs": logs, "error_kind": null, "error": null})
                );
            } else {
                for l in &logs {
                    println!("{l}");
                }
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            Ok(0)
        }
        Outcome::Paused(snap) => {
            let pending = snap.pending_unverified()?;
            byom_wire::write_atomic(snapshot_out, snap.as_bytes(), 0o600)
                .with_context(|| format!("cannot write {}", snapshot_out.display()))?;
            if json {
                println!(
                    "{}",
                    json!({"status": "paused", "result": null, "logs": logs, "error_kind": null, "error": null,
                           "snapshot": snapshot_out.display().to_string(), "pending": pending})
                );
            } else {
                for l in &logs {
                    println!("{l}");
                }
                for p in &pending {
                    let q = p
                        .args
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| p.args.to_string());
                    println!("{} asks (call {}): {q}", p.capability, p.id);
                }
                let (_, _, size) = snap.sizes();
                eprintln!(
                    "paused; snapshot ({size} bytes) in {}. Continue with:\n  byom js resume {} --call {} --answer '\"…\"'",
                    snapshot_out.display(),
                    snapshot_out.display(),
                    pending.first().map(|p| p.id).unwrap_or(0)
                );
            }
            Ok(EXIT_PAUSED)
        }
        Outcome::Error(kind, msg) => {
            if json {
                println!(
                    "{}",
                    json!({"status": "error", "result": null, "logs": logs, "error_kind": kind.name(), "error": msg})
                );
            } else {
                for l in &logs {
                    println!("{l}");
                }
                eprintln!("byom js: {kind}: {msg}");
            }
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(super::parse_size("512k"), Ok(512 << 10));
        assert_eq!(super::parse_size("100"), Ok(100));
        assert!(super::parse_size("lots").is_err());
    }
}
