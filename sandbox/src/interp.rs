//! One JavaScript context in one wasm instance, and the host side of the
//! bridge: capability calls, console output, the wall clock, limits.
//! Snapshots of a paused context, and resuming one, are in `pause`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use wasmtime::{Memory, Store, TypedFunc};

use crate::capability::Capability;
use crate::engine::Engine;
use crate::host::Host;
use crate::limits::{ErrorKind, Limits, GUEST_STACK};
use crate::snapshot::Snapshot;

mod pause;

#[derive(Debug)]
pub enum Outcome {
    /// The script finished; its value as JSON (`null` for undefined).
    Done(Value),
    /// The script awaits a durable capability; resume it with the snapshot.
    Paused(Snapshot),
    Error(ErrorKind, String),
}

struct Exports {
    memory: Memory,
    alloc: TypedFunc<u32, u32>,
    free: TypedFunc<u32, ()>,
    eval: TypedFunc<(u32, u32), i32>,
    poll: TypedFunc<(), i32>,
    settle: TypedFunc<(i32, i32, u32, u32), i32>,
    result_kind: TypedFunc<(), i32>,
    result_ptr: TypedFunc<(), u32>,
    result_len: TypedFunc<(), u32>,
    stack_pointer: wasmtime::Global,
}

/// One JS context. Not `Sync`; one eval at a time (`&mut self`).
pub struct Interpreter {
    engine: Engine,
    store: Store<Host>,
    instance: wasmtime::Instance,
    ex: Exports,
    limits: Limits,
    caps: Arc<Vec<Capability>>,
    snapshot_key: Vec<u8>,
    /// A trap left the instance unusable; the next eval starts afresh.
    poisoned: bool,
}

const R_OK: i32 = 1;
const R_EXCEPTION: i32 = 2;
const R_SYNTAX: i32 = 3;
const R_INTERRUPTED: i32 = 4;
const R_OOM: i32 = 5;
const R_STACK: i32 = 6;
const R_HOST: i32 = 7;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn valid_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() < 64
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Outcome of one guest call: a trap becomes an error kind.
type GuestResult<T> = Result<T, (ErrorKind, String)>;

impl Interpreter {
    /// A fresh context with these capabilities. `snapshot_key` signs and
    /// checks snapshots (HMAC-SHA256); keep it secret and stable.
    pub fn new(
        engine: &Engine,
        limits: Limits,
        caps: Vec<Capability>,
        snapshot_key: &[u8],
    ) -> anyhow::Result<Interpreter> {
        Self::new_at(engine, limits, caps, snapshot_key, now_ms())
    }

    /// Like [`Interpreter::new`], with the virtual clock starting at
    /// `clock_ms`. QuickJS seeds `Math.random` from that clock, so the same
    /// start and the same script give the same run: a replay is exact.
    pub fn new_at(
        engine: &Engine,
        limits: Limits,
        caps: Vec<Capability>,
        snapshot_key: &[u8],
        clock_ms: u64,
    ) -> anyhow::Result<Interpreter> {
        let mut it = Self::instantiate(engine, limits, Arc::new(caps), snapshot_key)?;
        it.store.data_mut().clock_us = clock_ms * 1000;
        it.init_guest()?;
        Ok(it)
    }

    /// Sets the virtual clock `Date.now()` reads (and that seeds
    /// `Math.random` in new contexts): the same start replays the same run.
    pub fn set_clock_ms(&mut self, ms: u64) {
        self.store.data_mut().clock_us = ms * 1000;
    }

    /// Console lines of the current or last eval.
    pub fn logs(&self) -> &[String] {
        &self.store.data().logs
    }

    pub fn take_logs(&mut self) -> Vec<String> {
        self.store.data_mut().log_bytes = 0;
        std::mem::take(&mut self.store.data_mut().logs)
    }

