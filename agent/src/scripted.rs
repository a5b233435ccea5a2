//! `scripted`: a deterministic, rule-based stand-in for a model, for offline
//! runs, the demo, tests and benchmarks. It is not a language model: it
//! reads the event markup the agents write and applies fixed rules. This is
//! its pure part ([`Scripted::respond`]: a request in, a response and the
//! latency a provider would have taken out); the server wraps it as a model
//! that waits that long.
//!
//! Router rules, per event in the turn: a policy "ignore … from USER" or
//! "ignore … \"WORDS\"" ignores matching triggers; approval requests are
//! posted by the core (only an approver's `approve CODE` answers one), so
//! yes/no words on a thread with an open one are left to the core's hint;
//! "cancel"/"stop" on a thread with
//! workers cancels them; a message with a `backticked` command or a ```js
//! fence becomes a worker task on the machine named by "on NAME"; worker
//! reports and questions are relayed to their thread; anything else
//! addressed to it gets a reply saying what it is and naming `--model`;
//! unaddressed chatter is ignored.
//!
//! Worker rules: a task with a ```js fence runs that program; "in parallel"
//! with several `commands` runs a program that spawns one subagent per
//! command (and, with "ask me before `CMD`", asks a human before running
//! CMD); otherwise each `command` is started with shell_start. When every
//! started command has finished it reports their output. A pass-through
//! message saying cancel/stop, or with nothing to do, is bounced.
//!
//! Latency model: per call `base + new_input_tokens × per_input +
//! output_tokens × per_output`, where input tokens already seen as a prefix
//! of the same session's previous request count as cache reads.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use crate::llm::{Message, Request, Response, Role, ToolCall, Usage};
use crate::prompt::tokens;
use crate::trust::{has_word, NO, YES};

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    pub base: Duration,
    pub per_input_token: Duration,
    pub per_output_token: Duration,
}

impl Latency {
    /// `BASE[,PER_INPUT,PER_OUTPUT]` in humantime, e.g. `200ms,20us,5ms`.
    pub fn parse(s: &str) -> Result<Latency, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let d = |i: usize| -> Result<Duration, String> {
            match parts.get(i) {
                Some(p) if !p.is_empty() => {
                    humantime::parse_duration(p).map_err(|e| format!("bad latency {p:?}: {e}"))
                }
                _ => Ok(Duration::ZERO),
            }
        };
        if parts.len() > 3 {
            return Err("latency is BASE[,PER_INPUT_TOKEN,PER_OUTPUT_TOKEN]".into());
        }
        Ok(Latency {
            base: d(0)?,
            per_input_token: d(1)?,
            per_output_token: d(2)?,
        })
    }
}

/// The scripted stand-in. Cheap to clone state: only the prefix cache.
#[derive(Debug, Default)]
pub struct Scripted {
    pub latency: Latency,
    /// session key → hashes of the previous request's messages.
    cache: Mutex<HashMap<u64, Vec<u64>>>,
}

