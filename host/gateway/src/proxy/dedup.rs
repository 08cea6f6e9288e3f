//! Client retries: a harness whose client timed out resends the same
//! request. A call supersedes an earlier one with the same prompt ids in the
//! same rollout attempt only when that earlier answer never reached its
//! client (the gateway wrote its body out whole, or not): that is a retry.
//! When the client did get the earlier answer, the same request again is a
//! deliberate repeat, and both calls stay in the export.
//!
//! The index lives in memory only: after a gateway restart, retries of calls
//! recorded before it are not detected (both stay exported). A rollout's
//! entries are dropped when it finishes (`forget`), so the index holds only
//! live rollouts.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use axum::body::{Body, Bytes};
use futures_util::{Stream, StreamExt, future, stream};

use agl_wire::rollout::Choice;

/// A call's identity for retry detection: its attempt and a hash of its
/// prompt ids (and which choice it is, for an `n` > 1 request).
pub type RetryKey = (u32, [u8; 32]);

/// The key of a call with these prompt ids; `None` without any. The
/// choices of one request have keys of their own, so siblings never
/// supersede each other, and a retried request's choice `i` supersedes
/// the earlier choice `i`.
pub fn retry_key(attempt: u32, prompt_ids: &[u32], choice: Option<Choice>) -> Option<RetryKey> {
    if prompt_ids.is_empty() {
        return None;
    }
    let mut hasher = blake3::Hasher::new();
    // The ids' bytes as they lie in memory, in one update: blake3 hashes a
    // long input several chunks at once. The index lives in this process
    // only, so the byte order is never compared across machines.
    hasher.update(bytemuck::cast_slice(prompt_ids));
    if let Some(c) = choice {
        hasher.update(b"choice");
        hasher.update(&c.index.to_le_bytes());
        hasher.update(&c.count.to_le_bytes());
    }
    Some((attempt, *hasher.finalize().as_bytes()))
}

/// The latest call of a retry key, and whether its answer was delivered.
#[derive(Clone, Copy)]
struct Latest {
    seq: u64,
    delivered: bool,
}

/// rollout -> retry key -> latest call.
#[derive(Clone, Default)]
pub struct RetryIndex(Arc<Mutex<HashMap<String, HashMap<RetryKey, Latest>>>>);

impl RetryIndex {
    /// Records call `seq`; returns `(old, new)` when it is a retry of a call
    /// whose answer was not delivered, `new` being the later seq.
    pub fn observe(&self, rollout_id: &str, key: RetryKey, seq: u64) -> Option<(u64, u64)> {
        // A poisoned map is still a valid map.
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let map = all.entry(rollout_id.to_string()).or_default();
        let fresh = Latest {
            seq,
            delivered: false,
        };
        let prev = map.insert(key, fresh)?;
        if prev.delivered {
            return None; // a deliberate repeat: both stay
        }
        let (old, new) = (prev.seq.min(seq), prev.seq.max(seq));
        map.insert(key, Latest { seq: new, ..fresh });
        Some((old, new))
    }

    /// Call `seq`'s answer was written out whole.
    pub fn delivered(&self, rollout_id: &str, key: RetryKey, seq: u64) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(latest) = all.get_mut(rollout_id).and_then(|m| m.get_mut(&key))
            && latest.seq == seq
        {
            latest.delivered = true;
        }
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

/// Where an answer's body reports that it went out whole: the proxy fills
/// in the call once it is committed, the body calls [`RetryIndex::delivered`]
/// when the server polls past its last chunk.
#[derive(Clone)]
pub struct DeliveryNote {
    retries: RetryIndex,
    rollout_id: String,
    calls: Arc<OnceLock<Vec<(RetryKey, u64)>>>,
}

impl DeliveryNote {
    pub fn new(retries: RetryIndex, rollout_id: String) -> DeliveryNote {
        DeliveryNote {
            retries,
            rollout_id,
            calls: Arc::default(),
        }
    }

    /// The committed calls this answer holds (retry key and seq; one per
    /// choice), once.
    pub fn set(&self, calls: impl IntoIterator<Item = (Option<RetryKey>, u64)>) {
        let calls = calls
            .into_iter()
            .filter_map(|(key, seq)| Some((key?, seq)))
            .collect();
        let _ = self.calls.set(calls);
    }

    /// `chunks` as a response body that reports its delivery on the end.
    pub fn body<S>(self, chunks: S) -> Body
    where
        S: Stream<Item = Result<Bytes, io::Error>> + Send + 'static,
    {
        let end = stream::once(async move {
            for (key, seq) in self.calls.get().into_iter().flatten() {
                self.retries.delivered(&self.rollout_id, *key, *seq);
            }
        })
        .filter_map(|()| future::ready(None));
        Body::from_stream(chunks.chain(end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_supersedes_only_an_undelivered_call() {
        let idx = RetryIndex::default();
        let key = |attempt, ids: &[u32]| retry_key(attempt, ids, None).expect("key");
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 5), None);
        assert_eq!(idx.observe("r", key(1, &[1, 3]), 6), None);
        assert_eq!(idx.observe("r", key(2, &[1, 2]), 7), None);
        // 5 never reached its client: 9 is its retry.
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 9), Some((5, 9)));
        // A late commit of an older seq is superseded by the newer one.
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 8), Some((8, 9)));
        // 9 was delivered: 10 is a deliberate repeat and supersedes nothing.
        idx.delivered("r", key(1, &[1, 2]), 9);
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 10), None);
        // A delivery note for a call that is no longer the latest is ignored.
        idx.delivered("r", key(1, &[1, 2]), 9);
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 11), Some((10, 11)));
        assert_eq!(retry_key(1, &[], None), None);
        // Each choice of a request is its own key.
        let choice = |index| Some(Choice { index, count: 2 });
        assert_ne!(
            retry_key(1, &[1, 2], choice(0)),
            retry_key(1, &[1, 2], choice(1))
        );
        assert_ne!(
            retry_key(1, &[1, 2], choice(0)),
            retry_key(1, &[1, 2], None)
        );
        idx.forget("r");
        assert_eq!(idx.len(), 0);
        assert_eq!(idx.observe("r", key(1, &[1, 2]), 12), None);
    }

    /// The key is the hash of the ids' bytes in order (in this process's
    /// byte order): a long prompt keys as its whole byte string does, and
    /// one id more or less keys apart.
    #[test]
    fn the_key_hashes_the_ids_bytes_in_order() {
        let ids: Vec<u32> = (0..2051u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_ne_bytes()).collect();
        assert_eq!(
            retry_key(3, &ids, None),
            Some((3, *blake3::hash(&bytes).as_bytes()))
        );
        assert_ne!(
            retry_key(3, &ids, None),
            retry_key(3, &ids[..ids.len() - 1], None)
        );
    }
}
