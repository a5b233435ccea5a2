//! The interpreter's limits and the kinds of error crossing one gives:
//! each limit has its own kind, so an embedder can tell a runaway loop
//! (`OutOfFuel`) from a slow host (`Timeout`) from a hostile allocation
//! (`OutOfMemory`).

use std::time::Duration;

/// Largest linear memory any interpreter may have (its `Limits` pick less).
pub(crate) const MAX_MEMORY_BYTES: usize = 512 << 20;

/// Every limit of an interpreter, each with its own [`ErrorKind`].
#[derive(Debug, Clone)]
pub struct Limits {
    /// JS heap (QuickJS's allocator limit); linear memory may be a few MiB
    /// more for the stack and static data. → `OutOfMemory`
    pub memory_bytes: usize,
    /// wasmtime fuel per eval (roughly one unit per wasm instruction). → `OutOfFuel`
    pub cpu_fuel: u64,
    /// Wall clock per eval or resume, including time waiting on host calls. → `Timeout`
    pub wall_clock: Duration,
    /// console output per eval. → `OutputLimit`
    pub max_output_bytes: usize,
    /// JSON of the final value. → `ResultLimit`
    pub max_result_bytes: usize,
    /// QuickJS's own stack limit (inactive under WASI: deep recursion
    /// traps on wasmtime's native stack limit first). → `StackOverflow`
    pub js_stack_bytes: usize,
    /// Capability calls waiting at once, all capabilities together. → `CapabilityLimit`
    pub max_pending_calls: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            cpu_fuel: 10_000_000_000,
            wall_clock: Duration::from_secs(5),
            max_output_bytes: 1 << 20,
            max_result_bytes: 1 << 20,
            js_stack_bytes: 256 << 10,
            max_pending_calls: 1024,
        }
    }
}

/// Extra linear memory beyond the JS heap: the 4 MiB guest stack and the
/// module's static data.
pub(crate) const MEMORY_OVERHEAD: usize = 8 << 20;
/// Guest stack the module was linked with (`-z stack-size`).
pub(crate) const GUEST_STACK: u32 = 4 << 20;

/// Why an eval failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ErrorKind {
    Timeout,
    OutOfMemory,
    OutOfFuel,
    StackOverflow,
    OutputLimit,
    ResultLimit,
    SyntaxError,
    Exception,
    CapabilityLimit,
    BadSnapshot,
    Internal,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "Timeout",
            ErrorKind::OutOfMemory => "OutOfMemory",
            ErrorKind::OutOfFuel => "OutOfFuel",
            ErrorKind::StackOverflow => "StackOverflow",
            ErrorKind::OutputLimit => "OutputLimit",
            ErrorKind::ResultLimit => "ResultLimit",
            ErrorKind::SyntaxError => "SyntaxError",
            ErrorKind::Exception => "Exception",
            ErrorKind::CapabilityLimit => "CapabilityLimit",
            ErrorKind::BadSnapshot => "BadSnapshot",
            ErrorKind::Internal => "Internal",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
