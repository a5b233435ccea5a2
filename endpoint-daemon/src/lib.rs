//! byomd, the byom endpoint daemon: pairs a machine once with a one-time
//! token, then dials out to the server over mutual-TLS QUIC and runs the
//! commands it is sent, streaming their output back.
//!
//! It must never know about wasmtime, sled or models: it stays small. It
//! keeps only its identity on disk (key in the OS keyring or a 0600 file,
//! certificate, CA pin, server address); command state lives in memory,
//! bounded, so a restart forgets it and the server marks those commands lost.
//!
//! Key types: [`identity::Identity`], [`exec::Runner`] (runs and holds
//! commands), [`conn::run`] (the reconnecting client), [`pair::pair`],
//! [`upgrade`] (checked, tried, rolled-back upgrades from the server).

pub mod approvals;
pub mod audit;
pub mod conn;
pub mod display;
pub mod docs;
pub mod exec;
pub mod identity;
pub mod pair;
pub mod policy;
pub mod power;
pub mod sandbox;
pub mod secrets;
pub mod service;
pub mod shell;
pub mod tls;
pub mod unpair;
pub mod upgrade;

pub use byom_wire::{hostname, now_ms};

/// The kill switch file `byomd pause` creates and `byomd resume` removes.
pub fn paused_flag(config_dir: &std::path::Path) -> std::path::PathBuf {
    config_dir.join("paused")
}

/// Whether the owner paused byomd. A flag that cannot be looked at counts
/// as set: the kill switch fails closed.
pub fn is_paused(config_dir: &std::path::Path) -> bool {
    match std::fs::symlink_metadata(paused_flag(config_dir)) {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}
