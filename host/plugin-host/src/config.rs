//! `[plugins]`: the plugin section of `agl.toml` (paths, cache, limits), owned here.

use std::path::PathBuf;

use serde::Deserialize;

/// `[plugins]`: which plugins `agl run` loads, and how they run.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsConfig {
    /// The sample-adapter plugin (`--plugin` overrides it).
    pub adapter: Option<PathBuf>,
    /// The reward plugin (`--reward` overrides it).
    pub reward: Option<PathBuf>,
    /// Where compiled components are cached; default `~/.cache/agl/components`.
    pub cache_dir: Option<PathBuf>,
    #[serde(default)]
    pub limits: crate::PluginLimits,
}
