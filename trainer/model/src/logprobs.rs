//! The logprob convention shared by the trainer and the engine.

use tch::{Kind, Tensor};

use super::{Model, ModelError, fused};

/// [`Model::logprobs_at`]'s result.
pub struct PickedLogprobs {
    /// `[B, T - 1]` f32: [`token_logprobs`] where asked, with autograd; 0
    /// (no graph) elsewhere.
    pub logprobs: Tensor,
    /// The logits of the positions asked for, `[N, V]` in the model dtype,
    /// in row-major order of the grid.
    pub logits: Tensor,
}

impl Model {
    /// [`token_logprobs`] of [`Model::forward`], computed only at the
    /// positions where `at` (`[B, T - 1]`) is positive: the final norm, the
    /// LM head and the log-softmax run on those rows alone. A training
    /// step's loss has weight only on response tokens, so the head (often
    /// the step's largest matmuls, vocabulary-wide) skips the prompts and
    /// the padding; the values where asked are the full forward's. f32
    /// logits on the CPU take one fused op ([`fused::token_logprobs`]).
    pub fn logprobs_at(
        &self,
        tokens: &Tensor,
        attention_mask: Option<&Tensor>,
        temperature: f64,
        at: &Tensor,
    ) -> Result<PickedLogprobs, ModelError> {
        let hidden = self.hidden_states(tokens, attention_mask)?;
        let picked = Picked::of(at, &tokens.to_device(hidden.device()))?;
        let logits = self.head(&picked.select(&hidden));
        let lp =
            fused::token_logprobs(&logits, &picked.targets, temperature).unwrap_or_else(|| {
                at_temperature(&logits, temperature)
                    .log_softmax(-1, None)
                    .gather(1, &picked.targets.unsqueeze(-1), false)
                    .squeeze_dim(-1)
            });
        let logprobs = picked.scatter(&lp);
        Ok(PickedLogprobs { logprobs, logits })
    }
}

/// The cells of a `[B, T - 1]` logprob grid a caller asks for, and where
/// they lie in a `[B, T]` forward.
pub(super) struct Picked {
    /// Grid cells (`r * (T - 1) + c`), ascending.
    pub cells: Tensor,
    /// The hidden-state row of each (`r * T + c`).
    pub rows: Tensor,
    /// The token each predicts (`tokens[r, c + 1]`).
    pub targets: Tensor,
    /// The forward's `[B, T]`.
    forward: [i64; 2],
}

impl Picked {
    /// The cells where `at` (`[B, T - 1]`) is positive, for `tokens` `[B, T]`.
    pub fn of(at: &Tensor, tokens: &Tensor) -> Result<Self, ModelError> {
        let [b, t] = tokens.size()[..] else {
            return Err(ModelError::Input(format!(
                "tokens must be [B, T], got {:?}",
                tokens.size()
            )));
        };
        let cols = t - 1;
        if at.size() != [b, cols] {
            return Err(ModelError::Input(format!(
                "positions {:?} != the logprob grid {:?}",
                at.size(),
                [b, cols]
            )));
        }
        let device = tokens.device();
        let cells = at
            .to_device(device)
            .reshape([b * cols])
            .gt(0.0)
            .nonzero()
            .squeeze_dim(1);
        let rows = cells.floor_divide_scalar(cols) * t + cells.remainder(cols);
        let targets = tokens.reshape([b * t]).index_select(0, &(&rows + 1));
        Ok(Self {
            cells,
            rows,
            targets,
            forward: [b, t],
        })
    }

    /// How many cells.
    pub fn len(&self) -> i64 {
        self.cells.size()[0]
    }

    /// `values` (`[N]`, one per cell) laid on the grid, 0 elsewhere; the
    /// gradient flows back to `values`.
    pub fn scatter(&self, values: &Tensor) -> Tensor {
        let [b, t] = self.forward;
        Tensor::zeros([b * (t - 1)], (Kind::Float, values.device()))
            .index_put(&[Some(&self.cells)], values, false)
            .view([b, t - 1])
    }

    /// The grid's `[B, T - 1]` values at the cells: `[N]`.
    pub fn gather(&self, grid: &Tensor) -> Tensor {
        let [b, t] = self.forward;
        grid.to_device(self.cells.device())
            .reshape([b * (t - 1)])
            .index_select(0, &self.cells)
    }

    /// The hidden states `[B, T, H]` of the cells' rows: `[N, H]`.
    pub fn select(&self, hidden: &Tensor) -> Tensor {
        let [b, t] = self.forward;
        hidden.reshape([b * t, -1]).index_select(0, &self.rows)
    }

    /// [`Picked::select`]'s inverse: `rows` (`[N, H]`) laid into
    /// `[B, T, H]`, 0 on the other rows.
    pub fn spread(&self, rows: &Tensor) -> Tensor {
        let ([b, t], h) = (self.forward, rows.size()[1]);
        Tensor::zeros([b * t, h], (rows.kind(), rows.device()))
            .index_add(0, &self.rows, rows)
            .view([b, t, h])
    }
}

/// `logits / temperature` in f32. At temperature 1 the division is left
/// out: it changes no value, and on a head's `[N, V]` logits it costs a
/// pass over them forward and another backward.
pub fn at_temperature(logits: &Tensor, temperature: f64) -> Tensor {
    let logits = logits.to_kind(Kind::Float);
    if temperature == 1.0 {
        logits
    } else {
        logits / temperature
    }
}

/// Log-probabilities of each next token under `logits` (as returned by
/// [`super::Model::forward`]): `out[b, t] = log_softmax(logits[b, t] /
/// temperature)[tokens[b, t + 1]]`, shape `[B, T - 1]`, in f32.
///
/// Always computed in f32 whatever the model dtype, and with the same
/// `temperature` the engine sampled with, so trainer and engine logprobs of a
/// token are comparable (importance ratios). Entries whose target is padding
/// are meaningless; mask them.
pub fn token_logprobs(logits: &Tensor, tokens: &Tensor, temperature: f64) -> Tensor {
    let t = logits.size()[1];
    let scaled = at_temperature(&logits.narrow(1, 0, t - 1), temperature);
    let targets = tokens
        .narrow(1, 1, t - 1)
        .to_device(logits.device())
        .unsqueeze(-1);
    scaled
        .log_softmax(-1, None)
        .gather(2, &targets, false)
        .squeeze_dim(-1)
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    /// At temperature 1 the f32 logits are returned as they are (no pass
    /// over them, no graph node); otherwise divided.
    #[test]
    fn temperature_one_leaves_the_logits_alone() {
        let logits = Tensor::randn([3, 7], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let same = at_temperature(&logits, 1.0);
        assert_eq!(same.data_ptr(), logits.data_ptr());
        assert!(same.equal(&logits));
        let hot = at_temperature(&logits, 0.5);
        assert_ne!(hot.data_ptr(), logits.data_ptr());
        assert!(hot.allclose(&(&logits * 2.0), 0.0, 0.0, false));
        // bf16 logits come back in f32 at either temperature.
        let half = logits.detach().to_kind(Kind::BFloat16);
        assert_eq!(at_temperature(&half, 1.0).kind(), Kind::Float);
    }
}
