use std::collections::{BTreeMap, VecDeque};

use serde_json::{json, Value};

use super::tools::timeout_ms;
use super::*;
use crate::event::{Reply, TriggerInfo};
use crate::llm::{Message, Request, Response, Role, ToolCall, Usage};
use crate::scripted::Scripted;
use crate::state::ApprovalState;
use crate::storage::keys::ROUTER;
use crate::world::TestWorld;

/// What a restart does: write what the driver writes, rebuild from it.
/// A step in a test whose world is readable (a void step fails the test).
trait Step {
    fn step(&mut self, w: &mut dyn World, ev: Event) -> Vec<Effect>;
}

impl Step for Core {
    fn step(&mut self, w: &mut dyn World, ev: Event) -> Vec<Effect> {
        self.handle(w, ev).expect("the test world is readable")
    }
}

fn reload(core: &mut Core) -> Core {
    let mut stored: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in core.take_writes() {
        match v {
            Some(v) => stored.insert(k, v),
            None => stored.remove(&k),
        };
    }
    let (fresh, errors) = Core::rebuild_from_image(Budgets::default(), &stored, true);
    assert!(errors.is_empty(), "{errors:?}");
    fresh
}

fn trig(id: &str, thread: &str, text: &str) -> Event {
    Event::Trigger(TriggerInfo {
        id: id.into(),
        thread: thread.into(),
        source: "chat".into(),
        user: "ada".into(),
        text: text.into(),
        mention: true,
        trusted: true,
        ..Default::default()
    })
}

fn model_call(fx: &[Effect]) -> Option<(String, u64, Request)> {
    fx.iter().find_map(|e| match e {
        Effect::CallModel {
            session,
            turn,
            request,
            ..
        } => Some((session.clone(), *turn, request.clone())),
        _ => None,
    })
}

#[test]
fn the_router_cannot_execute_even_if_the_model_asks() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    core.step(&mut w, trig("trg_1", "thr_1", "hello"));
    let fx = router_step(
        &mut core,
        &mut w,
        vec![
            (
                "shell_start",
                json!({"command": "rm -rf /", "machine": "lap"}),
            ),
            ("run_js", json!({"code": "1"})),
        ],
    );
    assert!(!fx
        .iter()
        .any(|e| matches!(e, Effect::StartCommand { .. } | Effect::RunJs { .. })));
    let results: Vec<&Message> = core
        .router()
        .conversation
        .messages()
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect();
    assert_eq!(results.len(), 2);
    assert!(results[0].text.contains("cannot run commands or code"));
}

