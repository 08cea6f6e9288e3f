//! `[store]`: the store section of `agl.toml`, owned here.

use serde::Deserialize;

/// `[store]`: the SQLite store.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `process` (default): an acknowledged write survives kill -9 of agl;
    /// `power`: also power loss, at an fsync per commit batch.
    pub durability: crate::Durability,
}
