//! A newcomer's first ten minutes and everyday CLI use, with real
//! processes: README's "Use it" commands run as written (temp dirs and
//! loopback ports substituted), `byom exec` used as ssh is, and the errors
//! wrong credentials and a busy data dir give.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use byom_tests::channels::free_port;
use byom_tests::{bin, bin_dir, stderr, stdout, wait_for, Daemon, Server};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// Background processes of a README run, killed at the end.
struct Bg(Vec<Child>);

impl Drop for Bg {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The first ```sh block after `heading` in README.md, one command a line.
fn readme_block(heading: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let at = readme.find(heading).expect("the section");
    let rest = &readme[at..];
    let start = rest.find("```sh\n").expect("a sh block") + 6;
    let end = rest[start..].find("```").unwrap() + start;
    rest[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn readme_use_it_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let data = dir.path().join("var-lib-byom");
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (quic, api, hooks) = (free_port(), free_port(), free_port());
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), home.display().to_string()),
        ("PATH".into(), path),
        (
            "XDG_CONFIG_HOME".into(),
            home.join(".config").display().to_string(),
        ),
        (
            "XDG_DATA_HOME".into(),
            home.join(".local/share").display().to_string(),
        ),
    ];
    let mut bg = Bg(Vec::new());
    let mut token = String::new();
    let mut last_cmd = String::new();
    let lines = readme_block("## Use it");
    assert!(lines.len() >= 10, "{lines:?}");
    for line in lines {
        let mut l = line
            .replace("/var/lib/byom", &data.display().to_string())
            .replace("byom.example.com:7443", &format!("127.0.0.1:{quic}"))
            .replace("byom1-…", &token)
            .replace("cmd_…", &last_cmd);
        if let Some(v) = l.strip_prefix("export ") {
            let (k, v) = v.split_once('=').unwrap();
            env.push((k.to_string(), v.to_string()));
            continue;
        }
        if l.starts_with("byom server") {
            // Loopback ports only, as every test here.
            l = l.replace(
                "byom server",
                &format!(
                    "byom server --listen-quic 127.0.0.1:{quic} --listen-api 127.0.0.1:{api} --listen-webhook 127.0.0.1:{hooks}"
                ),
            );
        }
        let background = l.ends_with('&');
        let l = l.trim_end_matches('&').trim().to_string();
        let mut cmd = Command::new("sh");
        // `exec`: the background process is the child killed at the end,
        // not an orphan of a killed shell.
        let script = if background {
            format!("exec {l}")
        } else {
            l.clone()
        };
        cmd.arg("-c")
            .arg(&script)
            .envs(env.iter().map(|(k, v)| (k, v)));
        for k in [
            "BYOM_CREDS",
            "BYOM_API",
            "BYOM_DATA_DIR",
            "BYOMD_CONFIG_DIR",
        ] {
            if !env.iter().any(|(e, _)| e == k) {
                cmd.env_remove(k);
            }
        }
        if background {
            let log =
                std::fs::File::create(dir.path().join(format!("bg{}.log", bg.0.len()))).unwrap();
            cmd.stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log);
            bg.0.push(cmd.spawn().unwrap());
            if l.starts_with("byom server") {
                wait_for("server.json", T, || {
                    data.join("server.json").exists().then_some(())
                });
                let log = std::fs::read_to_string(dir.path().join("bg0.log")).unwrap_or_default();
                wait_for("the next steps", T, || {
                    let log =
                        std::fs::read_to_string(dir.path().join("bg0.log")).unwrap_or_default();
                    log.contains("byom token create").then_some(())
                });
                let _ = log;
            } else if l.starts_with("byomd run") {
                wait_for("lap online", T, || {
                    let o = Command::new(bin("byom"))
                        .args(["machines", "ls", "--json"])
                        .envs(env.iter().map(|(k, v)| (k, v)))
                        .env_remove("BYOM_CREDS")
                        .output()
                        .unwrap();
                    let v: Value = serde_json::from_slice(&o.stdout).ok()?;
                    v.as_array()?
                        .iter()
                        .any(|m| m["name"] == "lap" && m["online"] == true)
                        .then_some(())
                });
            }
            continue;
        }
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        assert!(
            out.status.success(),
            "README line `{line}` failed ({}):\n{}\n{}",
            out.status,
            stdout(&out),
            stderr(&out)
        );
        let text = format!("{}{}", stdout(&out), stderr(&out));
        if let Some(t) = text.split_whitespace().find(|w| w.starts_with("byom1-")) {
            token = t.to_string();
        }
        if let Some(c) = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .find(|w| w.starts_with("cmd_"))
        {
            last_cmd = c.to_string();
        }
        if l.contains("GREETING") {
            assert!(stdout(&out).contains("hello from /tmp"), "{}", stdout(&out));
        }
    }
    assert!(
        token.starts_with("byom1-") && last_cmd.starts_with("cmd_"),
        "{token} {last_cmd}"
    );
    assert_eq!(bg.0.len(), 2, "the server and the daemon ran");
    // The server said what to do next.
    let log = std::fs::read_to_string(dir.path().join("bg0.log")).unwrap();
    for want in [
        "Admin credentials are in",
        "byom token create",
        "model:",
        "--model",
    ] {
        assert!(log.contains(want), "{want:?} missing from:\n{log}");
    }
}