#[test]
fn a_failed_router_call_puts_its_triggers_back() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    let fx = core.step(&mut w, trig("trg_1", "thr_1", "please run `ls` on lap"));
    let (session, turn, _) = model_call(&fx).unwrap();
    // Another trigger arrives while the call is out: it waits.
    let fx = core.step(&mut w, trig("trg_2", "thr_2", "hi"));
    assert!(model_call(&fx).is_none());
    let fx = core.step(
        &mut w,
        Event::ModelDone {
            session,
            turn,
            result: Err("503 from the provider".into()),
        },
    );
    assert!(model_call(&fx).is_none(), "backs off before retrying");
    assert_eq!(core.router().queue.len(), 2, "nothing dropped");
    w.now = 60_000;
    let fx = core.step(&mut w, Event::Tick);
    let (session, turn, req) = model_call(&fx).expect("retried after the backoff");
    let last = &req.messages.last().unwrap().text;
    assert!(last.contains("trg_1") && last.contains("trg_2"), "{last}");
    // A third failure in a row: people waiting hear about it, once.
    let fx = core.step(
        &mut w,
        Event::ModelDone {
            session,
            turn,
            result: Err("503".into()),
        },
    );
    assert!(fx.is_empty());
    w.now = 600_000;
    let fx = core.step(&mut w, Event::Tick);
    let (session, turn, _) = model_call(&fx).unwrap();
    let fx = core.step(
        &mut w,
        Event::ModelDone {
            session,
            turn,
            result: Err("503".into()),
        },
    );
    let notices: Vec<&Reply> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Reply(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(notices.len(), 2, "one per waiting thread");
    assert!(notices[0].text.contains("queued"));
    assert_eq!(core.router().queue.len(), 2, "still nothing dropped");
    // The queue survives a restart, in order.
    let fresh = reload(&mut core);
    let ids: Vec<String> = fresh
        .router()
        .queue
        .iter()
        .filter_map(|i| match i {
            RouterItem::Trigger(t) => Some(t.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["trg_1", "trg_2"]);
}

#[test]
fn state_survives_a_reload_and_resumes_what_was_in_flight() {
    let model = Scripted::default();
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    let mut queue: VecDeque<Effect> = core
        .step(
            &mut w,
            trig("trg_1", "thr_1", "please run `sleep 5` on lap"),
        )
        .into();
    // Answer model calls until a command starts.
    let mut started = None;
    for _ in 0..20 {
        match queue.pop_front() {
            Some(Effect::StartCommand { cmd, .. }) => {
                started = Some(cmd);
                break;
            }
            Some(Effect::CallModel {
                session,
                turn,
                request,
                ..
            }) => {
                let (resp, _) = model.respond(&request);
                queue.extend(core.step(
                    &mut w,
                    Event::ModelDone {
                        session,
                        turn,
                        result: Ok(resp),
                    },
                ));
            }
            Some(_) => {}
            None => break,
        }
    }
    let cmd = started.expect("a command started");
    // Write what the driver writes, rebuild a fresh core from it.
    let mut fresh = reload(&mut core);
    for (id, w) in core.workers() {
        assert_eq!(
            fresh.workers()[id].conversation.messages(),
            w.conversation.messages(),
            "the transcript comes back whole"
        );
    }
    assert_eq!(
        fresh.router().conversation.messages(),
        core.router().conversation.messages()
    );
    let again = fresh.resume_effects();
    let restarts: Vec<&String> = again
        .iter()
        .filter_map(|e| match e {
            Effect::StartCommand { cmd, command, .. } => {
                assert_eq!(command, "sleep 5");
                Some(cmd)
            }
            _ => None,
        })
        .collect();
    assert_eq!(restarts, [&cmd], "the same command ID: created once");
}

#[test]
fn a_hostile_reply_is_bounded() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    core.step(&mut w, trig("trg_1", "thr_1", "hi"));
    let spin = json!({"task": "spin", "threads": ["thr_1"], "machine": "lap"});
    router_step(&mut core, &mut w, vec![("create_worker", spin); 100]);
    assert_eq!(core.workers().len(), MAX_TOOL_CALLS_PER_REPLY);
}

fn reply_with(calls: Vec<(&str, Value)>) -> Response {
    Response {
        text: String::new(),
        tool_calls: calls
            .into_iter()
            .enumerate()
            .map(|(i, (n, a))| ToolCall {
                id: format!("t{i}"),
                name: n.into(),
                arguments: a,
            })
            .collect(),
        usage: Usage::default(),
        stop_reason: "tool_calls".into(),
        attempts: 1,
    }
}

/// A worker on thr_1, created by the Router; returns its ID.
fn with_worker(core: &mut Core, w: &mut dyn World) -> String {
    let fx = core.step(w, trig("trg_1", "thr_1", "hi"));
    let (session, turn, _) = model_call(&fx).unwrap();
    core.step(
        w,
        Event::ModelDone {
            session,
            turn,
            result: Ok(reply_with(vec![(
                "create_worker",
                json!({"task": "watch", "threads": ["thr_1"], "machine": "lap"}),
            )])),
        },
    );
    core.workers().keys().next().unwrap().clone()
}

/// Answers the Router's call in flight with `calls`.
fn router_step(core: &mut Core, w: &mut dyn World, calls: Vec<(&str, Value)>) -> Vec<Effect> {
    let turn = core.router().in_flight.expect("a Router call in flight");
    core.step(
        w,
        Event::ModelDone {
            session: ROUTER.into(),
            turn,
            result: Ok(reply_with(calls)),
        },
    )
}

fn worker_step(
    core: &mut Core,
    w: &mut dyn World,
    id: &str,
    calls: Vec<(&str, Value)>,
) -> Vec<Effect> {
    let turn = core.workers()[id].in_flight.expect("a call in flight");
    core.step(
        w,
        Event::ModelDone {
            session: id.into(),
            turn,
            result: Ok(reply_with(calls)),
        },
    )
}

/// A trigger passed straight to a subscribed worker brings the owner's
/// policies with it (once, and again when they change).
#[test]
fn pass_through_workers_see_the_policies() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    let id = with_worker(&mut core, &mut w);
    w.policies = vec!["be brief with bob (pol_1)".into()];
    core.step(&mut w, trig("trg_2", "thr_1", "more"));
    core.step(&mut w, trig("trg_3", "thr_1", "and more"));
    let all = |core: &Core| {
        let ws = &core.workers()[&id];
        let mut text: Vec<String> = ws.inbox.clone();
        text.extend(ws.conversation.messages().iter().map(|m| m.text.clone()));
        text.join("\n")
    };
    let text = all(&core);
    assert_eq!(text.matches("Policies now in force:").count(), 1, "{text}");
    assert!(text.contains("- be brief with bob (pol_1)"), "{text}");
    w.policies.push("reply in French (pol_2)".into());
    core.step(&mut w, trig("trg_4", "thr_1", "again"));
    assert!(all(&core).contains("reply in French"));
}

