//! The super-agent end to end: real `byom server` and `byomd` processes on
//! loopback, the scripted model, real sled stores. Batching, pass-through,
//! bounce, cancel (chat and CLI), approvals (chat and CLI), restarts during
//! a pause and during a model call, webhooks, channel norms.

use std::time::Duration;

use byom_tests::provider::{Api, FakeProvider};
use byom_tests::{
    byom_headers, server_config, stderr, stdout, wait_for, webhook_post, Daemon, Server,
};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

fn setup(extra: &[&str]) -> (tempfile::TempDir, Server, Daemon) {
    setup_env(extra, &[])
}

fn setup_env(extra: &[&str], env: &[(&str, &str)]) -> (tempfile::TempDir, Server, Daemon) {
    Server::with_lap(extra, env)
}

fn say_on(server: &Server, source: &str, thread: &str, user: &str, text: &str) -> Value {
    server.json(&[
        "events",
        "send",
        "--source",
        source,
        "--thread",
        thread,
        "--user",
        user,
        "--mention",
        text,
    ])
}

fn say(server: &Server, thread: &str, text: &str) -> Value {
    say_on(server, "chat", thread, "ada", text)
}

/// The agent's replies on a thread, oldest first.
fn replies(server: &Server, thread: &str) -> Vec<String> {
    server.replies(thread)
}

fn wait_replies(server: &Server, thread: &str, n: usize) -> Vec<String> {
    wait_for(&format!("{n} replies on {thread}"), T, || {
        let r = replies(server, thread);
        (r.len() >= n).then_some(r)
    })
}

fn tasks(server: &Server) -> Vec<Value> {
    server.json(&["tasks", "ls"]).as_array().unwrap().clone()
}

fn workers(server: &Server) -> Vec<Value> {
    server.json(&["workers", "ls"]).as_array().unwrap().clone()
}

fn router(server: &Server) -> Value {
    server.json(&["router"])
}

