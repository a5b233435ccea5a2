//! byom server: every I/O shell of the control plane. The QUIC gateway
//! for daemons ([`gateway`], with the TCP fallback), the admin gRPC service
//! ([`admin`]), webhooks and trigger ingest, the commands service (the only
//! writer of command state), the agents' driver around the deterministic
//! core of `byom-agent` with programs in the real interpreter, the model
//! providers, the PKI, and what replicas sharing a store tell each other
//! (`cluster`, `replicas`, the agents' lease).
//!
//! It never parses command lines (the `byom` binary does, and calls
//! [`run`]) and never knows how the daemon runs processes: it sends
//! ExecRequests and records what comes back. It keeps nothing in memory it
//! cannot rebuild from the store and from daemons reconnecting; tasks get
//! narrow handles (the store, [`live::LiveMachines`], [`commands::Commands`],
//! [`triggers::Triggers`], [`agents::AgentInbox`], the server identity, a
//! cancellation token), never one shared state.
//!
//! Its own health shows in [`metrics`] (counted as things happen) and
//! [`monitor`] (`/metrics`, `/healthz`, `/readyz`).
//!
//! Public: [`run`] with its options, [`ServerInfo`] (the `server.json` it
//! writes), [`MetricsListen`] (where `/metrics` is served),
//! [`migrate_store`] (`byom store migrate`), and [`SandboxPrograms`] for
//! running the agents' simulator with the real interpreter.

mod admin;
mod admins;
mod agents;
mod channels;
mod cluster;
mod commands;
mod console;
mod dist;
mod gate;
mod gateway;
mod http;
mod http_in;
mod idempotency;
mod identity;
mod live;
mod machines;
mod metrics;
mod migrate;
mod model;
mod monitor;
mod pki;
mod replicas;
mod startup;
mod tls;
mod triggers;
mod trust;
mod vault;
mod webhook;

pub use agents::programs::SandboxPrograms;
pub use commands::OutputKeep;
pub use console::Listen as ConsoleListen;
pub use migrate::{migrate as migrate_store, MigrateReport};
pub use monitor::Listen as MetricsListen;
pub use startup::{redact_url, run, ModelOptions, ServerInfo, ServerOptions};

/// Trigger ingest exactly as the server runs it, over a store the caller
/// opened: for the benchmarks, which measure it against raw store writes.
#[doc(hidden)]
pub struct BenchIngest(triggers::Triggers);

impl BenchIngest {
    pub fn new(store: byom_store::Store, sources_toml: &str) -> Result<BenchIngest, String> {
        let rules = byom_agent::fastpath::Rules::parse(sources_toml)?;
        let inbox = agents::AgentInbox::new(store.clone());
        Ok(BenchIngest(triggers::Triggers::new(store, rules, inbox)))
    }

    pub async fn ingest(
        &self,
        ev: byom_protocol::pb::SendEventRequest,
    ) -> Result<byom_protocol::pb::Trigger, byom_store::StoreError> {
        self.0.ingest(ev, None, None).await
    }
}
