//! How the RL update runs: `[train]` as written in `agl.toml`
//! ([`TrainConfig`]) and what a step takes from it ([`StepConfig`]: the
//! loss, the logprob temperature, micro-batch packing, clipping, precision
//! and memory savings).

use serde::{Deserialize, Serialize};

use crate::adamw::AdamWConfig;
use crate::advantage::Estimator;
use crate::batch::{BatchConfig, LossNorm, UpdateCap};
use crate::loss::{Correction, LossConfig};
use crate::optimizer::{LrDecay, LrSchedule};
use agl_model::{Lean, LoraConfig};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepConfig {
    pub loss: LossConfig,
    /// The temperature the engine sampled with (logprob convention).
    pub temperature: f64,
    /// Tokens (slots: rows * row length) per micro-batch.
    pub token_budget: usize,
    /// A micro-batch's fixed cost beside its slots, in slots: a pass reads
    /// every weight and launches every kernel however few its rows
    /// (`pack`: where padding would cost more, a batch is cut).
    #[serde(default = "default_micro_batch_overhead")]
    pub micro_batch_overhead: usize,
    /// Global L2 gradient-norm clip; `None` = no clipping.
    pub max_grad_norm: Option<f64>,
    pub bf16_autocast: bool,
    /// Compute the policy entropy on trainable tokens (costs a log-softmax
    /// over the vocabulary per trainable token, without autograd).
    pub entropy: bool,
    /// Memory savings: activation checkpointing per layer, chunked
    /// log-probabilities (`model::lean`); the gradient is the same.
    #[serde(default)]
    pub lean: Lean,
}

/// [`StepConfig::micro_batch_overhead`]'s default, for CPU training: a
/// forward + backward of SmolLM2-135M's shape in f32 on 2 cores takes
/// ~0.25-0.3 s plus ~4.4 ms per slot (PyTorch eager, 48 to 1,536 slots),
/// so a pass costs what 55-70 slots do. On a GPU far more tokens go by in
/// the time a pass's kernels launch: set it higher there.
pub const DEFAULT_MICRO_BATCH_OVERHEAD: usize = 64;

fn default_micro_batch_overhead() -> usize {
    DEFAULT_MICRO_BATCH_OVERHEAD
}

impl Default for StepConfig {
    fn default() -> Self {
        StepConfig {
            loss: LossConfig::default(),
            temperature: 1.0,
            token_budget: 16_384,
            micro_batch_overhead: DEFAULT_MICRO_BATCH_OVERHEAD,
            max_grad_norm: Some(1.0),
            bf16_autocast: true,
            entropy: true,
            lean: Lean::default(),
        }
    }
}

/// `[train] correction`: how the engine/trainer mismatch is corrected
/// ([`Correction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionKind {
    None,
    TokenTis,
    SequenceTis,
    TokenMask,
    SequenceMask,
}

/// `[train] loss_norm`: what weighs the same in the loss
/// ([`LossNorm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossNormKind {
    Rollout,
    Token,
    Sequence,
    Group,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EstimatorKind {
    /// (r - mean) / (std + eps).
    Grpo,
    /// r - mean.
    GrpoNoStd,
    Rloo,
}

