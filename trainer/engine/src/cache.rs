//! The engine's per-sequence cache: a fixed number of *slots*, one per live
//! sequence, over every layer's state ([`LayerState`]: an attention layer's
//! keys and values, or a layer's recurrent state). The cache decides which
//! sequence holds which slot and how long each is; the model runs a step
//! over the states ([`Model::forward_cached`]). Attention states grow
//! (doubling, up to `max_len`) when a step needs more, so a cache sized for
//! long contexts costs little until used. Sequences join ([`SequenceCache::allocate`],
//! then a prefill step) and leave ([`SequenceCache::release`]) between
//! steps.

use tch::Tensor;

use agl_model::{LayerState, Model, ModelError, StepRow, grow_states};

/// A sequence's place in a [`SequenceCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(usize);

impl SlotId {
    pub fn index(self) -> usize {
        self.0
    }
}

/// The states of up to `num_slots` sequences; see the module docs.
#[derive(Debug)]
pub struct SequenceCache {
    states: Vec<LayerState>,
    /// Positions held per slot; `None` when the slot is free.
    lens: Vec<Option<usize>>,
    capacity: usize,
    max_len: usize,
}

/// The first capacity allocated; grown on demand.
const INITIAL_CAPACITY: usize = 64;

impl SequenceCache {
    /// An empty cache for `model` holding `num_slots` sequences of at most
    /// `max_len` tokens each.
    pub fn new(model: &Model, num_slots: usize, max_len: usize) -> Self {
        let capacity = INITIAL_CAPACITY.min(max_len);
        Self {
            states: model.layer_states(num_slots, capacity),
            lens: vec![None; num_slots],
            capacity,
            max_len,
        }
    }

    pub fn num_slots(&self) -> usize {
        self.lens.len()
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Slots not in use.
    pub fn free_slots(&self) -> usize {
        self.lens.iter().filter(|l| l.is_none()).count()
    }

    /// Takes a free slot (length 0), or `None` if all are in use.
    pub fn allocate(&mut self) -> Option<SlotId> {
        let i = self.lens.iter().position(Option::is_none)?;
        self.lens[i] = Some(0);
        Some(SlotId(i))
    }

    /// Frees a slot; its contents are dropped (overwritten by the next user).
    pub fn release(&mut self, slot: SlotId) {
        if let Some(len) = self.lens.get_mut(slot.0) {
            *len = None;
        }
    }

    /// Tokens cached for `slot`, or `None` if it is not allocated.
    pub fn seq_len(&self, slot: SlotId) -> Option<usize> {
        self.lens.get(slot.0).copied().flatten()
    }

    /// Keeps only the first `len` positions of `slot` (e.g. to re-use a
    /// shared prefix and recompute what follows). Attention states only: a
    /// recurrent state cannot be rolled back.
    pub fn truncate(&mut self, slot: SlotId, len: usize) -> Result<(), ModelError> {
        match self.lens.get_mut(slot.0) {
            Some(Some(cur)) if len <= *cur => {
                *cur = len;
                Ok(())
            }
            Some(Some(cur)) => Err(ModelError::Cache(format!(
                "cannot truncate {slot:?} of length {cur} to {len}"
            ))),
            _ => Err(ModelError::Cache(format!("{slot:?} is not allocated"))),
        }
    }

    /// One batched step: `batch` lists (slot, new tokens) pairs, each slot
    /// at most once and allocated. Runs the model over the slots' states,
    /// advances their lengths, and returns the logits of each pair's last
    /// new token, `[N, V]`, in batch order.
    pub fn step(
        &mut self,
        model: &Model,
        batch: &[(SlotId, &[i64])],
    ) -> Result<Tensor, ModelError> {
        let mut rows = Vec::with_capacity(batch.len());
        for (slot, tokens) in batch {
            let start = self
                .seq_len(*slot)
                .ok_or_else(|| ModelError::Cache(format!("{slot:?} is not allocated")))?;
            if start + tokens.len() > self.max_len {
                return Err(ModelError::Cache(format!(
                    "{slot:?} would hold {} tokens, over max_len {}",
                    start + tokens.len(),
                    self.max_len
                )));
            }
            rows.push(StepRow {
                slot: slot.0,
                start,
                tokens,
            });
        }
        let needed = rows.iter().map(|r| r.start + r.tokens.len()).max();
        if let Some(needed) = needed.filter(|n| *n > self.capacity) {
            self.capacity = needed.max(2 * self.capacity).min(self.max_len);
            grow_states(&mut self.states, self.capacity);
        }
        let logits = model.forward_cached(&mut self.states, &rows)?;
        for r in &rows {
            self.lens[r.slot] = Some(r.start + r.tokens.len());
        }
        Ok(logits)
    }
}
