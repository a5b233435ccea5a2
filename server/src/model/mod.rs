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
mod scripted;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use anthropic::Anthropic;
pub use byom_agent::llm::{Request, Response, Role, ToolCall, Usage};
pub use openai::OpenAi;
pub use scripted::ScriptedModel;

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

/// Which models the agents use. Keys come from the environment only
/// (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`).
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// `scripted`, `openai:NAME` or `anthropic:NAME`, for both roles.
    pub model: String,
    pub router_model: Option<String>,
    pub worker_model: Option<String>,
    pub openai_base_url: String,
    pub anthropic_base_url: String,
    /// The scripted model's latency: BASE[,PER_NEW_INPUT_TOKEN,PER_OUTPUT_TOKEN].
    pub scripted_latency: String,
}

impl ModelOptions {
    /// The Router's model spec.
    pub fn router(&self) -> String {
        self.router_model
            .clone()
            .unwrap_or_else(|| self.model.clone())
    }
    /// The Workers' model spec.
    pub fn worker(&self) -> String {
        self.worker_model
            .clone()
            .unwrap_or_else(|| self.model.clone())
    }
}

/// A model spec for people: the scripted stand-in says what it is and
/// what it understands, so nobody mistakes it for a language model.
pub fn describe(spec: &str) -> String {
    if spec == "scripted" {
        format!("scripted: {}", byom_agent::scripted::ABOUT)
    } else {
        spec.to_string()
    }
}

/// A model from its name: `scripted`, `openai:NAME`, `anthropic:NAME`.
pub fn from_spec(spec: &str, a: &ModelOptions) -> anyhow::Result<std::sync::Arc<dyn Model>> {
    let (kind, name) = spec.split_once(':').unwrap_or((spec, ""));
    Ok(match kind {
        "scripted" => std::sync::Arc::new(ScriptedModel(byom_agent::scripted::Scripted::new(
            byom_agent::scripted::Latency::parse(&a.scripted_latency).map_err(anyhow::Error::msg)?,
        ))),
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
