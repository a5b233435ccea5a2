//! The agents in simulated time: the real core, the scripted model, the
//! real interpreter; simulated machines and clock.

use byom_control_plane::agent::sim::{self, SimConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_mixed_stream_finishes_every_task() {
    let events = sim::day(40, 11);
    let r = sim::run(events, &SimConfig::default()).await.unwrap();
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    assert!(r.tasks > 5, "{r:?}");
    assert!(r.tasks_unfinished.is_empty(), "{r:?}");
    assert!(r.quiescent);
    assert!(r.replies >= r.tasks);
    assert!(r.programs > 0 && r.subagents >= 3, "{r:?}");
    // Batching: fewer Router turns than events reaching it.
    assert!(r.router_turns <= r.triggers as u64 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_replays_in_seconds_and_deterministically() {
    let cfg = SimConfig::default();
    let a = sim::run(sim::day(300, 5), &cfg).await.unwrap();
    let b = sim::run(sim::day(300, 5), &cfg).await.unwrap();
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
        budgets: byom_control_plane::agent::Budgets {
            router_context_tokens: 3000,
            worker_context_tokens: 1500,
            ..Default::default()
        },
        ..SimConfig::default()
    };
    let calm = sim::run(events.clone(), &base).await.unwrap();
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
        let r = sim::run(events.clone(), &cfg).await.unwrap();
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
