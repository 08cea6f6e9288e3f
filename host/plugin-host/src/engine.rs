//! The shared wasmtime engine: configuration, instance pool, epoch ticker
//! and the linker every plugin instantiates against.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::{v0_1, v0_2, v0_3, v0_4, v0_5, v0_6};
use super::state::PluginState;

const MIB: usize = 1024 * 1024;

/// Engine-wide settings, fixed for the host's lifetime.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where compiled components are cached; `None` disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// Instances alive at once across all plugins (the pool's slot count).
    pub max_instances: u32,
    /// Largest linear memory any instance may have; every plugin's
    /// `memory_bytes` must fit in it.
    pub max_memory_bytes: usize,
    /// How often the epoch advances: the granularity of deadlines and how
    /// long a guest runs before it yields to the async runtime.
    pub epoch_tick: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            cache_dir: default_cache_dir(),
            max_instances: 64,
            max_memory_bytes: 1024 * MIB,
            epoch_tick: Duration::from_millis(10),
        }
    }
}

/// `$XDG_CACHE_HOME/agl/components`, else `~/.cache/agl/components`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("agl").join("components"))
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot configure the wasm engine: {0}")]
    Engine(String),
    #[error("cannot link the plugin imports: {0}")]
    Linker(String),
    #[error("cannot start the epoch ticker thread: {0}")]
    Ticker(#[source] std::io::Error),
}

pub(crate) fn build_engine(config: &HostConfig) -> Result<Engine, HostError> {
    let slots = config.max_instances.max(1);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(slots)
        // A Rust wasip2 component holds a handful of core instances (the
        // program plus shims) and tables, and one memory; other toolchains
        // use more, so leave headroom (unused slots cost only address space).
        .total_core_instances(slots.saturating_mul(16))
        .total_memories(slots.saturating_mul(2))
        .total_tables(slots.saturating_mul(8))
        .total_stacks(slots)
        .max_memory_size(config.max_memory_bytes)
        // Reused slots keep their first pages mapped: a fresh instance then
        // does not page-fault its way through the stack and heap start.
        .linear_memory_keep_resident(MIB)
        .table_keep_resident(64 * 1024);
    let mut wasm = Config::new();
    wasm.wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&wasm).map_err(|e| HostError::Engine(format!("{e:#}")))
}

/// WASI p2 (std guests need it even for pure computation) plus the
/// `agl:adapter` imports of every served version; both worlds import the
/// same interfaces.
pub(crate) fn build_linker(engine: &Engine) -> Result<Linker<PluginState>, HostError> {
    let mut linker = Linker::new(engine);
    let err = |e: wasmtime::Error| HostError::Linker(format!("{e:#}"));
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(err)?;
    v0_6::sample::SampleAdapter::add_to_linker::<_, HasSelf<PluginState>>(&mut linker, |s| s)
        .map_err(err)?;
    v0_5::sample::SampleAdapter::add_to_linker::<_, HasSelf<PluginState>>(&mut linker, |s| s)
        .map_err(err)?;
    v0_4::sample::SampleAdapter::add_to_linker::<_, HasSelf<PluginState>>(&mut linker, |s| s)
        .map_err(err)?;
    v0_3::sample::SampleAdapter::add_to_linker::<_, HasSelf<PluginState>>(&mut linker, |s| s)
        .map_err(err)?;
    v0_2::sample::SampleAdapter::add_to_linker::<_, HasSelf<PluginState>>(&mut linker, |s| s)
        .map_err(err)?;
    v0_1::sample::SampleAdapter::add_to_linker::<_, HasSelf<PluginState>>(&mut linker, |s| s)
        .map_err(err)?;
    Ok(linker)
}

/// Advances the engine's epoch every tick until dropped. Guests yield at
/// each tick, which is what lets a deadline cancel them.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub(crate) fn start(engine: &Engine, tick: Duration) -> Result<Self, HostError> {
        let stop = Arc::new(AtomicBool::new(false));
        let engine = engine.clone();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("agl-epoch".to_string())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            })
            .map_err(HostError::Ticker)?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // The thread only sleeps and ticks; it ends within one tick.
            let _ = thread.join();
        }
    }
}
