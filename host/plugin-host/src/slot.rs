//! Hot reload: a slot serving one plugin that can be swapped for a new
//! build without failing calls in flight.

use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

use super::error::{PluginError, PluginErrorKind};
use super::host::PluginHost;
use super::loaded::{Plugin, error};
use super::{LoadReport, Rollout, Sample};

/// Holds the plugin currently serving a role. Calls take a clone of the
/// current plugin, so a reload never disturbs calls already running.
pub struct PluginSlot {
    current: RwLock<Plugin>,
}

impl PluginSlot {
    pub fn new(plugin: Plugin) -> Self {
        Self {
            current: RwLock::new(plugin),
        }
    }

    /// The plugin serving now.
    pub fn current(&self) -> Plugin {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Loads `path` with the current plugin's name, config, limits and
    /// tokenizer, and swaps it in only if it loads, describes itself and
    /// implements the same world. On any error the old plugin keeps serving.
    pub async fn reload(&self, host: &PluginHost, path: &Path) -> Result<LoadReport, PluginError> {
        let old = self.current();
        let mut spec = old.spec().clone();
        spec.path = path.to_path_buf();
        let new = host.load(spec).await?;
        let report = new.load_report().clone();
        self.swap(new)?;
        tracing::info!(plugin = %old.name(), path = %path.display(), "plugin reloaded");
        Ok(report)
    }

    /// Serves `new` from now on if it implements the same world; otherwise
    /// the current plugin stays.
    pub fn swap(&self, new: Plugin) -> Result<(), PluginError> {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if new.world() != current.world() {
            let kind = PluginErrorKind::WrongWorld {
                expected: current.world(),
                actual: new.world(),
            };
            return Err(error(new.spec(), kind, String::new()));
        }
        *current = new;
        Ok(())
    }

    pub async fn build_samples(&self, rollout: &Arc<Rollout>) -> Result<Vec<Sample>, PluginError> {
        self.current().build_samples(rollout).await
    }

    pub async fn reward(&self, rollout: &Arc<Rollout>) -> Result<Option<f64>, PluginError> {
        self.current().reward(rollout).await
    }
}
