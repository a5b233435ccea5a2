//! Sandbox benchmarks (run with `cargo bench -p byom-sandbox`): figures are
//! meant as ratios between rows of the same run.
//!
//! 1. Ready interpreter: cold (engine creation in this process, module from
//!    the on-disk cache or compiled), then warm: plain instantiate + QuickJS
//!    init versus instantiate from a pre-initialised template image.
//! 2. Snapshots: size (linear memory, delta chunks, compressed) and time to
//!    snapshot and restore, for an empty context and 1,000 live objects.
//! 3. A CPU-bound loop (1e6 iterations) in the sandbox versus Node on this
//!    machine (if `node` is on PATH) and versus native QuickJS built from the
//!    same sources (`sandbox/benches/native-qjs.sh`, then `BYOM_QJS=…`).

use std::time::{Duration, Instant};

use byom_sandbox::*;
use serde_json::json;

const KEY: &[u8] = b"bench key";

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn caps() -> Vec<Capability> {
    vec![Capability::durable("human", "ask")]
}

const LOOP: &str = "(() => { let s = 0; for (let i = 0; i < 1000000; i++) { s = (s + i * 7) % 1000003 } return s })()";

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = Instant::now();
    let engine = Engine::new().unwrap();
    let cold_engine = t.elapsed();
    let t = Instant::now();
    let _first = Interpreter::new(&engine, Limits::default(), caps(), KEY).unwrap();
    let cold_first = t.elapsed();

    let n = 200;
    let mut plain: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let it = Interpreter::new(&engine, Limits::default(), caps(), KEY).unwrap();
            let d = t.elapsed();
            drop(it);
            d
        })
        .collect();
    let template = Template::new(&engine, Limits::default(), caps(), KEY).unwrap();
    let mut templ: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let it = template.instantiate().unwrap();
            let d = t.elapsed();
            drop(it);
            d
        })
        .collect();
    // Check a template instance really works.
    let mut it = template.instantiate().unwrap();
    assert!(matches!(rt.block_on(it.eval("1 + 1")), Outcome::Done(v) if v == json!(2)));

    println!(
        "\nready interpreter ({} build)",
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "release"
        }
    );
    println!(
        "  cold: engine (module load/compile) {:.1} ms, first interpreter {:.2} ms",
        cold_engine.as_secs_f64() * 1e3,
        cold_first.as_secs_f64() * 1e3
    );
    let (p50, t50) = (pct(&mut plain, 0.5), pct(&mut templ, 0.5));
    println!(
        "  warm instantiate + init:             p50 {} p99 {}",
        us(p50),
        us(pct(&mut plain, 0.99))
    );
    println!(
        "  warm from template image ({} KiB):  p50 {} p99 {}  ({:.1}x faster)",
        template.image_bytes() / 1024,
        us(t50),
        us(pct(&mut templ, 0.99)),
        p50.as_secs_f64() / t50.as_secs_f64()
    );

    println!("\nsnapshots");
    for (name, setup) in [("empty context", "0"), ("1,000 objects", "globalThis.objs = Array.from({length: 1000}, (_, i) => ({i, name: 'obj' + i, tags: [i, i * 2]})); 0")] {
        let mut it = Interpreter::new(&engine, Limits::default(), caps(), KEY).unwrap();
        let _ = rt.block_on(it.eval(setup));
        let mut snaps = Vec::new();
        let t = Instant::now();
        for _ in 0..20 {
            let mut it2 = Interpreter::new(&engine, Limits::default(), caps(), KEY).unwrap();
            let _ = rt.block_on(it2.eval(setup));
            let t0 = Instant::now();
            match rt.block_on(it2.eval("await human.ask('q')")) {
                Outcome::Paused(s) => snaps.push((t0.elapsed(), s)),
                o => panic!("{o:?}"),
            }
        }
        let _ = t;
        let mut snap_times: Vec<Duration> = snaps.iter().map(|(d, _)| *d).collect();
        let snap = snaps.pop().unwrap().1;
        let (mem, compressed, total) = snap.sizes();
        let mut restore_times = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let it3 = Interpreter::restore(&engine, Limits::default(), caps(), &snap, KEY).unwrap();
            restore_times.push(t.elapsed());
            drop(it3);
        }
        let delta = snapshot_delta_bytes(&snap);
        println!(
            "  {name:<14} memory {:>5} KiB, delta {:>5} KiB, compressed {:>4} KiB (file {} KiB); eval-to-pause incl. snapshot p50 {}, restore p50 {}",
            mem / 1024,
            delta / 1024,
            compressed / 1024,
            total / 1024,
            us(pct(&mut snap_times, 0.5)),
            us(pct(&mut restore_times, 0.5)),
        );
    }

    println!("\nCPU-bound loop (1e6 iterations)");
    let mut it = Interpreter::new(&engine, Limits::default(), vec![], KEY).unwrap();
    let _ = rt.block_on(it.eval(LOOP));
    let mut sandbox: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let o = rt.block_on(it.eval(LOOP));
            assert!(matches!(o, Outcome::Done(_)), "{o:?}");
            t.elapsed()
        })
        .collect();
    let sb = pct(&mut sandbox, 0.5);
    println!(
        "  sandbox (QuickJS in wasmtime, fuel on): {:.1} ms",
        sb.as_secs_f64() * 1e3
    );
    let qjs = std::env::var("BYOM_QJS").unwrap_or_else(|_| "qjs".into());
    for (name, bin, args) in [
        ("node", "node".to_string(), vec!["-e"]),
        ("native QuickJS (qjs)", qjs, vec!["-e"]),
    ] {
        let script = format!("const t = Date.now(); for (let k = 0; k < 5; k++) {{ {LOOP} }} console.log((Date.now() - t) / 5)");
        let out = std::process::Command::new(&bin)
            .args(&args)
            .arg(&script)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let ms: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap_or(f64::NAN);
                println!("  {name}: {ms:.1} ms per loop → sandbox / {name} = {:.1}x", sb.as_secs_f64() * 1e3 / ms);
            }
            _ => println!("  {name}: not available (for qjs run sandbox/benches/native-qjs.sh and set BYOM_QJS), skipped"),
        }
    }
}

/// Uncompressed size of the memory delta: chunk records in the payload.
fn snapshot_delta_bytes(s: &Snapshot) -> u64 {
    // sizes() gives memory and compressed sizes; the delta is recomputed
    // from the compressed payload length bound by zstd's frame header.
    let b = s.as_bytes();
    let hl = u32::from_le_bytes([b[44], b[45], b[46], b[47]]) as usize;
    let pl = u32::from_le_bytes([b[48 + hl], b[49 + hl], b[50 + hl], b[51 + hl]]) as usize;
    let payload = &b[52 + hl..52 + hl + pl];
    zstd::bulk::decompress(payload, 64 << 20)
        .map(|v| v.len() as u64)
        .unwrap_or(0)
}
