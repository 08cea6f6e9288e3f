//! What a step reports: the token sums its micro-batches (and ranks) add
//! up ([`StepSums`]) and the means taken from them ([`StepStats`]).

use tch::{Kind, Tensor};

use crate::RlError;
use crate::config::StepConfig;
use crate::layout::Grid;
use crate::loss::{LossOutput, Mismatch};

/// What one update did (token statistics are means over trainable tokens).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepStats {
    /// The batch loss `sum w * l` (the per-rollout mean of ARCHITECTURE.md, Training).
    pub loss: f64,
    /// `sum w * A` = the mean advantage over the batch's rollouts.
    pub mean_advantage: f64,
    pub clip_fraction: f64,
    /// Share of trained tokens whose correction weight was truncated or
    /// masked ([`super::loss::Correction`]).
    pub corrected_fraction: f64,
    /// Mean k3(old -> new): 0 on the first step of an update.
    pub approx_kl: f64,
    /// Mean k3(ref -> new) over tokens that have reference logprobs.
    pub ref_kl: Option<f64>,
    /// Mean entropy of the policy (at the sampling temperature); NaN when
    /// not computed.
    pub entropy: f64,
    /// Global gradient norm before clipping (0 for [`evaluate`]).
    pub grad_norm: f64,
    pub lr: f64,
    pub trainable_tokens: usize,
    pub samples: usize,
    /// Samples left out of [`train_step`]'s forward/backward: zero
    /// advantage, no KL term (see `pack_with_signal`). The token statistics
    /// (fractions, KLs, entropy) are over the samples that ran.
    pub skipped_samples: usize,
    /// Mean k3 estimate of KL(engine || trainer) over the trainable tokens
    /// that ran: how far the trainer's logprobs of the sampled tokens are
    /// from the engine's (kernels, precision, stale weights).
    pub engine_kl: f64,
    /// Mean and max `|log p_engine - log p_trainer|` over the trained
    /// tokens that ran.
    pub mismatch_mean: f64,
    pub mismatch_max: f64,
    /// Shares of those tokens, and of their sequences, whose importance
    /// ratio lies outside the correction's bounds.
    pub outside_token_fraction: f64,
    pub outside_sequence_fraction: f64,
    pub micro_batches: usize,
    pub padding_waste: f64,
}

/// What a step's forwards add up over micro-batches: token sums, so that ranks of
/// a data-parallel step add theirs before the means are taken.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepSums {
    pub loss: f64,
    pub mean_advantage: f64,
    pub tokens: f64,
    pub clipped: f64,
    pub corrected: f64,
    pub mismatch: Mismatch,
    pub kl: f64,
    pub engine_kl: f64,
    pub ref_kl: f64,
    pub ref_tokens: f64,
    pub entropy: f64,
}

impl StepSums {
    /// One micro-batch's sums: its loss output, its grid and the entropy
    /// summed over its trainable tokens.
    pub(crate) fn from_output(
        out: LossOutput,
        g: &Grid,
        entropy: f64,
    ) -> Result<StepSums, RlError> {
        Ok(StepSums {
            loss: scalar(&out.loss.detach())?,
            mean_advantage: scalar(&(&g.weight * &g.advantage))?,
            tokens: scalar(&g.trainable)?,
            clipped: out.clipped_tokens,
            corrected: out.corrected_tokens,
            mismatch: out.mismatch,
            kl: out.approx_kl_sum,
            engine_kl: out.engine_kl_sum,
            ref_kl: out.ref_kl_sum,
            ref_tokens: out.ref_tokens,
            entropy,
        })
    }

    /// Every field that adds across ranks, in the order
    /// [`StepSums::set_sums`] reads back; `mismatch.abs_gap_max` reduces
    /// by max instead and is not among them.
    pub fn sums(&self) -> [f64; 14] {
        [
            self.loss,
            self.mean_advantage,
            self.tokens,
            self.clipped,
            self.corrected,
            self.mismatch.abs_gap_sum,
            self.mismatch.tokens_outside,
            self.mismatch.sequences,
            self.mismatch.sequences_outside,
            self.kl,
            self.engine_kl,
            self.ref_kl,
            self.ref_tokens,
            self.entropy,
        ]
    }

    /// Folds another micro-batch's sums in.
    pub fn add(&mut self, other: &StepSums) {
        let mut v = self.sums();
        for (a, b) in v.iter_mut().zip(other.sums()) {
            *a += b;
        }
        let max = self.mismatch.abs_gap_max.max(other.mismatch.abs_gap_max);
        self.set_sums(v);
        self.mismatch.abs_gap_max = max;
    }

    pub fn set_sums(&mut self, v: [f64; 14]) {
        [
            self.loss,
            self.mean_advantage,
            self.tokens,
            self.clipped,
            self.corrected,
            self.mismatch.abs_gap_sum,
            self.mismatch.tokens_outside,
            self.mismatch.sequences,
            self.mismatch.sequences_outside,
            self.kl,
            self.engine_kl,
            self.ref_kl,
            self.ref_tokens,
            self.entropy,
        ] = v;
    }
}

/// The statistics of a step from its sums (means over trainable tokens).
pub(crate) fn stats_from(sums: &StepSums, cfg: &StepConfig) -> StepStats {
    let per_token = |x: f64| {
        if sums.tokens > 0.0 {
            x / sums.tokens
        } else {
            0.0
        }
    };
    let m = &sums.mismatch;
    StepStats {
        loss: sums.loss,
        mean_advantage: sums.mean_advantage,
        trainable_tokens: sums.tokens as usize,
        clip_fraction: per_token(sums.clipped),
        corrected_fraction: per_token(sums.corrected),
        mismatch_mean: per_token(m.abs_gap_sum),
        mismatch_max: m.abs_gap_max,
        outside_token_fraction: per_token(m.tokens_outside),
        outside_sequence_fraction: if m.sequences > 0.0 {
            m.sequences_outside / m.sequences
        } else {
            0.0
        },
        approx_kl: per_token(sums.kl),
        engine_kl: per_token(sums.engine_kl),
        ref_kl: (sums.ref_tokens > 0.0).then(|| sums.ref_kl / sums.ref_tokens),
        entropy: if cfg.entropy {
            per_token(sums.entropy)
        } else {
            f64::NAN
        },
        ..StepStats::default()
    }
}

pub(crate) fn scalar(t: &Tensor) -> Result<f64, RlError> {
    Ok(f64::try_from(t.to_kind(Kind::Double).sum(Kind::Double))?)
}
