//! The optimizer of the RL update: AdamW over the trainable parameters
//! with a learning-rate schedule, whole or ZeRO-1 sharded over ranks
//! ([`shard_owners`]), and its state for checkpoints.

use tch::Tensor;

use crate::RlError;
use crate::adamw::{AdamW, AdamWConfig, AdamWError};
use agl_model::Model;

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
    /// this rank owns ([`shard_owners`]) only; every
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
        let owners = shard_owners(&sizes, world_size);
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

/// Which rank owns each parameter's optimizer state under ZeRO-1: largest
/// parameters first, each to the rank holding the fewest elements (ties to
/// the lowest rank); indices follow `sizes`' order.
pub fn shard_owners(sizes: &[usize], world_size: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
    let mut load = vec![0usize; world_size.max(1)];
    let mut owners = vec![0; sizes.len()];
    for i in order {
        let (least, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(r, l)| (*l, r))
            .expect("world_size >= 1");
        load[least] += sizes[i];
        owners[i] = least;
    }
    owners
}
