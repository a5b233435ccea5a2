//! The agents in simulated time: the real core, the scripted model, the
//! real interpreter (QuickJS in wasmtime, snapshots kept in memory);
//! simulated machines and clock. The simulator checks the core's
//! invariants after every step.

use std::time::Duration;

use byom_agent::event::TriggerInfo;
use byom_agent::scripted::Latency;
use byom_agent::sim::{self, SimConfig};
use byom_server::SandboxPrograms;

fn programs(cfg: &SimConfig) -> SandboxPrograms {
    SandboxPrograms::warm_up().expect("the interpreter compiles");
    SandboxPrograms::new(cfg.budgets.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_mixed_stream_finishes_every_task() {
    let events = sim::day(40, 11);
    let cfg = SimConfig::default();
    let r = sim::run(events, &cfg, &mut programs(&cfg)).await.unwrap();
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    assert!(r.tasks > 5, "{r:?}");
    assert!(r.tasks_unfinished.is_empty(), "{r:?}");
    assert!(r.quiescent);
    assert!(r.replies >= r.tasks);
    assert!(r.programs > 0 && r.subagents >= 3, "{r:?}");
    assert_eq!(
        r.snapshots_left, 0,
        "every paused program's snapshot is dropped"
    );
    // Batching: fewer Router turns than events reaching it.
    assert!(r.router_turns <= r.triggers as u64 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_replays_in_seconds_and_deterministically() {
    let cfg = SimConfig::default();
    let a = sim::run(sim::day(300, 5), &cfg, &mut programs(&cfg))
        .await
        .unwrap();
    let b = sim::run(sim::day(300, 5), &cfg, &mut programs(&cfg))
        .await
        .unwrap();
    println!("{}", serde_json::to_string_pretty(&a).unwrap());
    assert!(a.tasks_unfinished.is_empty(), "{:?}", a.tasks_unfinished);
    assert!(a.simulated_ms > 3600 * 1000, "a day of events spans hours");
    assert!(a.wall_ms < 60_000.0, "replay took {} ms", a.wall_ms);
    assert_eq!(
        (
            a.replies,
            a.tasks,
            a.router_turns,
            a.worker_model_calls,
            a.router_usage
        ),
        (
            b.replies,
            b.tasks,
            b.router_turns,
            b.worker_model_calls,
            b.router_usage
        )
    );
}

/// TigerBeetle-style: crash after every k-th step (everything in memory
/// lost, the core rebuilt from its records) and check that the same work
/// gets done: every task finishes, the machines run exactly the commands a
/// crash-free run runs, people get the same number of replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_step_loses_nothing_and_runs_nothing_twice() {
    let events = sim::day(30, 3);
    // Small context budgets, so conversations are compacted (messages
    // deleted from the store) while crashing too.
    let base = SimConfig {
        budgets: byom_agent::Budgets {
            router_context_tokens: 1200,
            worker_context_tokens: 1500,
            ..Default::default()
        },
        ..SimConfig::default()
    };
    let calm = sim::run(events.clone(), &base, &mut programs(&base))
        .await
        .unwrap();
    assert!(calm.programs > 0, "the stream includes a program: {calm:?}");
    assert!(
        calm.router_dropped_turns > 0,
        "compaction happened: {calm:?}"
    );
    for k in [1, 2, 3, 7] {
        let cfg = SimConfig {
            crash_every: k,
            ..base.clone()
        };
        let r = sim::run(events.clone(), &cfg, &mut programs(&cfg))
            .await
            .unwrap();
        assert!(r.crashes > 10, "k={k}: {r:?}");
        assert!(
            r.tasks_unfinished.is_empty(),
            "k={k}: {:?}",
            r.tasks_unfinished
        );
        assert!(r.quiescent, "k={k}");
        assert_eq!(r.tasks, calm.tasks, "k={k}");
        assert_eq!(r.commands, calm.commands, "k={k}: commands run");
        assert_eq!(r.replies, calm.replies, "k={k}: replies");
        assert_eq!(r.subagents, calm.subagents, "k={k}");
    }
}

fn chat(id: &str, thread: &str, text: &str, mention: bool) -> TriggerInfo {
    TriggerInfo {
        id: id.into(),
        thread: thread.into(),
        source: "chat".into(),
        user: "ada".into(),
        text: text.into(),
        mention,
        ..Default::default()
    }
}

/// Races, swept: a program with subagents and an approval on one thread,
/// a task with a follow-up on another, and the answer (once, or repeated
/// every second as impatient people do) at every moment across the run,
/// under several model and command latencies. Every run must end with no
/// work left anywhere (this sweep found a stuck Router queue and a worker
/// failed by its lifetime step count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_and_follow_ups_at_any_moment_leave_nothing_stuck() {
    const PARALLEL: &str = "check `echo one`, `echo two` and `echo three` on lap in parallel, then ask me before running `echo cleaned-up`";
    let mut bad = Vec::new();
    let mut runs = 0;
    for (lat, cmd) in [(0u64, 1u64), (50, 100), (150, 1), (150, 800), (400, 13)] {
        for x in (0..3000u64).step_by(97) {
            let answer = if x % 2 == 0 { "no" } else { "yes, go ahead" };
            let repeats = if (x / 97) % 3 == 0 { 1 } else { 30 };
            let mut events = vec![
                (0, chat("trg_a0", "thr_n1", PARALLEL, true)),
                (
                    x / 2,
                    chat("trg_c0", "thr_n2", "please run `echo other` on lap", true),
                ),
                (
                    x + 3,
                    chat("trg_c1", "thr_n2", "also run `ls /tmp` on lap", false),
                ),
            ];
            for k in 0..repeats {
                events.push((
                    x + k * 1000,
                    chat(&format!("trg_b{k}"), "thr_n1", answer, false),
                ));
            }
            let cfg = SimConfig {
                latency: Latency {
                    base: Duration::from_millis(lat),
                    per_input_token: Duration::from_micros(lat / 10),
                    per_output_token: Duration::from_micros(lat * 10),
                },
                command_ms: cmd,
                ..SimConfig::default()
            };
            let (r, core) = sim::run_with_core(events, &cfg, &mut programs(&cfg))
                .await
                .unwrap();
            runs += 1;
            // An answer sent before the question exists is chatter, not an
            // answer: then the program rightly still waits.
            let asked_after_answer = core.approvals().values().any(|a| a.created_ms >= x);
            let answered = !asked_after_answer || repeats > 1;
            if !r.quiescent || (answered && !r.tasks_unfinished.is_empty()) {
                bad.push(format!(
                    "latency {lat} ms, commands {cmd} ms, answer at {x} ms ×{repeats}: unfinished {:?}, quiescent {}",
                    r.tasks_unfinished, r.quiescent
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {runs} runs:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
