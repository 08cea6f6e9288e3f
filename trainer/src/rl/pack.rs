//! Packing samples into micro-batches under a token budget.
//!
//! A micro-batch is a padded `[rows, max_len]` tensor, so its cost is
//! `rows * max_len` slots; the budget bounds that product (a sample longer
//! than the budget gets a micro-batch of its own). First-fit-decreasing:
//! samples sorted by length, longest first, each placed in the first
//! micro-batch it fits; since the first sample of a micro-batch is its
//! longest, adding a row costs exactly `max_len` slots.
//!
//! Padding waste = pad slots / all slots.

/// One micro-batch: indices into the sample list, and its padded length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroBatch {
    pub indices: Vec<usize>,
    pub max_len: usize,
}

impl MicroBatch {
    pub fn slots(&self) -> usize {
        self.indices.len() * self.max_len
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Packing {
    pub micro_batches: Vec<MicroBatch>,
    /// Sum of the samples' lengths.
    pub real_tokens: usize,
}

impl Packing {
    /// Micro-batches of the given index sets (in that order), e.g. to test
    /// that any split gives the same gradient.
    pub fn from_groups(lengths: &[usize], groups: Vec<Vec<usize>>) -> Self {
        let micro_batches = groups
            .into_iter()
            .map(|indices| MicroBatch {
                max_len: indices.iter().map(|&i| lengths[i]).max().unwrap_or(0),
                indices,
            })
            .collect();
        Packing {
            micro_batches,
            real_tokens: lengths.iter().sum(),
        }
    }

    pub fn slots(&self) -> usize {
        self.micro_batches.iter().map(MicroBatch::slots).sum()
    }

    /// Samples packed.
    pub fn samples(&self) -> usize {
        self.micro_batches.iter().map(|mb| mb.indices.len()).sum()
    }

    /// Pad slots / all slots (0 when empty).
    pub fn padding_waste(&self) -> f64 {
        let slots = self.slots();
        if slots == 0 {
            return 0.0;
        }
        (slots - self.real_tokens) as f64 / slots as f64
    }
}

/// First-fit-decreasing under `token_budget` slots per micro-batch.
pub fn pack_ffd(lengths: &[usize], token_budget: usize) -> Packing {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable: equal lengths keep their input order, so packing is deterministic.
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut bins: Vec<MicroBatch> = Vec::new();
    for i in order {
        let len = lengths[i];
        match bins
            .iter_mut()
            .find(|b| (b.indices.len() + 1) * b.max_len <= token_budget)
        {
            Some(bin) => bin.indices.push(i),
            None => bins.push(MicroBatch {
                indices: vec![i],
                max_len: len,
            }),
        }
    }
    Packing {
        micro_batches: bins,
        real_tokens: lengths.iter().sum(),
    }
}

/// Samples in input order, a new micro-batch whenever the next would exceed
/// the budget: the baseline FFD is measured against.
pub fn pack_in_order(lengths: &[usize], token_budget: usize) -> Packing {
    let mut bins: Vec<MicroBatch> = Vec::new();
    for (i, &len) in lengths.iter().enumerate() {
        match bins.last_mut() {
            Some(b) if (b.indices.len() + 1) * b.max_len.max(len) <= token_budget => {
                b.indices.push(i);
                b.max_len = b.max_len.max(len);
            }
            _ => bins.push(MicroBatch {
                indices: vec![i],
                max_len: len,
            }),
        }
    }
    Packing {
        micro_batches: bins,
        real_tokens: lengths.iter().sum(),
    }
}
