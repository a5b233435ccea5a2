//! byom's code interpreter: agent-written JavaScript runs in QuickJS
//! compiled to WebAssembly, inside wasmtime. A script has the language and
//! nothing else; each capability (run a command, spawn a subagent, ask a
//! human) is a host function the embedder registers, with its own schema and
//! policy. When a script awaits a durable capability the interpreter's whole
//! state becomes a [`Snapshot`] that a later process can resume.
//!
//! It must never know about agents, machines or the store: capabilities are
//! opaque async functions and snapshots are bytes.
//!
//! Key types: [`Engine`] (one per process: the compiled module), [`Interpreter`]
//! (one JS context), [`Limits`], [`Capability`], [`Outcome`], [`ErrorKind`],
//! [`Snapshot`].
//!
//! Concurrency: an `Interpreter` runs one eval at a time. `eval` and
//! `resume` take `&mut self`, so Rust refuses a second concurrent eval at
//! compile time; an embedder sharing one behind a lock queues evals.

mod capability;
mod engine;
mod host;
mod interp;
mod limits;
mod schema;
mod snapshot;

pub use capability::{Capability, CapabilityFn, PendingCall};
pub use engine::{Engine, MODULE_SHA256};
pub use interp::{Interpreter, Outcome, Template};
pub use limits::{ErrorKind, Limits};
pub use schema::{validate, SchemaError};
pub use snapshot::{Snapshot, SnapshotError, SNAPSHOT_VERSION};
