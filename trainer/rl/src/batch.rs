//! From rollouts to an update batch: exclusion, grouping, the update cap,
//! advantages and the fixed per-token weights.
//!
//! Order of operations in [`build_update`]:
//! 1. validate every sample (lengths agree, a non-empty prompt, ids >= 0);
//!    With a per-token staleness bound ([`StaleTokens`], partial rollouts),
//!    trained tokens sampled more than `max` versions before `current` are
//!    masked (counted in `stale_tokens`);
//! 2. exclude (and count) rollouts that failed for system reasons or have no
//!    reward: they are never trained as reward 0. An agent failure with a
//!    reward is trained with that reward;
//! 3. group the rest by group id (order of first appearance) and apply the
//!    [`UpdateCap`]: whole groups are taken in order until the next one would
//!    exceed the cap; that group and all later ones are returned untouched
//!    (`carried`) for the caller to train later. The first group is always
//!    taken, so an oversize group is trained alone instead of carried forever;
//! 4. advantages per group over its kept rollouts ([`super::advantage`]);
//! 5. token weights by the [`LossNorm`]: per rollout (the default)
//!    `w_{s,t} = m_{s,t} / (N * T_i)`, with `T_i` the rollout's trainable
//!    token count and `N` the number of rollouts with `T_i > 0`; per token
//!    `m / T` (T: the update's trainable tokens); per sequence
//!    `m / (S * T_s)` (S samples with `T_s > 0`); per group
//!    `m / (G * T_g)` (G groups with `T_g > 0`). A rollout with no trainable
//!    token still counts in its group's baseline but not in `N` (its loss
//!    term would be 0/0).
//!
//! The weights are fixed here, before any micro-batching, so the summed
//! gradient is the same for every packing and accumulation split.

use std::collections::HashMap;
use std::ops::Range;

use super::RlError;
use super::advantage::{Estimator, group_advantages};

/// How a rollout ended, as the controller recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// The agent itself failed (bad answer, gave up, crashed its own tool):
    /// trained with its reward.
    AgentFailure,
    /// Infrastructure failed (timeout, engine down, harness crash): excluded.
    SystemFailure,
}

/// One training sample from an adapter plugin: a prompt and a response, of
/// which the `mask`ed tokens were produced by the model and are trained.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub prompt_ids: Vec<i64>,
    pub response_ids: Vec<i64>,
    /// Per response token: true = trained (the model produced it), false =
    /// context (e.g. a tool result merged into the response).
    pub mask: Vec<bool>,
    /// The engine's logprob of each response token (same convention as
    /// [`agl_model::token_logprobs`]); masked-out entries are ignored.
    pub engine_logprobs: Vec<f32>,
    /// The weight version the engine sampled with (the oldest, when the
    /// tokens came from several).
    pub weight_version: u64,
    /// Per response token, the version that sampled it, when an update
    /// came while the sample was generated (partial rollouts); `None`: all
    /// `weight_version`.
    pub token_versions: Option<Vec<u64>>,
    /// A reference model's logprobs of the response tokens, for the KL term.
    pub ref_logprobs: Option<Vec<f32>>,
}

impl Sample {
    /// A response mask that is true exactly on `spans` (clamped to `len`).
    pub fn mask_from_spans(len: usize, spans: &[Range<usize>]) -> Vec<bool> {
        let mut mask = vec![false; len];
        for span in spans {
            for m in &mut mask[span.start.min(len)..span.end.min(len)] {
                *m = true;
            }
        }
        mask
    }

    fn trainable_tokens(&self) -> usize {
        self.mask.iter().filter(|m| **m).count()
    }

    /// Masks the trained tokens sampled too long ago; returns how many.
    fn mask_stale(&mut self, bound: StaleTokens) -> usize {
        let Some(versions) = &self.token_versions else {
            return 0;
        };
        let mut masked = 0;
        for (m, &v) in self.mask.iter_mut().zip(versions) {
            if *m && bound.too_old(v) {
                *m = false;
                masked += 1;
            }
        }
        masked
    }

    fn validate(&self) -> Result<(), String> {
        let n = self.response_ids.len();
        if self.prompt_ids.is_empty() {
            return Err(
                "empty prompt (the first response token needs a position before it)".into(),
            );
        }
        if let Some(v) = &self.token_versions
            && v.len() != n
        {
            return Err(format!("{n} response ids but {} token versions", v.len()));
        }
        if self.mask.len() != n || self.engine_logprobs.len() != n {
            return Err(format!(
                "{n} response ids but {} mask entries and {} engine logprobs",
                self.mask.len(),
                self.engine_logprobs.len()
            ));
        }
        if let Some(r) = &self.ref_logprobs
            && r.len() != n
        {
            return Err(format!(
                "{n} response ids but {} reference logprobs",
                r.len()
            ));
        }
        if self
            .prompt_ids
            .iter()
            .chain(&self.response_ids)
            .any(|&t| t < 0)
        {
            return Err("negative token id".into());
        }
        Ok(())
    }
}

/// A finished rollout and the samples its adapter built.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredRollout {
    pub id: String,
    pub group_id: String,
    pub reward: Option<f64>,
    pub outcome: Outcome,
    pub samples: Vec<Sample>,
}

