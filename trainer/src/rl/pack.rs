//! Packing samples into micro-batches under a token budget.
//!
//! A micro-batch is a padded `[rows, row_len]` tensor; a row holds one
//! sample, or several end to end (the model's attention mask keeps each to
//! itself, `Model::forward`). Its slots are `rows * row_len`, and the
//! budget bounds them (a sample longer than the budget gets a micro-batch
//! of its own). What a micro-batch costs ([`PassCost`]): its slots; the
//! attention's scores, `row_len^2` a row, so a long row costs more per
//! slot; and a fixed cost per pass (reading every weight, launching the
//! kernels), all counted in slots.
//!
//! [`pack`] (what the trainer uses) sorts the samples by length, longest
//! first, and cuts that order into the runs of least cost (exact, by
//! dynamic programming over the cut points, a sample a row): few
//! micro-batches where lengths are alike, more where one padded length
//! would waste more than a pass costs. Then each micro-batch is laid out in
//! the number of rows that costs least, the samples spread over them
//! longest first, each to the least filled row ([`lay_out`]): alike
//! lengths pair up into rows of alike fill, so the padding of one length
//! for all goes. Then neighbouring micro-batches merge where the merged one
//! laid out costs less than the two. First-fit-decreasing ([`pack_ffd`],
//! the fewest micro-batches the budget allows) and input order
//! ([`pack_in_order`]), a sample a row, are the baselines it is measured
//! against.
//!
//! Padding waste = pad slots / all slots.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One micro-batch: its rows, each the indices of the samples laid end to
/// end in it, and its padded row length (the fullest row's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroBatch {
    pub rows: Vec<Vec<usize>>,
    pub row_len: usize,
}

