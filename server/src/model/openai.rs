//! OpenAI-compatible Chat Completions (OpenAI, DeepSeek, vLLM, Ollama,
//! llama.cpp): `POST {base}/chat/completions`.

use std::time::Duration;

use serde_json::{json, Value};

use super::http::call_json;
use super::{Model, ModelError, Request, Response, Role, ToolCall, Usage};

pub struct OpenAi {
    /// e.g. `https://api.openai.com/v1`, `http://127.0.0.1:11434/v1`.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
}

impl OpenAi {
    fn body(&self, req: &Request) -> Value {
        let mut messages = Vec::new();
        if !req.system.is_empty() {
            messages.push(json!({"role": "system", "content": req.system}));
        }
        for m in &req.messages {
            messages.push(match m.role {
                Role::User => json!({"role": "user", "content": m.text}),
                Role::Tool => json!({"role": "tool", "tool_call_id": m.call_id, "content": m.text}),
                Role::Assistant => {
                    // Null content is only valid alongside tool calls.
                    let content = if m.text.is_empty() && !m.tool_calls.is_empty() { Value::Null } else { json!(m.text) };
                    let mut v = json!({"role": "assistant", "content": content});
                    if !m.tool_calls.is_empty() {
                        v["tool_calls"] = m
                            .tool_calls
                            .iter()
                            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
                            .collect();
                    }
                    v
                }
            });
        }
        let mut body = json!({"model": self.model, "messages": messages});
        if req.max_tokens > 0 {
            body["max_tokens"] = json!(req.max_tokens);
        }
        if !req.tools.is_empty() {
            body["tools"] = req
                .tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
        }
        body
    }
}

fn bad(msg: &str) -> ModelError {
    ModelError::Permanent(format!("malformed Chat Completions reply: {msg}"))
}

pub(crate) fn parse(v: &Value) -> Result<Response, ModelError> {
    let choice = v["choices"].get(0).ok_or_else(|| bad("no choices"))?;
    let msg = &choice["message"];
    let mut tool_calls = Vec::new();
    if let Some(calls) = msg["tool_calls"].as_array() {
        for c in calls {
            let args = c["function"]["arguments"].as_str().unwrap_or("{}");
            tool_calls.push(ToolCall {
                id: c["id"].as_str().unwrap_or_default().to_string(),
                name: c["function"]["name"]
                    .as_str()
                    .ok_or_else(|| bad("tool call without a name"))?
                    .to_string(),
                // A model may emit invalid JSON arguments: keep the raw text.
                arguments: serde_json::from_str(args).unwrap_or_else(|_| json!({"_raw": args})),
            });
        }
    }
    let u = &v["usage"];
    Ok(Response {
        text: msg["content"].as_str().unwrap_or_default().to_string(),
        tool_calls,
        usage: Usage {
            input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            // OpenAI: prompt_tokens_details.cached_tokens; DeepSeek: prompt_cache_hit_tokens.
            cache_read_tokens: u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .or_else(|| u["prompt_cache_hit_tokens"].as_u64())
                .unwrap_or(0),
        },
        stop_reason: choice["finish_reason"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        attempts: 1,
    })
}

#[async_trait::async_trait]
impl Model for OpenAi {
    async fn call(&self, req: &Request, timeout: Duration) -> Result<Response, ModelError> {
        let url = format!("{}/chat/completions", self.base_url.trim_end_matches('/'));
        let mut headers = Vec::new();
        if let Some(k) = &self.api_key {
            headers.push(("authorization", format!("Bearer {k}")));
        }
        parse(&call_json(&url, &headers, &self.body(req), timeout).await?)
    }

    fn name(&self) -> String {
        format!("openai:{}", self.model)
    }
}