/// A limit on one update; `None` = unlimited. Tokens are prompt + response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpdateCap {
    pub max_groups: Option<usize>,
    pub max_samples: Option<usize>,
    pub max_tokens: Option<usize>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchConfig {
    pub estimator: Estimator,
    pub cap: UpdateCap,
    pub norm: LossNorm,
    /// Per-token staleness (partial rollouts): tokens sampled more than
    /// `max` versions before `current` are masked out of training.
    pub stale_tokens: Option<StaleTokens>,
}

/// The per-token staleness bound: what the update trains on is the policy
/// of version `current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleTokens {
    pub current: u64,
    pub max: u64,
}

impl StaleTokens {
    fn too_old(&self, version: u64) -> bool {
        self.current.saturating_sub(version) > self.max
    }
}

/// How the loss is normalised: what weighs the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LossNorm {
    /// Every rollout, whatever its samples and lengths (the mean over
    /// rollouts of each rollout's token mean).
    #[default]
    Rollout,
    /// Every trained token of the update.
    Token,
    /// Every sample (the mean over samples of each sample's token mean).
    Sequence,
    /// Every group, i.e. every prompt (the mean over groups of each group's
    /// token mean).
    Group,
}

/// A sample ready for the loss: its tokens and per-response-token inputs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainSample {
    /// Prompt then response ids.
    pub tokens: Vec<i64>,
    pub prompt_len: usize,
    /// `w_{s,t}` per response token (the [`LossNorm`]'s; 0 off the trained ones).
    pub weights: Vec<f32>,
    /// The rollout's advantage, the same for every token.
    pub advantage: f32,
    pub engine_logprobs: Vec<f32>,
    pub ref_logprobs: Option<Vec<f32>>,
    /// The trainer's logprobs at the start of the update; `None` = take the
    /// detached logprobs of the training forward itself (exact when the
    /// update is a single optimizer step, see [`super::step`]).
    pub old_logprobs: Option<Vec<f32>>,
    /// Index of the rollout within the update (0..N-ish, for reporting).
    pub rollout: usize,
}

impl TrainSample {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Response tokens with a weight (the trained ones).
    pub fn trainable_tokens(&self) -> usize {
        self.weights.iter().filter(|w| **w > 0.0).count()
    }
}

/// The samples of one update with their fixed weights.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UpdateBatch {
    pub samples: Vec<TrainSample>,
    /// N: rollouts with at least one trainable token.
    pub rollouts: usize,
}

/// What [`build_update`] kept, excluded and carried.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchStats {
    pub groups: usize,
    pub rollouts: usize,
    pub samples: usize,
    pub excluded_system_failure: usize,
    pub excluded_no_reward: usize,
    /// Kept rollouts with no trainable token (in the baseline, not in N).
    pub untrainable_rollouts: usize,
    /// Trained tokens masked for being sampled too many versions ago.
    pub stale_tokens: usize,
    pub carried_groups: usize,
    /// Means over the kept rollouts.
    pub mean_reward: f64,
    pub mean_advantage: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prepared {
    pub batch: UpdateBatch,
    pub stats: BatchStats,
    /// Whole groups beyond the cap, in order, to train in a later update.
    pub carried: Vec<Vec<ScoredRollout>>,
}

