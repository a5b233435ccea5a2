//! The sandbox end to end: real QuickJS in real wasmtime, one shared engine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use byom_sandbox::*;
use serde_json::{json, Value};

const KEY: &[u8] = b"test snapshot key";

fn engine() -> Engine {
    Engine::shared().unwrap()
}

fn limits() -> Limits {
    Limits {
        wall_clock: Duration::from_secs(5),
        ..Limits::default()
    }
}

fn interp(caps: Vec<Capability>) -> Interpreter {
    Interpreter::new(&engine(), limits(), caps, KEY).unwrap()
}

async fn done(it: &mut Interpreter, code: &str) -> Value {
    match it.eval(code).await {
        Outcome::Done(v) => v,
        o => panic!("{code}: {o:?}"),
    }
}

async fn error(it: &mut Interpreter, code: &str) -> (ErrorKind, String) {
    match it.eval(code).await {
        Outcome::Error(k, m) => (k, m),
        o => panic!("{code}: expected an error, got {o:?}"),
    }
}

fn echo() -> Capability {
    Capability::new(
        "tools",
        "echo",
        Arc::new(|v| Box::pin(async move { Ok(v) })),
    )
}

#[tokio::test]
async fn language_console_and_values() {
    let mut it = interp(vec![]);
    assert_eq!(done(&mut it, "1 + 2").await, json!(3));
    assert_eq!(
        done(&mut it, "let x = await Promise.resolve(41); x + 1").await,
        json!(42)
    );
    assert_eq!(
        done(
            &mut it,
            "console.log('hi', {a: 1}, [2]); ({b: [1, 'two', null]})"
        )
        .await,
        json!({"b": [1, "two", null]})
    );
    assert_eq!(it.logs(), &["hi {\"a\":1} [2]".to_string()]);
    assert_eq!(done(&mut it, "undefined").await, Value::Null);
    assert_eq!(
        done(&mut it, "var g = 5; globalThis.h = 6; [g, h]").await,
        json!([5, 6])
    );
    assert_eq!(
        done(&mut it, "[typeof g, h]").await,
        json!(["number", 6]),
        "globals persist across evals"
    );
}

#[tokio::test]
async fn error_kinds() {
    let mut it = interp(vec![]);
    assert_eq!(error(&mut it, "let = ;").await.0, ErrorKind::SyntaxError);
    let (k, m) = error(&mut it, "throw new TypeError('nope')").await;
    assert_eq!(k, ErrorKind::Exception);
    assert!(m.contains("TypeError: nope"), "{m}");
    assert_eq!(
        error(&mut it, "await Promise.reject(new Error('async nope'))")
            .await
            .0,
        ErrorKind::Exception
    );
    // Catchable errors stay inside JS.
    assert_eq!(
        done(&mut it, "try { null.x } catch (e) { e.name }").await,
        json!("TypeError")
    );
}

