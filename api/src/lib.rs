//! byom's admin API, an API boundary: the gRPC service generated from
//! `protocol/proto/admin.proto` ([`proto`], client and server stubs), the
//! client the CLI and integrations use ([`client`]: credentials discovery,
//! TLS with a personal admin certificate, connect), [`watch_to_end`], the
//! one way to follow a command until it ends, and [`until_answered`] with
//! [`new_key`]: creating calls that a server restart cannot make create
//! twice.
//!
//! It must never know the server's implementation: the server depends on
//! it for the service trait, never the other way round. Messages are
//! `byom_protocol::pb`.
//!
//! Key types: [`Client`], [`Creds`], [`ClientError`], [`watch::Seen`].

pub mod client;
pub mod retry;
pub mod watch;

/// Generated gRPC code (package `byom.admin.v1`), committed like the
/// protocol's messages (see `tests/tests/protos.rs`).
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!("gen/byom.admin.v1.rs");
}

pub use client::{connect, default_data_dir, load_creds, Client, ClientError, Creds};
pub use retry::{new_key, until_answered};
pub use watch::{
    exec, exec_stream, run_command, watch_to_end, Run, Seen, WatchError, WatchOptions,
};