impl Scripted {
    pub fn new(latency: Latency) -> Scripted {
        Scripted {
            latency,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The answer and how long a provider would have taken; no waiting.
    pub fn respond(&self, req: &Request) -> (Response, Duration) {
        let tool_calls = if req.system.starts_with("You are byom's Router") {
            router_rules(req)
        } else {
            worker_rules(req)
        };
        let tool_calls: Vec<ToolCall> = tool_calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, arguments))| ToolCall {
                id: format!("call_{}_{i}", req.messages.len()),
                name,
                arguments,
            })
            .collect();
        let text = if tool_calls.is_empty() {
            "Nothing more to do now.".to_string()
        } else {
            String::new()
        };
        let usage = self.usage(req, &text, &tool_calls);
        let new_input = usage.input_tokens - usage.cache_read_tokens;
        let l = self.latency;
        let latency = l.base
            + l.per_input_token * new_input as u32
            + l.per_output_token * usage.output_tokens as u32;
        let stop_reason = if tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        (
            Response {
                text,
                tool_calls,
                usage,
                stop_reason: stop_reason.into(),
                attempts: 1,
            },
            latency,
        )
    }

    fn usage(&self, req: &Request, text: &str, calls: &[ToolCall]) -> Usage {
        let head = tokens(&req.system)
            + req
                .tools
                .iter()
                .map(|t| {
                    tokens(&t.name) + tokens(&t.description) + tokens(&t.parameters.to_string())
                })
                .sum::<usize>();
        let msg_tokens: Vec<usize> = req.messages.iter().map(message_tokens).collect();
        let hashes: Vec<u64> = req.messages.iter().map(message_hash).collect();
        let key = hash_str(&format!(
            "{}\u{0}{}",
            req.system,
            req.messages.first().map(|m| m.text.as_str()).unwrap_or("")
        ));
        let cached = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let prev = cache.insert(key, hashes.clone());
            match prev {
                None => 0,
                Some(prev) => {
                    let common = prev.iter().zip(&hashes).take_while(|(a, b)| a == b).count();
                    head + msg_tokens[..common].iter().sum::<usize>()
                }
            }
        };
        let input = head + msg_tokens.iter().sum::<usize>();
        let output = tokens(text)
            + calls
                .iter()
                .map(|c| tokens(&c.name) + tokens(&c.arguments.to_string()))
                .sum::<usize>();
        Usage {
            input_tokens: input as u64,
            output_tokens: output.max(1) as u64,
            cache_read_tokens: cached.min(input) as u64,
        }
    }
}

fn message_tokens(m: &Message) -> usize {
    tokens(&m.text)
        + m.tool_calls
            .iter()
            .map(|c| tokens(&c.arguments.to_string()) + 4)
            .sum::<usize>()
        + 4
}

fn hash_str(s: &str) -> u64 {
    // FNV-1a: stable across processes, unlike the std hasher.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn message_hash(m: &Message) -> u64 {
    hash_str(&serde_json::to_string(m).unwrap_or_default())
}

/// One `<event a=b c>text</event>` (or `<approval …>`) element.
#[derive(Debug, Default, Clone)]
struct El {
    attrs: HashMap<String, String>,
    flags: Vec<String>,
    body: String,
}

fn elements(text: &str, tag: &str) -> Vec<El> {
    let mut out = Vec::new();
    let open = format!("<{tag}");
    let close = format!("</{tag}>");
    let mut rest = text;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(gt) = after.find('>') else { break };
        let head = &after[..gt];
        let body_start = &after[gt + 1..];
        let Some(end) = body_start.find(&close) else {
            break;
        };
        let mut el = El {
            body: body_start[..end].to_string(),
            ..Default::default()
        };
        let mut words = head.split_whitespace();
        if let Some(first) = words.next() {
            // `<event report worker=…>`: a bare first word is the kind.
            if first.contains('=') {
                if let Some((k, v)) = first.split_once('=') {
                    el.attrs.insert(k.into(), v.into());
                }
            } else {
                el.flags.push(first.to_string());
            }
        }
        for w in words {
            match w.split_once('=') {
                Some((k, v)) => {
                    el.attrs.insert(k.into(), v.into());
                }
                None => el.flags.push(w.to_string()),
            }
        }
        out.push(el);
        rest = &body_start[end + close.len()..];
    }
    out
}

fn attr<'a>(e: &'a El, k: &str) -> &'a str {
    e.attrs.get(k).map(String::as_str).unwrap_or("")
}

/// Words in `backticks`.
fn backticked(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut parts = text.split('`');
    parts.next();
    while let (Some(inside), Some(_)) = (parts.next(), Some(())) {
        if !inside.trim().is_empty() && !inside.contains('\n') {
            out.push(inside.trim().to_string());
        }
        // Skip the text between this pair and the next.
        if parts.next().is_none() {
            break;
        }
    }
    out
}

fn fenced_js(text: &str) -> Option<String> {
    let start = text.find("```js")?;
    let body = &text[start + 5..];
    let end = body.find("```")?;
    Some(body[..end].trim().to_string())
}