#[test]
fn unsubscribing_sends_the_thread_back_to_the_router() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    let id = with_worker(&mut core, &mut w);
    assert!(core.router().subs["thr_1"].contains(&id));
    worker_step(&mut core, &mut w, &id, vec![("unsubscribe", json!({}))]);
    assert!(!core.router().subs.contains_key("thr_1"));
    let before = core.router().stats.passed_through;
    core.step(&mut w, trig("trg_2", "thr_1", "more"));
    assert_eq!(core.router().stats.passed_through, before);
    assert!(core
        .router()
        .queue
        .iter()
        .any(|i| matches!(i, RouterItem::Trigger(t) if t.id == "trg_2")));
}

#[test]
fn recall_and_read_page_through_long_objects() {
    let mut core = Core::new(Budgets {
        recall_chars: 4000,
        ..Budgets::default()
    });
    let mut w = TestWorld::new();
    w.objects
        .insert("cmd_big".into(), "x".repeat(10_000) + "END");
    let id = with_worker(&mut core, &mut w);
    worker_step(
        &mut core,
        &mut w,
        &id,
        vec![
            ("recall", json!({"id": "cmd_big"})),
            ("read", json!({"id": "cmd_big", "offset": 8000})),
            ("recall", json!({"id": "cmd_nope"})),
        ],
    );
    let results: Vec<String> = core.workers()[&id]
        .conversation
        .messages()
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.text.clone())
        .collect();
    assert!(
        results[0].contains("read(\"cmd_big\", 4000)"),
        "{}",
        &results[0][4000..]
    );
    assert!(results[1].ends_with("END"), "the last page has the end");
    assert!(results[2].contains("no object cmd_nope"));
}

#[test]
fn idle_workers_retire_and_ended_ones_leave_memory() {
    let mut core = Core::new(Budgets {
        idle_retire_ms: 1000,
        ..Budgets::default()
    });
    let mut w = TestWorld::new();
    let id = with_worker(&mut core, &mut w);
    worker_step(&mut core, &mut w, &id, vec![]);
    assert_eq!(core.workers()[&id].status, WorkerStatus::Idle);
    w.now = 500;
    core.step(&mut w, Event::Tick);
    assert_eq!(core.workers()[&id].status, WorkerStatus::Idle);
    w.now = 5000;
    core.step(&mut w, Event::Tick);
    assert_eq!(core.workers()[&id].status, WorkerStatus::Done);
    assert!(
        !core.router().subs.contains_key("thr_1"),
        "its thread goes back"
    );
    // Written first (dirty), then evicted.
    core.evict_closed();
    assert!(core.workers().contains_key(&id));
    core.take_dirty();
    core.evict_closed();
    assert!(!core.workers().contains_key(&id));
}

