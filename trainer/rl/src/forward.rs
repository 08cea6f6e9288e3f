//! A step's forward (and backward) over its micro-batches, the plain one
//! (the head's logprobs with autograd) or the lean one (activation
//! checkpointing, a chunked head: [`Lean`]), adding up their
//! [`StepSums`].

use tch::Tensor;

use crate::RlError;
use crate::autocast::with_bf16_autocast;
use crate::batch::UpdateBatch;
use crate::config::StepConfig;
use crate::layout::{Grid, Layout};
use crate::loss::{LossOutput, TokenInputs, token_loss};
use crate::pack::Packing;
use crate::stats::{StepSums, scalar};
use agl_model::{Lean, Model, at_temperature};

/// Forward (+ backward) over `packing`, returning the token sums.
pub(crate) fn run_sums(
    model: &Model,
    batch: &UpdateBatch,
    packing: &Packing,
    cfg: &StepConfig,
    backward: bool,
) -> Result<StepSums, RlError> {
    let device = model.device();
    let mut sums = StepSums::default();
    // Each micro-batch's large tensors reuse the blocks the last one freed.
    let _reuse = crate::memory::reuse_freed_blocks();
    // LoRA dropout only where gradients flow.
    model.set_lora_training(backward);
    let lean = cfg.lean != Lean::default();
    for mb in &packing.micro_batches {
        let layout = Layout::new(batch, mb, device);
        let g = Grid::new(batch, &layout.samples, device);
        // The head only where the loss has weight (see `logprobs_at`).
        let at = layout.to_forward(&g.trainable);
        if lean {
            sums.add(&lean_micro_batch(model, &layout, &at, &g, cfg, backward)?);
            continue;
        }
        let picked = with_bf16_autocast(autocast(model, cfg), || {
            model.logprobs_at(&layout.tokens, Some(&layout.mask), cfg.temperature, &at)
        })?;
        let new = layout.to_samples(&picked.logprobs);
        let out = grid_loss(&new, &g, cfg);
        if backward {
            out.loss.backward();
        }
        let entropy = if cfg.entropy {
            tch::no_grad(|| entropy_sum(&picked.logits, cfg.temperature))?
        } else {
            0.0
        };
        sums.add(&StepSums::from_output(out, &g, entropy)?);
    }
    model.set_lora_training(false);
    Ok(sums)
}

/// One micro-batch through [`Model::lean_forward`] / `lean_backward`: the
/// loss on the logprobs as a leaf, its gradient handed to the model.
fn lean_micro_batch(
    model: &Model,
    layout: &Layout,
    at: &Tensor,
    g: &Grid,
    cfg: &StepConfig,
    backward: bool,
) -> Result<StepSums, RlError> {
    let bf16 = autocast(model, cfg);
    let entropy_at = cfg.entropy.then_some(at);
    let fwd = with_bf16_autocast(bf16, || {
        model.lean_forward(
            &layout.tokens,
            Some(&layout.mask),
            cfg.temperature,
            cfg.lean,
            at,
            entropy_at,
        )
    })?;
    // The leaf on the forward's grid, so its gradient is what
    // `lean_backward` takes.
    let leaf = fwd.logprobs.detach().set_requires_grad(backward);
    let new = layout.to_samples(&leaf);
    let out = grid_loss(&new, g, cfg);
    let entropy = fwd.entropy_sum;
    if backward {
        out.loss.backward();
        let grad = leaf.grad();
        if grad.defined() {
            with_bf16_autocast(bf16, || model.lean_backward(fwd, &grad))?;
        }
    }
    StepSums::from_output(out, g, entropy)
}

/// The loss of a micro-batch's logprobs `new` (on the sample grid `g`):
/// `old` is the sample's own where it carries one, else `new` detached.
fn grid_loss(new: &Tensor, g: &Grid, cfg: &StepConfig) -> LossOutput {
    let old = g.old.where_self(&g.has_old.gt(0.5), &new.detach());
    token_loss(
        &TokenInputs {
            new,
            old: &old,
            engine: &g.engine,
            advantage: &g.advantage,
            weight: &g.weight,
            trainable: &g.trainable,
            reference: Some((&g.reference, &g.has_ref)),
        },
        &cfg.loss,
    )
}

/// Sum of the policy entropy over rows of logits (`[N, V]`).
fn entropy_sum(logits: &Tensor, temperature: f64) -> Result<f64, RlError> {
    let logp = at_temperature(&logits.detach(), temperature).log_softmax(-1, None);
    scalar(&-(logp.exp() * &logp))
}

/// Whether `model`'s forward runs under bf16 autocast (`bf16_autocast`,
/// CUDA only).
pub(crate) fn autocast(model: &Model, cfg: &StepConfig) -> bool {
    cfg.bf16_autocast && model.device().is_cuda()
}
