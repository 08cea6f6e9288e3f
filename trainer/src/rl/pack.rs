//! Packing samples into micro-batches under a token budget.
//!
//! A micro-batch is a padded `[rows, max_len]` tensor, so its cost is
//! `rows * max_len` slots; the budget bounds that product (a sample longer
//! than the budget gets a micro-batch of its own). Each micro-batch is also
//! a pass of its own, with a fixed cost beside its slots (reading every
//! weight, launching the kernels): `overhead`, counted in slots.
//!
//! [`pack`] (what the trainer uses) sorts the samples by length, longest
//! first, and cuts that order into the runs whose slots plus overheads are
//! least (exact, by dynamic programming over the cut points): few
//! micro-batches where lengths are alike, more where one padded length
//! would waste more than a pass costs. First-fit-decreasing ([`pack_ffd`],
//! the fewest micro-batches the budget allows) and input order
//! ([`pack_in_order`]) are the baselines it is measured against.
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

/// The samples in `token_budget`-slot micro-batches whose slots plus
/// `overhead` slots each are least among runs of the longest-first order
/// (a run costs its size times its first, longest, sample's length).
pub fn pack(lengths: &[usize], token_budget: usize, overhead: usize) -> Packing {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable: equal lengths keep their input order, so packing is deterministic.
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let n = order.len();
    // best[j]: the least cost of the first j samples of `order`, and where
    // the last run of that packing starts.
    let mut best = vec![(0usize, 0usize); n + 1];
    for j in 1..=n {
        let mut choice = (usize::MAX, j - 1);
        for i in (0..j).rev() {
            let (rows, len) = (j - i, lengths[order[i]]);
            // Longer runs only get longer and wider: past the budget, stop
            // (a run of one always fits).
            if rows > 1 && rows * len > token_budget {
                break;
            }
            let cost = best[i].0 + rows * len + overhead;
            if cost < choice.0 {
                choice = (cost, i);
            }
        }
        best[j] = choice;
    }
    let mut micro_batches = Vec::new();
    let mut end = n;
    while end > 0 {
        let start = best[end].1;
        micro_batches.push(MicroBatch {
            indices: order[start..end].to_vec(),
            max_len: lengths[order[start]],
        });
        end = start;
    }
    micro_batches.reverse();
    Packing {
        micro_batches,
        real_tokens: lengths.iter().sum(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots plus `overhead` per micro-batch: what [`pack`] minimises.
    fn cost(p: &Packing, overhead: usize) -> usize {
        p.slots() + overhead * p.micro_batches.len()
    }

    /// Each index once, and every micro-batch within the budget (or one
    /// sample alone), its `max_len` its longest sample's.
    fn assert_valid(p: &Packing, lengths: &[usize], budget: usize) {
        let mut seen: Vec<usize> = p
            .micro_batches
            .iter()
            .flat_map(|m| m.indices.clone())
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for mb in &p.micro_batches {
            let longest = mb.indices.iter().map(|&i| lengths[i]).max().unwrap_or(0);
            assert_eq!(mb.max_len, longest);
            assert!(mb.indices.len() == 1 || mb.slots() <= budget, "{mb:?}");
        }
    }

    /// A small deterministic generator (no dependency for a test).
    fn lengths(seed: u64, n: usize, spread: u64) -> Vec<usize> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                20 + ((x >> 33) % spread) as usize
            })
            .collect()
    }

    #[test]
    fn a_pass_is_split_off_where_its_padding_costs_more_than_the_pass() {
        // One micro-batch: 4 x 10 = 40 slots + 3; two: 20 + 3 + 4 + 3 = 30.
        let p = pack(&[10, 2, 10, 2], 100, 3);
        assert_eq!(
            p.micro_batches,
            vec![
                MicroBatch {
                    indices: vec![0, 2],
                    max_len: 10
                },
                MicroBatch {
                    indices: vec![1, 3],
                    max_len: 2
                },
            ]
        );
        assert_eq!(p.padding_waste(), 0.0);
        // A pass that costs more than the padding it saves: one.
        let p = pack(&[10, 9, 10, 9], 100, 5);
        assert_eq!(p.micro_batches.len(), 1);
        assert_eq!(p.slots(), 40);
    }

    #[test]
    fn it_costs_no_more_than_first_fit_decreasing_and_keeps_the_budget() {
        for seed in 0..50 {
            for (n, spread, budget, overhead) in [
                (32, 40, 8192, 32),
                (64, 400, 4096, 64),
                (200, 3000, 16384, 256),
                (7, 5, 30, 0),
            ] {
                let lens = lengths(seed, n, spread);
                let p = pack(&lens, budget, overhead);
                assert_valid(&p, &lens, budget);
                let ffd = pack_ffd(&lens, budget);
                assert!(
                    cost(&p, overhead) <= cost(&ffd, overhead),
                    "seed {seed}: {} > {}",
                    cost(&p, overhead),
                    cost(&ffd, overhead)
                );
            }
        }
    }

    #[test]
    fn without_an_overhead_nothing_is_padded_and_a_long_sample_stands_alone() {
        let lens = lengths(7, 40, 30);
        assert_eq!(pack(&lens, 1 << 20, 0).padding_waste(), 0.0);
        let p = pack(&[500, 10, 10], 100, 8);
        assert_valid(&p, &[500, 10, 10], 100);
        assert_eq!(p.micro_batches[0].indices, vec![0]);
        assert!(pack(&[], 100, 8).micro_batches.is_empty());
    }
}
