//! `[run]`, `[train]` and `[engine]` in `agl.toml`: what `agl run` trains
//! on, how, and which engine serves the policy.

use agl_conversation::ToolFormat;
use agl_wire::api::{EngineApi, Render};
use std::path::PathBuf;

use agl_engine::EngineConfig as TchEngineConfig;
use agl_model::{Lean, LoraConfig};
use serde::{Deserialize, Serialize};

use agl_rl::{
    AdamWConfig, BatchConfig, Correction, Estimator, LossConfig, LossNorm, LrDecay, LrSchedule,
    ScheduleConfig, StepConfig, UpdateCap,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopMode {
    /// Launch B groups, wait for all of them, train, repeat.
    Sync,
    /// Keep `groups_in_flight` groups running; train on the first
    /// `groups_per_step` complete ones and carry the rest.
    Async,
}

/// `[run] in_flight`: the model calls running when new weights are
/// published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlightMode {
    /// Wait for them (up to `drain_timeout_secs`): every call is sampled by
    /// one version.
    #[default]
    Drain,
    /// Partial rollouts: the engine pauses them at a token boundary and
    /// they go on under the new weights, each token recorded with the
    /// version that sampled it; the update waits for no call.
    Continue,
}

impl InFlightMode {
    /// What the engine does with its running sequences.
    pub fn engine(self) -> agl_engine::InFlight {
        match self {
            InFlightMode::Drain => agl_engine::InFlight::Abort,
            InFlightMode::Continue => agl_engine::InFlight::Continue,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            InFlightMode::Drain => "drain",
            InFlightMode::Continue => "continue",
        }
    }
}

/// `[run]`: the data and the shape of the loop.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// JSONL, one input per line; a row's `"split"` (`"train"` | `"val"`,
    /// default train) decides where it goes. The whole row is the rollout input.
    pub data: Option<PathBuf>,
    /// Run folder: store, checkpoints, metrics, plot (default `agl-runs/run`).
    pub out_dir: Option<PathBuf>,
    /// Optimizer updates to run.
    pub steps: u64,
    pub mode: LoopMode,
    /// Rollouts per input (n).
    pub group_size: usize,
    /// Groups trained per update (B_train).
    pub groups_per_step: usize,
    /// Groups kept in flight in async mode (B_async >= B_train).
    pub groups_in_flight: usize,
    /// Async: a complete group launched more than this many weight versions
    /// ago is dropped, not trained; under `in_flight = "continue"`, tokens
    /// sampled more than this many versions ago are masked instead.
    pub max_staleness: Option<u64>,
    /// Validate before training and every this many steps (0 = never).
    pub val_every: u64,
    /// Validate on at most this many val rows.
    pub val_size: usize,
    /// Checkpoint every this many steps (0 = only at the end).
    pub checkpoint_every: u64,
    pub keep_checkpoints: usize,
    /// What a weight update does with the model calls in flight: wait for
    /// them (`drain`) or let them go on under the new weights (`continue`).
    pub in_flight: InFlightMode,
    /// How long the gateway waits for in-flight calls before a weight update
    /// (`in_flight = "drain"`).
    pub drain_timeout_secs: u64,
    /// Seeds the data order.
    pub seed: u64,
    /// Progress bars on stderr (off when it is not a terminal anyway).
    pub progress: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            data: None,
            out_dir: None,
            steps: 10,
            mode: LoopMode::Sync,
            group_size: 4,
            groups_per_step: 4,
            groups_in_flight: 8,
            max_staleness: Some(2),
            val_every: 5,
            val_size: 32,
            checkpoint_every: 5,
            keep_checkpoints: 2,
            in_flight: InFlightMode::Drain,
            drain_timeout_secs: 60,
            seed: 0,
            progress: true,
        }
    }
}

impl RunConfig {
    pub fn schedule(&self) -> ScheduleConfig {
        match self.mode {
            LoopMode::Sync => ScheduleConfig::sync(self.groups_per_step),
            LoopMode::Async => ScheduleConfig {
                groups_in_flight: self.groups_in_flight.max(self.groups_per_step),
                groups_per_update: self.groups_per_step,
                // Partial rollouts: staleness is per token (the batch masks
                // tokens sampled too long ago), not per launch.
                max_staleness: match self.in_flight {
                    InFlightMode::Drain => self.max_staleness,
                    InFlightMode::Continue => None,
                },
            },
        }
    }

