//! How a step trains: the loss, the logprob temperature, micro-batch
//! packing, clipping, precision and memory savings.

use crate::loss::LossConfig;
use agl_model::Lean;

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