/// `… with label k=v`: a label selector instead of a machine name.
fn labels_of(text: &str) -> Option<(String, String)> {
    let lower = text.to_lowercase();
    let i = lower.find("label ")?;
    let word: String = text[i + 6..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',' && *c != '`')
        .collect();
    let (k, v) = word.trim_end_matches('.').split_once('=')?;
    (!k.is_empty() && !v.is_empty()).then(|| (k.to_string(), v.to_string()))
}

/// The word after the last " on " (a machine name), if any.
fn machine_of(text: &str) -> Option<String> {
    if labels_of(text).is_some() {
        return None;
    }
    let lower = text.to_lowercase();
    let i = lower.rfind(" on ")?;
    let word: String = text[i + 4..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
        .collect();
    let word = word.trim_end_matches('.').to_string();
    (!word.is_empty()).then_some(word)
}

const CANCEL: &[&str] = &["cancel", "stop", "abort"];
const WORK: &[&str] = &[
    "run",
    "check",
    "build",
    "test",
    "deploy",
    "install",
    "fix",
    "investigate",
    "look",
];

fn last_user(req: &Request) -> Option<&Message> {
    match req.messages.last() {
        Some(m) if m.role == Role::User => Some(m),
        _ => None,
    }
}

fn router_rules(req: &Request) -> Vec<(String, Value)> {
    let Some(msg) = last_user(req) else {
        return Vec::new();
    };
    let policies = current_policies(req);
    let approvals = elements(&msg.text, "approval");
    let subs: HashMap<String, Vec<String>> = elements(&msg.text, "subs")
        .into_iter()
        .map(|e| {
            (
                attr(&e, "thread").to_string(),
                e.body.split_whitespace().map(str::to_string).collect(),
            )
        })
        .collect();
    let mut calls = Vec::new();
    for e in elements(&msg.text, "event") {
        let thread = attr(&e, "thread").to_string();
        if e.flags.iter().any(|f| f == "report") {
            let status = attr(&e, "status");
            let text = if status == "done" {
                format!("Done: {}", e.body)
            } else {
                format!("{status}: {}", e.body)
            };
            // Everyone waiting on the worker hears: each of its threads
            // (the chat that asked, the PR it watches).
            let mut threads: Vec<&str> = attr(&e, "threads")
                .split(',')
                .filter(|t| !t.is_empty() && *t != "-")
                .collect();
            if threads.is_empty() {
                threads.push(&thread);
            }
            for t in threads {
                calls.push((
                    "reply".into(),
                    json!({"thread": t, "text": text, "status": status}),
                ));
            }
            continue;
        }
        if e.flags.iter().any(|f| f == "question") {
            // byom posted the request on the thread itself.
            continue;
        }
        let trigger = attr(&e, "trigger").to_string();
        let user = attr(&e, "user");
        let text = &e.body;
        if let Some(why) = policies.iter().find(|p| policy_ignores(p, user, text)) {
            calls.push((
                "ignore".into(),
                json!({"trigger": trigger, "reason": format!("policy: {why}")}),
            ));
            continue;
        }
        // Yes/no words on a thread with an open request: not an answer
        // (the core told them what one looks like), nothing to do.
        if approvals.iter().any(|a| attr(a, "thread") == thread)
            && (has_word(text, YES) || has_word(text, NO))
        {
            calls.push((
                "ignore".into(),
                json!({"trigger": trigger, "reason": "words about an approval; only `approve CODE` answers one"}),
            ));
            continue;
        }
        let workers = subs.get(&thread).cloned().unwrap_or_default();
        if has_word(text, CANCEL) && !workers.is_empty() {
            for w in &workers {
                calls.push((
                    "cancel_worker".into(),
                    json!({"worker": w, "reason": format!("{user} asked to cancel")}),
                ));
            }
            calls.push((
                "reply".into(),
                json!({"thread": thread, "text": "Cancelled."}),
            ));
            continue;
        }
        if !backticked(text).is_empty() || fenced_js(text).is_some() {
            let mut args = json!({"task": text, "threads": [thread]});
            if let Some(m) = machine_of(text) {
                args["machine"] = json!(m);
            }
            if let Some((k, v)) = labels_of(text) {
                args["labels"] = json!({ k: v });
            }
            calls.push(("create_worker".into(), args));
            calls.push((
                "reply".into(),
                json!({"thread": thread, "text": "On it; I'll report back here."}),
            ));
            continue;
        }
        // Spoken to, but nothing it can act on: it says what it is rather
        // than leave the person guessing. Unaddressed chatter stays quiet.
        if e.flags.iter().any(|f| f == "mention") {
            let what = if has_word(text, WORK) {
                "I can't work out a request in your own words"
            } else {
                "I don't follow"
            };
            calls.push((
                "reply".into(),
                json!({"thread": thread, "status": "not understood",
                       "text": format!("{what}: I'm byom's {ABOUT_SHORT}. {HOW_TO}")}),
            ));
            continue;
        }
        calls.push((
            "ignore".into(),
            json!({"trigger": trigger, "reason": "not a request"}),
        ));
    }
    calls
}

/// What the stand-in is, for the server's start line and `byom router`.
pub const ABOUT: &str = "the offline, rule-based stand-in, not a language model: it runs `commands` in backticks on the machine named by \"on NAME\", ```js programs, yes/no answers and cancels, and says so when it cannot do more. For a language model: byom server --model openai:NAME or anthropic:NAME";
const ABOUT_SHORT: &str = "scripted stand-in model (offline and rule-based, not a language model)";
const HOW_TO: &str = "I can run a command you put in backticks (\"run `df -h` on lap\"), a ```js program, or take yes/no to a question. For requests in your own words, the server needs a language model: `byom server --model openai:NAME` (or `anthropic:NAME`).";

fn current_policies(req: &Request) -> Vec<String> {
    let mut policies = Vec::new();
    for m in req.messages.iter().filter(|m| m.role == Role::User) {
        const HEAD: &str = "Policies now in force:\n";
        if let Some(i) = m.text.find(HEAD) {
            policies = m.text[i + HEAD.len()..]
                .lines()
                .take_while(|l| l.starts_with("- ") || *l == "(none)")
                .filter_map(|l| l.strip_prefix("- "))
                .map(str::to_string)
                .collect();
        }
    }
    policies
}

/// "ignore messages from bob" / "ignore anything saying \"standup\"".
fn policy_ignores(policy: &str, user: &str, text: &str) -> bool {
    let lower = policy.to_lowercase();
    if !lower.contains("ignore") {
        return false;
    }
    if let Some(i) = lower.find(" from ") {
        let who: String = lower[i + 6..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        if !who.is_empty() && who == user.to_lowercase() {
            return true;
        }
    }
    let quoted: Vec<&str> = policy.split(['"', '“', '”']).skip(1).step_by(2).collect();
    quoted
        .iter()
        .any(|q| !q.is_empty() && text.to_lowercase().contains(&q.to_lowercase()))
}

fn worker_rules(req: &Request) -> Vec<(String, Value)> {
    let Some(msg) = last_user(req) else {
        return Vec::new();
    };
    let machine = req
        .messages
        .first()
        .and_then(|m| {
            m.text
                .lines()
                .find_map(|l| l.strip_prefix("Default machine: "))
        })
        .unwrap_or("")
        .to_string();
    let mut calls = Vec::new();
    if let Some(task) = msg
        .text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("Task: "))
    {
        // The whole task text may span lines (a program).
        let task_text = msg.text.split("\nDefault machine:").next().unwrap_or(task);
        let task_text = task_text.strip_prefix("Task: ").unwrap_or(task_text);
        calls.extend(plan(task_text, &machine));
        if calls.is_empty() {
            calls.push((
                "report".into(),
                json!({"status": "done", "text": format!("Nothing to run for: {task}")}),
            ));
        }
        return calls;
    }
    let events = elements(&msg.text, "event");
    let policies = current_policies(req);
    for e in &events {
        if let Some(trg) = e.attrs.get("trigger") {
            if policies
                .iter()
                .any(|p| policy_ignores(p, attr(e, "user"), &e.body))
            {
                // The owner said to ignore it: nothing to do.
                continue;
            }
            let p = plan(&e.body, &machine);
            if has_word(&e.body, CANCEL) || p.is_empty() {
                calls.push(("bounce".into(), json!({"trigger": trg})));
            } else {
                calls.extend(p);
            }
        } else if let Some(prog) = e.attrs.get("program") {
            let ok = attr(e, "state") == "done";
            calls.push((
                "report".into(),
                json!({"status": if ok {"done"} else {"failed"},
                       "text": format!("Program {prog} {}: {}", if ok {"finished"} else {"failed"}, e.body.trim())}),
            ));
        }
    }
    // A command still pending (its machine went offline) is waited for.
    if events.iter().any(is_command_end) && all_commands_done(req) {
        let mut lines = Vec::new();
        for e in finished_since_report(req) {
            let cmd = e.body.lines().next().unwrap_or("").trim_matches('`');
            let out = e
                .body
                .split_once("\nstdout: ")
                .map(|(_, rest)| rest.split("\nstderr:").next().unwrap_or(""))
                .unwrap_or("")
                .trim();
            let state = attr(&e, "state");
            let exit = attr(&e, "exit");
            lines.push(if state == "exited" && exit == "0" {
                format!("`{cmd}` on {}: {out}", attr(&e, "machine"))
            } else {
                // A failure says why: the server's or machine's reason,
                // then what the command wrote to stderr, then stdout.
                let err = e
                    .body
                    .split_once("\nstderr: ")
                    .map(|(_, rest)| rest.split("\nreason: ").next().unwrap_or(""))
                    .unwrap_or("")
                    .trim();
                let reason = e
                    .body
                    .split_once("\nreason: ")
                    .map(|(_, r)| r.trim())
                    .unwrap_or("");
                let why: Vec<&str> = [reason, err, out]
                    .into_iter()
                    .filter(|x| !x.is_empty())
                    .collect();
                let how = if exit == "-" {
                    state.to_string()
                } else {
                    format!("{state} (exit {exit})")
                };
                format!(
                    "`{cmd}` on {} {how}: {}",
                    attr(&e, "machine"),
                    if why.is_empty() {
                        "no output and no reason given".to_string()
                    } else {
                        why.join("; ")
                    }
                )
            });
        }
        // A pull request or issue the commands opened is followed: its
        // reviews and CI come straight to this worker.
        let mut watched = Vec::new();
        for e in finished_since_report(req) {
            for url in github_links(&e.body) {
                if !watched.contains(&url) {
                    calls.push(("watch".into(), json!({"thread": url})));
                    watched.push(url);
                }
            }
        }
        let failed = finished_since_report(req)
            .iter()
            .any(|e| attr(e, "state") != "exited");
        calls.push((
            "report".into(),
            json!({"status": if failed {"failed"} else {"done"}, "text": lines.join("\n")}),
        ));
    }
    calls
}

/// GitHub pull request and issue links in `text`.
fn github_links(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || "()<>\"'`".contains(c))
        .map(|w| w.trim_end_matches(['.', ',']))
        .filter(|w| crate::world::github_thread(w).is_some())
        .map(str::to_string)
        .collect()
}

