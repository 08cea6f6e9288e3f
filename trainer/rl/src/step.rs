//! One optimizer update over an [`UpdateBatch`].
//!
//! [`train_step`], on one rank or every rank of a [`Collective`]: zero the
//! gradients, pack the samples that can move the
//! weights (`pack`: runs of the longest-first order under `token_budget`,
//! each one row of its samples end to end, cut where one long sample would
//! pad the attention of many short ones more than a pass costs,
//! [`pass_cost`]; zero-advantage samples without a KL term are left out),
//! run forward + backward per micro-batch of this rank's share
//! (`forward.rs`, `layout.rs`; gradients accumulate; the fixed weights make
//! the sum exactly the batch gradient), sum the ranks' gradients, clip the
//! global gradient norm, set the scheduled learning rate, AdamW step
//! (`optimizer.rs`), hand sharded parameters to every rank.
//!
//! `logp_old` (the trainer's logprobs at the start of the update) defaults to
//! the detached logprobs of the training forward itself: with one optimizer
//! step per update batch these are the same numbers, and it saves a forward.
//! To take several optimizer steps on one batch (PPO epochs), call
//! [`crate::score_old_logprobs`] once first so every step uses the same `old`.
//!
//! Mixed precision: bf16 autocast on CUDA when `bf16_autocast` is set
//! ([`with_bf16_autocast`]: plain `tch::autocast` would compute in f16); on
//! CPU the model runs in its own dtype (f32 for training). Logprobs are
//! always computed in f32.

use tch::{Kind, Tensor};

use crate::RlError;
use crate::batch::UpdateBatch;
use crate::collective::Collective;
use crate::config::StepConfig;
use crate::forward::run_sums;
use crate::optimizer::RlOptimizer;
use crate::pack::{Packing, PassCost, pack};
use crate::stats::{StepStats, stats_from};
use agl_model::{Model, ModelConfig};

/// One update: forward/backward over packed micro-batches (this rank's
/// share of them), the ranks' gradients and sums added up, clip, AdamW
/// step. Every rank of `ranks` calls it with the same batch and config and
/// gets the whole batch's statistics.
pub fn train_step(
    model: &Model,
    optimizer: &mut RlOptimizer,
    batch: &UpdateBatch,
    cfg: &StepConfig,
    ranks: &mut dyn Collective,
) -> Result<StepStats, RlError> {
    let params: Vec<Tensor> = model
        .trainable_parameters()
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    zero_grads(&params);
    let packing = pack_with_signal(model, batch, cfg);
    let mut sums = run_sums(model, batch, &ranks.share(&packing), cfg, true)?;
    ranks.reduce(&params, &mut sums)?;
    let mut stats = StepStats {
        samples: batch.samples.len(),
        skipped_samples: batch.samples.len() - packing.samples(),
        trainable_tokens: batch.samples.iter().map(|s| s.trainable_tokens()).sum(),
        micro_batches: packing.micro_batches.len(),
        padding_waste: packing.padding_waste(),
        ..stats_from(&sums, cfg)
    };
    stats.grad_norm = clip_grad_norm(&params, cfg.max_grad_norm);
    stats.lr = optimizer.schedule().lr_at(optimizer.steps());
    optimizer.step_adamw(stats.lr)?;
    ranks.publish(model, &params, optimizer.owners())?;
    Ok(stats)
}

/// Zeroes every defined gradient (whether or not an optimizer shard holds
/// the parameter).
fn zero_grads(params: &[Tensor]) {
    for p in params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.detach_();
            let _ = g.zero_();
        }
    }
}

/// Forward + backward of every micro-batch of `packing`, adding into the
/// parameters' `.grad` (not zeroed here). Any packing gives the same sum.
pub fn accumulate_gradients(
    model: &Model,
    batch: &UpdateBatch,
    packing: &Packing,
    cfg: &StepConfig,
) -> Result<StepStats, RlError> {
    run(model, batch, packing, cfg, true)
}