#[tokio::test]
async fn limits_each_have_their_kind_and_the_engine_survives() {
    let mut l = limits();
    l.wall_clock = Duration::from_millis(300);
    let mut it = Interpreter::new(&engine(), l.clone(), vec![], KEY).unwrap();
    let t = Instant::now();
    assert_eq!(error(&mut it, "for (;;) {}").await.0, ErrorKind::Timeout);
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(
        error(&mut it, "await new Promise(() => {})").await.0,
        ErrorKind::Timeout
    );

    let mut l2 = limits();
    l2.cpu_fuel = 50_000_000;
    let mut it = Interpreter::new(&engine(), l2, vec![], KEY).unwrap();
    assert_eq!(
        error(&mut it, "let i = 0; for (;;) { i++ }").await.0,
        ErrorKind::OutOfFuel
    );
    assert_eq!(
        done(&mut it, "'usable after a trap'").await,
        json!("usable after a trap")
    );

    let mut l3 = limits();
    l3.memory_bytes = 16 << 20;
    let mut it = Interpreter::new(&engine(), l3, vec![], KEY).unwrap();
    assert_eq!(
        error(
            &mut it,
            "const a = []; for (;;) a.push(new Array(10000).fill(1))"
        )
        .await
        .0,
        ErrorKind::OutOfMemory
    );
    assert_eq!(
        error(&mut it, "'x'.repeat(1 << 28)").await.0,
        ErrorKind::OutOfMemory
    );
    assert_eq!(done(&mut it, "[1,2,3].length").await, json!(3));

    let mut it = interp(vec![]);
    assert_eq!(
        error(&mut it, "function f(n) { return f(n + 1) + 1 } f(0)")
            .await
            .0,
        ErrorKind::StackOverflow
    );
    assert_eq!(done(&mut it, "'fresh'").await, json!("fresh"));

    let mut l4 = limits();
    l4.max_output_bytes = 1000;
    l4.max_result_bytes = 1000;
    let mut it = Interpreter::new(&engine(), l4, vec![], KEY).unwrap();
    assert_eq!(
        error(
            &mut it,
            "for (let i = 0; i < 1000; i++) console.log('spam spam spam')"
        )
        .await
        .0,
        ErrorKind::OutputLimit
    );
    assert_eq!(
        error(&mut it, "'y'.repeat(5000)").await.0,
        ErrorKind::ResultLimit
    );
    assert_eq!(done(&mut it, "'small'").await, json!("small"));
}