/// What a worker does about a piece of text.
fn plan(text: &str, machine: &str) -> Vec<(String, Value)> {
    let target = machine_of(text).unwrap_or_else(|| machine.to_string());
    if let Some(code) = fenced_js(text) {
        return vec![("run_js".into(), json!({"code": code}))];
    }
    let cmds = backticked(text);
    let lower = text.to_lowercase();
    if lower.contains("in parallel") && cmds.len() >= 2 {
        let ask = lower
            .find("ask me before")
            .and_then(|i| backticked(&text[i..]).into_iter().next());
        let parallel: Vec<String> = cmds
            .iter()
            .filter(|c| Some(*c) != ask.as_ref())
            .cloned()
            .collect();
        return vec![(
            "run_js".into(),
            json!({"code": parallel_program(&parallel, ask.as_deref(), &target)}),
        )];
    }
    cmds.into_iter()
        .map(|c| {
            let mut a = json!({"command": c});
            if !target.is_empty() {
                a["machine"] = json!(target);
            }
            ("shell_start".to_string(), a)
        })
        .collect()
}

/// The program the "in parallel" rule writes: a subagent per command, then
/// (optionally) a human's approval before one more command.
pub fn parallel_program(cmds: &[String], ask: Option<&str>, machine: &str) -> String {
    let list = serde_json::to_string(cmds).unwrap_or_else(|_| "[]".into());
    let m = serde_json::to_string(machine).unwrap_or_else(|_| "\"\"".into());
    let mut s = format!(
        "const machine = {m};\n\
         const cmds = {list};\n\
         const results = await Promise.all(cmds.map(c =>\n  agents.spawn({{task: \"run `\" + c + \"`\", machine}})));\n\
         const out = {{}};\n\
         results.forEach((r, i) => {{ out[cmds[i]] = r.text; }});\n"
    );
    if let Some(a) = ask {
        let a = serde_json::to_string(a).unwrap_or_else(|_| "\"\"".into());
        s.push_str(&format!(
            "const next = {a};\n\
             const ok = await human.ask(\"May I run `\" + next + \"` on \" + machine + \"?\");\n\
             if (ok.approved) {{\n  const r = await tools.exec({{machine, command: next}});\n  out[next] = r.stdout.trim();\n}} else {{\n  out[next] = \"skipped: not approved\";\n}}\n"
        ));
    }
    s.push_str("out;\n");
    s
}