/// The loss and statistics of `batch` under the current weights, without
/// gradients.
pub fn evaluate(
    model: &Model,
    batch: &UpdateBatch,
    cfg: &StepConfig,
) -> Result<StepStats, RlError> {
    let packing = pack(&lengths(batch), cfg.token_budget, pass_cost(model, cfg));
    tch::no_grad(|| run(model, batch, &packing, cfg, false))
}

/// Packs the samples that can move the weights. A sample whose rollout has
/// advantage 0 has a policy-gradient term of exactly 0 on every token (the
/// advantage multiplies it), so unless a KL term applies (it carries
/// reference logprobs and `kl_coef != 0`) its forward and backward add
/// nothing to the gradient: it is left out, and the update is the same.
/// GRPO groups whose rollouts all scored alike are such samples.
pub(crate) fn pack_with_signal(model: &Model, batch: &UpdateBatch, cfg: &StepConfig) -> Packing {
    let kl = cfg.loss.kl_coef != 0.0;
    let chosen: Vec<usize> = (0..batch.samples.len())
        .filter(|&i| {
            let s = &batch.samples[i];
            s.advantage != 0.0 || (kl && s.ref_logprobs.is_some())
        })
        .collect();
    let lens: Vec<usize> = chosen.iter().map(|&i| batch.samples[i].len()).collect();
    let mut packing = pack(&lens, cfg.token_budget, pass_cost(model, cfg));
    for i in packing
        .micro_batches
        .iter_mut()
        .flat_map(|mb| &mut mb.rows)
        .flatten()
    {
        *i = chosen[*i];
    }
    packing
}

/// What a micro-batch's pass costs `model` under `cfg`, in slots.
pub fn pass_cost(model: &Model, cfg: &StepConfig) -> PassCost {
    PassCost {
        overhead: cfg.micro_batch_overhead,
        attention_span: attention_span(model.config()),
    }
}

/// The sequence length at which a token's attention (`2 * heads *
/// head_dim` multiply-adds a key, scores and values) costs what its
/// projections and MLP do: 3,072 for SmolLM2-135M.
pub fn attention_span(c: &ModelConfig) -> usize {
    let (h, d) = (c.hidden_size, c.head_dim);
    let (q, kv) = (c.num_attention_heads * d, c.num_key_value_heads * d);
    let per_token = 2 * h * q + 2 * h * kv + 3 * h * c.intermediate_size;
    let per_key = 2 * q;
    (per_token / per_key.max(1)).max(1) as usize
}

pub fn lengths(batch: &UpdateBatch) -> Vec<usize> {
    batch.samples.iter().map(|s| s.len()).collect()
}

fn run(
    model: &Model,
    batch: &UpdateBatch,
    packing: &Packing,
    cfg: &StepConfig,
    backward: bool,
) -> Result<StepStats, RlError> {
    let sums = run_sums(model, batch, packing, cfg, backward)?;
    Ok(StepStats {
        samples: batch.samples.len(),
        micro_batches: packing.micro_batches.len(),
        padding_waste: packing.padding_waste(),
        ..stats_from(&sums, cfg)
    })
}

/// Global L2 norm of the gradients, scaled down to `max` when above it.
pub(crate) fn clip_grad_norm(params: &[Tensor], max: Option<f64>) -> f64 {
    tch::no_grad(|| {
        let norms: Vec<Tensor> = params
            .iter()
            .map(|p| p.grad())
            .filter(|g| g.defined())
            .map(|g| g.to_kind(Kind::Float).norm())
            .collect();
        if norms.is_empty() {
            return 0.0;
        }
        let total = f64::try_from(Tensor::stack(&norms, 0).norm()).unwrap_or(f64::NAN);
        if let Some(max) = max
            && total > max
        {
            let scale = max / (total + 1e-6);
            for p in params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.g_mul_scalar_(scale);
                }
            }
        }
        total
    })
}
