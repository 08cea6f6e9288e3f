//! A micro-batch's tensors: the forward's `[rows, row_len]` tokens and
//! attention mask, and the samples' logprob grid the loss reads.
//!
//! The loss works on the samples' grid, `[samples, max_len - 1]`, a row a
//! sample (a sequence's correction and statistics are its row's,
//! `loss.rs`): response token `k` of a sample with prompt length `p` is
//! column `p + k - 1`. Where the micro-batch packs samples end to end into
//! shared rows (their attention-mask ids 1, 2, ..., `Model::forward`), the
//! forward's `[rows, row_len - 1]` grid is another: [`Layout::to_samples`]
//! and [`Layout::to_forward`] move values between the two, with autograd.
//! A row a sample, the grids are one and nothing moves.

use tch::{Device, Tensor};

use super::batch::UpdateBatch;
use super::pack::MicroBatch;

pub(crate) struct Layout {
    /// `[rows, row_len]` right-padded tokens (pad id 0).
    pub tokens: Tensor,
    /// `[rows, row_len]`: 0 on padding, else the token's sample's place in
    /// its row, from 1.
    pub mask: Tensor,
    /// The samples, in the samples' grid's row order.
    pub samples: Vec<usize>,
    /// Packed rows only: the cell maps between the grids.
    map: Option<CellMap>,
}

struct CellMap {
    /// Each samples'-grid cell's forward-grid cell; cells off every
    /// sample's logprobs point one past the forward grid.
    to_samples: Tensor,
    /// Each forward-grid cell's samples'-grid cell, likewise.
    to_forward: Tensor,
    samples_grid: [i64; 2],
    forward_grid: [i64; 2],
}

impl Layout {
    pub fn new(batch: &UpdateBatch, mb: &MicroBatch, device: Device) -> Self {
        let (rows, len) = (mb.rows.len(), mb.row_len);
        let mut tokens = vec![0i64; rows * len];
        let mut mask = vec![0i64; rows * len];
        for (r, row) in mb.rows.iter().enumerate() {
            let mut at = r * len;
            for (place, &i) in row.iter().enumerate() {
                let s = &batch.samples[i].tokens;
                tokens[at..at + s.len()].copy_from_slice(s);
                mask[at..at + s.len()].fill(place as i64 + 1);
                at += s.len();
            }
        }
        let shape = [rows as i64, len as i64];
        let tensor = |v: Vec<i64>| Tensor::from_slice(&v).view(shape).to_device(device);
        let samples: Vec<usize> = mb.samples().collect();
        Layout {
            tokens: tensor(tokens),
            mask: tensor(mask),
            map: mb
                .is_packed()
                .then(|| CellMap::new(batch, mb, &samples, device)),
            samples,
        }
    }

    /// The forward grid's `[rows, row_len - 1]` values on the samples'
    /// grid (0 where no sample has a logprob).
    pub fn to_samples(&self, forward: &Tensor) -> Tensor {
        match &self.map {
            Some(m) => moved(forward, &m.to_samples, m.samples_grid),
            None => forward.shallow_clone(),
        }
    }

    /// The samples' grid's values on the forward's `[rows, row_len - 1]`
    /// grid (0 off the samples' cells).
    pub fn to_forward(&self, samples: &Tensor) -> Tensor {
        match &self.map {
            Some(m) => moved(samples, &m.to_forward, m.forward_grid),
            None => samples.shallow_clone(),
        }
    }
}

