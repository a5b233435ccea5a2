//! What a script may call: capabilities (a namespace, a name, an argument
//! schema, bounds, and either a handler or a durable pause) and the calls
//! a paused script waits on.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;

/// A host function: JSON in, JSON out; an `Err` reaches JS as a catchable
/// Error with that message, so keep it safe to show.
pub type CapabilityFn =
    Arc<dyn Fn(Value) -> BoxFuture<'static, Result<Value, String>> + Send + Sync>;

/// A function scripts can call as `await namespace.name(args)`.
#[derive(Clone)]
pub struct Capability {
    pub namespace: String,
    pub name: String,
    /// JSON Schema (subset, see [`crate::validate`]) for the argument.
    pub schema: Value,
    /// Calls running at once; more wait their turn (throttled, not refused).
    pub max_concurrent: usize,
    /// Calls per eval (resumes included); one more ends the eval with
    /// `CapabilityLimit`.
    pub max_calls: usize,
    /// A call pauses the interpreter durably; the embedder settles it later
    /// with [`Interpreter::resume`]. Durable capabilities have no handler.
    pub durable: bool,
    pub handler: Option<CapabilityFn>,
}

impl Capability {
    pub fn new(namespace: &str, name: &str, handler: CapabilityFn) -> Self {
        Capability {
            namespace: namespace.into(),
            name: name.into(),
            schema: Value::Bool(true),
            max_concurrent: 8,
            max_calls: 1000,
            durable: false,
            handler: Some(handler),
        }
    }

    pub fn durable(namespace: &str, name: &str) -> Self {
        Capability {
            namespace: namespace.into(),
            name: name.into(),
            schema: Value::Bool(true),
            max_concurrent: 1024,
            max_calls: 100,
            durable: true,
            handler: None,
        }
    }

    pub fn with_schema(mut self, schema: Value) -> Self {
        self.schema = schema;
        self
    }

    pub fn with_policy(mut self, max_concurrent: usize, max_calls: usize) -> Self {
        self.max_concurrent = max_concurrent.max(1);
        self.max_calls = max_calls;
        self
    }

    pub fn full_name(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }
}

/// A durable call waiting for its answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PendingCall {
    pub id: u32,
    pub capability: String,
    pub args: Value,
}