    fn instantiate(
        engine: &Engine,
        limits: Limits,
        caps: Arc<Vec<Capability>>,
        key: &[u8],
    ) -> anyhow::Result<Interpreter> {
        let mut host = Host::new(&limits);
        host.caps = caps.clone();
        let mut store = Store::new(engine.wasmtime(), host);
        store.limiter(|h| &mut h.store_limits);
        store.set_fuel(u64::MAX)?;
        let instance = engine.pre().instantiate(&mut store)?;
        let missing = |name: &str| format!("guest export {name} missing");
        let ex = Exports {
            memory: instance
                .get_memory(&mut store, "memory")
                .context(missing("memory"))?,
            alloc: instance.get_typed_func(&mut store, "byom_alloc")?,
            free: instance.get_typed_func(&mut store, "byom_free")?,
            eval: instance.get_typed_func(&mut store, "byom_eval")?,
            poll: instance.get_typed_func(&mut store, "byom_poll")?,
            settle: instance.get_typed_func(&mut store, "byom_settle")?,
            result_kind: instance.get_typed_func(&mut store, "byom_result_kind")?,
            result_ptr: instance.get_typed_func(&mut store, "byom_result_ptr")?,
            result_len: instance.get_typed_func(&mut store, "byom_result_len")?,
            stack_pointer: instance
                .get_global(&mut store, "__stack_pointer")
                .context(missing("__stack_pointer"))?,
        };
        Ok(Interpreter {
            engine: engine.clone(),
            store,
            instance,
            ex,
            limits,
            caps,
            snapshot_key: key.to_vec(),
            poisoned: false,
        })
    }

    fn init_guest(&mut self) -> anyhow::Result<()> {
        let initialize: TypedFunc<(), ()> = self
            .instance
            .get_typed_func(&mut self.store, "_initialize")?;
        initialize.call(&mut self.store, ())?;
        let init: TypedFunc<(u32, u32), i32> =
            self.instance.get_typed_func(&mut self.store, "byom_init")?;
        let heap = self.limits.memory_bytes.min(u32::MAX as usize) as u32;
        let stack = self.limits.js_stack_bytes.min(GUEST_STACK as usize / 2) as u32;
        anyhow::ensure!(
            init.call(&mut self.store, (heap, stack))? == 0,
            "QuickJS failed to start"
        );
        let register: TypedFunc<(u32, u32, u32, u32, u32), i32> = self
            .instance
            .get_typed_func(&mut self.store, "byom_register")?;
        let seal: TypedFunc<(u32, u32), i32> =
            self.instance.get_typed_func(&mut self.store, "byom_seal")?;
        let caps = self.caps.clone();
        let mut namespaces: Vec<&str> = Vec::new();
        for (i, c) in caps.iter().enumerate() {
            anyhow::ensure!(
                valid_ident(&c.namespace) && valid_ident(&c.name),
                "bad capability name {}",
                c.full_name()
            );
            anyhow::ensure!(
                c.durable || c.handler.is_some(),
                "{} needs a handler",
                c.full_name()
            );
            anyhow::ensure!(
                c.namespace != "console",
                "the console namespace is reserved"
            );
            let (np, nl) = self.put(c.namespace.as_bytes())?;
            let (fp, fl) = self.put(c.name.as_bytes())?;
            let r = register.call(&mut self.store, (np, nl, fp, fl, i as u32))?;
            self.ex.free.call(&mut self.store, np)?;
            self.ex.free.call(&mut self.store, fp)?;
            anyhow::ensure!(r == 0, "cannot register {}", c.full_name());
            if !namespaces.contains(&c.namespace.as_str()) {
                namespaces.push(&c.namespace);
            }
        }
        for ns in namespaces {
            let (p, l) = self.put(ns.as_bytes())?;
            seal.call(&mut self.store, (p, l))?;
            self.ex.free.call(&mut self.store, p)?;
        }
        Ok(())
    }

    /// Copies bytes into a guest buffer (the caller frees it).
    fn put(&mut self, bytes: &[u8]) -> anyhow::Result<(u32, u32)> {
        let len = u32::try_from(bytes.len()).context("too large")?;
        let ptr = self.ex.alloc.call(&mut self.store, len)?;
        anyhow::ensure!(ptr != 0, "guest out of memory");
        self.ex.memory.write(&mut self.store, ptr as usize, bytes)?;
        Ok((ptr, len))
    }