/// Sends `text` on `thread` as ada, addressed to the agent; the trigger's
/// ID and what `byom show` says became of it, once decided.
fn fate_of(server: &Server, thread: &str, text: &str) -> (String, String) {
    let sent = server.say(thread, text);
    let trg = sent["trigger"]["id"]
        .as_str()
        .or(sent["id"].as_str())
        .unwrap()
        .to_string();
    let became = wait_for("the trigger's fate", T, || {
        let b = server.json(&["show", &trg])["became"].as_str()?.to_string();
        (!b.contains("not decided yet")).then_some(b)
    });
    (trg, became)
}

fn byom_with(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(bin("byom"));
    c.args(args)
        .env_remove("BYOM_CREDS")
        .env_remove("BYOM_API")
        .env_remove("BYOM_DATA_DIR")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn exec_works_as_ssh_does() {
    let (dir, server, mut lap) = Server::with_lap(&[], &[]);
    let mut lap2 = Daemon::new(dir.path(), "lap2");
    lap2.pair(
        &server.token(&["--name", "lap2", "--label", "team=web"]),
        "lap2",
    );
    lap2.start();
    server.wait_online("lap2", true, T);
    assert!(server
        .byom(&["machines", "label", "lap", "team=web"])
        .status
        .success());

    // No `--`: everything after the machine is the command.
    let o = server.byom(&["exec", "lap", "echo", "-n", "no-dashes"]);
    assert_eq!(
        (o.status.code(), stdout(&o).as_str()),
        (Some(0), "no-dashes")
    );
    // stdin is passed through when it is not a terminal; -n turns it off.
    let pipe = |args: &[&str]| {
        let mut c = server
            .byom_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin.take().unwrap().write_all(b"x").unwrap();
        c.wait_with_output().unwrap()
    };
    assert_eq!(stdout(&pipe(&["exec", "lap", "--", "cat"])), "x");
    assert_eq!(stdout(&pipe(&["exec", "-n", "lap", "cat"])), "");
    // --json is one valid object, with the output inside.
    let o = server.byom(&[
        "exec",
        "lap",
        "--json",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(o.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    assert_eq!(
        (v["stdout"].as_str(), v["stderr"].as_str()),
        (Some("out\n"), Some("err\n")),
        "{v}"
    );
    // --follow: one event per line, the record last.
    let o = server.byom(&["exec", "lap", "--json", "--follow", "echo", "hi"]);
    let events: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("NDJSON"))
        .collect();
    assert!(events
        .iter()
        .any(|e| e["event"] == "output" && e["data"] == "hi\n"));
    assert_eq!(events.last().unwrap()["event"], "end");
    // A variable the machine's policy scrubs is named, not dropped quietly.
    let o = server.byom(&["exec", "lap", "--env", "GITHUB_TOKEN=x", "--", "true"]);
    assert!(stderr(&o).contains("drops GITHUB_TOKEN"), "{}", stderr(&o));
    // --all: every matching machine, lines prefixed, the worst exit code.
    let o = server.byom(&[
        "exec",
        "--all",
        "--label",
        "team=web",
        "--",
        "sh",
        "-c",
        "echo line; exit 2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("lap  | line") && out.contains("lap2 | line"),
        "{out}"
    );
    // A request becomes a task: `byom show` says which.
    let (_, became) = fate_of(&server, "f1", "run `echo fate` on lap");
    assert!(became.contains("given to a new worker, wrk_"), "{became}");
    // One screen for the admin side.
    let st = server.json(&["status"]);
    assert_eq!(st["machines"]["online"], 2, "{st}");
    assert!(st["server"]["version"].is_string(), "{st}");
    let o = server.byom(&["status"]);
    assert!(stdout(&o).contains("machines   2 online"), "{}", stdout(&o));
    // A paused machine: said, not a silent wait.
    assert!(lap.byomd(&["pause"]).status.success());
    wait_for("paused", T, || {
        (server.machine("lap")["paused"] == true).then_some(())
    });
    let o = server.byom(&["exec", "lap", "--detach", "--", "true"]);
    assert!(stderr(&o).contains("paused by its owner"), "{}", stderr(&o));
    assert!(lap.byomd(&["resume"]).status.success());
    // byom chat returns when the task has reported, not at --wait's end.
    let t0 = std::time::Instant::now();
    let o = server.byom(&[
        "chat",
        "--thread",
        "c1",
        "--wait",
        "40s",
        "run `echo quick` on lap2",
    ]);
    let out = stdout(&o);
    assert!(
        out.contains("On it") && out.contains("Done:") && out.contains("quick"),
        "{out}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "waited {:?}",
        t0.elapsed()
    );
    lap.stop();
    lap2.stop();
}

#[test]
fn wrong_credentials_and_a_busy_data_dir_say_what_is_wrong() {
    let a_dir = tempfile::tempdir().unwrap();
    let b_dir = tempfile::tempdir().unwrap();
    let a = Server::start(a_dir.path());
    let b = Server::start(b_dir.path());
    let a_api: Value =
        serde_json::from_str(&std::fs::read_to_string(a.creds().join("api.json")).unwrap())
            .unwrap();
    let a_api = a_api["api_addr"].as_str().unwrap().to_string();
    // Credentials of another server.
    let o = byom_with(
        &[
            ("BYOM_CREDS", b.creds().to_str().unwrap()),
            ("BYOM_API", &a_api),
        ],
        &["machines", "ls"],
    );
    assert!(
        stderr(&o).contains("not the one the credentials"),
        "{}",
        stderr(&o)
    );
    // A certificate the server refuses (another CA's, with this one's CA).
    let mix = a_dir.path().join("mix");
    std::fs::create_dir_all(&mix).unwrap();
    for f in ["ca.pem", "api.json"] {
        std::fs::copy(a.creds().join(f), mix.join(f)).unwrap();
    }
    for f in ["admin.pem", "admin.key"] {
        std::fs::copy(b.creds().join(f), mix.join(f)).unwrap();
    }
    let o = byom_with(
        &[("BYOM_CREDS", mix.to_str().unwrap())],
        &["machines", "ls"],
    );
    assert!(
        stderr(&o).contains("refused this admin certificate"),
        "{}",
        stderr(&o)
    );
    // No credentials: where it looked, and how to point elsewhere.
    let home = a_dir.path().join("empty-home");
    let o = byom_with(
        &[("HOME", home.to_str().unwrap()), ("XDG_DATA_HOME", "")],
        &["machines", "ls"],
    );
    let e = stderr(&o);
    assert!(e.contains("BYOM_DATA_DIR") && e.contains("--creds"), "{e}");
    // A server's data dir set by BYOM_DATA_DIR is found.
    let data = a.creds().parent().unwrap().to_path_buf();
    let o = byom_with(
        &[("BYOM_DATA_DIR", data.to_str().unwrap())],
        &["machines", "ls"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // A second server on the same data dir names the first one's PID.
    let o = byom_tests::server_cmd(&data)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let pid = a.pid().unwrap().to_string();
    assert!(
        stderr(&o).contains("in use by another byom server") && stderr(&o).contains(&pid),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_scripted_model_says_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let chat = |thread: &str, text: &str| {
        server.byom(&[
            "chat",
            "--thread",
            thread,
            "--user",
            "ada",
            "--wait",
            "20s",
            "--replies",
            "1",
            "-m",
            text,
        ])
    };
    for (thread, text) in [
        ("h1", "hi there"),
        ("h2", "can you check disk space on lap?"),
    ] {
        let o = chat(thread, text);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).contains("--model"), "{text}: {}", stdout(&o));
    }
    // --wait is an upper bound: it returns once the answer is in.
    let t0 = std::time::Instant::now();
    let o = server.byom(&[
        "chat", "--thread", "h3", "--user", "ada", "--wait", "40s", "hello?",
    ]);
    assert!(stdout(&o).contains("--model"), "{}", stdout(&o));
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "waited {:?}",
        t0.elapsed()
    );
    // byom show says what became of a trigger.
    let (trg, became) = fate_of(&server, "h4", "hi there");
    assert!(became.contains("answered by the Router"), "{became}");
    let o = server.byom(&["show", &trg]);
    assert!(stdout(&o).contains("became:"), "{}", stdout(&o));
    let r = stdout(&server.byom(&["router"]));
    assert!(r.contains("model:") && r.contains("scripted"), "{r}");
}

/// `byomd status` shows the name the server uses after a rename, and says
/// a stopped daemon is stopped (not a stale PID).
#[test]
fn byomd_status_follows_renames_and_says_when_stopped() {
    let (_dir, server, mut lap) = Server::with_lap(&[], &[]);
    let o = server.byom(&["machines", "rename", "lap", "laptop"]);
    assert!(o.status.success(), "{}", stderr(&o));
    wait_for("the daemon to learn its new name", T, || {
        let o = lap.byomd(&["status"]);
        stdout(&o).contains("machine:      laptop").then_some(())
    });
    lap.stop();
    let o = lap.byomd(&["status"]);
    let out = stdout(&o);
    assert!(out.contains("stopped; start it with `byomd run"), "{out}");
    assert!(!out.contains("pid"), "{out}");
}