fn commands_with(server: &Server, text: &str) -> Vec<Value> {
    server
        .json(&["commands", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["shell"].as_str() == Some(text) || c["command"].as_str() == Some(text))
        .cloned()
        .collect()
}

#[test]
fn chat_task_follow_up_passes_through_and_replies_keep_channel_norms() {
    let (_dir, server, _d) = setup(&[]);

    // `byom chat` as a person would use it, non-interactively.
    let out = server.byom(&[
        "chat",
        "--thread",
        "t1",
        "--user",
        "ada",
        "-m",
        "please run `echo hi-from-lap` on lap",
        "--wait",
        "30s",
        "--replies",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("byom: On it"), "{text}");
    assert!(text.contains("hi-from-lap"), "{text}");
    let ts = tasks(&server);
    assert_eq!(ts.len(), 1);
    let task = ts[0]["id"].as_str().unwrap().to_string();

    // A follow-up on the same thread goes to the same worker, not the Router.
    say(&server, "t1", "also run `echo second-one`");
    let r = wait_replies(&server, "t1", 3);
    assert!(r[2].contains("second-one"), "{r:?}");
    assert_eq!(tasks(&server).len(), 1, "no new task for a follow-up");
    let st = router(&server);
    assert_eq!(st["stats"]["passed_through"], 1, "{st}");
    let w = server.json(&["tasks", "show", &task]);
    assert_eq!(w["commands"].as_object().unwrap().len(), 2);
    assert_eq!(w["summary"]["status"], "idle");

    // Chat replies are short: at most 100 words, with a pointer to the rest.
    say(&server, "t2", "please run `seq 1 400` on lap");
    let r = wait_replies(&server, "t2", 2);
    let words = r[1].split_whitespace().count();
    assert!(words <= 100, "{words} words: {}", r[1]);
    assert!(r[1].contains("(more: byom threads show"), "{}", r[1]);

    // Asynchronous channels (a signed webhook here) get structured replies.
    // A webhook's sender is untrusted until an admin says otherwise.
    server.trust(&["add", "webhook:github/*"]);
    let key = std::fs::read_to_string(server.data_dir.join("webhook.key")).unwrap();
    let key = key.trim().as_bytes().to_vec();
    let body = r#"{"thread": "pr-42", "user": "ada", "text": "please run `echo from-github` on lap", "mention": true}"#;
    let (status, _) = webhook_post(
        server.webhook_addr,
        "/hooks/github",
        Some(&byom_headers(&key, body)),
        body,
    );
    assert_eq!(status, 202);
    let (status, _) = webhook_post(
        server.webhook_addr,
        "/hooks/github",
        Some("X-Byom-Signature: sha256=00\r\n"),
        body,
    );
    assert_eq!(status, 401, "a bad signature is refused and nothing stored");
    let r = wait_replies(&server, "pr-42", 2);
    assert!(r[1].starts_with("**byom — done**"), "{}", r[1]);
    assert!(r[1].contains("from-github"));
    assert_eq!(
        tasks(&server).len(),
        3,
        "the bad-signature post made no task"
    );

    // Every object links: show a worker and a thread by ID.
    let out = server.byom(&["show", &task]);
    assert!(stdout(&out).contains("transcript:"), "{}", stdout(&out));
}

#[test]
fn router_batches_triggers_that_arrive_during_a_model_call() {
    let (_dir, server, _d) = setup(&["--scripted-latency", "1500ms"]);
    // The first event starts a turn; the next five arrive while it runs.
    say(&server, "b0", "hello there");
    std::thread::sleep(Duration::from_millis(300));
    // Sent at once (five CLI processes), so a loaded machine cannot spread
    // them over several model calls.
    std::thread::scope(|s| {
        for i in 1..=5 {
            let server = &server;
            s.spawn(move || say(server, &format!("b{i}"), "good morning"));
        }
    });
    let st = wait_for("router to settle", T, || {
        let st = router(&server);
        (st["stats"]["events"] == 6
            && st["queued"] == 0
            && st["in_flight"] == false
            && st["stats"]["decisions"].as_u64() >= Some(6))
        .then_some(st)
    });
    let turns = st["stats"]["turns"].as_u64().unwrap();
    assert!(turns <= 3, "6 triggers took {turns} turns: {st}");
    assert_eq!(
        st["stats"]["decisions"], 6,
        "one decision (ignore) each: {st}"
    );
}

#[test]
fn cancel_from_the_thread_bounces_to_the_router_and_stops_the_command() {
    let (_dir, server, _d) = setup(&[]);
    say(&server, "c1", "please run `sleep 60` on lap");
    wait_replies(&server, "c1", 1);
    let cmd = wait_for("the command to run", T, || {
        commands_with(&server, "sleep 60")
            .into_iter()
            .find(|c| c["state"] == "running")
    });
    // Chatter on the thread is bounced by the worker and ignored by the Router.
    say(&server, "c1", "thanks!");
    // "cancel" passes through to the worker, which bounces it; the Router
    // cancels the worker, which stops its command.
    say(&server, "c1", "cancel that please");
    let c = server.wait_done(cmd["id"].as_str().unwrap(), T);
    assert_eq!(c["state"], "cancelled", "{c}");
    let r = wait_replies(&server, "c1", 2);
    assert!(r.iter().any(|x| x.contains("Cancelled")), "{r:?}");
    let t = &tasks(&server)[0];
    assert_eq!(t["status"], "cancelled");
    let w = server.json(&["tasks", "show", t["id"].as_str().unwrap()]);
    let bounces = w["conversation"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["name"] == "bounce")
        .count();
    assert_eq!(bounces, 2, "chatter and the cancel were both bounced");
    assert!(router(&server)["stats"]["passed_through"].as_u64() >= Some(2));
    wait_for("router settles", T, || {
        let st = router(&server);
        (st["queued"] == 0 && st["in_flight"] == false).then_some(())
    });
    let r = replies(&server, "c1");
    assert_eq!(
        r.iter()
            .filter(|x| x.to_lowercase().contains("cancel"))
            .count(),
        1,
        "the Router's own cancel is said once: {r:?}"
    );
}

#[test]
fn cancel_from_the_cli_stops_the_task_and_its_commands() {
    let (_dir, server, _d) = setup(&[]);
    say(&server, "k1", "please run `sleep 60` on lap");
    let cmd = wait_for("the command to run", T, || {
        commands_with(&server, "sleep 60")
            .into_iter()
            .find(|c| c["state"] == "running")
    });
    let task = tasks(&server)[0]["id"].as_str().unwrap().to_string();
    let out = server.byom(&["tasks", "cancel", &task]);
    assert!(out.status.success(), "{}", stderr(&out));
    let c = server.wait_done(cmd["id"].as_str().unwrap(), T);
    assert_eq!(c["state"], "cancelled");
    wait_for("task cancelled", T, || {
        (tasks(&server)[0]["status"] == "cancelled").then_some(())
    });
    // The Router tells the thread what happened.
    let r = wait_replies(&server, "k1", 2);
    assert!(r[1].contains("cancelled by admin"), "{r:?}");
    let out = server.byom(&["tasks", "cancel", &task]);
    assert!(!out.status.success(), "cancelling twice is refused");
    assert!(stderr(&out).contains("already ended"), "{}", stderr(&out));
    let out = server.byom(&["tasks", "cancel", "wrk_nope"]);
    assert!(stderr(&out).contains("no task"), "{}", stderr(&out));
}

const PARALLEL: &str = "check `echo one`, `echo two` and `echo three` on lap in parallel, then ask me before running `echo cleaned-up`";

#[test]
fn approval_answered_in_the_chat() {
    let (_dir, server, _d) = setup(&[]);
    say(&server, "a1", PARALLEL);
    let r = wait_replies(&server, "a1", 2);
    assert!(r[1].starts_with("Approval needed (apr_"), "{r:?}");
    let subs: Vec<Value> = workers(&server)
        .into_iter()
        .filter(|w| w["parent"].is_string())
        .collect();
    assert_eq!(subs.len(), 3, "three subagents");
    assert!(subs.iter().all(|w| w["status"] == "done"));
    // Words are not an answer; the code is.
    say(&server, "a1", "yes, go ahead");
    let i = r[1].find("`approve ").expect("a code");
    let code: String = r[1][i + 9..].chars().take(6).collect();
    say(&server, "a1", &format!("approve {code}"));
    let r = wait_for("the program's result", T, || {
        let r = replies(&server, "a1");
        r.iter()
            .any(|x| x.starts_with("Done: Program"))
            .then_some(r)
    });
    assert!(
        r.iter().any(|x| x.contains("That is not an answer")),
        "{r:?}"
    );
    let done = r
        .iter()
        .find(|x| x.starts_with("Done: Program"))
        .expect("program result");
    for want in ["one", "two", "three", "cleaned-up"] {
        assert!(done.contains(want), "{done}");
    }
    let a = server.json(&["approvals", "ls", "--all"]);
    assert_eq!(a[0]["state"], "approved");
    // The person who said yes, never the Router that carried it.
    assert_eq!(a[0]["by"], "admin:admin");
}

#[test]
fn approval_from_the_cli_after_a_restart_during_the_pause() {
    let (_dir, mut server, _d) = setup(&[]);
    say(&server, "p1", PARALLEL);
    wait_replies(&server, "p1", 2);
    let open = server.json(&["approvals", "ls"]);
    let apr = open[0]["id"].as_str().unwrap().to_string();

    // The paused interpreter is a snapshot in the store, linked both ways.
    let worker = open[0]["worker"].as_str().unwrap().to_string();
    let w = server.json(&["workers", "show", &worker]);
    let snp = w["js"]["snapshot"]
        .as_str()
        .expect("paused on a snapshot")
        .to_string();
    let shown = server.json(&["show", &snp]);
    assert_eq!(shown["paused_program_of"], worker.as_str(), "{shown}");
    assert!(shown["bytes"].as_u64() > Some(1000));

    server.restart();
    server.wait_online("lap", true, T);
    let open = server.json(&["approvals", "ls"]);
    assert_eq!(open[0]["id"], apr, "the pause survived kill -9");

    // Bad answers are refused with a clear message; nothing changes.
    let out = server.byom(&["approvals", "approve", &apr, "--answer", "not json"]);
    assert!(stderr(&out).contains("must be JSON"), "{}", stderr(&out));
    let out = server.byom(&["approvals", "approve", &apr, "--answer", "\"ship it\""]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = server.byom(&["approvals", "deny", &apr]);
    assert!(!out.status.success(), "an approval is answered once");

    let r = wait_replies(&server, "p1", 3);
    assert!(r[2].contains("cleaned-up"), "{r:?}");
    // Nothing ran twice across the restart.
    assert_eq!(commands_with(&server, "echo cleaned-up").len(), 1);
    for c in ["echo one", "echo two", "echo three"] {
        assert_eq!(commands_with(&server, c).len(), 1, "{c}");
    }
    let a = server.json(&["approvals", "ls", "--all"]);
    assert_eq!(a[0]["state"], "approved");
    assert_eq!(a[0]["answer"], "ship it");
}

#[test]
fn denied_approval_skips_the_step() {
    let (_dir, server, _d) = setup(&[]);
    say(&server, "n1", PARALLEL);
    let r = wait_replies(&server, "n1", 2);
    let i = r[1].find("`deny ").expect("a code");
    let code: String = r[1][i + 6..].chars().take(6).collect();
    say(&server, "n1", &format!("deny {code}"));
    let r = wait_for("the step skipped", T, || {
        let r = replies(&server, "n1");
        r.iter()
            .any(|x| x.contains("skipped: not approved"))
            .then_some(r)
    });
    assert!(r.iter().any(|x| x.contains("Denied by")), "{r:?}");
    assert!(commands_with(&server, "echo cleaned-up").is_empty());
}

#[test]
fn restart_during_model_calls_loses_nothing_and_runs_nothing_twice() {
    let (_dir, mut server, _d) = setup(&["--scripted-latency", "2s"]);
    say(&server, "m1", "please run `echo restarted-ok` on lap");
    // Mid Router call.
    std::thread::sleep(Duration::from_millis(700));
    server.restart();
    // Mid Worker call (the Router's call takes 2 s, then the worker's).
    wait_for("a task", T, || (!tasks(&server).is_empty()).then_some(()));
    std::thread::sleep(Duration::from_millis(700));
    server.restart();
    let r = wait_replies(&server, "m1", 2);
    assert!(r.iter().any(|x| x.contains("restarted-ok")), "{r:?}");
    assert_eq!(tasks(&server).len(), 1, "one task, not one per restart");
    assert_eq!(commands_with(&server, "echo restarted-ok").len(), 1);
}

#[test]
fn policies_steer_the_router() {
    let (_dir, server, _d) = setup(&[]);
    let out = server.byom(&["policy", "add", "ignore messages from bob"]);
    assert!(out.status.success(), "{}", stderr(&out));
    say_on(
        &server,
        "chat",
        "q1",
        "bob",
        "please run `echo from-bob` on lap",
    );
    say_on(
        &server,
        "chat",
        "q2",
        "ada",
        "please run `echo from-ada` on lap",
    );
    wait_replies(&server, "q2", 2);
    wait_for("router settles", T, || {
        let st = router(&server);
        (st["queued"] == 0 && st["in_flight"] == false).then_some(())
    });
    assert!(replies(&server, "q1").is_empty());
    assert_eq!(tasks(&server).len(), 1);
    // Ignored in code, before any agent: the trigger says which policy.
    let ls = server.json(&["policy", "ls"]);
    assert!(
        ls[0]["enforced"].as_str().unwrap().contains("named bob"),
        "{ls}"
    );
}

/// "ignore messages from bob" holds on a thread a worker is subscribed to:
/// bob's message never reaches it (the review saw it run `hostname`).
/// A policy that needs judgement reaches that worker with the trigger.
#[test]
fn policies_hold_on_threads_passed_to_workers() {
    let (_dir, server, _d) = setup(&[]);
    say_on(&server, "chat", "p1", "ada", "please run `sleep 5` on lap");
    wait_replies(&server, "p1", 1);
    wait_for("a subscribed worker", T, || {
        (!tasks(&server).is_empty()).then_some(())
    });
    let out = server.byom(&["policy", "add", "ignore messages from bob"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("in code"), "{}", stdout(&out));
    let out = server.byom(&["policy", "add", "be brief with carol"]);
    assert!(stdout(&out).contains("judgement"), "{}", stdout(&out));
    let bob = say_on(&server, "chat", "p1", "bob", "please run `hostname` on lap");
    assert_eq!(bob["decision"], "ignored", "{bob}");
    assert!(bob["reason"].as_str().unwrap().contains("pol_"), "{bob}");
    say_on(
        &server,
        "chat",
        "p1",
        "ada",
        "also run `echo ada-too` on lap",
    );
    wait_for("ada's command", T, || {
        (!commands_with(&server, "echo ada-too").is_empty()).then_some(())
    });
    assert!(
        commands_with(&server, "hostname").is_empty(),
        "bob's message ran"
    );
    let t = &tasks(&server)[0];
    let w = server.json(&["workers", "show", t["id"].as_str().unwrap()]);
    let text = w.to_string();
    assert!(text.contains("be brief with carol"), "{text}");
    assert!(!text.contains("`hostname`"), "{text}");
}

#[test]
fn the_same_server_runs_against_real_provider_apis() {
    let openai = FakeProvider::start(Api::OpenAi);
    let anthropic = FakeProvider::start(Api::Anthropic);
    let openai_base = format!("http://{}/v1", openai.addr);
    let anthropic_base = format!("http://{}", anthropic.addr);
    // A light Router on one provider, strong Workers on the other; keys
    // come from the environment only.
    let (_dir, server, _d) = setup_env(
        &[
            "--router-model",
            "openai:fake-gpt",
            "--worker-model",
            "anthropic:fake-claude",
            "--openai-base-url",
            &openai_base,
            "--anthropic-base-url",
            &anthropic_base,
        ],
        &[
            ("OPENAI_API_KEY", "sk-test"),
            ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ],
    );
    say(&server, "o1", "please run `echo via-providers` on lap");
    let r = wait_replies(&server, "o1", 2);
    assert!(r[1].contains("via-providers"), "{r:?}");
    for (name, p) in [("openai", &openai), ("anthropic", &anthropic)] {
        assert!(
            p.calls.load(std::sync::atomic::Ordering::SeqCst) >= 2,
            "{name}"
        );
        assert!(
            p.auth_ok.load(std::sync::atomic::Ordering::SeqCst),
            "{name}: key and path"
        );
    }
    let st = router(&server);
    assert!(
        st["stats"]["usage"]["cache_read_tokens"].as_u64() > Some(0),
        "{st}"
    );
    let t = &tasks(&server)[0];
    assert!(t["usage"]["cache_read_tokens"].as_u64() > Some(0), "{t}");
}

#[test]
fn chat_reads_lines_from_stdin() {
    use std::io::Write;
    let (_dir, server, _d) = setup(&[]);
    let mut child = server
        .byom_cmd(&[
            "chat",
            "--thread",
            "s1",
            "--user",
            "cy",
            "--wait",
            "30s",
            "--replies",
            "2",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "please run `echo typed-in` on lap").unwrap();
        writeln!(stdin).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("byom: On it"), "{text}");
    assert!(text.contains("typed-in"), "{text}");
}

#[test]
fn label_selectors_and_configured_budgets() {
    let dir = tempfile::tempdir().unwrap();
    // Budgets are named and configurable.
    server_config(
        dir.path(),
        "agents.toml",
        "[budgets]\nchat_reply_words = 12\n",
    );
    let server = Server::start(dir.path());
    let tok = server.token(&["--name", "web-1", "--label", "team=web"]);
    let mut d = Daemon::new(dir.path(), "web-1");
    d.pair(&tok, "web-1");
    d.start();
    server.wait_online("web-1", true, T);

    say(
        &server,
        "l1",
        "please run `hostname` on any machine with label team=web",
    );
    let r = wait_replies(&server, "l1", 2);
    assert!(r[1].starts_with("Done:"), "{r:?}");
    assert!(r[1].split_whitespace().count() <= 12, "{}", r[1]);
    let t = &tasks(&server)[0];
    let w = server.json(&["workers", "show", t["id"].as_str().unwrap()]);
    let cmd = w["commands"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    assert_eq!(
        server.command(&cmd)["machine_id"],
        server.machine("web-1")["id"]
    );

    server_config(
        dir.path(),
        "agents.toml",
        "[budgets]\nchat_reply_wordz = 12\n",
    );
    let out = byom_tests::server_cmd(&dir.path().join("server"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("agents.toml"), "{}", stderr(&out));
}

#[test]
fn a_program_sent_as_a_follow_up_arrives_intact() {
    let (_dir, server, _d) = setup(&[]);
    say(&server, "j1", "please run `echo start` on lap");
    wait_replies(&server, "j1", 2);
    say(
        &server,
        "j1",
        "now this:\n```js\nconst xs = [1, 2, 3, 4].filter(x => x < 3 && x > 0);\n({n: xs.length, html: '<b>ok</b>'});\n```",
    );
    let r = wait_replies(&server, "j1", 3);
    assert!(r[2].contains("\"n\":2"), "{r:?}");
    assert!(r[2].contains("<b>ok</b>"), "{r:?}");
}

/// README's first command: `byom demo` tells the whole story on embedded
/// defaults (a server, a paired daemon, the agents, a restart, GitHub on
/// loopback) and exits 0. Bounded: killed after five minutes.
#[test]
fn the_demo_runs_to_the_end() {
    use std::io::Read;
    let _cpu = byom_tests::cpu_heavy();
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(byom_tests::bin("byom"))
        .arg("demo")
        .env("HOME", dir.path())
        .env_remove("BYOM_DATA_DIR")
        .env_remove("BYOM_CREDS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    let said = reader.join().unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "byom demo did not finish well ({status:?}):\n{said}\n{err}"
    );
    assert!(said.contains("summary"), "{said}");
}

/// An inbox entry this version cannot read (a newer server's, a torn
/// write) is kept aside, not dropped, and stops nothing behind it.
#[test]
fn an_unreadable_inbox_entry_is_kept_aside_and_stops_nothing() {
    if byom_tests::test_store_is_postgres() {
        // The embedded store's files are written directly here.
        return;
    }
    use byom_store::{Op, Space, Store};
    let (_dir, mut server, _lap) = setup_env(&[], &[]);
    server.kill9();
    let at = server.data_dir.join("store");
    let entry = "00000000000000010000000001";
    {
        let store = Store::open_sled(&at).unwrap();
        store
            .batch(&[Op::put(
                Space::Agents,
                format!("i/{entry}").into_bytes(),
                b"{\"from\": \"a newer byom\"".to_vec(),
            )])
            .unwrap();
        store.flush().unwrap();
    }
    server.restart();
    say(
        &server,
        "after",
        "please run `echo after-the-bad-one` on lap",
    );
    wait_for("the reply after it", T, || {
        replies(&server, "after")
            .into_iter()
            .find(|r| r.contains("after-the-bad-one"))
    });
    server.kill9();
    let store = Store::open_sled(&at).unwrap();
    let kept = store.scan_prefix(Space::Agents, "x/", 10).unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].0, entry);
    assert!(String::from_utf8_lossy(&kept[0].1).contains("a newer byom"));
    assert!(store
        .scan_prefix(Space::Agents, "i/", 10)
        .unwrap()
        .is_empty());
}
