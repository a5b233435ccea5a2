//! The host side of the bridge: the wasmtime store's data (capability
//! calls waiting, console output, the deadline, the virtual clock) and the
//! functions the guest imports: `byom.host_call`, `host_log`,
//! `host_interrupt`, and the few WASI functions the libc wants, stubbed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use wasmtime::{Caller, Linker, Memory, StoreLimits, StoreLimitsBuilder};

use crate::capability::Capability;
use crate::limits::{ErrorKind, Limits, MAX_MEMORY_BYTES, MEMORY_OVERHEAD};

pub(crate) struct CallRec {
    pub(crate) id: u32,
    pub(crate) cap: usize,
    pub(crate) args: Value,
    pub(crate) started: bool,
    /// Settled by the host before it started (schema violation).
    pub(crate) immediate: Option<Result<Value, String>>,
}

/// The wasmtime store's data: everything the host functions touch.
pub(crate) struct Host {
    pub(crate) store_limits: StoreLimits,
    pub(crate) caps: Arc<Vec<Capability>>,
    pub(crate) calls: Vec<CallRec>,
    pub(crate) next_id: u32,
    pub(crate) calls_made: HashMap<usize, usize>,
    pub(crate) max_pending: usize,
    pub(crate) logs: Vec<String>,
    pub(crate) log_bytes: usize,
    pub(crate) max_output: usize,
    pub(crate) deadline: Option<Instant>,
    pub(crate) stop: Option<(ErrorKind, String)>,
    pub(crate) clock_us: u64,
}

impl Host {
    pub(crate) fn new(limits: &Limits) -> Host {
        Host {
            store_limits: StoreLimitsBuilder::new()
                .memory_size(
                    limits
                        .memory_bytes
                        .saturating_add(MEMORY_OVERHEAD)
                        .min(MAX_MEMORY_BYTES),
                )
                .instances(1)
                .tables(1)
                .memories(1)
                .build(),
            caps: Arc::new(Vec::new()),
            calls: Vec::new(),
            next_id: 1,
            calls_made: HashMap::new(),
            max_pending: limits.max_pending_calls,
            logs: Vec::new(),
            log_bytes: 0,
            max_output: limits.max_output_bytes,
            deadline: None,
            stop: None,
            clock_us: 0,
        }
    }

    pub(crate) fn stop(&mut self, kind: ErrorKind, msg: impl Into<String>) {
        if self.stop.is_none() {
            self.stop = Some((kind, msg.into()));
        }
    }
}

fn memory(caller: &mut Caller<'_, Host>) -> Option<Memory> {
    caller.get_export("memory").and_then(|e| e.into_memory())
}

fn read_bytes(caller: &mut Caller<'_, Host>, ptr: u32, len: u32) -> Option<Vec<u8>> {
    let mem = memory(caller)?;
    let data = mem.data(&caller);
    data.get(ptr as usize..(ptr as usize).checked_add(len as usize)?)
        .map(|s| s.to_vec())
}

const WASI_EBADF: i32 = 8;

pub(crate) fn add_host_functions(linker: &mut Linker<Host>) -> anyhow::Result<()> {
    linker.func_wrap(
        "byom",
        "host_call",
        |mut caller: Caller<'_, Host>, cap: u32, ptr: u32, len: u32| -> i32 {
            let Some(bytes) = read_bytes(&mut caller, ptr, len) else {
                return -1;
            };
            let h = caller.data_mut();
            let cap = cap as usize;
            let Some(c) = h.caps.get(cap).cloned() else {
                h.stop(ErrorKind::Internal, "call to an unknown capability");
                return -1;
            };
            let made = h.calls_made.entry(cap).or_insert(0);
            *made += 1;
            if *made > c.max_calls {
                let msg = format!(
                    "{} called more than {} times in one eval",
                    c.full_name(),
                    c.max_calls
                );
                h.stop(ErrorKind::CapabilityLimit, msg);
                return -1;
            }
            if h.calls.len() >= h.max_pending {
                let msg = format!(
                    "more than {} capability calls waiting at once",
                    h.max_pending
                );
                h.stop(ErrorKind::CapabilityLimit, msg);
                return -1;
            }
            let args: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let immediate = crate::schema::validate(&c.schema, &args)
                .err()
                .map(|e| Err(format!("invalid arguments for {}: {e}", c.full_name())));
            let id = h.next_id;
            h.next_id += 1;
            h.calls.push(CallRec {
                id,
                cap,
                args,
                started: false,
                immediate,
            });
            id as i32
        },
    )?;
    linker.func_wrap(
        "byom",
        "host_log",
        |mut caller: Caller<'_, Host>, _level: u32, ptr: u32, len: u32| -> i32 {
            let Some(bytes) = read_bytes(&mut caller, ptr, len) else {
                return 1;
            };
            let h = caller.data_mut();
            h.log_bytes += bytes.len() + 1;
            if h.log_bytes > h.max_output {
                let msg = format!("console output over the limit of {} bytes", h.max_output);
                h.stop(ErrorKind::OutputLimit, msg);
                return 1;
            }
            h.logs.push(String::from_utf8_lossy(&bytes).into_owned());
            0
        },
    )?;
    linker.func_wrap(
        "byom",
        "host_interrupt",
        |mut caller: Caller<'_, Host>| -> i32 {
            let h = caller.data_mut();
            if h.stop.is_some() {
                return 1;
            }
            if h.deadline.is_some_and(|d| Instant::now() >= d) {
                h.stop(ErrorKind::Timeout, "wall-clock limit reached");
                return 1;
            }
            0
        },
    )?;
    // WASI, stubbed: the guest gets a virtual clock and no files.
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "clock_time_get",
        |mut caller: Caller<'_, Host>, _id: i32, _prec: i64, out: i32| -> i32 {
            let h = caller.data_mut();
            h.clock_us += 1;
            let ns = h.clock_us.saturating_mul(1000);
            let Some(mem) = memory(&mut caller) else {
                return WASI_EBADF;
            };
            match mem.write(&mut caller, out as u32 as usize, &ns.to_le_bytes()) {
                Ok(()) => 0,
                Err(_) => WASI_EBADF,
            }
        },
    )?;
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "fd_write",
        |mut caller: Caller<'_, Host>, _fd: i32, iovs: i32, n: i32, written: i32| -> i32 {
            // Swallow the guest's own diagnostics, but report them written.
            let Some(mem) = memory(&mut caller) else {
                return WASI_EBADF;
            };
            let mut total: u32 = 0;
            for i in 0..n.max(0) as usize {
                let mut b = [0u8; 8];
                if mem
                    .read(&caller, iovs as u32 as usize + i * 8, &mut b)
                    .is_err()
                {
                    return WASI_EBADF;
                }
                total = total.saturating_add(u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
            }
            match mem.write(&mut caller, written as u32 as usize, &total.to_le_bytes()) {
                Ok(()) => 0,
                Err(_) => WASI_EBADF,
            }
        },
    )?;
    linker.func_wrap("wasi_snapshot_preview1", "fd_close", |_: i32| -> i32 {
        WASI_EBADF
    })?;
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "fd_seek",
        |_: i32, _: i64, _: i32, _: i32| -> i32 { WASI_EBADF },
    )?;
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "fd_fdstat_get",
        |_: i32, _: i32| -> i32 { WASI_EBADF },
    )?;
    Ok(())
}