#[test]
fn the_step_allowance_is_per_piece_of_work_and_a_stuck_worker_is_reported_at_once() {
    let mut core = Core::new(Budgets {
        max_worker_steps: 3,
        ..Budgets::default()
    });
    let mut w = TestWorld::new();
    let id = with_worker(&mut core, &mut w);
    router_step(&mut core, &mut w, vec![]);
    worker_step(&mut core, &mut w, &id, vec![]);
    // Many follow-ups over the thread's life: each one wakes the
    // worker from idle with the whole allowance again.
    for i in 0..10 {
        core.step(&mut w, trig(&format!("trg_f{i}"), "thr_1", "and?"));
        assert_eq!(core.workers()[&id].status, WorkerStatus::Running, "{i}");
        worker_step(&mut core, &mut w, &id, vec![]);
        assert_eq!(core.workers()[&id].status, WorkerStatus::Idle, "{i}");
    }
    // A worker busy with a long command that keeps being woken spends
    // its allowance; the turn it cannot take fails it, and the Router
    // hears so in that same step, not at some later event.
    core.step(&mut w, trig("trg_long", "thr_1", "long one"));
    worker_step(
        &mut core,
        &mut w,
        &id,
        vec![(
            "shell_start",
            json!({"machine": "lap", "command": "sleep 100"}),
        )],
    );
    worker_step(&mut core, &mut w, &id, vec![]);
    assert_eq!(core.workers()[&id].status, WorkerStatus::Running);
    let mut fx = Vec::new();
    for i in 0..5 {
        fx = core.step(&mut w, trig(&format!("trg_m{i}"), "thr_1", "more"));
        if core.workers()[&id].status.is_closed() {
            break;
        }
        worker_step(&mut core, &mut w, &id, vec![]);
    }
    assert_eq!(core.workers()[&id].status, WorkerStatus::Failed);
    let (session, _, req) = model_call(&fx).expect("the Router is called");
    assert_eq!(session, ROUTER);
    let last = req.messages.last().unwrap();
    assert!(last.text.contains("max_worker_steps"), "{}", last.text);
}

#[test]
fn a_model_given_timeout_cannot_overflow() {
    assert_eq!(timeout_ms(&json!({})), DEFAULT_COMMAND_TIMEOUT_MS);
    assert_eq!(timeout_ms(&json!({"timeout_s": 5})), 5000);
    assert_eq!(timeout_ms(&json!({"timeout_s": u64::MAX})), u64::MAX);
}

#[test]
fn a_turn_takes_a_bounded_batch() {
    let mut core = Core::new(Budgets {
        max_batch: 3,
        ..Budgets::default()
    });
    let mut w = TestWorld::new();
    let fx = core.step(&mut w, trig("trg_0", "thr_0", "hi"));
    let (session, turn, _) = model_call(&fx).unwrap();
    for i in 1..=7 {
        core.step(&mut w, trig(&format!("trg_{i}"), "thr_x", "hi"));
    }
    let empty = Response {
        text: "ok".into(),
        tool_calls: vec![],
        usage: Usage::default(),
        stop_reason: "stop".into(),
        attempts: 1,
    };
    let fx = core.step(
        &mut w,
        Event::ModelDone {
            session,
            turn,
            result: Ok(empty),
        },
    );
    let (_, _, req) = model_call(&fx).unwrap();
    assert!(req.messages.last().unwrap().text.contains("New events (3)"));
    assert_eq!(core.router().queue.len(), 4);
}

#[test]
fn broken_state_is_named_by_the_invariant_check() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    let id = with_worker(&mut core, &mut w);
    core.check_invariants().unwrap();
    // A stored Router record that routes a thread to a worker nobody has.
    let mut router = serde_json::to_value(crate::state::RouterState::default()).unwrap();
    router["subs"]["thr_9"] = json!(["wrk_ghost"]);
    let mut image = BTreeMap::new();
    image.insert(
        crate::storage::keys::record(ROUTER),
        serde_json::to_vec(&router).unwrap(),
    );
    let (broken, errors) = Core::rebuild_from_image(Budgets::default(), &image, false);
    assert!(errors.is_empty(), "{errors:?}");
    let e = broken.check_invariants().unwrap_err();
    assert!(
        e.contains("thr_9 is subscribed by unknown wrk_ghost"),
        "{e}"
    );
    // A worker record that says it is idle with a model call in flight.
    let mut rec = serde_json::to_value(&core.workers()[&id]).unwrap();
    rec["status"] = json!("idle");
    rec["in_flight"] = json!(7);
    image.clear();
    image.insert(
        crate::storage::keys::record(&id),
        serde_json::to_vec(&rec).unwrap(),
    );
    let (broken, _) = Core::rebuild_from_image(Budgets::default(), &image, false);
    let e = broken.check_invariants().unwrap_err();
    assert!(e.contains("idle") && e.contains(&id), "{e}");
}