/// `[train]` in `agl.toml`: the update, as users write it (flat keys, each
/// with its default); [`TrainConfig::step`], [`TrainConfig::batch`],
/// [`TrainConfig::adamw`] and [`TrainConfig::schedule`] give the parts
/// this crate runs on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub estimator: EstimatorKind,
    pub lr: f64,
    pub warmup_steps: u64,
    /// Cosine decay to `min_lr` over the run instead of a constant LR.
    pub cosine: bool,
    pub min_lr: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub max_grad_norm: Option<f64>,
    pub clip_eps_low: f64,
    pub clip_eps_high: f64,
    /// The off-policy correction and its ratio bounds: `correction_high`
    /// truncates (TIS) or masks above; `correction_low` masks below (masks
    /// only). `tis_threshold` is the older name of `correction_high`.
    pub correction: CorrectionKind,
    pub correction_low: f64,
    #[serde(alias = "tis_threshold")]
    pub correction_high: f64,
    pub loss_norm: LossNormKind,
    pub kl_coef: f64,
    /// Slots (rows x padded length) per micro-batch.
    pub token_budget: usize,
    /// A micro-batch pass's fixed cost, in slots ([`crate::pack`]).
    pub micro_batch_overhead: usize,
    /// Update cap: whole groups beyond these are carried to the next step.
    pub max_groups: Option<usize>,
    pub max_samples: Option<usize>,
    pub max_tokens: Option<usize>,
    pub bf16: bool,
    pub entropy: bool,
    /// `[train.lora]`: train a LoRA adapter instead of every weight.
    pub lora: Option<LoraConfig>,
    /// Data-parallel trainer ranks over libtorch's c10d (Gloo on CPU, NCCL
    /// on GPUs). Rank 0 is the `agl run` / `agl train` process; it starts
    /// the others on this machine, unless torchrun's `WORLD_SIZE` is set:
    /// then each rank was started by the launcher (README, Multi-rank).
    pub world_size: usize,
    /// Recompute each decoder layer in the backward instead of keeping
    /// its activations (about one layer's alive at a time).
    pub checkpoint_layers: bool,
    /// Compute log-probabilities this many positions at a time, forward
    /// and backward, so the `[tokens x vocabulary]` logits never exist
    /// whole (0: all at once).
    pub logprob_chunk: usize,
    /// Return memory a step frees to the system (glibc: allocations of
    /// 1 MiB and more get pages of their own) instead of keeping freed
    /// tensor blocks for the next step, for a lower resident peak at some
    /// speed.
    pub release_freed_memory: bool,
    /// ZeRO-1: each rank keeps the AdamW state of its share of the
    /// parameters and broadcasts their new values after each step.
    pub zero1: bool,
    /// The rendezvous port on rank 0 (`MASTER_PORT` wins); 0 picks a free
    /// one (ranks on this machine only).
    pub dist_port: u16,
    /// A collective gives up after this long: a rank that hangs is found
    /// this late (one that dies at once). Rank 0 waits this long between
    /// updates too, so it bounds the time a step may take.
    pub dist_timeout_secs: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        let loss = LossConfig::default();
        TrainConfig {
            estimator: EstimatorKind::Grpo,
            lr: 1e-6,
            warmup_steps: 0,
            cosine: false,
            min_lr: 0.0,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            max_grad_norm: Some(1.0),
            clip_eps_low: loss.eps_low,
            clip_eps_high: loss.eps_high,
            correction: CorrectionKind::TokenTis,
            correction_low: 0.5,
            correction_high: 2.0,
            loss_norm: LossNormKind::Rollout,
            kl_coef: 0.0,
            token_budget: 8192,
            micro_batch_overhead: DEFAULT_MICRO_BATCH_OVERHEAD,
            max_groups: None,
            max_samples: None,
            max_tokens: None,
            bf16: true,
            entropy: true,
            lora: None,
            checkpoint_layers: false,
            logprob_chunk: 0,
            release_freed_memory: false,
            world_size: 1,
            zero1: false,
            dist_port: 0,
            dist_timeout_secs: 3600,
        }
    }
}

impl TrainConfig {
    pub fn batch(&self) -> BatchConfig {
        let estimator = match self.estimator {
            EstimatorKind::Grpo => Estimator::default(),
            EstimatorKind::GrpoNoStd => Estimator::Grpo {
                normalize_std: false,
                eps: 1e-6,
            },
            EstimatorKind::Rloo => Estimator::Rloo,
        };
        BatchConfig {
            estimator,
            cap: UpdateCap {
                max_groups: self.max_groups,
                max_samples: self.max_samples,
                max_tokens: self.max_tokens,
            },
            // Set by the loop under `in_flight = "continue"`.
            stale_tokens: None,
            norm: match self.loss_norm {
                LossNormKind::Rollout => LossNorm::Rollout,
                LossNormKind::Token => LossNorm::Token,
                LossNormKind::Sequence => LossNorm::Sequence,
                LossNormKind::Group => LossNorm::Group,
            },
        }
    }

