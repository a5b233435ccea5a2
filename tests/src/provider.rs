//! A language-model provider on loopback speaking the OpenAI Chat
//! Completions or the Anthropic Messages API, answering with the scripted
//! rules (optionally tampered with, to play a compromised model).

use byom_agent::llm::{Request, Response};
use serde_json::Value;

/// A provider endpoint on loopback speaking the OpenAI Chat Completions or
/// the Anthropic Messages API. Its answers come from the scripted rules, so
/// the test is deterministic, but every byte crosses the real provider
/// path: `--model openai:NAME` / `anthropic:NAME`, base URL and key from
/// the environment, the JSON wire format both ways, usage with cache reads.
pub struct FakeProvider {
    pub addr: std::net::SocketAddr,
    pub calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub auth_ok: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Clone, Copy, PartialEq)]
pub enum Api {
    OpenAi,
    Anthropic,
}

fn openai_to_request(body: &Value) -> byom_agent::llm::Request {
    use byom_agent::llm::{Message, Request, ToolCall};
    let mut req = Request::default();
    for m in body["messages"].as_array().cloned().unwrap_or_default() {
        let text = m["content"].as_str().unwrap_or("").to_string();
        match m["role"].as_str().unwrap_or("") {
            "system" => req.system = text,
            "user" => req.messages.push(Message::user(text)),
            "tool" => req.messages.push(Message::tool_result(
                m["tool_call_id"].as_str().unwrap_or(""),
                text,
            )),
            _ => {
                let calls = m["tool_calls"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| ToolCall {
                        id: c["id"].as_str().unwrap_or("").into(),
                        name: c["function"]["name"].as_str().unwrap_or("").into(),
                        arguments: serde_json::from_str(
                            c["function"]["arguments"].as_str().unwrap_or("{}"),
                        )
                        .unwrap_or(Value::Null),
                    })
                    .collect();
                req.messages.push(Message::assistant(text, calls));
            }
        }
    }
    req
}

fn anthropic_to_request(body: &Value) -> byom_agent::llm::Request {
    use byom_agent::llm::{Message, Request, ToolCall};
    let mut req = Request {
        system: body["system"][0]["text"].as_str().unwrap_or("").to_string(),
        ..Default::default()
    };
    for m in body["messages"].as_array().cloned().unwrap_or_default() {
        let blocks = m["content"].as_array().cloned().unwrap_or_default();
        if m["role"] == "assistant" {
            let text: String = blocks
                .iter()
                .filter(|b| b["type"] == "text")
                .filter_map(|b| b["text"].as_str())
                .collect();
            let calls = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| ToolCall {
                    id: b["id"].as_str().unwrap_or("").into(),
                    name: b["name"].as_str().unwrap_or("").into(),
                    arguments: b["input"].clone(),
                })
                .collect();
            req.messages.push(Message::assistant(text, calls));
            continue;
        }
        // A user turn may carry tool results and text, in that order.
        for b in blocks {
            if b["type"] == "tool_result" {
                req.messages.push(Message::tool_result(
                    b["tool_use_id"].as_str().unwrap_or(""),
                    b["content"].as_str().unwrap_or(""),
                ));
            } else {
                req.messages
                    .push(Message::user(b["text"].as_str().unwrap_or("")));
            }
        }
    }
    req
}

fn reply_body(api: Api, resp: &byom_agent::llm::Response) -> String {
    let u = &resp.usage;
    match api {
        Api::OpenAi => {
            let calls: Vec<Value> = resp
                .tool_calls
                .iter()
                .map(|c| serde_json::json!({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
                .collect();
            let mut msg = serde_json::json!({"role": "assistant", "content": resp.text});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            serde_json::json!({
                "id": "chatcmpl-1", "object": "chat.completion",
                "choices": [{"index": 0, "message": msg,
                             "finish_reason": if resp.tool_calls.is_empty() {"stop"} else {"tool_calls"}}],
                "usage": {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
                          "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens}}
            })
        }
        Api::Anthropic => {
            let mut content = Vec::new();
            if !resp.text.is_empty() {
                content.push(serde_json::json!({"type": "text", "text": resp.text}));
            }
            for c in &resp.tool_calls {
                content.push(serde_json::json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}));
            }
            serde_json::json!({
                "id": "msg_1", "type": "message", "role": "assistant", "content": content,
                "stop_reason": if resp.tool_calls.is_empty() {"end_turn"} else {"tool_use"},
                "usage": {"input_tokens": u.input_tokens - u.cache_read_tokens,
                          "cache_read_input_tokens": u.cache_read_tokens,
                          "output_tokens": u.output_tokens}
            })
        }
    }
    .to_string()
}

impl FakeProvider {
    pub fn start(api: Api) -> FakeProvider {
        FakeProvider::start_with(api, |_, resp| resp)
    }

    /// A provider whose answers are the scripted model's, passed through
    /// `tamper` first: a compromised or prompt-injected model.
    pub fn start_with(
        api: Api,
        tamper: impl Fn(&Request, Response) -> Response + Send + 'static,
    ) -> FakeProvider {
        use std::io::{BufRead, BufReader, Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let auth_ok = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (c2, a2) = (calls.clone(), auth_ok.clone());
        std::thread::spawn(move || {
            let model = byom_agent::scripted::Scripted::default();
            for conn in l.incoming() {
                let Ok(conn) = conn else { return };
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut len = 0usize;
                let mut auth = false;
                let mut first = String::new();
                let _ = r.read_line(&mut first);
                let mut line = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    let l = line.to_ascii_lowercase();
                    if let Some(v) = l.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    if l.starts_with("authorization: bearer sk-test")
                        || l.starts_with("x-api-key: sk-ant-test")
                    {
                        auth = true;
                    }
                }
                let mut body = vec![0u8; len];
                if r.read_exact(&mut body).is_err() {
                    continue;
                }
                let path_ok = match api {
                    Api::OpenAi => first.starts_with("POST /v1/chat/completions "),
                    Api::Anthropic => first.starts_with("POST /v1/messages "),
                };
                if !auth || !path_ok {
                    a2.store(false, std::sync::atomic::Ordering::SeqCst);
                }
                c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let req = match api {
                    Api::OpenAi => openai_to_request(&v),
                    Api::Anthropic => anthropic_to_request(&v),
                };
                let (resp, _) = model.respond(&req);
                let resp = tamper(&req, resp);
                let out = reply_body(api, &resp);
                let mut w = conn;
                let _ = write!(
                    w,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
                    out.len()
                );
            }
        });
        FakeProvider {
            addr,
            calls,
            auth_ok,
        }
    }
}
