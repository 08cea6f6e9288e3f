//! `PluginHost`: owns the engine and loads plugins into it.

use std::path::Path;
use std::sync::Arc;

use wasmtime::Engine;
use wasmtime::component::Linker;

use super::cache::{CacheOutcome, ComponentCache};
use super::engine::{EpochTicker, HostConfig, HostError, build_engine, build_linker};
use super::error::{PluginError, PluginErrorKind};
use super::inspect::{self, Inspection};
use super::loaded::{Parts, Plugin, default_name, error};
use super::state::{PluginEnv, PluginState};
use super::world::{self, WorldPre};
use super::{LoadReport, PluginSpec};

/// Loads and runs plugins. One per process is enough; it is `Send + Sync`
/// and loads may run concurrently. Must be used inside a Tokio runtime
/// (with the time driver enabled).
pub struct PluginHost {
    engine: Engine,
    linker: Linker<PluginState>,
    cache: Arc<ComponentCache>,
    ticker: Arc<EpochTicker>,
    max_memory_bytes: usize,
}

impl PluginHost {
    pub fn new(config: HostConfig) -> Result<Self, HostError> {
        let engine = build_engine(&config)?;
        let linker = build_linker(&engine)?;
        let ticker = Arc::new(EpochTicker::start(&engine, config.epoch_tick)?);
        Ok(Self {
            cache: Arc::new(ComponentCache::new(&engine, config.cache_dir)),
            engine,
            linker,
            ticker,
            max_memory_bytes: config.max_memory_bytes,
        })
    }

    /// Compiles (or takes from the disk cache) `spec.path`, checks it
    /// against its world, starts an instance and asks it to describe itself.
    pub async fn load(&self, spec: PluginSpec) -> Result<Plugin, PluginError> {
        let load_err = |spec: &PluginSpec, message: String| {
            error(spec, PluginErrorKind::Load(message), String::new())
        };
        if spec.limits.memory_bytes > self.max_memory_bytes {
            let message = format!(
                "memory limit of {} bytes exceeds the host's per-instance maximum of {} bytes",
                spec.limits.memory_bytes, self.max_memory_bytes
            );
            return Err(load_err(&spec, message));
        }
        let config_json = serde_json::to_string(&spec.config)
            .map_err(|e| load_err(&spec, format!("config is not representable as JSON: {e}")))?;
        let (component, report) = self
            .compile(&spec.path)
            .await
            .map_err(|message| load_err(&spec, message))?;
        let versions =
            world::candidate_versions(&self.engine, &component).map_err(|m| load_err(&spec, m))?;
        let world = world::detect(&self.engine, &component).map_err(|m| load_err(&spec, m))?;
        let pre = WorldPre::new(&self.linker, &component, world, &versions)
            .map_err(|e| load_err(&spec, format!("does not fit world {world}: {e:#}")))?;
        let env = Arc::new(PluginEnv {
            name: spec.name.clone(),
            config_json,
            tokenizer: spec.tokenizer.clone(),
        });
        tracing::debug!(plugin = %spec.name, %world, wit = %pre.version(), cache_hit = report.cache_hit, "plugin loaded");
        Plugin::start(Parts {
            spec,
            report,
            component,
            pre,
            env,
            ticker: self.ticker.clone(),
        })
        .await
    }

    /// Loads `path` with default settings and describes it for
    /// `agl plugin inspect`.
    pub async fn inspect(&self, path: &Path) -> Result<Inspection, PluginError> {
        let plugin = self.load(PluginSpec::new(default_name(path), path)).await?;
        Ok(Inspection {
            path: path.to_path_buf(),
            world: plugin.world(),
            wit: plugin.wit_version(),
            info: plugin.info().clone(),
            imports: inspect::imports(&self.engine, plugin.component()),
            exports: inspect::exports(&self.engine, plugin.component()),
            load: plugin.load_report().clone(),
        })
    }

    /// Reads and compiles off the async executor: a cold compile takes tens
    /// of milliseconds of CPU.
    async fn compile(
        &self,
        path: &Path,
    ) -> Result<(wasmtime::component::Component, LoadReport), String> {
        let engine = self.engine.clone();
        let cache = self.cache.clone();
        let path = path.to_path_buf();
        let task = tokio::task::spawn_blocking(move || {
            let wasm = std::fs::read(&path).map_err(|e| format!("cannot read: {e}"))?;
            let wasm_hash = blake3::hash(&wasm).to_hex().to_string();
            let (component, outcome) = cache
                .load_or_compile(&engine, &wasm)
                .map_err(|e| format!("not a valid component: {e:#}"))?;
            let (cache_hit, cache_file) = match outcome {
                CacheOutcome::Hit(file) => (true, Some(file)),
                CacheOutcome::Compiled(file) => (false, file),
                CacheOutcome::Disabled => (false, None),
            };
            let report = LoadReport {
                wasm_hash,
                cache_hit,
                cache_file,
            };
            Ok((component, report))
        });
        task.await
            .map_err(|e| format!("compile task failed: {e}"))?
    }
}
