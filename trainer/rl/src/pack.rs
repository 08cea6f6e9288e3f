//! Packing samples into micro-batches under a token budget.
//!
//! A micro-batch is a `[rows, row_len]` tensor, its cost `rows * row_len`
//! slots, and the budget bounds them (a sample longer than the budget gets
//! a micro-batch of its own). [`pack`], what the trainer uses, lays each
//! micro-batch out as one row of its samples end to end: the model's
//! attention mask numbers them, and each is attended alone
//! (`model/tiles.rs`), so the matmuls see no padding at all; only the
//! attention pads, each sample to the longest of its tile (the model groups
//! a row's samples by length into tiles, at most 10% of a sample's scores
//! on padding). Samples of one length get a row each (nothing to pad,
//! nothing to take apart). The
//! baselines, first-fit-decreasing ([`pack_ffd`], the fewest micro-batches
//! the budget allows) and input order ([`pack_in_order`]), pad a sample a
//! row to the longest.
//!
//! What a pass costs, in slots ([`PassCost`]): its slots; the attention's
//! scores, counted as `samples * longest^2` (each sample padded to the
//! micro-batch's longest: an upper bound since the tiles group lengths),
//! one slot's worth per `attention_span`; a
//! fixed cost (reading every weight, launching the kernels). [`pack`] sorts
//! the samples longest first and cuts that order into the runs of least
//! cost (exact, by dynamic programming over the cut points): one pass
//! where the budget allows and lengths are alike, a cut where one long
//! sample would pad the attention of many short ones more than a pass
//! costs.
//!
//! Padding waste = pad slots / all slots.

use std::cmp::Reverse;

/// One micro-batch: its rows, each the indices of the samples laid end to
/// end in it, its padded row length (the fullest row's) and its longest
/// sample's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroBatch {
    pub rows: Vec<Vec<usize>>,
    pub row_len: usize,
    pub longest: usize,
}

impl MicroBatch {
    /// A row per sample, padded to the longest.
    pub fn unpacked(lengths: &[usize], indices: Vec<usize>) -> Self {
        MicroBatch::of_rows(lengths, indices.into_iter().map(|i| vec![i]).collect())
    }

    /// The given rows of samples, each padded to the fullest.
    pub fn of_rows(lengths: &[usize], rows: Vec<Vec<usize>>) -> Self {
        let fill = |r: &Vec<usize>| r.iter().map(|&i| lengths[i]).sum::<usize>();
        MicroBatch {
            row_len: rows.iter().map(fill).max().unwrap_or(0),
            longest: rows
                .iter()
                .flatten()
                .map(|&i| lengths[i])
                .max()
                .unwrap_or(0),
            rows,
        }
    }

    pub fn slots(&self) -> usize {
        self.rows.len() * self.row_len
    }

    /// Its samples, row by row.
    pub fn samples(&self) -> impl Iterator<Item = usize> + '_ {
        self.rows.iter().flatten().copied()
    }

    /// Whether some row holds more than one sample.
    pub fn is_packed(&self) -> bool {
        self.rows.iter().any(|r| r.len() > 1)
    }
}

/// What a micro-batch's pass costs, in slots (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassCost {
    /// The fixed cost of a pass.
    pub overhead: usize,
    /// The sequence length at which a token's attention scores cost what
    /// the rest of its work does. `usize::MAX`: attention is free.
    pub attention_span: usize,
}

impl PassCost {
    /// A pass of `slots` slots over `samples` samples, attended each
    /// padded to `longest`.
    pub fn of(&self, slots: usize, samples: usize, longest: usize) -> usize {
        let scores = samples as u128 * (longest as u128).pow(2);
        let scores = (scores / self.attention_span.max(1) as u128).min(usize::MAX as u128);
        slots
            .saturating_add(scores as usize)
            .saturating_add(self.overhead)
    }

