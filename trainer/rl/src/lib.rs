//! agl-rl: the RL update of the trainer (ARCHITECTURE.md, Training), on plain structs the
//! host fills from plugin samples: no HTTP, no store.
//!
//! Pipeline: [`batch::build_update`] (exclude system failures and unrewarded
//! rollouts, group, cap whole groups, advantages, fixed token weights) ->
//! [`step::train_step`] (packed micro-batches, forward/backward with gradient
//! accumulation, on one rank or over c10d ([`collective`]), grad-norm clip,
//! [`adamw::AdamW`] with LR schedule, [`optimizer`]).
//!
//! The contract, with group g, rollout i (reward `r_i`, samples `S_i`),
//! response-token mask `m_{s,t}` and `T_i = sum_{s in S_i} sum_t m_{s,t}`:
//! - advantage ([`advantage`]): GRPO `(r_i - mean_g r) / (std_g r + eps)`
//!   (sample std, optional) or RLOO `r_i - mean_{j != i} r_j`; singleton
//!   groups get 0;
//! - loss ([`loss`]): `L = (1/N) sum_i (1/T_i) sum_{s in S_i} sum_t m_{s,t}
//!   l_{s,t}`, computed as `sum w_{s,t} l_{s,t}` with `w = m / (N T_i)` fixed
//!   before micro-batching, so every packing gives the same gradient.
//!
//! Which groups go into an update is [`schedule::GroupScheduler`]'s job
//! (collocated async, staleness bound); the step bench's `schedule_sim`
//! simulates that loop.

pub mod adamw;
pub mod advantage;
pub mod autocast;
pub mod batch;
pub mod checkpoint;
pub mod collective;
pub mod config;
pub mod data_parallel;
pub mod dist;
mod forward;
mod layout;
pub mod loss;
pub mod memory;
pub mod optimizer;
pub mod pack;
pub mod ranks;
pub mod schedule;
pub mod scoring;
pub mod stats;
pub mod step;
pub mod trainer;
mod trainer_error;

pub use adamw::{AdamW, AdamWConfig, AdamWError};
pub use advantage::{Estimator, group_advantages};
pub use batch::{
    BatchConfig, BatchStats, LossNorm, Outcome, Prepared, Sample, ScoredRollout, StaleTokens,
    TrainSample, UpdateBatch, UpdateCap, build_update,
};
pub use checkpoint::{
    CheckpointError, CheckpointMeta, latest_checkpoint, load_checkpoint, save_checkpoint,
};
pub use collective::{Collective, OneRank};
pub use config::{StepConfig, TrainConfig};
pub use data_parallel::{check_same_weights, weights_hash};
pub use loss::{Correction, LossConfig};
pub use optimizer::{LrDecay, LrSchedule, RlOptimizer};
pub use pack::{MicroBatch, Packing, PassCost, pack, pack_ffd, pack_in_order};
pub use schedule::{GroupScheduler, ScheduleConfig, ScheduleError, ScheduleSnapshot, Update};
pub use scoring::{score_old_logprobs, score_ref_logprobs};
pub use stats::StepStats;
pub use step::{accumulate_gradients, evaluate, train_step};
pub use trainer::{Trainer, TrainerSpec};
pub use trainer_error::TrainerError;

#[derive(Debug, thiserror::Error)]
pub enum RlError {
    #[error("invalid rollout data: {0}")]
    Input(String),
    #[error(transparent)]
    Model(#[from] agl_model::ModelError),
    #[error(transparent)]
    Optimizer(#[from] adamw::AdamWError),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    #[error(transparent)]
    Dist(#[from] crate::dist::DistError),
}
