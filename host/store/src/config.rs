//! `[store]`: the store section of `agl.toml`, owned here.

use serde::Deserialize;

/// `[store] wal_limit_mib` unless set: a pass over what the checkpoint
/// thread left of 64 MiB takes milliseconds.
pub const DEFAULT_WAL_LIMIT_MIB: u32 = 64;

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
    /// How long (MiB) the write-ahead log may grow before the writer
    /// checkpoints it itself, inside a commit. The checkpoint thread copies
    /// the log off the write path, but under writes that never pause it
    /// never finishes a pass, and the log, which only starts over after a
    /// pass that copied all of it, grows without end (~150 MB/s in the
    /// gateway bench at 64 connections). Past this size the writer's own
    /// pass copies what is left, and the next transaction starts the log
    /// over.
    pub wal_limit_mib: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            durability: crate::Durability::default(),
            max_system_retries: crate::DEFAULT_SYSTEM_RETRIES,
            wal_limit_mib: DEFAULT_WAL_LIMIT_MIB,
        }
    }
}
