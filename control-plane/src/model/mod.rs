//! Language-model providers behind one interface, for the Router and the
//! Workers: messages with tool calls in, text and tool calls out, token
//! accounting (input, output, and cache-read input as the provider reports
//! it), and retries with backoff on 429/5xx/timeouts.
//!
//! Providers: OpenAI-compatible Chat Completions (OpenAI, DeepSeek, vLLM,
//! Ollama, llama.cpp) and Anthropic Messages. Each is tested against a real
//! HTTP server on loopback that speaks its API.

mod anthropic;
mod http;
mod openai;
pub mod scripted;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use anthropic::Anthropic;
pub use openai::OpenAi;
pub use scripted::{Latency, Scripted};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    /// A tool result, answering the assistant's tool call `call_id`.
    Tool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    #[serde(default)]
    pub text: String,
    /// Assistant messages: the tools it called.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Tool messages: which call this answers.
    #[serde(default)]
    pub call_id: String,
}

impl Message {
    pub fn user(text: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            text: text.into(),
            tool_calls: Vec::new(),
            call_id: String::new(),
        }
    }
    pub fn assistant(text: impl Into<String>, tool_calls: Vec<ToolCall>) -> Message {
        Message {
            role: Role::Assistant,
            text: text.into(),
            tool_calls,
            call_id: String::new(),
        }
    }
    pub fn tool_result(call_id: impl Into<String>, text: impl Into<String>) -> Message {
        Message {
            role: Role::Tool,
            text: text.into(),
            tool_calls: Vec::new(),
            call_id: call_id.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub system: String,
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub max_tokens: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's prefix cache.
    pub cache_read_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cache_read_tokens += o.cache_read_tokens;
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// Provider's reason for stopping ("stop", "tool_calls", "end_turn", …).
    pub stop_reason: String,
    /// Attempts it took (1 without retries).
    pub attempts: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Worth retrying: 429, 5xx, timeouts, connection failures.
    #[error("model provider temporarily failed: {0}")]
    Transient(String, Option<Duration>),
    /// Not worth retrying: bad request, authentication, malformed reply.
    #[error("model provider error: {0}")]
    Permanent(String),
    #[error("model provider still failing after {attempts} attempts: {last}")]
    GaveUp { attempts: u32, last: String },
}

/// Retries with exponential backoff (honouring `retry-after`), bounded.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            timeout: Duration::from_secs(120),
        }
    }
}

/// A model the agents can call.
#[async_trait::async_trait]
pub trait Model: Send + Sync {
    /// One attempt, no retries.
    async fn call(&self, req: &Request, timeout: Duration) -> Result<Response, ModelError>;
    fn name(&self) -> String;
}

/// Calls `model` with retries per `policy`.
pub async fn complete(
    model: &dyn Model,
    req: &Request,
    policy: &RetryPolicy,
) -> Result<Response, ModelError> {
    let mut last = String::new();
    for attempt in 1..=policy.max_attempts.max(1) {
        match model.call(req, policy.timeout).await {
            Ok(mut r) => {
                r.attempts = attempt;
                return Ok(r);
            }
            Err(ModelError::Transient(msg, retry_after)) => {
                tracing::warn!(model = %model.name(), attempt, "model call failed, will retry: {msg}");
                last = msg;
                if attempt < policy.max_attempts {
                    let backoff = policy
                        .base_delay
                        .saturating_mul(1 << (attempt - 1).min(16))
                        .min(policy.max_delay);
                    tokio::time::sleep(retry_after.unwrap_or(backoff).min(policy.max_delay)).await;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(ModelError::GaveUp {
        attempts: policy.max_attempts,
        last,
    })
}

/// A model from its name: `scripted`, `openai:NAME`, `anthropic:NAME`.
pub fn from_spec(
    spec: &str,
    a: &crate::cli::ModelArgs,
) -> anyhow::Result<std::sync::Arc<dyn Model>> {
    let (kind, name) = spec.split_once(':').unwrap_or((spec, ""));
    Ok(match kind {
        "scripted" => std::sync::Arc::new(Scripted::new(
            Latency::parse(&a.scripted_latency).map_err(anyhow::Error::msg)?,
        )),
        "openai" if !name.is_empty() => std::sync::Arc::new(OpenAi {
            base_url: a.openai_base_url.trim_end_matches('/').to_string(),
            model: name.to_string(),
            api_key: std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()),
        }),
        "anthropic" if !name.is_empty() => std::sync::Arc::new(Anthropic {
            base_url: a.anthropic_base_url.trim_end_matches('/').to_string(),
            model: name.to_string(),
            api_key: std::env::var("ANTHROPIC_API_KEY")
                .ok()
                .filter(|k| !k.is_empty())
                .ok_or_else(|| anyhow::anyhow!("anthropic:{name} needs ANTHROPIC_API_KEY in the environment"))?,
        }),
        _ => anyhow::bail!(
            "unknown model {spec:?}: use scripted, openai:NAME (with OPENAI_BASE_URL, OPENAI_API_KEY) or anthropic:NAME (with ANTHROPIC_API_KEY)"
        ),
    })
}
