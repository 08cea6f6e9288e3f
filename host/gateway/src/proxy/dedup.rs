//! Client retries: a harness whose client timed out resends the same
//! request, and both answers reach the store. The later successful call with
//! the same prompt ids in the same rollout attempt supersedes the earlier
//! one, so the export holds a single call.
//!
//! The index lives in memory only: after a gateway restart, retries of calls
//! recorded before it are not detected (both stay exported). A rollout's
//! entries are dropped when it finishes (`forget`), so the index holds only
//! live rollouts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A call's identity for retry detection: its attempt and a hash of its
/// prompt ids.
pub type RetryKey = (u32, [u8; 32]);

/// The key of a call with these prompt ids; `None` without any.
pub fn retry_key(attempt: u32, prompt_ids: &[u32]) -> Option<RetryKey> {
    if prompt_ids.is_empty() {
        return None;
    }
    let mut hasher = blake3::Hasher::new();
    for id in prompt_ids {
        hasher.update(&id.to_le_bytes());
    }
    Some((attempt, *hasher.finalize().as_bytes()))
}

/// rollout -> retry key -> seq of the latest call.
#[derive(Clone, Default)]
pub struct RetryIndex(Arc<Mutex<HashMap<String, HashMap<RetryKey, u64>>>>);

impl RetryIndex {
    /// Records call `seq`; returns `(old, new)` when it duplicates another
    /// call, `new` being the later seq.
    pub fn observe(&self, rollout_id: &str, key: RetryKey, seq: u64) -> Option<(u64, u64)> {
        // A poisoned map is still a valid map.
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let map = all.entry(rollout_id.to_string()).or_default();
        let prev = map.insert(key, seq)?;
        let (old, new) = (prev.min(seq), prev.max(seq));
        map.insert(key, new);
        Some((old, new))
    }

    /// Drops a finished rollout's entries.
    pub fn forget(&self, rollout_id: &str) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.remove(rollout_id);
    }

    /// Rollouts with entries (for tests and metrics).
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_repeats_of_a_prompt_within_an_attempt() {
        let idx = RetryIndex::default();
        let key = |attempt, ids: &[u32]| retry_key(attempt, ids).expect("key");
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 5), None);
        assert_eq!(idx.observe("r", key(1, &[1, 3]), 6), None);
        assert_eq!(idx.observe("r", key(2, &[1, 2]), 7), None);
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 9), Some((5, 9)));
        // A late commit of an older seq is superseded by the newer one.
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 8), Some((8, 9)));
        assert_eq!(retry_key(1, &[]), None);
        idx.forget("r");
        assert_eq!(idx.len(), 0);
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 11), None);
    }
}