    pub fn out_dir(&self) -> PathBuf {
        self.out_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("agl-runs/run"))
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.group_size == 0 || self.groups_per_step == 0 {
            return Err("run.group_size and run.groups_per_step must be >= 1".into());
        }
        if self.data.is_none() {
            return Err("run.data (a JSONL file of inputs) is required".into());
        }
        self.schedule().validate()
    }
}

/// `[train] correction`: how the engine/trainer mismatch is corrected
/// (`agl_rl::Correction`).
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
/// (`agl_rl::LossNorm`).
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

/// `[train]`: the update.
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
    /// A micro-batch pass's fixed cost, in slots (`agl_rl::pack`).
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
            micro_batch_overhead: agl_rl::config::DEFAULT_MICRO_BATCH_OVERHEAD,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// agl's own tch engine on the policy weights, in this process.
    Embedded,
    /// A vLLM server (0.33, dev mode: `VLLM_SERVER_DEV_MODE=1`, and
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` for LoRA) at `base_url`; new
    /// weights through its RL routes (`policy/reload.rs`).
    Vllm,
    /// An SGLang server (0.5.23) at `base_url`; new weights through
    /// `update_weights_from_disk` / `load_lora_adapter`.
    Sglang,
    /// agl's own engine served apart (`agl engine serve`) at `base_url`;
    /// new weights (LoRA merged) through its `/load_weights` route. What
    /// `agl train` publishes to when the policy runs on agl's engine.
    Agl,
    /// Any OpenAI-compatible server at `base_url` that keeps its weights
    /// (evaluation-only runs: nothing is reloaded).
    External,
}

impl EngineKind {
    /// A server agl does not start (it has a `base_url`).
    pub fn is_remote(self) -> bool {
        self != EngineKind::Embedded
    }
}

/// How a remote engine treats requests still in flight when it pauses
/// for new weights (the gateway has drained its own calls by then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// Frozen in place and continued on the new weights (vLLM `keep`,
    /// SGLang `in_place`).
    Keep,
    /// Aborted (vLLM and SGLang `abort`): the harness retries them.
    Abort,
}

/// `[engine]`: which engine serves the policy during `agl run`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyEngineConfig {
    pub kind: EngineKind,
    /// External: the server's URL, its root or its `/v1` URL (either is
    /// accepted: calls go under `/v1`, reloads to the root).
    pub base_url: Option<String>,
    /// External: the model name it serves (default: the model folder's name).
    pub model_name: Option<String>,
    /// vLLM / SGLang: what the engine does with requests in flight while
    /// it loads new weights.
    pub pause_mode: PauseMode,
    /// Embedded: concurrent sequences and the longest prompt + response;
    /// defaults are the engine's own (`agl engine serve` uses the same).
    pub max_seqs: usize,
    pub max_len: usize,
    /// Who renders chat prompts: `"engine"` (its own template, Chat
    /// Completions passed through) or `"gateway"` (the policy's template,
    /// token ids to `/v1/completions`, token-exact continuation).
    pub render: Render,
    /// The token-in API of an external engine the gateway renders for:
    /// `"openai"` (vLLM's `/v1/completions` with token ids) or `"sglang"`
    /// (`/generate` with `input_ids`).
    pub api: EngineApi,
    /// Gateway rendering: how the model writes tool calls (`"hermes"`,
    /// `"qwen3_coder"`, `"llama3_json"`, `"none"`); unset: read from the
    /// chat template. (Not serialized: the exports record it as given.)
    #[serde(skip_serializing)]
    pub tool_parser: Option<ToolFormat>,
    /// Gateway rendering: whether outputs open with `<think>...</think>`;
    /// unset: read from the chat template.
    pub reasoning: Option<bool>,
}

impl Default for PolicyEngineConfig {
    fn default() -> Self {
        PolicyEngineConfig {
            kind: EngineKind::Embedded,
            base_url: None,
            model_name: None,
            pause_mode: PauseMode::Keep,
            max_seqs: TchEngineConfig::default().max_seqs,
            max_len: TchEngineConfig::default().max_len,
            render: Render::Engine,
            api: EngineApi::Openai,
            tool_parser: None,
            reasoning: None,
        }
    }
}