/// A command's end (not a note that it is still pending).
fn is_command_end(e: &El) -> bool {
    e.attrs.contains_key("command") && attr(e, "state") != "pending"
}

fn all_commands_done(req: &Request) -> bool {
    let mut started = 0usize;
    let mut finished = 0usize;
    for m in &req.messages {
        match m.role {
            Role::Tool if m.text.starts_with("started cmd_") => started += 1,
            Role::User => {
                finished += elements(&m.text, "event")
                    .iter()
                    .filter(|e| is_command_end(e))
                    .count()
            }
            _ => {}
        }
    }
    finished >= started
}

/// Command events since the worker's last report.
fn finished_since_report(req: &Request) -> Vec<El> {
    let mut out = Vec::new();
    for m in &req.messages {
        if m.role == Role::Assistant && m.tool_calls.iter().any(|c| c.name == "report") {
            out.clear();
        }
        if m.role == Role::User {
            out.extend(
                elements(&m.text, "event")
                    .into_iter()
                    .filter(is_command_end),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::Message;

    fn router_req(text: &str) -> Request {
        Request {
            system: crate::prompt::ROUTER_SYSTEM.into(),
            messages: vec![Message::user(text)],
            ..Default::default()
        }
    }

    #[test]
    fn addressed_request_becomes_a_task() {
        let s = Scripted::default();
        let (r, _) = s.respond(&router_req(
            "New events (1):\n<event trigger=trg_1 thread=thr_1 source=chat user=ada mention>please run `uname -s` on lap</event>\n",
        ));
        assert_eq!(r.tool_calls[0].name, "create_worker");
        assert_eq!(r.tool_calls[0].arguments["machine"], "lap");
        assert_eq!(r.tool_calls[0].arguments["threads"][0], "thr_1");
        assert_eq!(r.tool_calls[1].name, "reply");
    }

    #[test]
    fn batch_gives_one_decision_per_event() {
        let s = Scripted::default();
        let (r, _) = s.respond(&router_req(
            "<event trigger=trg_1 thread=thr_1 source=chat user=a>hello</event>\n<event trigger=trg_2 thread=thr_2 source=chat user=b>run `ls` on lap</event>\n",
        ));
        let names: Vec<&str> = r.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["ignore", "create_worker", "reply"]);
    }

    #[test]
    fn policies_ignore() {
        let s = Scripted::default();
        let (r, _) = s.respond(&router_req(
            "Policies now in force:\n- ignore messages from bob\n- ignore anything about \"standup\"\nNew events (2):\n<event trigger=trg_1 thread=thr_1 source=chat user=bob>run `ls` on lap</event>\n<event trigger=trg_2 thread=thr_2 source=chat user=ada>run the standup bot</event>\n",
        ));
        assert!(r.tool_calls.iter().all(|c| c.name == "ignore"), "{r:?}");
    }

    #[test]
    fn worker_plans() {
        let s = Scripted::default();
        let req = Request {
            system: crate::prompt::WORKER_SYSTEM.into(),
            messages: vec![Message::user(
                "Task: check `df -h /`, `uptime` and `uname -r` in parallel, then ask me before running `echo cleaned`\nDefault machine: lap\nYou are wrk_1.",
            )],
            ..Default::default()
        };
        let (r, _) = s.respond(&req);
        assert_eq!(r.tool_calls[0].name, "run_js");
        let code = r.tool_calls[0].arguments["code"].as_str().unwrap();
        assert!(code.contains("agents.spawn") && code.contains("human.ask"));
        assert!(code.contains("\"uname -r\"") && !code.contains("[\"echo cleaned\""));
    }

    #[test]
    fn a_pending_command_is_waited_for() {
        let s = Scripted::default();
        let mut req = Request {
            system: crate::prompt::WORKER_SYSTEM.into(),
            messages: vec![Message::user(
                "Task: run `sleep 9` on lap\nDefault machine: lap\nYou are wrk_1.",
            )],
            ..Default::default()
        };
        let (r, _) = s.respond(&req);
        assert_eq!(r.tool_calls[0].name, "shell_start");
        req.messages
            .push(Message::assistant("", r.tool_calls.clone()));
        req.messages.push(Message::tool_result(
            "call_1_0",
            "started cmd_1; its result arrives as an event",
        ));
        req.messages.push(Message::user(
            "<event command=cmd_1 machine=lap state=pending>`sleep 9`\nmachine lap is offline</event>",
        ));
        let (r, _) = s.respond(&req);
        assert!(r.tool_calls.is_empty(), "waits, does not report: {r:?}");
        req.messages
            .push(Message::assistant(r.text.clone(), vec![]));
        req.messages.push(Message::user(
            "<event command=cmd_1 machine=lap state=exited exit=0 ms=9000>`sleep 9`\nstdout: \nstderr: </event>",
        ));
        let (r, _) = s.respond(&req);
        assert_eq!(r.tool_calls[0].name, "report", "{r:?}");
    }

    #[test]
    fn prefix_cache_counts_reads() {
        let s = Scripted::default();
        let mut req = router_req("first");
        let (a, _) = s.respond(&req);
        assert_eq!(a.usage.cache_read_tokens, 0);
        req.messages.push(Message::assistant("", vec![]));
        req.messages.push(Message::user("second"));
        let (b, _) = s.respond(&req);
        assert!(b.usage.cache_read_tokens > 0);
        assert!(b.usage.cache_read_tokens < b.usage.input_tokens);
    }

    #[test]
    fn latency_model() {
        let l = Latency::parse("100ms,1ms,2ms").unwrap();
        let s = Scripted::new(l);
        let (r, d) = s.respond(&router_req("hi"));
        let expect = Duration::from_millis(
            100 + (r.usage.input_tokens - r.usage.cache_read_tokens) + 2 * r.usage.output_tokens,
        );
        assert_eq!(d, expect);
        assert!(Latency::parse("1s,2s,3s,4s").is_err());
    }

    #[test]
    fn github_links_are_found() {
        assert_eq!(
            github_links(
                "opened https://github.com/acme/app/pull/7. see (https://github.com/a/b/issues/3)"
            ),
            [
                "https://github.com/acme/app/pull/7",
                "https://github.com/a/b/issues/3"
            ]
        );
        assert!(
            github_links("https://github.com/acme/app/tree/main https://github.com/x").is_empty()
        );
    }

    #[test]
    fn backticks() {
        assert_eq!(backticked("a `x` b `y z` c"), ["x", "y z"]);
        assert_eq!(backticked("no ticks"), Vec::<String>::new());
        assert_eq!(machine_of("run `ls` on lap."), Some("lap".into()));
        let t = "run `ls` on any machine with label team=web.";
        assert_eq!(labels_of(t), Some(("team".into(), "web".into())));
        assert_eq!(machine_of(t), None);
    }
}
