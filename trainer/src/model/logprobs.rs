//! The logprob convention shared by the trainer and the engine.

use tch::{Kind, Tensor};

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
