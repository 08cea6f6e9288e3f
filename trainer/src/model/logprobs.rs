//! The logprob convention shared by the trainer and the engine.

use tch::{Kind, Tensor};

use super::{Model, ModelError};

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
    /// the padding; the values where asked are the full forward's.
    pub fn logprobs_at(
        &self,
        tokens: &Tensor,
        attention_mask: Option<&Tensor>,
        temperature: f64,
        at: &Tensor,
    ) -> Result<PickedLogprobs, ModelError> {
        let hidden = self.hidden_states(tokens, attention_mask)?;
        let [b, t, h] = hidden.size()[..] else {
            return Err(ModelError::Input("hidden states are not [B, T, H]".into()));
        };
        let cols = t - 1;
        if at.size() != [b, cols] {
            return Err(ModelError::Input(format!(
                "positions {:?} != the logprob grid {:?}",
                at.size(),
                [b, cols]
            )));
        }
        let device = hidden.device();
        // Grid cell `r * cols + c` is hidden row `r * t + c`, and predicts
        // token `r * t + c + 1`.
        let cells = at
            .to_device(device)
            .reshape([b * cols])
            .gt(0.0)
            .nonzero()
            .squeeze_dim(1);
        let rows = cells.floor_divide_scalar(cols) * t + cells.remainder(cols);
        let logits = self.head(&hidden.reshape([b * t, h]).index_select(0, &rows));
        let targets = tokens
            .to_device(device)
            .reshape([b * t])
            .index_select(0, &(rows + 1))
            .unsqueeze(-1);
        let picked = (logits.to_kind(Kind::Float) / temperature)
            .log_softmax(-1, None)
            .gather(1, &targets, false)
            .squeeze_dim(-1);
        let logprobs = Tensor::zeros([b * cols], (Kind::Float, device))
            .index_put(&[Some(cells)], &picked, false)
            .view([b, cols]);
        Ok(PickedLogprobs { logprobs, logits })
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
    let scaled = logits.narrow(1, 0, t - 1).to_kind(Kind::Float) / temperature;
    let targets = tokens
        .narrow(1, 1, t - 1)
        .to_device(logits.device())
        .unsqueeze(-1);
    scaled
        .log_softmax(-1, None)
        .gather(2, &targets, false)
        .squeeze_dim(-1)
}
