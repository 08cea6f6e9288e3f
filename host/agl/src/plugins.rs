//! The run's plugins: the sample adapter and the optional reward, each in a
//! slot that a request to the gateway (`POST /v1/plugins/{role}`, see
//! `agl plugins reload`) can swap while the run goes. A swap loads and
//! validates the new component first; on any failure the old one keeps
//! serving. Rollouts collected after a swap use the new plugin, and each
//! step's metrics name the plugins its rollouts were scored with.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use agl_gateway::{PluginAdmin, PluginFuture, PluginSource};
use agl_plugin_host::{
    HostConfig, Plugin, PluginHost, PluginLimits, PluginSlot, PluginSpec, World,
};
use agl_tokenizer::Tokenizer;
use agl_wire::ApiError;
use agl_wire::api::{LoadedPlugin, PluginRole};
use agl_wire::record::{REWARD, RewardEvent};
use agl_wire::rollout::Rollout;

use crate::config::{Config, plugin_name};

pub struct Plugins {
    loader: Loader,
    /// Where posted `.wasm` bytes are written before they are loaded.
    uploads: PathBuf,
    adapter: PluginSlot,
    reward: RwLock<Option<Plugin>>,
}

/// Loads plugins the way the config says: their `[plugin.NAME]` table,
/// the limits, the policy's tokenizer.
struct Loader {
    host: PluginHost,
    tables: BTreeMap<String, toml::Table>,
    limits: PluginLimits,
    tokenizer: Option<Arc<Tokenizer>>,
}

impl Loader {
    async fn load(&self, name: &str, path: &Path, want: World) -> anyhow::Result<Plugin> {
        let mut spec = PluginSpec::new(name, path);
        spec.config = self.tables.get(name).cloned().unwrap_or_default();
        spec.limits = self.limits;
        spec.tokenizer = self.tokenizer.clone();
        let plugin = self.host.load(spec).await?;
        // Every instance up front: the first rollouts do not wait for a
        // Python plugin's interpreter, and a plugin that cannot run that
        // many under its limits fails here (a swap keeps the old one).
        plugin.prewarm().await?;
        anyhow::ensure!(
            plugin.world() == want,
            "{} is a {} plugin, expected {}",
            path.display(),
            plugin.world().as_str(),
            want.as_str()
        );
        Ok(plugin)
    }
}

/// One plugin of `want`'s world at `path`, configured as the run would
/// (its `[plugin.NAME]` table, the limits, `tokenizer`), outside any run.
pub async fn load_plugin(
    config: &Config,
    path: &Path,
    want: World,
    tokenizer: Option<Arc<Tokenizer>>,
) -> anyhow::Result<Plugin> {
    let loader = Loader {
        host: plugin_host(config)?,
        tables: config.plugin.clone(),
        limits: config.plugins.limits,
        tokenizer,
    };
    loader.load(&plugin_name(path), path, want).await
}

/// A plugin host with the config's component cache.
pub fn plugin_host(config: &Config) -> anyhow::Result<PluginHost> {
    let mut host_config = HostConfig::default();
    if let Some(dir) = &config.plugins.cache_dir {
        host_config.cache_dir = Some(dir.clone());
    }
    Ok(PluginHost::new(host_config)?)
}

impl Plugins {
    /// Loads the adapter (and reward) at the given paths. Posted plugins are
    /// kept under `uploads`.
    pub async fn load(
        config: &Config,
        adapter: &Path,
        reward: Option<&Path>,
        tokenizer: Option<Arc<Tokenizer>>,
        uploads: PathBuf,
    ) -> anyhow::Result<Plugins> {
        let loader = Loader {
            host: plugin_host(config)?,
            tables: config.plugin.clone(),
            limits: config.plugins.limits,
            tokenizer,
        };
        let first = loader
            .load(&plugin_name(adapter), adapter, World::SampleAdapter)
            .await?;
        let reward = match reward {
            Some(path) => Some(loader.load(&plugin_name(path), path, World::Reward).await?),
            None => None,
        };
        Ok(Plugins {
            loader,
            uploads,
            adapter: PluginSlot::new(first),
            reward: RwLock::new(reward),
        })
    }

