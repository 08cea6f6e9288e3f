//! The sandboxed Wasm plugin host.
//!
//! A plugin is a WebAssembly component implementing world `sample-adapter`
//! or `reward` of `wit/agl.wit`. [`PluginHost`] compiles it once (cached on
//! disk), checks it against its world and runs it in a sandbox: no files,
//! network, environment or clock, a memory cap and a per-call deadline.
//! Calls are async; any failure comes back as a [`PluginError`] naming the
//! plugin, and the instance that failed is replaced.
//!
//! ```ignore
//! let host = PluginHost::new(HostConfig::default())?;
//! let plugin = host.load(PluginSpec::new("trajectory", "build/plugins/trajectory.wasm")).await?;
//! let samples = plugin.build_samples(&rollout).await?;
//! ```

mod bindings;
mod cache;
mod config;
mod engine;
mod error;
mod host;
mod inspect;
mod instance;
mod limits;
mod loaded;
pub mod samples;
mod sandbox;
mod slot;
mod state;
mod stdio;
#[cfg(test)]
mod test_calls;
mod validate;
mod view;
mod world;

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

pub use config::PluginsConfig;
pub use engine::{HostConfig, HostError, default_cache_dir};
pub use error::{PluginError, PluginErrorKind};
pub use host::PluginHost;
pub use inspect::{Inspection, Item};
pub use limits::PluginLimits;
pub use loaded::Plugin;
pub use slot::PluginSlot;
pub use validate::{InvalidSample, validate_reward, validate_samples};
pub use world::{WIT_PACKAGE, WIT_VERSION, WitVersion, World};

use agl_tokenizer::Tokenizer;
use agl_wire::rollout::{Rollout, Sample};

// Plugins are shared across tasks and threads.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<PluginHost>();
    shared::<Plugin>();
    shared::<PluginSlot>();
};

/// How to load one plugin.
#[derive(Clone)]
pub struct PluginSpec {
    /// Name used in logs and errors (e.g. its key in `agl.toml`).
    pub name: String,
    pub path: PathBuf,
    /// The plugin's own config table, handed to it as JSON by `config.get`.
    pub config: toml::Table,
    pub limits: PluginLimits,
    /// Served through the `tokenizer` import; `None`: every call errs.
    pub tokenizer: Option<Arc<Tokenizer>>,
}

impl PluginSpec {
    /// A spec with an empty config, default limits and no tokenizer.
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            path: path.into(),
            config: toml::Table::new(),
            limits: PluginLimits::default(),
            tokenizer: None,
        }
    }
}

impl std::fmt::Debug for PluginSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginSpec")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("config", &self.config)
            .field("limits", &self.limits)
            .field("tokenizer", &self.tokenizer.is_some())
            .finish()
    }
}

/// What a plugin says about itself (its `describe` export).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
}

/// How a load went, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// blake3 of the `.wasm` bytes (hex).
    pub wasm_hash: String,
    /// Whether the compiled component came from the disk cache.
    pub cache_hit: bool,
    /// The cache file read or written, if any.
    pub cache_file: Option<PathBuf>,
}
