//! Anthropic Messages: `POST {base}/v1/messages`.

use std::time::Duration;

use serde_json::{json, Value};

use super::http::call_json;
use super::{Model, ModelError, Request, Response, Role, ToolCall, Usage};

pub const API_VERSION: &str = "2023-06-01";

pub struct Anthropic {
    /// e.g. `https://api.anthropic.com`.
    pub base_url: String,
    pub model: String,
    pub api_key: String,
}

impl Anthropic {
    fn body(&self, req: &Request) -> Value {
        let mut messages: Vec<Value> = Vec::new();
        for m in &req.messages {
            let (role, content) = match m.role {
                Role::User => ("user", json!([{"type": "text", "text": m.text}])),
                // Tool results travel in a user turn.
                Role::Tool => (
                    "user",
                    json!([{"type": "tool_result", "tool_use_id": m.call_id, "content": m.text}]),
                ),
                Role::Assistant => {
                    let mut blocks = Vec::new();
                    if !m.text.is_empty() {
                        blocks.push(json!({"type": "text", "text": m.text}));
                    }
                    for c in &m.tool_calls {
                        blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}));
                    }
                    // The API refuses an empty assistant turn.
                    if blocks.is_empty() {
                        blocks.push(json!({"type": "text", "text": "(no reply)"}));
                    }
                    ("assistant", Value::Array(blocks))
                }
            };
            // Consecutive same-role turns merge (several tool results).
            match messages.last_mut() {
                Some(last) if last["role"] == role => {
                    if let (Some(a), Some(b)) = (last["content"].as_array_mut(), content.as_array())
                    {
                        a.extend(b.iter().cloned());
                    }
                }
                _ => messages.push(json!({"role": role, "content": content})),
            }
        }
        let mut body = json!({"model": self.model, "messages": messages, "max_tokens": if req.max_tokens > 0 { req.max_tokens } else { 4096 }});
        if !req.system.is_empty() {
            // Mark the stable prefix cacheable.
            body["system"] = json!([{"type": "text", "text": req.system, "cache_control": {"type": "ephemeral"}}]);
        }
        if !req.tools.is_empty() {
            body["tools"] = req.tools.iter().map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters})).collect();
        }
        body
    }
}

fn bad(msg: &str) -> ModelError {
    ModelError::Permanent(format!("malformed Messages reply: {msg}"))
}

pub(crate) fn parse(v: &Value) -> Result<Response, ModelError> {
    let blocks = v["content"].as_array().ok_or_else(|| bad("no content"))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => text.push_str(b["text"].as_str().unwrap_or_default()),
            Some("tool_use") => tool_calls.push(ToolCall {
                id: b["id"].as_str().unwrap_or_default().to_string(),
                name: b["name"]
                    .as_str()
                    .ok_or_else(|| bad("tool_use without a name"))?
                    .to_string(),
                arguments: b["input"].clone(),
            }),
            _ => {}
        }
    }
    let u = &v["usage"];
    Ok(Response {
        text,
        tool_calls,
        usage: Usage {
            input_tokens: u["input_tokens"].as_u64().unwrap_or(0)
                + u["cache_read_input_tokens"].as_u64().unwrap_or(0)
                + u["cache_creation_input_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
            cache_read_tokens: u["cache_read_input_tokens"].as_u64().unwrap_or(0),
        },
        stop_reason: v["stop_reason"].as_str().unwrap_or_default().to_string(),
        attempts: 1,
    })
}

#[async_trait::async_trait]
impl Model for Anthropic {
    async fn call(&self, req: &Request, timeout: Duration) -> Result<Response, ModelError> {
        let url = format!("{}/v1/messages", self.base_url.trim_end_matches('/'));
        let headers = vec![
            ("x-api-key", self.api_key.clone()),
            ("anthropic-version", API_VERSION.to_string()),
        ];
        parse(&call_json(&url, &headers, &self.body(req), timeout).await?)
    }

    fn name(&self) -> String {
        format!("anthropic:{}", self.model)
    }
}
