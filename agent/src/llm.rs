//! The language-model vocabulary the agents speak, independent of any
//! provider: messages with tool calls, tools as JSON Schemas, requests,
//! responses and token usage (with the provider's prefix-cache reads).
//! Providers translate these to and from their wire formats in the server.

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