    pub fn adapter(&self) -> Plugin {
        self.adapter.current()
    }

    pub fn reward(&self) -> Option<Plugin> {
        self.reward
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The plugins serving now, adapter first.
    pub fn loaded(&self) -> Vec<LoadedPlugin> {
        let mut out = vec![describe(PluginRole::Adapter, &self.adapter())];
        out.extend(self.reward().map(|r| describe(PluginRole::Reward, &r)));
        out
    }

    /// Loads `source` for `role` and swaps it in. `name` picks the config
    /// table; default: the file stem, or for posted bytes the replaced
    /// plugin's name.
    pub async fn swap(
        &self,
        role: PluginRole,
        source: PluginSource,
        name: Option<String>,
    ) -> anyhow::Result<LoadedPlugin> {
        let current = match role {
            PluginRole::Adapter => Some(self.adapter().name().to_string()),
            PluginRole::Reward => self.reward().map(|r| r.name().to_string()),
        };
        let (path, name) = match source {
            PluginSource::Path(path) => {
                let name = name.unwrap_or_else(|| plugin_name(&path));
                (path, name)
            }
            PluginSource::Wasm(bytes) => {
                let hash = blake3::hash(&bytes).to_hex();
                std::fs::create_dir_all(&self.uploads)?;
                let path = self.uploads.join(format!("{}.wasm", &hash[..16]));
                std::fs::write(&path, &bytes)?;
                let name = name.or(current).unwrap_or_else(|| role.as_str().into());
                (path, name)
            }
        };
        let want = match role {
            PluginRole::Adapter => World::SampleAdapter,
            PluginRole::Reward => World::Reward,
        };
        let plugin = self.loader.load(&name, &path, want).await?;
        let loaded = describe(role, &plugin);
        match role {
            PluginRole::Adapter => self.adapter.swap(plugin)?,
            PluginRole::Reward => {
                *self.reward.write().unwrap_or_else(PoisonError::into_inner) = Some(plugin)
            }
        }
        tracing::info!(
            role = role.as_str(),
            name = %loaded.name,
            version = %loaded.version,
            hash = %loaded.wasm_hash,
            "plugin swapped in"
        );
        Ok(loaded)
    }
}

/// How metrics and the API name a plugin.
pub fn describe(role: PluginRole, p: &Plugin) -> LoadedPlugin {
    LoadedPlugin {
        role,
        name: p.name().to_string(),
        version: p.info().version.clone(),
        wasm_hash: p.load_report().wasm_hash.clone(),
        path: p.path().display().to_string(),
    }
}

impl PluginAdmin for Plugins {
    fn current(&self) -> Vec<LoadedPlugin> {
        self.loaded()
    }

    fn swap(
        &self,
        role: PluginRole,
        source: PluginSource,
        name: Option<String>,
    ) -> PluginFuture<'_, LoadedPlugin> {
        Box::pin(async move {
            Plugins::swap(self, role, source, name)
                .await
                .map_err(|e| ApiError::bad_request(format!("{e:#}; the old plugin keeps serving")))
        })
    }
}

/// The reward plugin's score; without a reward plugin, the harness's own
/// last `reward` event.
pub async fn score(reward: Option<&Plugin>, rollout: &Arc<Rollout>) -> anyhow::Result<Option<f64>> {
    match reward {
        Some(p) => Ok(p.reward(rollout).await?),
        None => reported_reward(rollout),
    }
}

/// The harness's own reward: the last `reward` event of the attempt, read
/// by the one contract ([`RewardEvent::read`], the SDK's `last_reward` reads
/// the same). No event = no reward; a malformed last event is an error.
pub fn reported_reward(rollout: &Rollout) -> anyhow::Result<Option<f64>> {
    let Some(event) = rollout.events.iter().rev().find(|e| e.kind == REWARD) else {
        return Ok(None);
    };
    RewardEvent::read(event.payload.as_str())
        .map(Some)
        .map_err(|e| anyhow::anyhow!("rollout {}: {e}", rollout.id))
}
