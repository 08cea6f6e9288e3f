//! What each decoder layer keeps per sequence between inference steps
//! ([`LayerState`]). Which sequence holds which slot, and how long each is,
//! is the engine's (`agl-engine`'s per-sequence cache); the step over the
//! states is `cached.rs`.
//!
//! Each layer's state holds every slot's part. An attention layer keeps
//! keys and values `[slots, kv_heads, capacity, head_dim]`, a slot's first
//! `start` positions valid; the capacity grows ([`grow_states`]) when a
//! step needs more. A layer that keeps a fixed-size recurrent state per
//! sequence instead (Gated DeltaNet) is another [`LayerState`] variant:
//! growing leaves it alone, and the step hands each layer its own state.

use tch::Tensor;

/// One layer's state for every slot.
#[derive(Debug)]
pub enum LayerState {
    /// Keys and values `[slots, kv_heads, capacity, head_dim]`.
    Attention { keys: Tensor, values: Tensor },
}

impl LayerState {
    /// Positions per slot an attention state holds; `None` for a state of
    /// fixed size.
    pub fn capacity(&self) -> Option<usize> {
        match self {
            LayerState::Attention { keys, .. } => Some(keys.size()[2] as usize),
        }
    }

    /// The slots this state holds.
    pub fn slots(&self) -> usize {
        match self {
            LayerState::Attention { keys, .. } => keys.size()[0] as usize,
        }
    }

    /// A copy (for tests that run two paths from one state).
    #[cfg(test)]
    pub(crate) fn copy(&self) -> LayerState {
        match self {
            LayerState::Attention { keys, values } => LayerState::Attention {
                keys: keys.copy(),
                values: values.copy(),
            },
        }
    }
}

/// Grows every attention state to `capacity` positions per slot, keeping
/// what it holds; a state already that large, or of fixed size, is left.
pub fn grow_states(states: &mut [LayerState], capacity: usize) {
    for state in states {
        let LayerState::Attention { keys, values } = state;
        let old = keys.size()[2];
        if capacity as i64 <= old {
            continue;
        }
        for t in [keys, values] {
            let mut size = t.size();
            size[2] = capacity as i64;
            let bigger = Tensor::zeros(&size, (t.kind(), t.device()));
            bigger.narrow(2, 0, old).copy_(t);
            *t = bigger;
        }
    }
}

/// One sequence's new tokens in a step: its slot, the positions its state
/// already holds, and the tokens.
#[derive(Debug, Clone, Copy)]
pub struct StepRow<'a> {
    pub slot: usize,
    pub start: usize,
    pub tokens: &'a [i64],
}
