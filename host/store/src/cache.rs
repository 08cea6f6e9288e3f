//! Read-through memos for what the proxy reads on every call (a rollout's
//! status and attempt, the engine list, the latest weight version), so a
//! proxied call costs no SQLite read in the steady state.
//!
//! Correct because this process's `Store` is the only writer of its file:
//! every write that changes a memoised value invalidates it after commit.
//! A reader that raced such a write must not put the value it read back, so
//! invalidation bumps a generation and a fill only lands if the generation
//! it started under is still current.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// Entries kept before the memo starts over (bounds memory on long runs).
const MAX_ENTRIES: usize = 100_000;

pub struct Memo<K, V> {
    inner: Mutex<State<K, V>>,
}

struct State<K, V> {
    generation: u64,
    map: HashMap<K, V>,
}

impl<K: Eq + Hash, V: Clone> Default for Memo<K, V> {
    fn default() -> Self {
        Memo {
            inner: Mutex::new(State {
                generation: 0,
                map: HashMap::new(),
            }),
        }
    }
}

impl<K: Eq + Hash, V: Clone> Memo<K, V> {
    /// The memoised value, or the generation a fill must present.
    pub fn get<Q>(&self, key: &Q) -> Result<V, u64>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Ok(s) = self.inner.lock() else {
            return Err(u64::MAX);
        };
        s.map.get(key).cloned().ok_or(s.generation)
    }

    /// Stores `value` read under `generation`, unless a write has
    /// invalidated since.
    pub fn fill(&self, generation: u64, key: K, value: V) {
        if let Ok(mut s) = self.inner.lock()
            && s.generation == generation
        {
            if s.map.len() >= MAX_ENTRIES {
                s.map.clear();
            }
            s.map.insert(key, value);
        }
    }

    /// Forgets `key` (all keys when `None`); called after a write commits.
    pub fn invalidate(&self, key: Option<&K>) {
        if let Ok(mut s) = self.inner.lock() {
            s.generation += 1;
            match key {
                Some(k) => {
                    s.map.remove(k);
                }
                None => s.map.clear(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_that_raced_an_invalidation_is_dropped() {
        let memo: Memo<&str, u32> = Memo::default();
        let generation = memo.get(&"r").unwrap_err();
        memo.invalidate(Some(&"r"));
        memo.fill(generation, "r", 1);
        assert!(memo.get(&"r").is_err(), "stale value must not land");
        let generation = memo.get(&"r").unwrap_err();
        memo.fill(generation, "r", 2);
        assert_eq!(memo.get(&"r"), Ok(2));
        memo.invalidate(None);
        assert!(memo.get(&"r").is_err());
    }
}