    /// Turns a wasmtime error from a guest call into an error kind. A trap
    /// poisons the instance: its memory may be mid-update.
    fn trap(&mut self, e: anyhow::Error) -> (ErrorKind, String) {
        self.poisoned = true;
        if let Some((k, m)) = self.store.data_mut().stop.take() {
            return (k, m);
        }
        let sp = match self.ex.stack_pointer.get(&mut self.store) {
            wasmtime::Val::I32(v) => v as u32,
            _ => 0,
        };
        match e.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::OutOfFuel) => (ErrorKind::OutOfFuel, format!("CPU limit of {} fuel reached", self.limits.cpu_fuel)),
            Some(wasmtime::Trap::StackOverflow) => (ErrorKind::StackOverflow, "stack overflow: recursion too deep; the interpreter was discarded and starts afresh".into()),
            Some(wasmtime::Trap::MemoryOutOfBounds) if !(4096..=GUEST_STACK).contains(&sp) => {
                (ErrorKind::StackOverflow, "stack overflow: recursion too deep; the interpreter was discarded and starts afresh".into())
            }
            Some(t) => (ErrorKind::Internal, format!("the interpreter crashed ({t}) and was discarded")),
            None => {
                if self.store.get_fuel().map(|f| f == 0).unwrap_or(false) {
                    (ErrorKind::OutOfFuel, "CPU limit reached".into())
                } else {
                    (ErrorKind::Internal, format!("the interpreter failed: {e}"))
                }
            }
        }
    }

    /// Starts over with a fresh context after a trap (the old JS state is
    /// gone; that is the price of an instance that may be inconsistent).
    fn reset_if_poisoned(&mut self) -> anyhow::Result<()> {
        if self.poisoned {
            let mut fresh = Self::instantiate(
                &self.engine,
                self.limits.clone(),
                self.caps.clone(),
                &self.snapshot_key,
            )?;
            fresh.store.data_mut().clock_us = self.store.data().clock_us;
            fresh.init_guest()?;
            *self = fresh;
        }
        Ok(())
    }

    fn begin(&mut self) {
        let h = self.store.data_mut();
        h.deadline = Some(Instant::now() + self.limits.wall_clock);
        h.stop = None;
        h.logs.clear();
        h.log_bytes = 0;
        let _ = self.store.set_fuel(self.limits.cpu_fuel);
    }

    /// Runs a script (top-level `await` allowed) to its end, a durable
    /// pause, or an error.
    pub async fn eval(&mut self, code: &str) -> Outcome {
        if let Err(e) = self.reset_if_poisoned() {
            return Outcome::Error(
                ErrorKind::Internal,
                format!("cannot start a fresh interpreter: {e}"),
            );
        }
        self.begin();
        {
            let h = self.store.data_mut();
            h.calls.clear();
            h.calls_made.clear();
        }
        let r = (|| -> anyhow::Result<i32> {
            let (p, l) = self.put(code.as_bytes())?;
            let r = self.ex.eval.call(&mut self.store, (p, l));
            let _ = self.ex.free.call(&mut self.store, p);
            Ok(r?)
        })();
        match r {
            Ok(0) => self.drive().await,
            Ok(_) => self.settled(),
            Err(e) => {
                let (k, m) = self.trap(e);
                Outcome::Error(k, m)
            }
        }
    }

    fn poll(&mut self) -> GuestResult<i32> {
        match self.ex.poll.call(&mut self.store, ()) {
            Ok(r) => Ok(r),
            Err(e) => Err(self.trap(e.into())),
        }
    }

    fn settle(&mut self, id: u32, result: Result<Value, String>) -> GuestResult<()> {
        let (ok, mut bytes) = match result {
            Ok(v) => (
                1,
                serde_json::to_vec(&v).unwrap_or_else(|_| b"null".to_vec()),
            ),
            Err(m) => (0, m.into_bytes()),
        };
        // QuickJS's JSON parser wants a NUL after the text.
        bytes.push(0);
        let r = (|| -> anyhow::Result<i32> {
            let (p, l) = self.put(&bytes)?;
            let l = l - 1;
            let r = self.ex.settle.call(&mut self.store, (id as i32, ok, p, l));
            let _ = self.ex.free.call(&mut self.store, p);
            Ok(r?)
        })();
        match r {
            Ok(_) => Ok(()),
            Err(e) => Err(self.trap(e)),
        }
    }

    /// Reads the settled result out of the guest.
    fn settled(&mut self) -> Outcome {
        if let Some((k, m)) = self.store.data_mut().stop.take() {
            return Outcome::Error(k, m);
        }
        let read = (|| -> anyhow::Result<(i32, Vec<u8>)> {
            let kind = self.ex.result_kind.call(&mut self.store, ())?;
            let ptr = self.ex.result_ptr.call(&mut self.store, ())? as usize;
            let len = self.ex.result_len.call(&mut self.store, ())? as usize;
            let data = self.ex.memory.data(&self.store);
            let bytes = data
                .get(ptr..ptr.saturating_add(len))
                .context("bad result pointer")?
                .to_vec();
            Ok((kind, bytes))
        })();
        let (kind, bytes) = match read {
            Ok(x) => x,
            Err(e) => {
                let (k, m) = self.trap(e);
                return Outcome::Error(k, m);
            }
        };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        match kind {
            R_OK => {
                if bytes.len() > self.limits.max_result_bytes {
                    return Outcome::Error(
                        ErrorKind::ResultLimit,
                        format!(
                            "result of {} bytes is over the limit of {} bytes",
                            bytes.len(),
                            self.limits.max_result_bytes
                        ),
                    );
                }
                match serde_json::from_slice(&bytes) {
                    Ok(v) => Outcome::Done(v),
                    Err(e) => {
                        Outcome::Error(ErrorKind::Internal, format!("result is not JSON: {e}"))
                    }
                }
            }
            R_SYNTAX => Outcome::Error(ErrorKind::SyntaxError, text),
            R_OOM => Outcome::Error(
                ErrorKind::OutOfMemory,
                format!(
                    "memory limit of {} bytes reached: {text}",
                    self.limits.memory_bytes
                ),
            ),
            R_STACK => Outcome::Error(ErrorKind::StackOverflow, text),
            R_INTERRUPTED => Outcome::Error(
                ErrorKind::Timeout,
                format!("wall-clock limit of {:?} reached", self.limits.wall_clock),
            ),
            R_HOST => Outcome::Error(ErrorKind::Internal, text),
            R_EXCEPTION => Outcome::Error(ErrorKind::Exception, text),
            _ => Outcome::Error(
                ErrorKind::Internal,
                format!("unexpected guest state {kind}: {text}"),
            ),
        }
    }

    /// Polls the guest, runs capability calls (throttled per policy), and
    /// settles them until the script ends, pauses durably, or runs out of
    /// wall clock.
    async fn drive(&mut self) -> Outcome {
        let mut running: FuturesUnordered<BoxFuture<'static, (u32, Result<Value, String>)>> =
            FuturesUnordered::new();
        let deadline = self
            .store
            .data()
            .deadline
            .unwrap_or_else(|| Instant::now() + self.limits.wall_clock);
        loop {
            match self.poll() {
                Ok(0) => return self.settled(),
                Ok(_) => {}
                Err((k, m)) => return Outcome::Error(k, m),
            }
            if let Some((k, m)) = self.store.data_mut().stop.take() {
                return Outcome::Error(k, m);
            }
            // Settle what the host refused before starting (bad arguments).
            let immediate: Vec<(u32, Result<Value, String>)> = {
                let h = self.store.data_mut();
                let mut out = Vec::new();
                h.calls.retain_mut(|c| match c.immediate.take() {
                    Some(r) => {
                        out.push((c.id, r));
                        false
                    }
                    None => true,
                });
                out
            };
            if !immediate.is_empty() {
                for (id, r) in immediate {
                    if let Err((k, m)) = self.settle(id, r) {
                        return Outcome::Error(k, m);
                    }
                }
                continue;
            }
            // Start calls while their capability has room.
            {
                let caps = self.caps.clone();
                let h = self.store.data_mut();
                let mut active: HashMap<usize, usize> = HashMap::new();
                for c in h.calls.iter().filter(|c| c.started) {
                    *active.entry(c.cap).or_insert(0) += 1;
                }
                for c in h.calls.iter_mut().filter(|c| !c.started) {
                    let cap = &caps[c.cap];
                    if cap.durable {
                        continue;
                    }
                    let n = active.entry(c.cap).or_insert(0);
                    if *n >= cap.max_concurrent {
                        continue;
                    }
                    *n += 1;
                    c.started = true;
                    if let Some(handler) = &cap.handler {
                        let fut = handler(c.args.clone());
                        let id = c.id;
                        running.push(Box::pin(async move { (id, fut.await) }));
                    }
                }
            }
            if running.is_empty() {
                let durable = self.pending();
                if durable.is_empty() {
                    return Outcome::Error(
                        ErrorKind::Timeout,
                        "the script awaits a promise that nothing can settle (no capability call is pending)".into(),
                    );
                }
                return match self.snapshot(durable) {
                    Ok(s) => Outcome::Paused(s),
                    Err(e) => Outcome::Error(ErrorKind::Internal, format!("cannot snapshot: {e}")),
                };
            }
            let next = tokio::time::timeout_at(deadline.into(), running.next()).await;
            let (id, result) = match next {
                Err(_) => {
                    return Outcome::Error(
                        ErrorKind::Timeout,
                        format!(
                            "wall-clock limit of {:?} reached while waiting on capability calls",
                            self.limits.wall_clock
                        ),
                    );
                }
                Ok(None) => continue,
                Ok(Some(x)) => x,
            };
            self.store.data_mut().calls.retain(|c| c.id != id);
            if let Err((k, m)) = self.settle(id, result) {
                return Outcome::Error(k, m);
            }
        }
    }
}