    /// Checks the correction's bounds: `0 < low < 1 < high` (a ratio of 1,
    /// no mismatch, is always inside).
    pub fn check(&self) -> Result<(), String> {
        if self.world_size == 0 {
            return Err("train.world_size must be at least 1".into());
        }
        if self.checkpoint_layers && self.lora.as_ref().is_some_and(|l| l.dropout > 0.0) {
            // The recomputed layer would draw another dropout mask.
            return Err("train.checkpoint_layers needs train.lora.dropout = 0".into());
        }
        if self.dist_timeout_secs == 0 {
            return Err("train.dist_timeout_secs must be at least 1".into());
        }
        let (low, high) = (self.correction_low, self.correction_high);
        if !(high.is_finite() && high > 1.0) {
            return Err(format!(
                "correction_high must be a number above 1, got {high}"
            ));
        }
        if !(low > 0.0 && low < 1.0) {
            return Err(format!("correction_low must lie in (0, 1), got {low}"));
        }
        Ok(())
    }

    fn correction(&self) -> Correction {
        let (low, high) = (self.correction_low, self.correction_high);
        match self.correction {
            CorrectionKind::None => Correction::None,
            CorrectionKind::TokenTis => Correction::TokenTis { high },
            CorrectionKind::SequenceTis => Correction::SequenceTis { high },
            CorrectionKind::TokenMask => Correction::TokenMask { low, high },
            CorrectionKind::SequenceMask => Correction::SequenceMask { low, high },
        }
    }

    pub fn step(&self, temperature: f64) -> StepConfig {
        StepConfig {
            loss: LossConfig {
                eps_low: self.clip_eps_low,
                eps_high: self.clip_eps_high,
                correction: self.correction(),
                kl_coef: self.kl_coef,
            },
            temperature,
            token_budget: self.token_budget,
            micro_batch_overhead: self.micro_batch_overhead,
            max_grad_norm: self.max_grad_norm,
            bf16_autocast: self.bf16,
            entropy: self.entropy,
            lean: Lean {
                checkpoint_layers: self.checkpoint_layers,
                logprob_chunk: self.logprob_chunk,
            },
        }
    }

    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            beta1: self.beta1,
            beta2: self.beta2,
            weight_decay: self.weight_decay,
            ..AdamWConfig::default()
        }
    }

    pub fn schedule(&self, total_steps: u64) -> LrSchedule {
        LrSchedule {
            peak_lr: self.lr,
            warmup_steps: self.warmup_steps,
            decay: if self.cosine {
                LrDecay::Cosine {
                    total_steps,
                    min_lr: self.min_lr,
                }
            } else {
                LrDecay::Constant
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(toml_text: &str) -> Result<TrainConfig, toml::de::Error> {
        toml::from_str(toml_text)
    }

    #[test]
    fn the_correction_and_the_normalisation_reach_the_step() {
        let config = train("").unwrap();
        let step = config.step(1.0);
        assert_eq!(step.loss.correction, Correction::TokenTis { high: 2.0 });
        assert_eq!(config.batch().norm, LossNorm::Rollout);
        let config = train(
            "correction = \"sequence_mask\"\ncorrection_low = 0.25\n\
             tis_threshold = 3.0\nloss_norm = \"group\"",
        )
        .unwrap();
        config.check().unwrap();
        assert_eq!(
            config.step(1.0).loss.correction,
            Correction::SequenceMask {
                low: 0.25,
                high: 3.0
            },
            "tis_threshold is correction_high's older name"
        );
        assert_eq!(config.batch().norm, LossNorm::Group);
        for (bad, says) in [
            (
                "correction_high = 0.9",
                "correction_high must be a number above 1",
            ),
            ("correction_low = 1.5", "correction_low must lie in (0, 1)"),
        ] {
            let e = train(bad).unwrap().check().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = train("correction = \"icepop\"").unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
        let e = train("learning_rate = 1e-5").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