#[tokio::test]
async fn capabilities_validate_throttle_and_report_errors() {
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (a, p) = (active.clone(), peak.clone());
    let slow = Capability::new(
        "tools",
        "slow",
        Arc::new(move |v: Value| {
            let (a, p) = (a.clone(), p.clone());
            Box::pin(async move {
                let now = a.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                a.fetch_sub(1, Ordering::SeqCst);
                Ok(json!(v["n"].as_i64().unwrap_or(0) * 2))
            })
        }),
    )
    .with_schema(json!({"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}, "additionalProperties": false}))
    .with_policy(4, 100);
    let failing = Capability::new(
        "tools",
        "fail",
        Arc::new(|_| Box::pin(async { Err("disk on fire".to_string()) })),
    );
    let mut it = interp(vec![slow, failing, echo()]);
    let v = done(&mut it, "const r = await Promise.all(Array.from({length: 50}, (_, i) => tools.slow({n: i}))); r.reduce((a, b) => a + b, 0)").await;
    assert_eq!(v, json!((0..50).map(|i| i * 2).sum::<i64>()));
    assert!(
        peak.load(Ordering::SeqCst) <= 4,
        "throttled to the policy: {}",
        peak.load(Ordering::SeqCst)
    );
    assert!(peak.load(Ordering::SeqCst) >= 2, "calls ran concurrently");
    let v = done(
        &mut it,
        "try { await tools.slow({n: 'x'}) } catch (e) { e.message }",
    )
    .await;
    assert!(v.as_str().unwrap().contains("invalid arguments"), "{v}");
    let v = done(
        &mut it,
        "try { await tools.fail({}) } catch (e) { e.message }",
    )
    .await;
    assert_eq!(v, json!("disk on fire"));
    let (k, m) = error(
        &mut it,
        "for (let i = 0; i < 101; i++) await tools.slow({n: 1})",
    )
    .await;
    assert_eq!(k, ErrorKind::CapabilityLimit, "{m}");
    assert_eq!(
        done(&mut it, "await tools.echo({a: [1, {b: 'c'}]})").await,
        json!({"a": [1, {"b": "c"}]})
    );
}

#[tokio::test]
async fn slow_host_calls_count_against_the_wall_clock() {
    let sleepy = Capability::new(
        "tools",
        "sleep",
        Arc::new(|_| {
            Box::pin(async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Value::Null)
            })
        }),
    );
    let mut l = limits();
    l.wall_clock = Duration::from_millis(300);
    let mut it = Interpreter::new(&engine(), l, vec![sleepy], KEY).unwrap();
    let t = Instant::now();
    let (k, _) = error(&mut it, "await tools.sleep({})").await;
    assert_eq!(k, ErrorKind::Timeout);
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn hostile_scripts_cannot_reach_out_or_break_the_bridge() {
    let mut it = interp(vec![echo()]);
    assert_eq!(
        done(
            &mut it,
            "[typeof std, typeof os, typeof require, typeof process, typeof fetch]"
        )
        .await,
        json!([
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined"
        ])
    );
    let v = done(
        &mut it,
        "try { await import('os'); 'imported' } catch (e) { 'refused' }",
    )
    .await;
    assert_eq!(v, json!("refused"));
    // Prototype pollution and bridge replacement.
    let v = done(
        &mut it,
        "Object.prototype.toJSON = () => 'pwned'; try { tools.echo = () => 'fake' } catch (e) {}
         try { delete globalThis.tools } catch (e) {}
         const r = await tools.echo({a: 1}); delete Object.prototype.toJSON; r",
    )
    .await;
    assert_eq!(
        v,
        json!("pwned"),
        "the script sees its own toJSON, nothing more"
    );
    assert_eq!(
        done(
            &mut it,
            "typeof tools.echo === 'function' && Object.isFrozen(tools)"
        )
        .await,
        json!(true)
    );
    assert_eq!(
        done(&mut it, "await tools.echo([1, 2])").await,
        json!([1, 2])
    );
    // Huge strings inside the limit are fine.
    assert_eq!(
        done(&mut it, "'z'.repeat(1 << 20).length").await,
        json!(1 << 20)
    );
}

fn ask() -> Capability {
    Capability::durable("human", "ask").with_schema(json!({"type": "string"}))
}

#[tokio::test]
async fn durable_pause_and_resume_in_a_fresh_instance() {
    let mut it = interp(vec![ask(), echo()]);
    let code = "let count = 40; const who = await human.ask('name?'); count += 1;
                const [a, b] = await Promise.all([human.ask('a?'), human.ask('b?')]);
                ({who, count, a, b, echoed: await tools.echo(who)})";
    let snap = match it.eval(code).await {
        Outcome::Paused(s) => s,
        o => panic!("{o:?}"),
    };
    let pending = snap.pending_unverified().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].args, json!("name?"));
    drop(it);

    let mut it = Interpreter::restore(
        &engine(),
        limits(),
        vec![ask(), echo()],
        &Snapshot::from_bytes(snap.as_bytes().to_vec()),
        KEY,
    )
    .unwrap();
    let snap2 = match it.resume(pending[0].id, Ok(json!("ada"))).await {
        Outcome::Paused(s) => s,
        o => panic!("{o:?}"),
    };
    let p2 = snap2.pending_unverified().unwrap();
    assert_eq!(p2.len(), 2);
    let mut it =
        Interpreter::restore(&engine(), limits(), vec![ask(), echo()], &snap2, KEY).unwrap();
    let first = p2.iter().find(|p| p.args == json!("a?")).unwrap().id;
    let second = p2.iter().find(|p| p.args == json!("b?")).unwrap().id;
    let snap3 = match it.resume(first, Ok(json!(1))).await {
        Outcome::Paused(s) => s,
        o => panic!("{o:?}"),
    };
    let mut it =
        Interpreter::restore(&engine(), limits(), vec![ask(), echo()], &snap3, KEY).unwrap();
    match it.resume(second, Ok(json!(2))).await {
        Outcome::Done(v) => assert_eq!(
            v,
            json!({"who": "ada", "count": 41, "a": 1, "b": 2, "echoed": "ada"})
        ),
        o => panic!("{o:?}"),
    }
}

