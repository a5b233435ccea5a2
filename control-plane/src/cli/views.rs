//! The agents' and channels' messages as the CLI prints them with
//! `--json`: the shapes scripts read (RFC 3339 times under `*_at`, unset
//! values as null), kept byte-stable by `tests/tests/cli_json.rs`.

use byom_protocol::pb::{self, OutboxState};
use serde_json::{json, Map, Value};

use super::output::time;

fn opt_time(ms: Option<u64>) -> Value {
    ms.map(time).unwrap_or(Value::Null)
}

/// JSON a model or a person wrote, as it was (text if it is not JSON).
fn raw(text: &str) -> Value {
    if text.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

pub fn usage(u: Option<&pb::Usage>) -> Value {
    let d = pb::Usage::default();
    let u = u.unwrap_or(&d);
    json!({"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
           "cache_read_tokens": u.cache_read_tokens})
}

fn causes(c: &[pb::FlagCause]) -> Value {
    c.iter()
        .map(|c| json!({"object": c.object, "why": c.why}))
        .collect()
}

fn flags(f: Option<&pb::RuleOfTwo>) -> Value {
    let d = pb::RuleOfTwo::default();
    let f = f.unwrap_or(&d);
    json!({"untrusted": causes(&f.untrusted), "sensitive": causes(&f.sensitive),
           "acts": causes(&f.acts)})
}

pub fn summary(w: &pb::WorkerSummary) -> Value {
    json!({
        "id": w.id, "parent": w.parent, "status": w.status, "task": w.task,
        "threads": w.threads, "machine": w.machine, "created_at": time(w.created_at_ms),
        "updated_at": time(w.updated_at_ms), "commands": w.commands,
        "running_commands": w.running_commands, "program": w.program,
        "model_calls": w.model_calls, "usage": usage(w.usage.as_ref()),
        "last_report": w.last_report, "rule_of_two": w.rule_of_two,
        "containment": w.containment,
    })
}

pub fn summaries(ws: &[pb::WorkerSummary]) -> Value {
    ws.iter().map(summary).collect()
}

fn message(m: &pb::TranscriptMessage) -> Value {
    let calls: Vec<Value> = m
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": raw(&c.arguments_json)}))
        .collect();
    json!({"role": m.role, "text": m.text, "tool_calls": calls, "call_id": m.call_id})
}

fn command(c: &pb::WorkerCommand) -> Value {
    let mut v = json!({
        "command": c.command, "machine": c.machine, "timeout_ms": c.timeout_ms,
        "js_call": match (c.js_run, c.js_call) {
            (Some(run), Some(call)) => json!([run, call]),
            _ => Value::Null,
        },
        "done": c.done,
    });
    if let Some(h) = &c.held {
        v["held"] = json!(h);
    }
    if let Some(a) = &c.approval {
        v["approval"] = json!(a);
    }
    if !c.approved_by.is_empty() {
        v["approved_by"] = json!(c.approved_by);
    }
    v
}

fn program(j: &pb::ProgramRun) -> Value {
    let calls: Map<String, Value> = j
        .calls
        .iter()
        .map(|(n, what)| (n.to_string(), json!(what)))
        .collect();
    json!({"run": j.run, "code": j.code, "started_at": time(j.started_at_ms),
           "snapshot": j.snapshot, "step": j.step, "ready": j.results_waiting,
           "calls": calls, "spawned": j.spawned})
}

/// A worker's record: what `byom show wrk_…` prints (its transcript by
/// the stored numbers of its messages).
pub fn worker_record(w: &pb::Worker) -> Value {
    let d = pb::WorkerSummary::default();
    let s = w.summary.as_ref().unwrap_or(&d);
    let commands: Map<String, Value> = w
        .commands
        .iter()
        .map(|c| (c.handle.clone(), command(c)))
        .collect();
    json!({
        "id": s.id, "parent": s.parent, "depth": w.depth, "task": s.task,
        "threads": s.threads, "machine": s.machine, "labels": w.labels, "status": s.status,
        "conversation": {"seqs": w.transcript_seqs, "next": w.transcript_next},
        "inbox": w.inbox, "in_flight": w.in_flight, "turn": w.turn, "steps": w.steps,
        "failures": w.failures, "retry_at": opt_time(w.retry_at_ms), "commands": commands,
        "js": w.program.as_ref().map(program), "js_runs": w.program_runs,
        "last_report": s.last_report, "created_at": time(s.created_at_ms),
        "updated_at": time(s.updated_at_ms), "usage": usage(s.usage.as_ref()),
        "dropped_turns": w.dropped_turns, "policies_shown": w.policies_shown,
        "flags": flags(w.flags.as_ref()), "own_threads": w.own_threads,
    })
}

/// A worker whole (`byom workers show`): its record with the transcript,
/// a summary, the model and its subagents.
pub fn worker(w: &pb::Worker) -> Value {
    let mut v = worker_record(w);
    v["conversation"] = w.transcript.iter().map(message).collect();
    v["summary"] = w.summary.as_ref().map(summary).unwrap_or(Value::Null);
    v["model"] = json!(w.model);
    v["children"] = summaries(&w.children);
    v
}

pub fn approval(a: &pb::Approval) -> Value {
    let mut v = json!({
        "id": a.id, "worker": a.worker, "thread": a.thread, "question": a.question,
        "run": a.run, "call": a.call, "state": a.state, "answer": raw(&a.answer_json),
        "by": a.by, "created_at": time(a.created_at_ms), "answered_at": time(a.answered_at_ms),
        "kind": a.kind, "machine": a.machine, "flags": flags(a.flags.as_ref()),
        "approvers": a.approvers, "expires_ms": a.expires_at_ms,
    });
    for (k, s) in [
        ("cmd", &a.cmd),
        ("code", &a.code),
        ("action", &a.action),
        ("digest", &a.digest),
    ] {
        if !s.is_empty() {
            v[k] = json!(s);
        }
    }
    if !a.refused.is_empty() {
        v["refused"] = json!(a.refused);
    }
    if let Some(r) = &a.reply {
        let mut reply = json!({"id": r.id, "thread": r.thread, "source": r.source, "text": r.text});
        if let Some(u) = &r.untrusted {
            reply["untrusted"] = json!(u);
        }
        v["reply"] = reply;
    }
    v
}

pub fn snapshot(s: &pb::Snapshot) -> Value {
    json!({"id": s.id, "bytes": s.bytes, "paused_program_of": s.paused_program_of,
           "what": "a paused interpreter's memory (signed, compressed)"})
}

pub fn threads(t: &pb::ThreadList) -> Value {
    t.threads
        .iter()
        .map(|t| {
            json!({"id": t.id, "source": t.source, "external": t.external, "kind": t.kind,
                   "created_at": time(t.created_at_ms),
                   "last_trigger_at": time(t.last_trigger_at_ms), "workers": t.workers})
        })
        .collect()
}

pub fn thread(t: &pb::ThreadView) -> Value {
    let msgs: Vec<Value> = t
        .messages
        .iter()
        .map(|x| {
            json!({"id": x.id, "user": x.user, "text": x.text, "from_bot": x.from_bot,
                   "created_at": time(x.created_at_ms), "decision": x.decision})
        })
        .collect();
    json!({"id": t.id, "source": t.source, "external": t.external, "messages": msgs,
           "workers": summaries(&t.workers)})
}

pub fn router(r: &pb::RouterView) -> Value {
    let d = pb::RouterStats::default();
    let s = r.stats.as_ref().unwrap_or(&d);
    let subs: Map<String, Value> = r
        .subscriptions
        .iter()
        .map(|(t, w)| (t.clone(), json!(w.items)))
        .collect();
    json!({
        "model": r.model,
        "stats": {"turns": s.turns, "model_calls": s.model_calls, "events": s.events,
                  "decisions": s.decisions, "passed_through": s.passed_through,
                  "replies": s.replies, "dropped": s.dropped, "usage": usage(s.usage.as_ref())},
        "queued": r.queued, "in_flight": r.in_flight,
        "conversation_messages": r.conversation_messages, "dropped_turns": r.dropped_turns,
        "subscriptions": subs,
    })
}

pub fn trust(t: &pb::TrustConfig) -> Value {
    let approvers: Vec<Value> = t
        .approvers
        .iter()
        .map(|a| match &a.label {
            Some(l) => json!({"principal": a.principal, "label": l}),
            None => json!({"principal": a.principal}),
        })
        .collect();
    json!({"trusted": t.trusted, "github_associations": t.github_associations,
           "slack_members": t.slack_members, "matrix_homeservers": t.matrix_homeservers,
           "approvers": approvers})
}

/// A trust configuration from its JSON (a file the admin edited, or
/// `byom trust ls --json` changed by the CLI).
pub fn trust_from(v: &Value) -> anyhow::Result<pb::TrustConfig> {
    let strs = |k: &str| -> anyhow::Result<Vec<String>> {
        match &v[k] {
            Value::Null => Ok(Vec::new()),
            Value::Array(a) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| anyhow::anyhow!("{k}: a list of strings"))
                })
                .collect(),
            _ => anyhow::bail!("{k}: a list of strings"),
        }
    };
    let obj = v
        .as_object()
        .ok_or_else(|| anyhow::anyhow!("not a trust configuration: a JSON object"))?;
    const KEYS: [&str; 5] = [
        "trusted",
        "github_associations",
        "slack_members",
        "matrix_homeservers",
        "approvers",
    ];
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        anyhow::bail!(
            "not a trust configuration: unknown field {k:?} (expected {})",
            KEYS.join(", ")
        );
    }
    let approvers = match &v["approvers"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                let principal = x["principal"]
                    .as_str()
                    .ok_or_else(|| anyhow::anyhow!("approvers: each needs a principal"))?;
                Ok(pb::Approver {
                    principal: principal.to_string(),
                    label: x["label"].as_str().map(str::to_string),
                })
            })
            .collect::<anyhow::Result<_>>()?,
        _ => anyhow::bail!("approvers: a list of {{\"principal\", \"label\"}}"),
    };
    Ok(pb::TrustConfig {
        trusted: strs("trusted")?,
        github_associations: strs("github_associations")?,
        slack_members: match &v["slack_members"] {
            Value::Null => false,
            Value::Bool(b) => *b,
            _ => anyhow::bail!("slack_members: true or false"),
        },
        matrix_homeservers: strs("matrix_homeservers")?,
        approvers,
    })
}

