//! `[store]`: the store section of `agl.toml`, owned here.

use serde::Deserialize;

/// `[store]`: the SQLite store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `process` (default): an acknowledged write survives kill -9 of agl;
    /// `power`: also power loss, at an fsync per commit batch.
    pub durability: crate::Durability,
    /// A rollout's retry budget: an attempt that fails for a system reason
    /// (crash, timeout, engine down) is re-queued as the next attempt in
    /// the same transaction while its attempt number is at most this.
    pub max_system_retries: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            durability: crate::Durability::default(),
            max_system_retries: crate::DEFAULT_SYSTEM_RETRIES,
        }
    }
}