#[tokio::test]
async fn tampered_or_foreign_snapshots_are_refused() {
    let mut it = interp(vec![ask()]);
    let snap = match it.eval("const x = await human.ask('q'); x").await {
        Outcome::Paused(s) => s,
        o => panic!("{o:?}"),
    };
    let bytes = snap.as_bytes().to_vec();
    for pos in [
        0,
        9,
        20,
        50,
        bytes.len() / 2,
        bytes.len() - 40,
        bytes.len() - 1,
    ] {
        let mut b = bytes.clone();
        b[pos] ^= 1;
        match Interpreter::restore(
            &engine(),
            limits(),
            vec![ask()],
            &Snapshot::from_bytes(b),
            KEY,
        ) {
            Err((ErrorKind::BadSnapshot, _)) => {}
            Err(e) => panic!("byte {pos}: {e:?}"),
            Ok(_) => panic!("byte {pos}: tampered snapshot accepted"),
        }
    }
    assert!(matches!(
        Interpreter::restore(&engine(), limits(), vec![ask()], &snap, b"other key"),
        Err((ErrorKind::BadSnapshot, _))
    ));
    assert!(matches!(
        Interpreter::restore(&engine(), limits(), vec![ask(), echo()], &snap, KEY),
        Err((ErrorKind::BadSnapshot, _))
    ));
    assert!(matches!(
        Interpreter::restore(
            &engine(),
            limits(),
            vec![ask()],
            &Snapshot::from_bytes(b"junk".to_vec()),
            KEY
        ),
        Err((ErrorKind::BadSnapshot, _))
    ));
    let mut it = Interpreter::restore(&engine(), limits(), vec![ask()], &snap, KEY).unwrap();
    assert!(matches!(
        it.resume(999, Ok(json!(1))).await,
        Outcome::Error(ErrorKind::BadSnapshot, _)
    ));
}

mod bridge_props {
    use super::*;
    use proptest::prelude::*;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            (-1e9f64..1e9f64).prop_map(|f| json!(f)),
            ".{0,40}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,8}", inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn random_json_crosses_the_bridge_unchanged(v in json_value()) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let got = rt.block_on(async {
                let mut it = interp(vec![echo()]);
                let code = format!("await tools.echo({})", serde_json::to_string(&v).unwrap());
                it.eval(&code).await
            });
            match got {
                Outcome::Done(out) => prop_assert!(json_eq(&out, &v), "{} != {}", out, v),
                o => prop_assert!(false, "{:?}", o),
            }
        }
    }

    /// Equal as JSON numbers compare (1.0 and 1 are the same number in JS).
    fn json_eq(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                (x.as_f64().unwrap() - y.as_f64().unwrap()).abs()
                    <= 1e-9 * y.as_f64().unwrap().abs().max(1.0)
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
            }
            _ => a == b,
        }
    }
}

#[tokio::test]
async fn template_instances_are_independent_and_working() {
    let t = Template::new(&engine(), limits(), vec![echo(), ask()], KEY).unwrap();
    let mut a = t.instantiate().unwrap();
    let mut b = t.instantiate().unwrap();
    assert_eq!(
        done(&mut a, "globalThis.v = 1; await tools.echo(v)").await,
        json!(1)
    );
    assert_eq!(done(&mut b, "typeof v").await, json!("undefined"));
    assert!(matches!(
        b.eval("await human.ask('x')").await,
        Outcome::Paused(_)
    ));
}

#[tokio::test]
async fn clock_and_randomness_come_from_the_host_and_replay_exactly() {
    let run = || async {
        let mut it =
            Interpreter::new_at(&engine(), limits(), vec![], KEY, 1_700_000_000_000).unwrap();
        done(&mut it, "[Math.floor(Date.now() / 1000), Math.random(), Math.random(), new Date(0).toISOString()]").await
    };
    let (a, b) = (run().await, run().await);
    assert_eq!(a, b, "same clock start, same run");
    assert_eq!(a[0], json!(1_700_000_000));
    let mut other = Interpreter::new_at(&engine(), limits(), vec![], KEY, 42_000).unwrap();
    assert_ne!(done(&mut other, "Math.random()").await, a[1]);
}