pub fn verdict(v: &pb::TrustVerdict) -> Value {
    json!({"principal": v.principal, "trusted": v.trusted, "why": v.why,
           "may_approve": v.may_approve})
}

/// An admin as `byom admins ls` lists them (`revoked` and `you` added).
pub fn admin_row(a: &pb::AdminView) -> Value {
    let mut v = admin(a);
    v["revoked"] = json!(a.revoked_at_ms.is_some());
    v["you"] = json!(a.you);
    v
}

pub fn admin(a: &pb::AdminView) -> Value {
    json!({"name": a.name, "spki_sha256": a.spki_sha256, "created_at": time(a.created_at_ms),
           "created_by": a.created_by, "revoked_at": opt_time(a.revoked_at_ms),
           "revoked_by": a.revoked_by})
}

pub fn fate(f: &pb::Fate) -> Value {
    json!({"trigger": f.trigger, "fate": f.fate})
}

pub fn connector(c: &pb::ConnectorView) -> Value {
    let mut v = json!({
        "name": c.name, "kind": c.kind, "api_url": c.api_url, "user_id": c.user_id,
        "rooms": c.rooms, "bot_login": c.bot_login, "app_id": c.app_id,
        "post_to": c.post_to, "invite_from": c.invite_from,
        "has_token": c.has_token, "has_secret": c.has_secret,
        "has_private_key": c.has_private_key, "webhook_path": c.webhook_path,
        "outbox_pending": c.outbox_pending, "interactive_path": c.interactive_path,
        "created_at": time(c.created_at_ms),
    });
    for (k, x) in [
        ("webhook_url", &c.webhook_url),
        ("interactive_url", &c.interactive_url),
        ("webhook_note", &c.webhook_note),
        ("note", &c.note),
    ] {
        if let Some(x) = x {
            v[k] = json!(x);
        }
    }
    if c.removed {
        v["removed"] = json!(true);
    }
    v
}

