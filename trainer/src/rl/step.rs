//! One optimizer update over an [`UpdateBatch`].
//!
//! [`train_step`]: zero the gradients, pack the samples that can move the
//! weights (`pack`: runs of the longest-first order under `token_budget`,
//! each one row of its samples end to end, cut where one long sample would
//! pad the attention of many short ones more than a pass costs,
//! [`pass_cost`]; zero-advantage samples without a KL term are left out),
//! run forward + backward per micro-batch
//! (`layout.rs`; gradients accumulate; the fixed weights make the sum
//! exactly the batch gradient), clip the global gradient norm, set the
//! scheduled learning rate, AdamW step.
//!
//! `logp_old` (the trainer's logprobs at the start of the update) defaults to
//! the detached logprobs of the training forward itself: with one optimizer
//! step per update batch these are the same numbers, and it saves a forward.
//! To take several optimizer steps on one batch (PPO epochs), call
//! [`score_old_logprobs`] once first so every step uses the same `old`.
//!
//! Mixed precision: bf16 autocast on CUDA when `bf16_autocast` is set
//! ([`with_bf16_autocast`]: plain `tch::autocast` would compute in f16); on
//! CPU the model runs in its own dtype (f32 for training). Logprobs are
//! always computed in f32.

use tch::{Device, Kind, Tensor};

use super::RlError;
use super::adamw::{AdamW, AdamWConfig, AdamWError};
use super::batch::{TrainSample, UpdateBatch};
use super::layout::{Grid, Layout, response_cells};
use super::loss::{LossConfig, LossOutput, Mismatch, TokenInputs, token_loss};
use super::pack::{Packing, PassCost, pack};
use crate::autocast::with_bf16_autocast;
use crate::model::{Lean, Model, ModelConfig, at_temperature};

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

/// After the linear warm-up: constant, or cosine down to `min_lr` at
/// `total_steps`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum LrDecay {
    Constant,
    Cosine { total_steps: u64, min_lr: f64 },
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LrSchedule {
    pub peak_lr: f64,
    pub warmup_steps: u64,
    pub decay: LrDecay,
}

impl LrSchedule {
    /// The learning rate of update `step` (0-based): `peak * (step + 1) /
    /// warmup` during warm-up, then the decay.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.decay {
            LrDecay::Constant => self.peak_lr,
            LrDecay::Cosine {
                total_steps,
                min_lr,
            } => {
                let span = total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
                min_lr
                    + 0.5
                        * (self.peak_lr - min_lr)
                        * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// AdamW over the model's trainable parameters with an LR schedule.
#[derive(Debug)]
pub struct RlOptimizer {
    adamw: AdamW,
    schedule: LrSchedule,
    steps: u64,
    /// ZeRO-1: the rank that owns each trainable parameter's state (in
    /// `trainable_parameters` order); this rank's AdamW holds its own only.
    shard: Option<Shard>,
}

#[derive(Debug)]
struct Shard {
    owners: Vec<usize>,
}

/// The [`RlOptimizer::state_tensors`] key of the update count.
const STEPS_KEY: &str = "rl.steps";

impl RlOptimizer {
    pub fn new(model: &Model, adamw: AdamWConfig, schedule: LrSchedule) -> Result<Self, RlError> {
        // The adapter's parameters with LoRA (the base is frozen), else
        // every parameter: only these get AdamW state.
        let params = model.trainable_parameters();
        Ok(RlOptimizer {
            adamw: AdamW::new(params, adamw)?,
            schedule,
            steps: 0,
            shard: None,
        })
    }

    /// ZeRO-1 for `rank` of `world_size`: AdamW state for the parameters
    /// this rank owns ([`super::data_parallel::shard_owners`]) only; every
    /// rank computes the same owners.
    pub fn new_sharded(
        model: &Model,
        adamw: AdamWConfig,
        schedule: LrSchedule,
        rank: usize,
        world_size: usize,
    ) -> Result<Self, RlError> {
        let params = model.trainable_parameters();
        let sizes: Vec<usize> = params.iter().map(|(_, t)| t.numel()).collect();
        let owners = super::data_parallel::shard_owners(&sizes, world_size);
        let mine = params
            .into_iter()
            .zip(&owners)
            .filter(|&(_, &o)| o == rank)
            .map(|(p, _)| p)
            .collect();
        Ok(RlOptimizer {
            adamw: AdamW::new(mine, adamw)?,
            schedule,
            steps: 0,
            shard: Some(Shard { owners }),
        })
    }

    /// ZeRO-1: each trainable parameter's owner rank; `None` unsharded.
    pub fn owners(&self) -> Option<&[usize]> {
        self.shard.as_ref().map(|s| s.owners.as_slice())
    }

    /// One AdamW step at `lr` from the gradients, counted.
    pub(crate) fn step_adamw(&mut self, lr: f64) -> Result<(), RlError> {
        self.adamw.step(lr)?;
        self.steps += 1;
        Ok(())
    }

    /// Updates done so far (the LR schedule's position).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn schedule(&self) -> &LrSchedule {
        &self.schedule
    }

    pub fn adamw(&self) -> &AdamW {
        &self.adamw
    }

    /// Everything a resumed run needs besides the weights: the AdamW state
    /// ([`AdamW::state_tensors`]) and the update count (`rl.steps`, i64).
    /// The hyper-parameters are not state: the caller passes them to
    /// [`RlOptimizer::new`] again.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = self.adamw.state_tensors();
        out.push((STEPS_KEY.to_string(), Tensor::from(self.steps as i64)));
        out
    }

