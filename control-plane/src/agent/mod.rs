//! The super-agent: a Router that talks to people and hands out work, and
//! Workers that do it on paired machines and in the code interpreter.
//!
//! [`core`] is a deterministic state machine with no I/O and no clock: it
//! takes an [`core::Event`] and a [`core::World`] (time, IDs, policies,
//! object lookup) and returns [`core::Effect`]s. [`driver`] is the thin shell
//! that feeds it from the store, runs its effects (model calls, commands,
//! interpreter runs) and writes every state change to the store before acting
//! on it. [`sim`] runs the same core in simulated time with the scripted
//! model, so a day of events replays in milliseconds.
//!
//! The Router has no execution tools: [`core`] dispatches only its own tool
//! names for it, so no prompt can make it run anything.

pub mod core;
pub mod driver;
pub mod prompt;
pub mod query;
pub mod sim;

pub use self::core::{Budgets, Core, Effect, Event, World};