fn replies(fx: &[Effect]) -> Vec<Reply> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Reply(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// A reply goes where the work came from; another thread only where its
/// connector allows unprompted posts.
#[test]
fn replies_go_to_the_threads_of_the_turn() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    w.threads.insert("thr_gh".into(), "github".into());
    core.step(&mut w, trig("trg_1", "thr_1", "hello"));
    let fx = router_step(
        &mut core,
        &mut w,
        vec![
            (
                "reply",
                json!({"thread": "thr_gh", "text": "posting elsewhere"}),
            ),
            ("reply", json!({"thread": "thr_1", "text": "hi"})),
        ],
    );
    let r = replies(&fx);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].thread, "thr_1");
    let refused = core
        .router()
        .conversation
        .messages()
        .iter()
        .any(|m| m.role == Role::Tool && m.text.contains("not a thread of this turn"));
    assert!(refused);
    // Once the connector opens it, the Router may post there.
    w.open_sources.push("github".into());
    core.step(&mut w, trig("trg_2", "thr_1", "again"));
    let fx = router_step(
        &mut core,
        &mut w,
        vec![("reply", json!({"thread": "thr_gh", "text": "now allowed"}))],
    );
    assert_eq!(replies(&fx).len(), 1);
}

/// Norms by the thread's kind: chat is short with a pointer to the rest,
/// GitHub gets a summary with headed parts.
#[test]
fn reply_norms_come_from_the_channel_kind() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    w.threads.insert("thr_m".into(), "matrix".into());
    w.threads.insert("thr_gh".into(), "github".into());
    let mut t = trig("trg_1", "thr_m", "x");
    if let Event::Trigger(i) = &mut t {
        i.source = "matrix".into();
    }
    core.step(&mut w, t);
    let long = "word ".repeat(300);
    let fx = router_step(
        &mut core,
        &mut w,
        vec![(
            "reply",
            json!({"thread": "thr_m", "text": long, "changed": "a file"}),
        )],
    );
    let r = &replies(&fx)[0];
    assert!(r.text.split_whitespace().count() <= 110, "{}", r.text);
    assert!(r.text.contains("byom threads show thr_m"), "{}", r.text);
    assert!(!r.text.contains("###"), "{}", r.text);
    // The turn ends; the next one is about the GitHub thread.
    router_step(&mut core, &mut w, vec![]);

    let mut t = trig("trg_2", "thr_gh", "x");
    if let Event::Trigger(i) = &mut t {
        i.source = "github".into();
    }
    core.step(&mut w, t);
    let fx = router_step(
        &mut core,
        &mut w,
        vec![(
            "reply",
            json!({"thread": "thr_gh", "text": "Fixed the typo.", "changed": "README.md",
                   "verified": "`make check` passed", "links": "https://github.com/acme/app/pull/7"}),
        )],
    );
    let r = &replies(&fx)[0];
    for part in [
        "### Summary\nFixed the typo.",
        "### What changed\nREADME.md",
        "### How it was verified",
        "### Links",
    ] {
        assert!(r.text.contains(part), "{part:?} in {}", r.text);
    }
}

/// `watch` subscribes a worker to another thread, named or linked.
#[test]
fn workers_watch_other_threads() {
    let mut core = Core::new(Budgets::default());
    let mut w = TestWorld::new();
    let id = with_worker(&mut core, &mut w);
    worker_step(
        &mut core,
        &mut w,
        &id,
        vec![(
            "watch",
            json!({"thread": "https://github.com/acme/app/pull/7"}),
        )],
    );
    let pr = w.named_threads["github:acme/app#7"].clone();
    assert!(core.router().subs[&pr].contains(&id));
    assert!(core.workers()[&id].threads.contains(&pr));
    worker_step(
        &mut core,
        &mut w,
        &id,
        vec![("watch", json!({"thread": "nonsense"}))],
    );
    let said = core.workers()[&id]
        .conversation
        .messages()
        .iter()
        .any(|m| m.role == Role::Tool && m.text.contains("no thread nonsense"));
    assert!(said);
}

fn said(id: &str, thread: &str, user: &str, text: &str, at_ms: u64) -> Event {
    Event::Trigger(TriggerInfo {
        id: id.into(),
        thread: thread.into(),
        source: "chat".into(),
        user: user.into(),
        text: text.into(),
        mention: true,
        trusted: user.starts_with("admin:"),
        at_ms,
        ..Default::default()
    })
}

fn starts(fx: &[Effect]) -> usize {
    fx.iter()
        .filter(|e| matches!(e, Effect::StartCommand { .. }))
        .count()
}

mod containment;