pub fn connector_test(t: &pb::ConnectorTest) -> Value {
    if t.ok {
        json!({"name": t.name, "ok": true, "identity": t.identity})
    } else {
        json!({"name": t.name, "ok": false, "error": t.error})
    }
}

pub fn outbox(it: &pb::OutboxItem) -> Value {
    json!({
        "id": it.id, "connector": it.connector, "kind": it.kind, "thread": it.thread_id,
        "external": it.external, "reply": it.reply_id,
        "state": match it.state() {
            OutboxState::OutboxPending => "pending",
            OutboxState::OutboxSent => "sent",
            OutboxState::OutboxFailed => "failed",
            OutboxState::Unspecified => "unknown",
        },
        "attempts": it.attempts, "last_error": it.last_error, "receipt": it.receipt,
        "maybe_duplicate": it.maybe_duplicate, "created_at": time(it.created_at_ms),
        "next_attempt_at": if it.state() == OutboxState::OutboxPending { time(it.next_attempt_ms) } else { Value::Null },
        "sent_at": time(it.sent_at_ms), "text": it.text,
    })
}

pub fn sources(s: &pb::Sources) -> Value {
    json!({"rules": s.rules, "last_refused_edit": s.last_refused_edit})
}

pub fn sources_check(s: &pb::SourcesCheck) -> Value {
    if s.ok {
        json!({"ok": true})
    } else {
        json!({"ok": false, "error": s.error})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_and_unset_is_null() {
        let a = pb::AdminView {
            name: "ada".into(),
            created_at_ms: 1_796_107_970_123,
            ..Default::default()
        };
        let v = admin_row(&a);
        assert_eq!(v["created_at"], "2026-12-01T06:52:50.123Z");
        assert_eq!(v["revoked_at"], Value::Null);
        assert_eq!(v["revoked"], false);
        let p = pb::ProgramRun {
            started_at_ms: 1000,
            ..Default::default()
        };
        assert_eq!(program(&p)["started_at"], "1970-01-01T00:00:01.000Z");
    }

    #[test]
    fn free_form_json_comes_back_as_written() {
        let a = pb::Approval {
            answer_json: r#"{"ship": [1, "it"]}"#.into(),
            ..Default::default()
        };
        assert_eq!(approval(&a)["answer"], json!({"ship": [1, "it"]}));
        let none = pb::Approval::default();
        assert_eq!(approval(&none)["answer"], Value::Null);
        assert!(
            approval(&none).get("cmd").is_none(),
            "empty fields are left out"
        );
    }

    #[test]
    fn a_trust_file_with_an_unknown_field_is_refused() {
        let ok = json!({"trusted": ["admin:*"], "approvers": [{"principal": "admin:*"}]});
        let t = trust_from(&ok).unwrap();
        assert_eq!(trust(&t)["approvers"][0]["principal"], "admin:*");
        assert!(trust_from(&json!({"trusted": ["x"], "approver": []})).is_err());
        assert!(trust_from(&json!({"trusted": "x"})).is_err());
        assert!(trust_from(&json!([])).is_err());
    }
}