    /// Restores [`RlOptimizer::state_tensors`] output; an error changes
    /// nothing.
    pub fn load_state_tensors(
        &mut self,
        mut tensors: Vec<(String, Tensor)>,
    ) -> Result<(), RlError> {
        let at = tensors
            .iter()
            .position(|(n, _)| n == STEPS_KEY)
            .ok_or_else(|| AdamWError::State(format!("missing {STEPS_KEY}")))?;
        let steps = i64::try_from(&tensors.swap_remove(at).1)?;
        let steps =
            u64::try_from(steps).map_err(|_| AdamWError::State(format!("{STEPS_KEY}: {steps}")))?;
        if self.shard.is_some() {
            // ZeRO-1: a full checkpoint's state, of which this rank keeps
            // its own parameters'.
            let mine: std::collections::HashSet<String> = self
                .adamw
                .params()
                .flat_map(|(name, _)| AdamW::state_names(name))
                .collect();
            tensors.retain(|(name, _)| mine.contains(name));
        }
        self.adamw.load_state_tensors(&tensors)?;
        self.steps = steps;
        Ok(())
    }
}

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

/// One update: forward/backward over packed micro-batches, clip, AdamW step.
pub fn train_step(
    model: &Model,
    optimizer: &mut RlOptimizer,
    batch: &UpdateBatch,
    cfg: &StepConfig,
) -> Result<StepStats, RlError> {
    optimizer.adamw.zero_grad();
    let packing = pack_with_signal(model, batch, cfg);
    let mut stats = accumulate_gradients(model, batch, &packing, cfg)?;
    stats.samples = batch.samples.len();
    stats.skipped_samples = batch.samples.len() - packing.samples();
    stats.trainable_tokens = batch.samples.iter().map(|s| s.trainable_tokens()).sum();
    let params: Vec<Tensor> = model
        .trainable_parameters()
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    stats.grad_norm = clip_grad_norm(&params, cfg.max_grad_norm);
    stats.lr = optimizer.schedule.lr_at(optimizer.steps);
    optimizer.step_adamw(stats.lr)?;
    Ok(stats)
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

/// Whether `model`'s forward runs under bf16 autocast (`bf16_autocast`,
/// CUDA only).
fn autocast(model: &Model, cfg: &StepConfig) -> bool {
    cfg.bf16_autocast && model.device().is_cuda()
}

pub fn lengths(batch: &UpdateBatch) -> Vec<usize> {
    batch.samples.iter().map(|s| s.len()).collect()
}

fn scalar(t: &Tensor) -> Result<f64, RlError> {
    Ok(f64::try_from(t.to_kind(Kind::Double).sum(Kind::Double))?)
}

/// What [`run`] adds up over micro-batches: token sums, so that ranks of
/// a data-parallel step add theirs before the means are taken.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StepSums {
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
    fn from_output(out: LossOutput, g: &Grid, entropy: f64) -> Result<StepSums, RlError> {
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
        let old = g.old.where_self(&g.has_old.gt(0.5), &new.detach());
        let out = token_loss(
            &TokenInputs {
                new: &new,
                old: &old,
                engine: &g.engine,
                advantage: &g.advantage,
                weight: &g.weight,
                trainable: &g.trainable,
                reference: Some((&g.reference, &g.has_ref)),
            },
            &cfg.loss,
        );
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
    let old = g.old.where_self(&g.has_old.gt(0.5), &new.detach());
    let out = token_loss(
        &TokenInputs {
            new: &new,
            old: &old,
            engine: &g.engine,
            advantage: &g.advantage,
            weight: &g.weight,
            trainable: &g.trainable,
            reference: Some((&g.reference, &g.has_ref)),
        },
        &cfg.loss,
    );
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

/// Sum of the policy entropy over rows of logits (`[N, V]`).
fn entropy_sum(logits: &Tensor, temperature: f64) -> Result<f64, RlError> {
    let logp = at_temperature(&logits.detach(), temperature).log_softmax(-1, None);
    scalar(&-(logp.exp() * &logp))
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