/// Builds one update batch from finished rollouts (see the module docs).
pub fn build_update(rollouts: Vec<ScoredRollout>, cfg: &BatchConfig) -> Result<Prepared, RlError> {
    let mut stats = BatchStats::default();
    let mut order: Vec<String> = Vec::new();
    let mut groups: HashMap<String, Vec<(ScoredRollout, f64)>> = HashMap::new();
    for mut rollout in rollouts {
        for (k, sample) in rollout.samples.iter().enumerate() {
            sample
                .validate()
                .map_err(|e| RlError::Input(format!("rollout {} sample {k}: {e}", rollout.id)))?;
        }
        if let Some(bound) = cfg.stale_tokens {
            for sample in &mut rollout.samples {
                stats.stale_tokens += sample.mask_stale(bound);
            }
        }
        let reward = match (rollout.outcome, rollout.reward) {
            (Outcome::SystemFailure, _) => {
                stats.excluded_system_failure += 1;
                continue;
            }
            (_, None) => {
                stats.excluded_no_reward += 1;
                continue;
            }
            (_, Some(r)) if !r.is_finite() => {
                return Err(RlError::Input(format!(
                    "rollout {}: reward {r}",
                    rollout.id
                )));
            }
            (_, Some(r)) => r,
        };
        if !groups.contains_key(&rollout.group_id) {
            order.push(rollout.group_id.clone());
        }
        groups
            .entry(rollout.group_id.clone())
            .or_default()
            .push((rollout, reward));
    }
    let mut ordered: Vec<Vec<(ScoredRollout, f64)>> =
        order.iter().filter_map(|g| groups.remove(g)).collect();
    let keep = groups_within_cap(&ordered, &cfg.cap);
    let carried = ordered
        .split_off(keep)
        .into_iter()
        .map(|g| g.into_iter().map(|(r, _)| r).collect())
        .collect::<Vec<Vec<ScoredRollout>>>();
    stats.carried_groups = carried.len();
    stats.groups = ordered.len();

    // (rollout, advantage, group index)
    let mut kept: Vec<(ScoredRollout, f64, usize)> = Vec::new();
    for (g, group) in ordered.into_iter().enumerate() {
        let rewards: Vec<f64> = group.iter().map(|(_, r)| *r).collect();
        let advantages = group_advantages(&rewards, cfg.estimator);
        for ((rollout, reward), adv) in group.into_iter().zip(advantages) {
            stats.mean_reward += reward;
            stats.mean_advantage += adv;
            kept.push((rollout, adv, g));
        }
    }
    stats.rollouts = kept.len();
    if !kept.is_empty() {
        stats.mean_reward /= kept.len() as f64;
        stats.mean_advantage /= kept.len() as f64;
    }

    let trainable =
        |r: &ScoredRollout| -> usize { r.samples.iter().map(Sample::trainable_tokens).sum() };
    let n = kept.iter().filter(|(r, _, _)| trainable(r) > 0).count();
    stats.untrainable_rollouts = kept.len() - n;
    let weigh = TokenWeights::new(&kept, cfg.norm);
    let mut batch = UpdateBatch {
        samples: Vec::new(),
        rollouts: n,
    };
    for (index, (rollout, adv, group)) in kept.into_iter().enumerate() {
        let t_i = trainable(&rollout);
        if t_i == 0 {
            continue;
        }
        for s in rollout.samples {
            // A sample with no trainable token adds nothing to loss or gradient.
            let t_s = s.trainable_tokens();
            if t_s == 0 {
                continue;
            }
            let w = weigh.of(t_i, t_s, group);
            let prompt_len = s.prompt_ids.len();
            let mut tokens = s.prompt_ids;
            tokens.extend_from_slice(&s.response_ids);
            batch.samples.push(TrainSample {
                tokens,
                prompt_len,
                weights: s.mask.iter().map(|&m| if m { w } else { 0.0 }).collect(),
                advantage: adv as f32,
                engine_logprobs: s.engine_logprobs,
                ref_logprobs: s.ref_logprobs,
                old_logprobs: None,
                rollout: index,
            });
        }
    }
    stats.samples = batch.samples.len();
    Ok(Prepared {
        batch,
        stats,
        carried,
    })
}

/// The per-token weight of a trained token under a [`LossNorm`], from the
/// counts of the update (see the module docs).
struct TokenWeights {
    norm: LossNorm,
    /// Rollouts, samples and groups with a trained token.
    rollouts: usize,
    samples: usize,
    groups: usize,
    /// Trained tokens of the update, and of each group.
    tokens: usize,
    group_tokens: Vec<usize>,
}

impl TokenWeights {
    fn new(kept: &[(ScoredRollout, f64, usize)], norm: LossNorm) -> TokenWeights {
        let groups = kept.iter().map(|(_, _, g)| g + 1).max().unwrap_or(0);
        let mut w = TokenWeights {
            norm,
            rollouts: 0,
            samples: 0,
            groups: 0,
            tokens: 0,
            group_tokens: vec![0; groups],
        };
        for (rollout, _, g) in kept {
            let t: Vec<usize> = rollout
                .samples
                .iter()
                .map(Sample::trainable_tokens)
                .collect();
            let t_i: usize = t.iter().sum();
            w.rollouts += usize::from(t_i > 0);
            w.samples += t.iter().filter(|&&n| n > 0).count();
            w.tokens += t_i;
            w.group_tokens[*g] += t_i;
        }
        w.groups = w.group_tokens.iter().filter(|&&n| n > 0).count();
        w
    }

    /// The weight of each trained token of a sample with `t_s` of them, in
    /// a rollout with `t_i`, in group `group`.
    fn of(&self, t_i: usize, t_s: usize, group: usize) -> f32 {
        let denominator = match self.norm {
            LossNorm::Rollout => self.rollouts * t_i,
            LossNorm::Token => self.tokens,
            LossNorm::Sequence => self.samples * t_s,
            LossNorm::Group => self.groups * self.group_tokens[group],
        };
        (1.0 / denominator as f64) as f32
    }
}

/// How many leading groups fit the cap (at least one when there is one).
fn groups_within_cap(groups: &[Vec<(ScoredRollout, f64)>], cap: &UpdateCap) -> usize {
    let (mut samples, mut tokens) = (0usize, 0usize);
    for (k, group) in groups.iter().enumerate() {
        let group_samples: usize = group.iter().map(|(r, _)| r.samples.len()).sum();
        let group_tokens: usize = group
            .iter()
            .flat_map(|(r, _)| &r.samples)
            .map(|s| s.prompt_ids.len() + s.response_ids.len())
            .sum();
        samples += group_samples;
        tokens += group_tokens;
        let over = cap.max_groups.is_some_and(|m| k + 1 > m)
            || cap.max_samples.is_some_and(|m| samples > m)
            || cap.max_tokens.is_some_and(|m| tokens > m);
        if over && k > 0 {
            return k;
        }
    }
    groups.len()
}
