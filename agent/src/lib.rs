//! byom's super-agent core: the Router and the Workers as one deterministic
//! state machine ([`Core`]: an [`Event`] and a [`World`] in, [`Effect`]s
//! out), with everything it decides by: its records and their storage
//! layout, budgets, prompts, the language-model vocabulary, the scripted
//! stand-in model, the per-source fast path, and a simulator that replays a
//! day of chat in simulated time with crashes at every step.
//!
//! It must never know about I/O: no tokio, sled, tonic, quinn, hyper or
//! wasmtime, and no byom crate but `byom-protocol`. Time, IDs and stored
//! objects come from the [`World`]; programs run in whatever [`Programs`]
//! the caller provides; the server's driver is the shell that writes every
//! step to the store before acting on it. The Router has no execution
//! tools: the core dispatches only its own tool names for it.
//!
//! Key types: [`Core`], [`Event`], [`Effect`], [`World`], [`Budgets`],
//! [`llm::Request`]/[`llm::Response`], [`scripted::Scripted`],
//! [`fastpath::decide`], [`sim::run`], [`storage::keys`].

pub mod approval;
pub mod budgets;
pub mod core;
pub mod event;
pub mod fastpath;
pub mod flags;
pub mod llm;
pub mod programs;
pub mod prompt;
pub mod scripted;
pub mod sim;
pub mod state;
pub mod storage;
pub mod trust;
pub mod world;

/// Milliseconds since the Unix epoch (or since a simulation began).
pub type Ms = u64;

pub use budgets::Budgets;
pub use core::Core;
pub use event::{Effect, Event};
pub use programs::{ProgramStep, Programs};
pub use world::{TestWorld, World};
