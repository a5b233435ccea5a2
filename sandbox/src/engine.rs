//! The process-wide engine: the QuickJS module compiled once (or loaded
//! from the on-disk cache), a pooling allocator, and the host functions.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::Context;

use crate::host::{add_host_functions, Host};
use crate::limits::MAX_MEMORY_BYTES;

/// The guest module, built by `sandbox/guest/build.sh` and committed.
pub(crate) static MODULE_BYTES: &[u8] = include_bytes!("../guest/quickjs.wasm");
/// SHA-256 of the guest module (hex), as committed next to it.
pub const MODULE_SHA256: &str = include_str!("../guest/quickjs.wasm.sha256");

/// Instances the pooling allocator keeps slots for.
const POOL_INSTANCES: u32 = 64;
/// Native stack wasm code may use. The JS stack limit is far below it, so
/// deep recursion is a catchable RangeError long before this traps.
pub(crate) const MAX_WASM_STACK: usize = 1 << 20;

struct Inner {
    engine: wasmtime::Engine,
    pre: wasmtime::InstancePre<Host>,
    /// Linear memory right after instantiation (data segments applied):
    /// snapshots store only the 4 KiB chunks that differ from it.
    initial_image: OnceLock<Vec<u8>>,
}

/// One per process; cheap to clone.
#[derive(Clone)]
pub struct Engine(Arc<Inner>);

fn cache_path(engine: &wasmtime::Engine) -> Option<PathBuf> {
    let dir = std::env::var_os("BYOM_JS_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("byom")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/byom")))?;
    // The compiled artifact depends on the module, wasmtime and the config.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut h);
    let key = std::hash::Hasher::finish(&h);
    Some(dir.join(format!("quickjs-{}-{key:016x}.cwasm", MODULE_SHA256.trim())))
}

fn sha256(b: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, b)
        .as_ref()
        .to_vec()
}

impl Engine {
    /// The shared engine for this process.
    pub fn shared() -> anyhow::Result<Engine> {
        static SHARED: OnceLock<Engine> = OnceLock::new();
        if let Some(e) = SHARED.get() {
            return Ok(e.clone());
        }
        let e = Engine::new()?;
        Ok(SHARED.get_or_init(|| e).clone())
    }

    pub fn new() -> anyhow::Result<Engine> {
        let mut cfg = wasmtime::Config::new();
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        pool.total_memories(POOL_INSTANCES)
            .total_tables(POOL_INSTANCES)
            .total_core_instances(POOL_INSTANCES)
            .max_memory_size(MAX_MEMORY_BYTES);
        cfg.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool))
            .consume_fuel(true)
            .max_wasm_stack(MAX_WASM_STACK)
            .memory_init_cow(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed);
        let engine = wasmtime::Engine::new(&cfg)?;
        let module = Self::load_module(&engine)?;
        let mut linker = wasmtime::Linker::new(&engine);
        add_host_functions(&mut linker)?;
        let pre = linker.instantiate_pre(&module)?;
        Ok(Engine(Arc::new(Inner {
            engine,
            pre,
            initial_image: OnceLock::new(),
        })))
    }

    /// Compiles the module, or loads it from the cache. A cached artifact is
    /// used only if its SHA-256 matches the one recorded when it was written,
    /// so a damaged cache file is recompiled, never trusted.
    fn load_module(engine: &wasmtime::Engine) -> anyhow::Result<wasmtime::Module> {
        let expect = MODULE_SHA256.trim();
        let actual: String = sha256(MODULE_BYTES)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        anyhow::ensure!(
            actual == expect,
            "embedded QuickJS module does not match its SHA-256"
        );
        let path = cache_path(engine);
        if let Some(p) = &path {
            if let (Ok(bytes), Ok(sum)) =
                (std::fs::read(p), std::fs::read(p.with_extension("sha256")))
            {
                if sha256(&bytes) == sum {
                    // SAFETY: the artifact was produced by Module::serialize of
                    // this exact module and engine configuration (the file name
                    // keys both) and its checksum matches what we wrote.
                    if let Ok(m) = unsafe { wasmtime::Module::deserialize(engine, &bytes) } {
                        return Ok(m);
                    }
                }
            }
        }
        let module = wasmtime::Module::new(engine, MODULE_BYTES)
            .map_err(anyhow::Error::from)
            .context("compiling the QuickJS module")?;
        if let Some(p) = path {
            if let Ok(bytes) = module.serialize() {
                if let Some(dir) = p.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, &bytes).is_ok()
                    && std::fs::write(p.with_extension("sha256"), sha256(&bytes)).is_ok()
                {
                    let _ = std::fs::rename(&tmp, &p);
                }
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Ok(module)
    }

    pub(crate) fn wasmtime(&self) -> &wasmtime::Engine {
        &self.0.engine
    }

    pub(crate) fn pre(&self) -> &wasmtime::InstancePre<Host> {
        &self.0.pre
    }

    pub(crate) fn initial_image(&self) -> anyhow::Result<&[u8]> {
        if let Some(i) = self.0.initial_image.get() {
            return Ok(i);
        }
        let mut store =
            wasmtime::Store::new(&self.0.engine, Host::new(&crate::limits::Limits::default()));
        store.limiter(|h| &mut h.store_limits);
        store.set_fuel(u64::MAX)?;
        let inst = self.0.pre.instantiate(&mut store)?;
        let mem = inst
            .get_memory(&mut store, "memory")
            .context("guest has no memory")?;
        let image = mem.data(&store).to_vec();
        Ok(self.0.initial_image.get_or_init(|| image))
    }
}
