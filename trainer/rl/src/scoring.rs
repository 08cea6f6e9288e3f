//! Scoring a batch without gradients: the trainer's own logprobs as every
//! sample's `old_logprobs` (several optimizer steps on one batch), or a
//! reference model's as its `ref_logprobs` (the KL term).

use tch::Device;

use crate::RlError;
use crate::autocast::with_bf16_autocast;
use crate::batch::{TrainSample, UpdateBatch};
use crate::config::StepConfig;
use crate::forward::autocast;
use crate::layout::{Layout, response_cells};
use crate::pack::pack;
use crate::step::{lengths, pass_cost};
use agl_model::{Lean, Model};

/// Stores the current trainer logprobs as every sample's `old_logprobs`.
pub fn score_old_logprobs(
    model: &Model,
    batch: &mut UpdateBatch,
    cfg: &StepConfig,
) -> Result<(), RlError> {
    score_logprobs(model, batch, cfg, |s, lp| s.old_logprobs = Some(lp))
}

/// Stores `reference`'s logprobs as every sample's `ref_logprobs` (the KL
/// term's reference, `kl_coef`).
pub fn score_ref_logprobs(
    reference: &Model,
    batch: &mut UpdateBatch,
    cfg: &StepConfig,
) -> Result<(), RlError> {
    score_logprobs(reference, batch, cfg, |s, lp| s.ref_logprobs = Some(lp))
}

/// `model`'s logprobs of each sample's response tokens, handed to `set`.
fn score_logprobs(
    model: &Model,
    batch: &mut UpdateBatch,
    cfg: &StepConfig,
    set: impl Fn(&mut TrainSample, Vec<f32>),
) -> Result<(), RlError> {
    let packing = pack(&lengths(batch), cfg.token_budget, pass_cost(model, cfg));
    let _reuse = crate::memory::reuse_freed_blocks();
    tch::no_grad(|| {
        for mb in &packing.micro_batches {
            let layout = Layout::new(batch, mb, model.device());
            let (tokens, mask) = (&layout.tokens, &layout.mask);
            // The head only on the response tokens (see `logprobs_at`).
            let at = layout.to_forward(&response_cells(batch, &layout.samples, model.device()));
            let lp = if cfg.lean.logprob_chunk > 0 {
                // Without a graph, checkpointing saves nothing: only the
                // chunked head matters.
                let lean = Lean {
                    checkpoint_layers: false,
                    ..cfg.lean
                };
                with_bf16_autocast(autocast(model, cfg), || {
                    model.lean_forward(tokens, Some(mask), cfg.temperature, lean, &at, None)
                })?
                .logprobs
            } else {
                with_bf16_autocast(autocast(model, cfg), || {
                    model.logprobs_at(tokens, Some(mask), cfg.temperature, &at)
                })?
                .logprobs
            };
            let lp = layout.to_samples(&lp).to_device(Device::Cpu);
            for (row, &i) in layout.samples.iter().enumerate() {
                let s = &mut batch.samples[i];
                let n = s.len() - s.prompt_len;
                let start = (s.prompt_len - 1) as i64;
                let row = lp.get(row as i64).narrow(0, start, n as i64);
                set(s, Vec::<f32>::try_from(row)?);
            }
        }
        Ok(())
    })
}