impl MicroBatch {
    /// A row per sample, padded to the longest.
    pub fn unpacked(lengths: &[usize], indices: Vec<usize>) -> Self {
        MicroBatch {
            row_len: indices.iter().map(|&i| lengths[i]).max().unwrap_or(0),
            rows: indices.into_iter().map(|i| vec![i]).collect(),
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
    /// The row length at which a token's attention scores cost what the
    /// rest of its work does: a row of `L` slots costs `L * (1 + L /
    /// attention_span)`. `usize::MAX`: attention is free.
    pub attention_span: usize,
}

impl PassCost {
    /// A pass over `rows` rows of `row_len` slots.
    pub fn of(&self, rows: usize, row_len: usize) -> usize {
        let slots = rows * row_len;
        let scores = (slots as u128 * row_len as u128 / self.attention_span.max(1) as u128)
            .min(usize::MAX as u128) as usize;
        slots.saturating_add(scores).saturating_add(self.overhead)
    }

    /// [`PassCost::of`] a micro-batch.
    pub fn of_batch(&self, mb: &MicroBatch) -> usize {
        self.of(mb.rows.len(), mb.row_len)
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
        Packing::from_rows(
            lengths,
            groups
                .into_iter()
                .map(|g| g.into_iter().map(|i| vec![i]).collect())
                .collect(),
        )
    }

    /// Micro-batches of the given rows of samples (in that order).
    pub fn from_rows(lengths: &[usize], micro_batches: Vec<Vec<Vec<usize>>>) -> Self {
        let micro_batches = micro_batches
            .into_iter()
            .map(|rows| MicroBatch {
                row_len: rows
                    .iter()
                    .map(|r| r.iter().map(|&i| lengths[i]).sum())
                    .max()
                    .unwrap_or(0),
                rows,
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

/// The samples in `token_budget`-slot micro-batches of least [`PassCost`]
/// (see the module docs).
pub fn pack(lengths: &[usize], token_budget: usize, cost: PassCost) -> Packing {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable: equal lengths keep their input order, so packing is deterministic.
    order.sort_by_key(|&i| Reverse(lengths[i]));
    let mut micro_batches: Vec<MicroBatch> = cut_runs(lengths, &order, token_budget, cost)
        .into_iter()
        .map(|run| lay_out(lengths, run, token_budget, cost))
        .collect();
    merge_neighbours(lengths, &mut micro_batches, token_budget, cost);
    Packing {
        micro_batches,
        real_tokens: lengths.iter().sum(),
    }
}

/// `order` (longest first) cut into the runs whose passes, a sample a row,
/// cost least.
fn cut_runs(
    lengths: &[usize],
    order: &[usize],
    token_budget: usize,
    cost: PassCost,
) -> Vec<Vec<usize>> {
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
            let total = best[i].0.saturating_add(cost.of(rows, len));
            if total < choice.0 {
                choice = (total, i);
            }
        }
        best[j] = choice;
    }
    let mut runs = Vec::new();
    let mut end = n;
    while end > 0 {
        let start = best[end].1;
        runs.push(order[start..end].to_vec());
        end = start;
    }
    runs.reverse();
    runs
}

/// `samples` (longest first) in the number of rows whose pass costs least
/// within the budget, a sample a row unless fewer rows cost less: for each
/// count tried (`ceil(n / k)`, `k` samples a row on average), the samples
/// go longest first each to the least filled row (ties: the first).
fn lay_out(
    lengths: &[usize],
    samples: Vec<usize>,
    token_budget: usize,
    cost: PassCost,
) -> MicroBatch {
    let n = samples.len();
    let mut best = MicroBatch::unpacked(lengths, samples.clone());
    let mut best_cost = cost.of_batch(&best);
    let mut last = n;
    for k in 2..=n {
        let rows = n.div_ceil(k);
        if rows == last {
            continue;
        }
        last = rows;
        let mut heap: BinaryHeap<Reverse<(usize, usize)>> =
            (0..rows).map(|r| Reverse((0, r))).collect();
        let mut laid = vec![Vec::new(); rows];
        for &i in &samples {
            let Some(Reverse((fill, r))) = heap.pop() else {
                break;
            };
            laid[r].push(i);
            heap.push(Reverse((fill + lengths[i], r)));
        }
        let row_len = heap
            .into_iter()
            .map(|Reverse((fill, _))| fill)
            .max()
            .unwrap_or(0);
        let c = cost.of(rows, row_len);
        if rows * row_len <= token_budget && c < best_cost {
            best_cost = c;
            best = MicroBatch {
                rows: laid,
                row_len,
            };
        }
    }
    best
}

/// Merges neighbouring micro-batches (laid out anew) while some merge
/// costs less than the two passes.
fn merge_neighbours(
    lengths: &[usize],
    micro_batches: &mut Vec<MicroBatch>,
    token_budget: usize,
    cost: PassCost,
) {
    let mut k = 0;
    while k + 1 < micro_batches.len() {
        let (a, b) = (&micro_batches[k], &micro_batches[k + 1]);
        let apart = cost.of_batch(a) + cost.of_batch(b);
        let mut both: Vec<usize> = a.samples().chain(b.samples()).collect();
        both.sort_by_key(|&i| Reverse(lengths[i]));
        let merged = lay_out(lengths, both, token_budget, cost);
        if merged.slots() <= token_budget && cost.of_batch(&merged) < apart {
            micro_batches[k] = merged;
            micro_batches.remove(k + 1);
            // The merged one may now merge with its left neighbour too.
            k = k.saturating_sub(1);
        } else {
            k += 1;
        }
    }
}

/// First-fit-decreasing under `token_budget` slots per micro-batch.
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

/// Samples in input order, a new micro-batch whenever the next would exceed
/// the budget: the baseline FFD is measured against.
pub fn pack_in_order(lengths: &[usize], token_budget: usize) -> Packing {
    let mut bins: Vec<MicroBatch> = Vec::new();
    for (i, &len) in lengths.iter().enumerate() {
        match bins.last_mut() {
            Some(b) if (b.rows.len() + 1) * b.row_len.max(len) <= token_budget => {
                b.rows.push(vec![i]);
                b.row_len = b.row_len.max(len);
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
    /// alone), its `row_len` its fullest row's.
    fn assert_valid(p: &Packing, lengths: &[usize], budget: usize) {
        let mut seen: Vec<usize> = p.micro_batches.iter().flat_map(|m| m.samples()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for mb in &p.micro_batches {
            let fullest = mb
                .rows
                .iter()
                .map(|r| r.iter().map(|&i| lengths[i]).sum::<usize>())
                .max()
                .unwrap_or(0);
            assert_eq!(mb.row_len, fullest);
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
    fn a_pass_is_split_off_where_its_padding_costs_more_than_the_pass() {
        // Attention dear (a row of L costs L * (1 + L)): no sharing rows.
        // One micro-batch: 40 * 11 + 3; two: 20 * 11 + 3 + 4 * 3 + 3.
        let p = pack(&[10, 2, 10, 2], 100, cost(3, 1));
        assert_eq!(
            p.micro_batches,
            vec![
                MicroBatch::unpacked(&[10, 2, 10, 2], vec![0, 2]),
                MicroBatch::unpacked(&[10, 2, 10, 2], vec![1, 3]),
            ]
        );
        assert_eq!(p.padding_waste(), 0.0);
        // A pass that costs more than the padding it would save: one (40
        // + 20 + 5 against 20 + 10 + 5 + 18 + 8 + 5; rows of 19: 38 + 36).
        let p = pack(&[10, 9, 10, 9], 100, cost(5, 20));
        assert_eq!(p.micro_batches.len(), 1);
        assert_eq!(p.slots(), 40);
    }

    #[test]
    fn short_samples_share_rows_where_that_costs_less() {
        // Attention free: 10 + 9 twice is 38 slots, against 40 padded.
        let lens = [10, 9, 10, 9];
        let p = pack(&lens, 100, cost(5, FREE));
        assert_eq!(
            p.micro_batches,
            vec![MicroBatch {
                rows: vec![vec![0, 1], vec![2, 3]],
                row_len: 19
            }]
        );
        assert_eq!(p.padding_waste(), 0.0);
        // Rows of 19 at a span of 10 cost 38 * 2.9, four of 10 40 * 2.
        let p = pack(&lens, 100, cost(5, 10));
        assert!(!p.micro_batches[0].is_packed());
        // Two passes' worth of samples merge into one packed pass: [10, 10]
        // and [2, 2] cost 20 + 4 + 2 * 3, rows of 12 cost 24 + 3.
        let p = pack(&[10, 2, 10, 2], 100, cost(3, FREE));
        assert_eq!(p.micro_batches.len(), 1);
        assert_eq!(p.micro_batches[0].rows, vec![vec![0, 1], vec![2, 3]]);
        // Unless the budget says no (24 slots > 20).
        let p = pack(&[10, 2, 10, 2], 20, cost(3, FREE));
        assert_valid(&p, &[10, 2, 10, 2], 20);
        assert_eq!(p.micro_batches.len(), 2);
    }

    #[test]
    fn alike_lengths_pack_with_little_padding() {
        // The main job's kind of batch: 16 samples of 35-50 tokens, one
        // pass; padded to the longest they waste ~15%.
        for seed in 0..20 {
            let lens = lengths(seed, 16, 35, 16);
            let c = cost(64, 3073);
            let p = pack(&lens, 16_384, c);
            assert_valid(&p, &lens, 16_384);
            let one = Packing {
                micro_batches: vec![MicroBatch::unpacked(&lens, (0..16).collect())],
                real_tokens: lens.iter().sum(),
            };
            assert!(p.cost(c) <= one.cost(c));
            assert!(p.padding_waste() <= 0.05, "seed {seed}: {p:?}");
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
                }
            }
        }
    }

    #[test]
    fn without_an_overhead_nothing_is_padded_and_a_long_sample_stands_alone() {
        let lens = lengths(7, 40, 20, 30);
        assert_eq!(pack(&lens, 1 << 20, cost(0, FREE)).padding_waste(), 0.0);
        let p = pack(&[500, 10, 10], 100, cost(8, FREE));
        assert_valid(&p, &[500, 10, 10], 100);
        assert_eq!(p.micro_batches[0].rows, vec![vec![0]]);
        assert!(pack(&[], 100, cost(8, FREE)).micro_batches.is_empty());
    }
}
