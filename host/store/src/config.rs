//! `[store]`: the store section of `agl.toml`, owned here.

use std::num::NonZeroU32;

use serde::Deserialize;

/// `[store] wal_limit_mib` unless set: a pass over what the checkpoint
/// thread left of 64 MiB takes milliseconds.
pub const DEFAULT_WAL_LIMIT_MIB: NonZeroU32 = NonZeroU32::new(64).expect("64 is not 0");

/// `[store]`: the SQLite store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `process` (default): an acknowledged write survives kill -9 of agl
    /// (an appended event once it is in the event log, `eventlog.rs`);
    /// `power`: also power loss, at an fsync per commit batch (events are
    /// then committed to SQLite before they are acknowledged).
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
    /// over. 0 is refused (a log checkpointed at every commit is the
    /// stall the checkpoint thread is there to avoid).
    pub wal_limit_mib: NonZeroU32,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_wal_limit_is_refused_by_name() {
        let zero = serde_json::from_str::<StoreConfig>(r#"{"wal_limit_mib": 0}"#);
        let e = zero.expect_err("0 refused").to_string();
        assert!(e.contains("nonzero"), "{e}");
        let set: StoreConfig = serde_json::from_str(r#"{"wal_limit_mib": 8}"#).expect("8 taken");
        assert_eq!(set.wal_limit_mib.get(), 8);
        assert_eq!(StoreConfig::default().wal_limit_mib, DEFAULT_WAL_LIMIT_MIB);
    }
}
