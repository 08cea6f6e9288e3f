//! The per-token loss: PPO clipped surrogate with truncated importance
//! sampling (TIS) and an optional k3 KL to a reference model.
//!
//! For a trainable token with advantage `A`, trainer logprob `new` (with
//! autograd), trainer logprob at the start of the update `old` (detached),
//! engine logprob `eng` and reference logprob `ref`:
//!
//! ```text
//! ratio = exp(new - old)
//! pg    = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
//! tis   = min(exp(old - eng), tis_threshold)              (detached)
//! k3    = exp(ref - new) - (ref - new) - 1
//! l     = tis * pg + kl_coef * k3
//! ```
//!
//! TIS corrects for the engine sampling from a slightly different policy
//! than the trainer's (other kernels, bf16, stale weights); it weights the
//! policy-gradient term only. The batch loss is `sum_{s,t} w_{s,t} * l_{s,t}`
//! with the weights fixed by [`super::batch`], which equals the ARCHITECTURE.md
//! per-rollout mean.

use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossConfig {
    pub eps_low: f64,
    pub eps_high: f64,
    /// `None` disables the TIS weight (all 1).
    pub tis_threshold: Option<f64>,
    /// Coefficient of the k3 KL to the reference; used only for samples that
    /// carry reference logprobs.
    pub kl_coef: f64,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            eps_low: 0.2,
            eps_high: 0.2,
            tis_threshold: Some(2.0),
            kl_coef: 0.0,
        }
    }
}

/// Per-token inputs, all the same shape (e.g. `[rows, cols]`), f32.
pub struct TokenInputs<'a> {
    /// Trainer logprobs with autograd.
    pub new: &'a Tensor,
    pub old: &'a Tensor,
    pub engine: &'a Tensor,
    pub advantage: &'a Tensor,
    /// `w_{s,t}`; 0 off the trainable tokens.
    pub weight: &'a Tensor,
    /// 1 on trainable tokens (for the reported fractions), else 0.
    pub trainable: &'a Tensor,
    /// Reference logprobs and a 1/0 mask of where they exist.
    pub reference: Option<(&'a Tensor, &'a Tensor)>,
}

/// The weighted loss (autograd) and unweighted token sums for reporting.
pub struct LossOutput {
    pub loss: Tensor,
    pub clipped_tokens: f64,
    pub truncated_tokens: f64,
    /// Sum over trainable tokens of k3(old -> new), a KL estimate of the step.
    pub approx_kl_sum: f64,
    /// Sum over trainable tokens of k3(eng -> old): with tokens sampled by
    /// the engine, an estimate of KL(engine || trainer).
    pub engine_kl_sum: f64,
    /// Sum over tokens with a reference of k3(ref -> new).
    pub ref_kl_sum: f64,
    pub ref_tokens: f64,
}

fn k3(log_ratio: &Tensor) -> Tensor {
    log_ratio.exp() - log_ratio - 1.0
}

fn sum(t: &Tensor) -> f64 {
    f64::try_from(t.to_kind(Kind::Double).sum(Kind::Double)).unwrap_or(f64::NAN)
}

/// The loss of one micro-batch. Off the trainable tokens every input is
/// replaced by a neutral value (ratio 1, TIS 1, KL 0), so whatever the
/// caller put there (e.g. NaN engine logprobs of context tokens) cannot leak
/// into the loss through `0 * inf`.
pub fn token_loss(x: &TokenInputs, cfg: &LossConfig) -> LossOutput {
    let on_mask = x.trainable.gt(0.5);
    let current = x.new.detach();
    let old = x.old.detach().where_self(&on_mask, &current);
    let engine = x.engine.detach().where_self(&on_mask, &old);
    let ratio = (x.new - &old).exp();
    let unclipped = -(&ratio * x.advantage);
    let clipped = -(ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * x.advantage);
    let pg = unclipped.maximum(&clipped);
    // In f64: the gap is often at f32 rounding level, where an f32
    // exp(x) - x - 1 is noise (even negative).
    let gap = (&old - &engine).to_kind(Kind::Double);
    let engine_kl_sum = sum(&(k3(&gap) * x.trainable.to_kind(Kind::Double)));
    let raw_tis = (&old - engine).exp();
    let pg = match cfg.tis_threshold {
        Some(threshold) => pg * raw_tis.clamp_max(threshold),
        None => pg,
    };
    let mut loss = (pg * x.weight).sum(Kind::Float);
    let (mut ref_kl_sum, mut ref_tokens) = (0.0, 0.0);
    if let Some((reference, has_ref)) = x.reference {
        let on = has_ref * x.trainable;
        let reference = reference.detach().where_self(&on.gt(0.5), &current);
        let kl = k3(&(reference - x.new));
        ref_kl_sum = sum(&(kl.detach() * &on));
        ref_tokens = sum(&on);
        if cfg.kl_coef != 0.0 {
            loss += (kl * x.weight).sum(Kind::Float) * cfg.kl_coef;
        }
    }
    let on = x.trainable;
    let clipped_tokens = sum(&(clipped.gt_tensor(&unclipped).to_kind(Kind::Float) * on));
    let truncated_tokens = match cfg.tis_threshold {
        Some(threshold) => sum(&(raw_tis.gt(threshold).to_kind(Kind::Float) * on)),
        None => 0.0,
    };
    let approx_kl_sum = sum(&(k3(&(&old - current)) * on));
    LossOutput {
        loss,
        clipped_tokens,
        truncated_tokens,
        approx_kl_sum,
        engine_kl_sum,
        ref_kl_sum,
        ref_tokens,
    }
}
