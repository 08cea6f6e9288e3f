//! The per-token loss: PPO clipped surrogate, an off-policy correction for
//! the engine having sampled from a slightly different policy than the
//! trainer's, and an optional k3 KL to a reference model.
//!
//! For a trainable token with advantage `A`, trainer logprob `new` (with
//! autograd), trainer logprob at the start of the update `old` (detached),
//! engine logprob `eng` and reference logprob `ref`:
//!
//! ```text
//! ratio = exp(new - old)
//! pg    = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
//! rho_t = exp(old - eng)                 the token's importance ratio
//! rho_s = exp(sum_t (old - eng))         its sequence's (trained tokens only)
//! c     = the correction's weight (detached), one of
//!         token_tis:     min(rho_t, high)
//!         sequence_tis:  min(rho_s, high)
//!         token_mask:    1 if low <= rho_t <= high else 0
//!         sequence_mask: 1 if low <= rho_s <= high else 0
//!         none:          1
//! k3    = exp(ref - new) - (ref - new) - 1
//! l     = c * pg + kl_coef * k3
//! ```
//!
//! The correction weights the policy-gradient term only; ratios are
//! compared in log space, so a long sequence's product cannot overflow. A
//! sequence is one row of the inputs (the last dimension). The batch loss
//! is `sum_{s,t} w_{s,t} * l_{s,t}` with the weights fixed by
//! [`super::batch`] (the chosen normalisation).
//!
//! The mismatch itself is reported whatever the correction: over trained
//! tokens, the mean and max `|old - eng|`, a k3 estimate of
//! KL(engine || trainer), and the shares of tokens and of sequences whose
//! ratio lies outside the correction's `[low, high]`.

use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossConfig {
    pub eps_low: f64,
    pub eps_high: f64,
    /// How the trainer/engine mismatch is corrected.
    pub correction: Correction,
    /// Coefficient of the k3 KL to the reference; used only for samples that
    /// carry reference logprobs.
    pub kl_coef: f64,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            eps_low: 0.2,
            eps_high: 0.2,
            correction: Correction::TokenTis { high: 2.0 },
            kl_coef: 0.0,
        }
    }
}

/// The off-policy correction: the weight each token's policy-gradient term
/// gets from its importance ratio (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Correction {
    None,
    /// Token-level truncated IS.
    TokenTis {
        high: f64,
    },
    /// Sequence-level truncated IS (the product of the token ratios).
    SequenceTis {
        high: f64,
    },
    /// Tokens whose ratio leaves `[low, high]` are masked (MIS / IcePop).
    TokenMask {
        low: f64,
        high: f64,
    },
    /// Sequences whose ratio leaves `[low, high]` are masked whole.
    SequenceMask {
        low: f64,
        high: f64,
    },
}

impl Correction {
    /// The ratio bounds as logs: truncated IS has no lower bound, none has
    /// no bounds.
    fn log_bounds(&self) -> (f64, f64) {
        match *self {
            Correction::None => (f64::NEG_INFINITY, f64::INFINITY),
            Correction::TokenTis { high } | Correction::SequenceTis { high } => {
                (f64::NEG_INFINITY, high.ln())
            }
            Correction::TokenMask { low, high } | Correction::SequenceMask { low, high } => {
                (low.ln(), high.ln())
            }
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
    /// Trained tokens whose correction weight is not their ratio:
    /// truncated or masked.
    pub corrected_tokens: f64,
    /// The mismatch: see [`Mismatch`].
    pub mismatch: Mismatch,
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

/// The trainer/engine mismatch of one micro-batch, as sums and maxima for
/// the caller to combine across micro-batches.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Mismatch {
    /// Sum and max over trained tokens of `|old - eng|`.
    pub abs_gap_sum: f64,
    pub abs_gap_max: f64,
    /// Trained tokens whose ratio lies outside the correction's bounds.
    pub tokens_outside: f64,
    /// Sequences with a trained token, and those whose ratio lies outside.
    pub sequences: f64,
    pub sequences_outside: f64,
}

impl Mismatch {
    /// Folds another micro-batch's figures in.
    pub fn add(&mut self, other: &Mismatch) {
        self.abs_gap_sum += other.abs_gap_sum;
        self.abs_gap_max = self.abs_gap_max.max(other.abs_gap_max);
        self.tokens_outside += other.tokens_outside;
        self.sequences += other.sequences;
        self.sequences_outside += other.sequences_outside;
    }
}

/// The loss of one micro-batch. Off the trainable tokens every input is
/// replaced by a neutral value (ratio 1, correction 1, KL 0), so whatever
/// the caller put there (e.g. NaN engine logprobs of context tokens) cannot
/// leak into the loss through `0 * inf`.
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
    let on = x.trainable.to_kind(Kind::Double);
    let gap = (&old - &engine).to_kind(Kind::Double) * &on;
    let engine_kl_sum = sum(&(k3(&gap) * &on));
    let (weight, corrected, mismatch) = correction(&gap, &on, &cfg.correction);
    let pg = pg * weight.to_kind(Kind::Float);
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
    let approx_kl_sum = sum(&(k3(&(&old - current)) * on));
    LossOutput {
        loss,
        clipped_tokens,
        corrected_tokens: corrected,
        mismatch,
        approx_kl_sum,
        engine_kl_sum,
        ref_kl_sum,
        ref_tokens,
    }
}

/// The correction's weight per token (f64, detached), how many trained
/// tokens it truncated or masked, and the mismatch figures. `gap` is
/// `old - eng` on trained tokens and 0 elsewhere; `on` is 1 on them.
fn correction(gap: &Tensor, on: &Tensor, c: &Correction) -> (Tensor, f64, Mismatch) {
    let (low, high) = c.log_bounds();
    // A sequence is a row: the sum of its trained tokens' log ratios.
    let seq_gap = gap.sum_dim_intlist(-1, true, Kind::Double);
    let has_tokens = on.sum_dim_intlist(-1, true, Kind::Double).gt(0.0);
    let outside = |t: &Tensor| t.lt(low).logical_or(&t.gt(high)).to_kind(Kind::Double);
    let token_out = outside(gap) * on;
    let seq_out = outside(&seq_gap) * has_tokens.to_kind(Kind::Double);
    let mismatch = Mismatch {
        abs_gap_sum: sum(&gap.abs()),
        abs_gap_max: f64::try_from(gap.abs().max()).unwrap_or(f64::NAN),
        tokens_outside: sum(&token_out),
        sequences: sum(&has_tokens.to_kind(Kind::Double)),
        sequences_outside: sum(&seq_out),
    };
    // A sequence's verdict is its every trained token's.
    let seq_out_tokens = seq_out.expand_as(on) * on;
    let (weight, corrected) = match *c {
        Correction::None => (on.ones_like(), 0.0),
        Correction::TokenTis { .. } => (gap.clamp_max(high).exp(), sum(&token_out)),
        Correction::SequenceTis { .. } => (
            seq_gap.clamp_max(high).exp().expand_as(on).shallow_clone(),
            sum(&seq_out_tokens),
        ),
        Correction::TokenMask { .. } => (on.ones_like() - &token_out, sum(&token_out)),
        Correction::SequenceMask { .. } => (on.ones_like() - &seq_out_tokens, sum(&seq_out_tokens)),
    };
    (weight, corrected, mismatch)
}