    /// [`PassCost::of`] a micro-batch.
    pub fn of_batch(&self, mb: &MicroBatch) -> usize {
        self.of(mb.slots(), mb.samples().count(), mb.longest)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Packing {
    pub micro_batches: Vec<MicroBatch>,
    /// Sum of the samples' lengths.
    pub real_tokens: usize,
}

impl Packing {
    /// Micro-batches of the given index sets (in that order), a sample a
    /// row, e.g. to test that any split gives the same gradient.
    pub fn from_groups(lengths: &[usize], groups: Vec<Vec<usize>>) -> Self {
        Packing {
            micro_batches: groups
                .into_iter()
                .map(|g| MicroBatch::unpacked(lengths, g))
                .collect(),
            real_tokens: lengths.iter().sum(),
        }
    }

    /// Micro-batches of the given rows of samples (in that order).
    pub fn from_rows(lengths: &[usize], micro_batches: Vec<Vec<Vec<usize>>>) -> Self {
        Packing {
            micro_batches: micro_batches
                .into_iter()
                .map(|rows| MicroBatch::of_rows(lengths, rows))
                .collect(),
            real_tokens: lengths.iter().sum(),
        }
    }

    pub fn slots(&self) -> usize {
        self.micro_batches.iter().map(MicroBatch::slots).sum()
    }

    /// Samples packed.
    pub fn samples(&self) -> usize {
        self.micro_batches
            .iter()
            .map(|mb| mb.samples().count())
            .sum()
    }

    /// Pad slots / all slots (0 when empty).
    pub fn padding_waste(&self) -> f64 {
        let slots = self.slots();
        if slots == 0 {
            return 0.0;
        }
        (slots - self.real_tokens) as f64 / slots as f64
    }

    /// What its passes cost in all, in slots.
    pub fn cost(&self, cost: PassCost) -> usize {
        self.micro_batches.iter().map(|mb| cost.of_batch(mb)).sum()
    }
}

/// The samples in micro-batches of at most `token_budget` tokens (or one
/// sample) whose [`PassCost`]s add up least, each one packed row (see the
/// module docs).
pub fn pack(lengths: &[usize], token_budget: usize, cost: PassCost) -> Packing {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable: equal lengths keep their input order, so packing is deterministic.
    order.sort_by_key(|&i| Reverse(lengths[i]));
    let n = order.len();
    // best[j]: the least cost of the first j samples of `order`, and where
    // the last run of that packing starts.
    let mut best = vec![(0usize, 0usize); n + 1];
    for j in 1..=n {
        let (mut choice, mut tokens) = ((usize::MAX, j - 1), 0);
        for i in (0..j).rev() {
            tokens += lengths[order[i]];
            // Longer runs only get longer: past the budget, stop (a run of
            // one always fits).
            if i + 1 < j && tokens > token_budget {
                break;
            }
            let run = cost.of(tokens, j - i, lengths[order[i]]);
            let total = best[i].0.saturating_add(run);
            if total < choice.0 {
                choice = (total, i);
            }
        }
        best[j] = choice;
    }
    let mut micro_batches = Vec::new();
    let mut end = n;
    while end > 0 {
        let start = best[end].1;
        let run = order[start..end].to_vec();
        micro_batches.push(if lengths[run[0]] == lengths[run[run.len() - 1]] {
            MicroBatch::unpacked(lengths, run)
        } else {
            MicroBatch::of_rows(lengths, vec![run])
        });
        end = start;
    }
    micro_batches.reverse();
    Packing {
        micro_batches,
        real_tokens: lengths.iter().sum(),
    }
}

/// First-fit-decreasing under `token_budget` slots per micro-batch, a
/// sample a row.
pub fn pack_ffd(lengths: &[usize], token_budget: usize) -> Packing {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable: equal lengths keep their input order, so packing is deterministic.
    order.sort_by_key(|&i| Reverse(lengths[i]));
    let mut bins: Vec<MicroBatch> = Vec::new();
    for i in order {
        match bins
            .iter_mut()
            .find(|b| (b.rows.len() + 1) * b.row_len <= token_budget)
        {
            Some(bin) => bin.rows.push(vec![i]),
            None => bins.push(MicroBatch::unpacked(lengths, vec![i])),
        }
    }
    Packing {
        micro_batches: bins,
        real_tokens: lengths.iter().sum(),
    }
}

/// Samples in input order, a sample a row, a new micro-batch whenever the
/// next would exceed the budget: the baseline FFD is measured against.
pub fn pack_in_order(lengths: &[usize], token_budget: usize) -> Packing {
    let mut bins: Vec<MicroBatch> = Vec::new();
    for (i, &len) in lengths.iter().enumerate() {
        match bins.last_mut() {
            Some(b) if (b.rows.len() + 1) * b.row_len.max(len) <= token_budget => {
                b.rows.push(vec![i]);
                b.row_len = b.row_len.max(len);
                b.longest = b.row_len;
            }
            _ => bins.push(MicroBatch::unpacked(lengths, vec![i])),
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

    const FREE: usize = usize::MAX;

    fn cost(overhead: usize, attention_span: usize) -> PassCost {
        PassCost {
            overhead,
            attention_span,
        }
    }

    /// Each index once; every micro-batch within the budget (or one sample
    /// alone), its `row_len` its fullest row's, `longest` its longest
    /// sample's.
    fn assert_valid(p: &Packing, lengths: &[usize], budget: usize) {
        let mut seen: Vec<usize> = p.micro_batches.iter().flat_map(|m| m.samples()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for mb in &p.micro_batches {
            assert_eq!(mb, &MicroBatch::of_rows(lengths, mb.rows.clone()));
            assert!(mb.rows.iter().all(|r| !r.is_empty()), "{mb:?}");
            assert!(mb.samples().count() == 1 || mb.slots() <= budget, "{mb:?}");
        }
    }

    /// A small deterministic generator (no dependency for a test).
    fn lengths(seed: u64, n: usize, min: usize, spread: u64) -> Vec<usize> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                min + ((x >> 33) % spread) as usize
            })
            .collect()
    }

    #[test]
    fn samples_of_different_lengths_share_one_row_and_nothing_pads() {
        let lens = [10, 9, 10, 9];
        let p = pack(&lens, 100, cost(5, FREE));
        assert_valid(&p, &lens, 100);
        assert_eq!(p.micro_batches.len(), 1);
        assert_eq!(p.micro_batches[0].rows, vec![vec![0, 2, 1, 3]]);
        assert_eq!(p.padding_waste(), 0.0);
        // The budget bounds a pass's tokens: two of 20 and 18, each of one
        // length, so a row a sample.
        let p = pack(&lens, 20, cost(5, FREE));
        assert_valid(&p, &lens, 20);
        assert_eq!(
            p.micro_batches,
            vec![
                MicroBatch::unpacked(&lens, vec![0, 2]),
                MicroBatch::unpacked(&lens, vec![1, 3])
            ]
        );
    }

    #[test]
    fn a_long_sample_is_cut_off_where_it_would_pad_the_attention_of_many() {
        // One pass: 140 + 5 * 100^2 / 100 + 5; two: 100 + 100 + 5, then
        // 40 + 4 * 10^2 / 100 + 5.
        let lens = [10, 100, 10, 10, 10];
        let p = pack(&lens, 1000, cost(5, 100));
        assert_eq!(
            p.micro_batches,
            vec![
                MicroBatch::unpacked(&lens, vec![1]),
                MicroBatch::unpacked(&lens, vec![0, 2, 3, 4])
            ]
        );
        // Attention free: one pass.
        assert_eq!(pack(&lens, 1000, cost(5, FREE)).micro_batches.len(), 1);
    }

    #[test]
    fn alike_lengths_pack_without_padding() {
        // The main job's kind of batch: 8-32 samples of 115-180 tokens.
        for seed in 0..20 {
            let lens = lengths(seed, 8 + 3 * seed as usize, 115, 66);
            let c = cost(64, 3072);
            let p = pack(&lens, 8192, c);
            assert_valid(&p, &lens, 8192);
            assert_eq!(p.padding_waste(), 0.0);
            // No costlier than all in one packed row, or a sample a row.
            let all: Vec<usize> = (0..lens.len()).collect();
            let one = Packing::from_rows(&lens, vec![vec![all.clone()]]);
            let padded = Packing::from_groups(&lens, vec![all]);
            assert!(p.cost(c) <= one.cost(c).min(padded.cost(c)), "seed {seed}");
        }
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
                for span in [FREE, 3000, 100] {
                    let c = cost(overhead, span);
                    let lens = lengths(seed, n, 20, spread);
                    let p = pack(&lens, budget, c);
                    assert_valid(&p, &lens, budget);
                    let ffd = pack_ffd(&lens, budget);
                    assert!(
                        p.cost(c) <= ffd.cost(c),
                        "seed {seed}: {} > {}",
                        p.cost(c),
                        ffd.cost(c)
                    );
                    assert!(p.padding_waste() == 0.0);
                }
            }
        }
    }

    #[test]
    fn a_long_sample_stands_alone() {
        let p = pack(&[500, 10, 10], 100, cost(8, FREE));
        assert_valid(&p, &[500, 10, 10], 100);
        assert_eq!(p.micro_batches[0].rows, vec![vec![0]]);
        assert!(pack(&[], 100, cost(8, FREE)).micro_batches.is_empty());
    }
}
