//! The core in simulated time with the scripted model and the scripted
//! stand-in interpreter: no runtime, no wasmtime, milliseconds per day of
//! chat. The simulator checks the core's invariants after every step, so
//! every run here is also an invariant check. (The server's tests run the
//! same simulator with the real interpreter.)

use byom_agent::sim::{self, block_on, ScriptedPrograms, SimConfig};
use byom_agent::Budgets;

fn small_budgets() -> Budgets {
    // Small enough that conversations are compacted (messages deleted from
    // the store) while everything else goes on.
    Budgets {
        router_context_tokens: 3000,
        worker_context_tokens: 1500,
        ..Budgets::default()
    }
}

#[test]
fn many_days_keep_every_invariant_and_finish_every_task() {
    for seed in 1..=12u64 {
        let cfg = SimConfig {
            budgets: if seed % 2 == 0 {
                small_budgets()
            } else {
                Budgets::default()
            },
            ..SimConfig::default()
        };
        let mut programs = ScriptedPrograms::new();
        let r = block_on(sim::run(sim::day(150, seed), &cfg, &mut programs))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(r.quiescent, "seed {seed}: {r:?}");
        assert!(r.tasks_unfinished.is_empty(), "seed {seed}: {r:?}");
        assert!(r.tasks > 10, "seed {seed}: {r:?}");
        assert_eq!(r.snapshots_left, 0, "seed {seed}: snapshots leaked");
    }
}

#[test]
fn crashes_at_every_step_change_nothing_people_or_machines_see() {
    let events = sim::day(60, 3);
    let base = SimConfig {
        budgets: small_budgets(),
        ..SimConfig::default()
    };
    let calm = block_on(sim::run(
        events.clone(),
        &base,
        &mut ScriptedPrograms::new(),
    ))
    .unwrap();
    assert!(calm.programs > 0 && calm.subagents > 0, "{calm:?}");
    for k in [1, 2, 5, 11] {
        let cfg = SimConfig {
            crash_every: k,
            ..base.clone()
        };
        let r = block_on(sim::run(events.clone(), &cfg, &mut ScriptedPrograms::new()))
            .unwrap_or_else(|e| panic!("k={k}: {e}"));
        assert!(r.crashes > 10, "k={k}: {r:?}");
        assert!(r.quiescent && r.tasks_unfinished.is_empty(), "k={k}: {r:?}");
        assert_eq!(
            (r.tasks, r.commands, r.replies, r.subagents),
            (calm.tasks, calm.commands, calm.replies, calm.subagents),
            "k={k}"
        );
    }
}
