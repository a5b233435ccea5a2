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

/// The store away at random steps: every step that read the world is
/// void and runs again; people and machines see what a calm day shows.
#[test]
fn an_unreadable_world_voids_the_step_and_changes_nothing() {
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
    for k in [2, 3, 7] {
        let cfg = SimConfig {
            outage_every: k,
            ..base.clone()
        };
        let r = block_on(sim::run(events.clone(), &cfg, &mut ScriptedPrograms::new()))
            .unwrap_or_else(|e| panic!("k={k}: {e}"));
        assert!(r.voided > 10, "k={k}: {r:?}");
        assert!(r.quiescent && r.tasks_unfinished.is_empty(), "k={k}: {r:?}");
        assert_eq!(
            (r.tasks, r.commands, r.replies, r.subagents),
            (calm.tasks, calm.commands, calm.replies, calm.subagents),
            "k={k}"
        );
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// The Rule of Two under random streams of trusted and untrusted
    /// messages, random answers from approvers and from people who may not
    /// approve, with and without crashes and store outages: after every
    /// step, no command that completes untrusted input, a sensitive
    /// machine and a state change has started without an approver's recorded yes (the simulator checks
    /// it at each start, against its own record of which model contexts
    /// held untrusted text as well as the core's flags).
    #[test]
    fn no_effect_completes_all_three_without_an_approver(
        seed in 1u64..10_000,
        strangers in 10u64..70,
        crash_every in proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..13],
        outage_every in proptest::prop_oneof![proptest::strategy::Just(0u64), 2u64..17],
        answer_seed in 1u64..1000,
    ) {
        let cfg = SimConfig {
            crash_every,
            outage_every,
            answerers: vec!["ada".into(), "github:mallory".into(), "bob".into()],
            answer_seed,
            ..SimConfig::default()
        };
        let events = sim::mixed_day(40, seed, strangers);
        let r = block_on(sim::run(events, &cfg, &mut ScriptedPrograms::new()))
            .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
        proptest::prop_assert!(r.quiescent, "{r:?}");
        proptest::prop_assert!(r.tasks_unreported.is_empty(), "{r:?}");
    }
}

/// The property above has teeth: a day with strangers holds commands for
/// approval, runs some after an approver's yes, and refuses answers from
/// people who may not approve.
#[test]
fn strangers_requests_wait_for_approvers() {
    let cfg = SimConfig {
        // `answerers[0]` follows every refused answer, so it must be an approver.
        answerers: vec!["ada".into(), "github:mallory".into()],
        ..SimConfig::default()
    };
    let r = block_on(sim::run(
        sim::mixed_day(120, 7, 50),
        &cfg,
        &mut ScriptedPrograms::new(),
    ))
    .unwrap();
    assert!(r.held > 0, "{r:?}");
    assert!(r.approved_runs > 0, "{r:?}");
    assert!(r.refused_answers > 0, "{r:?}");
    assert!(r.quiescent, "{r:?}");
    // A tainted worker's result still reaches the thread that asked.
    assert!(r.tasks_unreported.is_empty(), "{r:?}");
}