/// A pre-initialised interpreter image (Wizer-style): the linear memory of a
/// fresh context with its capabilities registered, kept as the chunks that
/// differ from the module's initial image. New interpreters start from it
/// with a copy-on-write instantiation plus those chunks, skipping QuickJS's
/// start-up.
pub struct Template {
    engine: Engine,
    limits: Limits,
    caps: Arc<Vec<Capability>>,
    key: Vec<u8>,
    mem_len: usize,
    chunks: Vec<(usize, Vec<u8>)>,
    stack_pointer: i32,
}

const TEMPLATE_CHUNK: usize = 4096;

impl Template {
    pub fn new(
        engine: &Engine,
        limits: Limits,
        caps: Vec<Capability>,
        snapshot_key: &[u8],
    ) -> anyhow::Result<Template> {
        let mut it = Interpreter::new(engine, limits.clone(), caps, snapshot_key)?;
        let initial = engine.initial_image()?;
        let sp = match it.ex.stack_pointer.get(&mut it.store) {
            wasmtime::Val::I32(v) => v,
            _ => anyhow::bail!("stack pointer is not i32"),
        };
        let mem = it.ex.memory.data(&it.store);
        let mut chunks = Vec::new();
        for (i, c) in mem.chunks(TEMPLATE_CHUNK).enumerate() {
            let start = i * TEMPLATE_CHUNK;
            let base = initial.get(start..start + c.len());
            let same = match base {
                Some(b) => b == c,
                None => c.iter().all(|b| *b == 0),
            };
            if !same {
                chunks.push((start, c.to_vec()));
            }
        }
        Ok(Template {
            engine: engine.clone(),
            limits,
            caps: it.caps.clone(),
            key: snapshot_key.to_vec(),
            mem_len: mem.len(),
            chunks,
            stack_pointer: sp,
        })
    }

    /// Bytes of memory the template writes into each new instance.
    pub fn image_bytes(&self) -> usize {
        self.chunks.len() * TEMPLATE_CHUNK
    }

    pub fn instantiate(&self) -> anyhow::Result<Interpreter> {
        let mut it = Interpreter::instantiate(
            &self.engine,
            self.limits.clone(),
            self.caps.clone(),
            &self.key,
        )?;
        let cur = it.ex.memory.data_size(&it.store);
        if self.mem_len > cur {
            it.ex
                .memory
                .grow(&mut it.store, (self.mem_len - cur).div_ceil(65536) as u64)?;
        }
        let data = it.ex.memory.data_mut(&mut it.store);
        for (start, c) in &self.chunks {
            data[*start..*start + c.len()].copy_from_slice(c);
        }
        it.ex
            .stack_pointer
            .set(&mut it.store, wasmtime::Val::I32(self.stack_pointer))?;
        it.store.data_mut().clock_us = now_ms() * 1000;
        Ok(it)
    }
}
