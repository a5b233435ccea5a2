//! The byom control plane: `byom server` (QUIC gateway for daemons, admin
//! gRPC API, webhooks, store, PKI, the agents and their models) and the
//! `byom` command line that talks to it.
//!
//! It must never know how the daemon runs processes: it sends ExecRequests
//! and records what comes back. The server keeps nothing in memory it cannot
//! rebuild from the [`store::Store`] and from daemons reconnecting.
//!
//! Key types: [`server::Shared`] (state shared by all tasks),
//! [`store::Store`] over a [`store::Backend`], [`pki::Pki`],
//! [`gateway::LiveMachine`], the agents' [`agent::Core`] and its driver,
//! the [`model::Model`] providers, and the CLI in [`cli`].

pub mod agent;
pub mod api;
pub mod cli;
pub mod client;
pub mod demo;
pub mod gateway;
pub mod js;
pub mod model;
pub mod pki;
pub mod reconcile;
pub mod server;
pub mod store;
pub mod tls;
pub mod triggers;
pub mod webhook;

pub use byom_wire::hostname;
