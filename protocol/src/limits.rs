//! Every bound in byom that both peers must agree on, by name. Crossing one
//! is a clear error, never a crash or a silent loss.

use std::time::Duration;

/// Largest encoded frame (after the 4-byte length prefix) either peer accepts.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// Largest `Output.data` the daemon sends in one frame.
pub const MAX_OUTPUT_CHUNK_BYTES: usize = 64 * 1024;
/// Output of one stream a daemon sends past what the server acknowledged:
/// a full window stops reading the command's pipe (the command waits).
pub const OUTPUT_WINDOW_BYTES: usize = 4 * 1024 * 1024;
/// The server acknowledges output at least every this many bytes (well
/// inside the window, so the daemon never waits on an ack not coming).
pub const OUTPUT_ACK_BYTES: u64 = 1024 * 1024;
/// What `byom exec --json` collects of each stream for its one object
/// (streaming, `--json --follow` or without `--json`, has no limit).
pub const MAX_COMMAND_OUTPUT_BYTES: u64 = 8 * 1024 * 1024;
/// Largest stdin carried inside a command's request (and record): more
/// comes as a stream (`Exec`), any length.
pub const MAX_STDIN_BYTES: usize = 512 * 1024;
/// Largest argv or shell string, in bytes, all arguments together.
pub const MAX_COMMAND_LINE_BYTES: usize = 128 * 1024;
/// Most environment variables a command may set.
pub const MAX_ENV_VARS: usize = 256;
/// Largest environment a command may set, names and values together.
pub const MAX_ENV_BYTES: usize = 128 * 1024;
/// Longest working directory.
pub const MAX_CWD_BYTES: usize = 4096;
/// Most labels per machine or token.
pub const MAX_LABELS: usize = 32;
/// Longest label key or value, and longest machine or token name.
pub const MAX_NAME_LEN: usize = 63;
/// Most command IDs a Hello may list (running + held).
pub const MAX_HELLO_COMMAND_IDS: usize = 4096;
/// Longest CSR or certificate PEM accepted.
pub const MAX_PEM_BYTES: usize = 16 * 1024;

/// Default queue TTL for commands waiting for an offline machine.
pub const DEFAULT_QUEUE_TTL: Duration = Duration::from_secs(24 * 3600);
/// Longest queue TTL a caller may ask for.
pub const MAX_QUEUE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a creating call's idempotency key is remembered: longer than
/// any command may wait in the queue, so a retry never creates twice.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(8 * 24 * 3600);
/// Longest idempotency key (printable ASCII).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;
/// Most commands waiting in the queue of one machine.
pub const MAX_QUEUED_PER_MACHINE: usize = 10_000;
/// Longest command timeout.
pub const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Default lifetime of a pairing token.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(15 * 60);
/// Longest lifetime of a pairing token.
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Default lifetime of a machine certificate.
pub const DEFAULT_CERT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long after expiry a known machine may still present its certificate
/// to renew it with the same key (no re-pairing cliff after a long trip).
pub const CERT_EXPIRED_GRACE: Duration = Duration::from_secs(90 * 24 * 3600);

/// Application heartbeat period; the peer is dead after
/// [`HEARTBEAT_MISSES`] periods without a frame.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// Missed heartbeats before a connection is declared dead.
pub const HEARTBEAT_MISSES: u32 = 3;
/// QUIC idle timeout: a backstop behind the heartbeat.
pub const QUIC_IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// QUIC keep-alive period.
pub const QUIC_KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Reconnect backoff: first delay, cap (jitter is added on top).
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest delay between reconnect attempts.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Commands one daemon runs at once.
pub const MAX_CONCURRENT_COMMANDS: usize = 64;
/// Finished results a daemon holds for delivery after a reconnect.
pub const MAX_HELD_RESULTS: usize = 1024;
/// Bytes of output a daemon holds across all commands.
pub const MAX_HELD_OUTPUT_BYTES: u64 = 256 * 1024 * 1024;
/// Command IDs a daemon process remembers to refuse running one twice.
pub const MAX_SEEN_COMMAND_IDS: usize = 65_536;
/// QUIC streams a peer may open concurrently.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
