//! Per-plugin resource limits.

use std::time::Duration;

use serde::Deserialize;

const MIB: usize = 1024 * 1024;

/// What one plugin may use. In `agl.toml` it reads
/// `{ deadline_ms = 2000, memory_mb = 256, instances = 4 }`, every key optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(from = "LimitsToml")]
pub struct PluginLimits {
    /// Wall-clock budget of one call (instantiation and the export itself).
    pub deadline: Duration,
    /// Cap on the guest's linear memory.
    pub memory_bytes: usize,
    /// Most instances of this plugin alive at once, which bounds concurrent
    /// calls; further calls wait for a free one.
    pub instances: usize,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(2),
            memory_bytes: 256 * MIB,
            instances: 4,
        }
    }
}

/// The humane spelling of [`PluginLimits`].
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct LimitsToml {
    deadline_ms: u64,
    memory_mb: usize,
    instances: usize,
}

impl Default for LimitsToml {
    fn default() -> Self {
        let limits = PluginLimits::default();
        Self {
            deadline_ms: limits.deadline.as_millis() as u64,
            memory_mb: limits.memory_bytes / MIB,
            instances: limits.instances,
        }
    }
}

impl From<LimitsToml> for PluginLimits {
    fn from(raw: LimitsToml) -> Self {
        Self {
            deadline: Duration::from_millis(raw.deadline_ms),
            memory_bytes: raw.memory_mb.saturating_mul(MIB),
            // Zero instances could never serve a call.
            instances: raw.instances.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humane_fields_with_defaults() {
        let limits: PluginLimits = toml::from_str("deadline_ms = 300").unwrap();
        assert_eq!(limits.deadline, Duration::from_millis(300));
        assert_eq!(limits.memory_bytes, 256 * MIB);
        let limits: PluginLimits = toml::from_str("memory_mb = 64\ninstances = 0").unwrap();
        assert_eq!(limits.memory_bytes, 64 * MIB);
        assert_eq!(limits.instances, 1);
        assert!(toml::from_str::<PluginLimits>("deadline = 3").is_err());
    }
}
