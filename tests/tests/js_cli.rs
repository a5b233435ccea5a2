//! `byom js` across processes: a script pauses on human.ask in one process
//! and continues in another, with all its variables.

use std::process::{Command, Stdio};

use byom_tests::bin;
use serde_json::Value;

fn js(dir: &std::path::Path, args: &[&str], stdin: Option<&str>) -> (i32, Value, String) {
    let mut c = Command::new(bin("byom"));
    c.arg("js")
        .args(args)
        .arg("--json")
        .env("BYOM_JS_KEY", "test key for byom js runs")
        .env("BYOM_DATA_DIR", dir);
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(s) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn pause_in_one_process_resume_in_another() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.js");
    std::fs::write(
        &script,
        "let total = 1; const seen = []; for (const q of ['a?', 'b?']) { seen.push(await human.ask(q)); total *= 10 } console.log('done'); ({total, seen})",
    )
    .unwrap();
    let snap1 = dir.path().join("1.snap");
    let snap2 = dir.path().join("2.snap");
    let (code, v, e) = js(
        dir.path(),
        &[
            "run",
            script.to_str().unwrap(),
            "--snapshot-out",
            snap1.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 3, "{v} {e}");
    assert_eq!(v["status"], "paused");
    assert_eq!(v["pending"][0]["args"], "a?");
    let call = v["pending"][0]["id"].as_u64().unwrap().to_string();
    let (code, v, _) = js(
        dir.path(),
        &[
            "resume",
            snap1.to_str().unwrap(),
            "--call",
            &call,
            "--answer",
            "\"one\"",
            "--snapshot-out",
            snap2.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 3, "{v}");
    let call = v["pending"][0]["id"].as_u64().unwrap().to_string();
    let (code, v, _) = js(
        dir.path(),
        &[
            "resume",
            snap2.to_str().unwrap(),
            "--call",
            &call,
            "--answer",
            "{\"two\": 2}",
        ],
        None,
    );
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        v["result"],
        serde_json::json!({"total": 100, "seen": ["one", {"two": 2}]})
    );
    assert_eq!(v["logs"], serde_json::json!(["done"]));

    // One flipped byte: refused.
    let mut b = std::fs::read(&snap2).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x40;
    std::fs::write(&snap2, b).unwrap();
    let (code, v, _) = js(
        dir.path(),
        &[
            "resume",
            snap2.to_str().unwrap(),
            "--call",
            &call,
            "--answer",
            "1",
        ],
        None,
    );
    assert_eq!(code, 1);
    assert_eq!(v["error_kind"], "BadSnapshot");
}

#[test]
fn error_kinds_reach_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    for (src, kind, extra) in [
        ("for (;;) {}", "Timeout", vec!["--timeout", "200ms"]),
        (
            "let x = [];\nfor (;;) x.push('x'.repeat(1000))",
            "OutOfMemory",
            vec!["--memory", "8MiB"],
        ),
        (
            "let i = 0; for (;;) i++",
            "OutOfFuel",
            vec!["--cpu-fuel", "10000000"],
        ),
        (
            "function f() { return f() + 1 } f()",
            "StackOverflow",
            vec![],
        ),
        (
            "for (;;) console.log('x')",
            "OutputLimit",
            vec!["--max-output", "1000"],
        ),
        ("let = ;", "SyntaxError", vec![]),
        ("throw new Error('boom')", "Exception", vec![]),
        (
            "for (let i = 0; i < 1000; i++) human.ask('q' + i)",
            "CapabilityLimit",
            vec![],
        ),
    ] {
        let mut args = vec!["run", "-"];
        args.extend(extra);
        let (code, v, e) = js(dir.path(), &args, Some(src));
        assert_eq!(code, 1, "{src}: {v} {e}");
        assert_eq!(v["error_kind"], kind, "{src}: {v}");
    }
    let (code, v, _) = js(dir.path(), &["run", "-"], Some("console.log('hi'); 6 * 7"));
    assert_eq!(code, 0);
    assert_eq!(v["result"], 42);
}