impl CellMap {
    fn new(batch: &UpdateBatch, mb: &MicroBatch, order: &[usize], device: Device) -> Self {
        let fcols = mb.row_len - 1;
        let forward_cells = mb.rows.len() * fcols;
        let (samples, scols) = grid_shape(batch, order);
        let mut to_samples = vec![forward_cells as i64; samples * scols];
        let mut to_forward = vec![(samples * scols) as i64; forward_cells];
        let mut row_of_samples = 0;
        for (r, row) in mb.rows.iter().enumerate() {
            let mut offset = 0;
            for &i in row {
                let n = batch.samples[i].len();
                // A sample's n tokens give n - 1 logprobs (the last
                // predicts the next sample's first token: no cell).
                for c in 0..n - 1 {
                    let (s, f) = (row_of_samples * scols + c, r * fcols + offset + c);
                    to_samples[s] = f as i64;
                    to_forward[f] = s as i64;
                }
                offset += n;
                row_of_samples += 1;
            }
        }
        let index = |v: Vec<i64>| Tensor::from_slice(&v).to_device(device);
        CellMap {
            to_samples: index(to_samples),
            to_forward: index(to_forward),
            samples_grid: [samples as i64, scols as i64],
            forward_grid: [mb.rows.len() as i64, fcols as i64],
        }
    }
}

/// `values`' cells picked by `index` (one past the end: 0), as `shape`.
fn moved(values: &Tensor, index: &Tensor, shape: [i64; 2]) -> Tensor {
    let zero = Tensor::zeros([1], (values.kind(), values.device()));
    Tensor::cat(&[&values.reshape([-1]), &zero], 0)
        .index_select(0, index)
        .view(shape)
}

/// 1 on the cells of the samples' grid that predict a response token,
/// else 0.
pub(crate) fn response_cells(batch: &UpdateBatch, samples: &[usize], device: Device) -> Tensor {
    let (rows, cols) = grid_shape(batch, samples);
    let mut cells = vec![0f32; rows * cols];
    for (r, &i) in samples.iter().enumerate() {
        let s = &batch.samples[i];
        cells[r * cols + s.prompt_len - 1..r * cols + s.len() - 1].fill(1.0);
    }
    Tensor::from_slice(&cells)
        .view([rows as i64, cols as i64])
        .to_device(device)
}

/// The samples' grid's `[samples, max_len - 1]`.
fn grid_shape(batch: &UpdateBatch, samples: &[usize]) -> (usize, usize) {
    let longest = samples.iter().map(|&i| batch.samples[i].len()).max();
    (samples.len(), longest.unwrap_or(1) - 1)
}

/// Per-token inputs laid out on the samples' grid.
pub(crate) struct Grid {
    pub weight: Tensor,
    pub advantage: Tensor,
    pub trainable: Tensor,
    pub old: Tensor,
    pub has_old: Tensor,
    pub engine: Tensor,
    pub reference: Tensor,
    pub has_ref: Tensor,
}

impl Grid {
    pub fn new(batch: &UpdateBatch, samples: &[usize], device: Device) -> Self {
        let (rows, cols) = grid_shape(batch, samples);
        let zeros = || vec![0f32; rows * cols];
        let (mut weight, mut advantage, mut trainable) = (zeros(), zeros(), zeros());
        let (mut old, mut has_old, mut engine) = (zeros(), zeros(), zeros());
        let (mut reference, mut has_ref) = (zeros(), zeros());
        for (r, &i) in samples.iter().enumerate() {
            let s = &batch.samples[i];
            let base = r * cols + s.prompt_len - 1;
            for (k, &w) in s.weights.iter().enumerate() {
                let c = base + k;
                weight[c] = w;
                advantage[c] = s.advantage;
                trainable[c] = if w > 0.0 { 1.0 } else { 0.0 };
                engine[c] = s.engine_logprobs[k];
                if let Some(o) = &s.old_logprobs {
                    old[c] = o[k];
                    has_old[c] = 1.0;
                }
                if let Some(rl) = &s.ref_logprobs {
                    reference[c] = rl[k];
                    has_ref[c] = 1.0;
                }
            }
        }
        let tensor = |v: Vec<f32>| {
            Tensor::from_slice(&v)
                .view([rows as i64, cols as i64])
                .to_device(device)
        };
        Grid {
            weight: tensor(weight),
            advantage: tensor(advantage),
            trainable: tensor(trainable),
            old: tensor(old),
            has_old: tensor(has_old),
            engine: tensor(engine),
            reference: tensor(reference),
            has_ref: tensor(has_ref),
        }
    }
}
