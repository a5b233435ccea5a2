//! Agent benchmarks, each against a baseline measured in the same run:
//!
//! 1. Router turns and decisions per second with a zero-latency scripted
//!    model (baseline: the model's own time in the same run).
//! 2. Triggers per second through the fast path into a real sled store
//!    (baseline: one raw put + flush of the same record).
//! 3. Memory per idle worker: process RSS and stored record size after
//!    2,000 finished tasks (baseline: the same process before).
//! 4. Time and tokens on the same 300-message day with and without
//!    pass-through.
//!
//! `cargo bench -p byom-tests --bench agents` (release).

use std::time::{Duration, Instant};

use byom_agent::event::TriggerInfo;
use byom_agent::scripted::Latency;
use byom_agent::sim::{self, SimConfig};
use byom_protocol::pb;
use byom_server::SandboxPrograms;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages * 4)
        .unwrap_or(0)
}

fn chatter(n: usize, gap_ms: u64) -> Vec<(u64, TriggerInfo)> {
    (0..n)
        .map(|i| {
            (
                i as u64 * gap_ms,
                TriggerInfo {
                    id: format!("trg_b{i:06}"),
                    thread: format!("thr_b{:04}", i % 500),
                    source: "chat".into(),
                    user: "ada".into(),
                    text: "good morning, all".into(),
                    mention: false,
                    ..Default::default()
                },
            )
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    // The core alone: invariant checks (which read every record after
    // every step) stay in the tests.
    let zero = SimConfig {
        latency: Latency::default(),
        command_ms: 0,
        check_invariants: false,
        ..SimConfig::default()
    };
    SandboxPrograms::warm_up().map_err(anyhow::Error::msg)?;
    let programs = |cfg: &SimConfig| SandboxPrograms::new(cfg.budgets.clone());

    // 1. Router throughput. Events one simulated second apart: one turn each;
    //    events all at once: one batched turn per model round trip. "with
    //    records" also serializes every changed record after each step, as
    //    the server does before writing it to the store.
    for (label, gap, persist) in [
        ("one event per turn", 1000u64, false),
        ("one event per turn, with records", 1000, true),
        ("batched (all at t=0)", 0, false),
    ] {
        let n = 5000;
        let cfg = SimConfig {
            persist,
            ..zero.clone()
        };
        let r = sim::run(chatter(n, gap), &cfg, &mut programs(&cfg)).await?;
        let secs = r.wall_ms / 1000.0;
        println!(
            "router, {label}: {n} triggers → {} turns, {} model calls, {} decisions in {:.0} ms: {:.0} turns/s, {:.0} decisions/s; model's own time {:.0} ms ({:.2}x of the total)",
            r.router_turns,
            r.router_model_calls,
            r.router_decisions,
            r.wall_ms,
            r.router_turns as f64 / secs,
            r.router_decisions as f64 / secs,
            r.model_ms,
            r.model_ms / r.wall_ms,
        );
    }

    // 2. Fast path into a real store.
    let dir = tempfile::tempdir()?;
    let store = byom_store::Store::open_sled(&dir.path().join("store"))?;
    let ingest =
        byom_server::BenchIngest::new(store.clone(), "[sources.chat]\nmode = \"addressed_only\"\n")
            .map_err(anyhow::Error::msg)?;
    let n = 2000;
    let t = Instant::now();
    for i in 0..n {
        let ev = pb::SendEventRequest {
            source: "chat".into(),
            thread: format!("t{}", i % 50),
            user: "ada".into(),
            text: "a message of ordinary length about the build".into(),
            mention: i % 2 == 0,
            from_bot: false,
            idempotency_key: String::new(),
            ..Default::default()
        };
        ingest.ingest(ev).await?;
    }
    let fast = t.elapsed();
    let t = Instant::now();
    for i in 0..n {
        let tr = pb::Trigger {
            id: format!("trg_base{i:08}"),
            text: "a message of ordinary length about the build".into(),
            ..Default::default()
        };
        store.put_trigger(&tr)?;
        store.flush_async().await?;
    }
    let base = t.elapsed();
    let per = |d: Duration| n as f64 / d.as_secs_f64();
    println!(
        "fast path: {n} triggers (half addressed → candidate + inbox, half ignored): {:.0}/s; baseline raw put+flush {:.0}/s; ratio {:.2}x",
        per(fast),
        per(base),
        fast.as_secs_f64() / base.as_secs_f64()
    );

    // 3. Memory per idle worker.
    let before = rss_kib();
    let tasks = 2000;
    let events: Vec<(u64, TriggerInfo)> = (0..tasks)
        .map(|i| {
            (
                i as u64 * 10,
                TriggerInfo {
                    id: format!("trg_m{i:06}"),
                    thread: format!("thr_m{i:06}"),
                    source: "chat".into(),
                    user: "ada".into(),
                    text: "please run `uname -s` on lap".into(),
                    mention: true,
                    ..Default::default()
                },
            )
        })
        .collect();
    let (r, core) = sim::run_with_core(events, &zero, &mut programs(&zero)).await?;
    let after = rss_kib();
    let idle = core
        .workers()
        .values()
        .filter(|w| w.status.name() == "idle")
        .count();
    let bytes: usize = core
        .workers()
        .values()
        .filter_map(|w| serde_json::to_vec(w).ok())
        .map(|v| v.len())
        .sum();
    println!(
        "idle workers: {idle} of {} tasks; RSS {} KiB → {} KiB: {:.1} KiB per idle worker in memory; stored record {:.1} KiB each",
        r.tasks,
        before,
        after,
        (after.saturating_sub(before)) as f64 / idle.max(1) as f64,
        bytes as f64 / 1024.0 / idle.max(1) as f64
    );
    drop(core);

    // 4. Pass-through on and off, same stream.
    let day = sim::day(300, 42);
    let realistic = SimConfig {
        check_invariants: false,
        ..SimConfig::default()
    };
    let on = sim::run(day.clone(), &realistic, &mut programs(&realistic)).await?;
    let without = SimConfig {
        pass_through: false,
        ..realistic.clone()
    };
    let off = sim::run(day, &without, &mut programs(&without)).await?;
    for (label, r) in [("pass-through on ", &on), ("pass-through off", &off)] {
        let tokens_in = r.router_usage.input_tokens + r.worker_usage.input_tokens;
        let cached = r.router_usage.cache_read_tokens + r.worker_usage.cache_read_tokens;
        let out = r.router_usage.output_tokens + r.worker_usage.output_tokens;
        println!(
            "{label}: {} tasks, router turns {}, model calls {} router + {} worker, tokens {} in ({:.0}% cached) + {} out, model time {:.0} s, first reply p50 {} ms, result p50 {} ms (simulated), replayed in {:.0} ms",
            r.tasks,
            r.router_turns,
            r.router_model_calls,
            r.worker_model_calls,
            tokens_in,
            100.0 * cached as f64 / tokens_in.max(1) as f64,
            out,
            r.model_latency_ms as f64 / 1000.0,
            r.reply_p50_ms,
            r.result_p50_ms,
            r.wall_ms
        );
    }
    Ok(())
}
