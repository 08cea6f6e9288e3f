//! agl's policy side: the tch model (this crate knows nothing of HTTP).
//! See `trainer/README.md` for the API, the KV-cache design and the logprob
//! convention.

pub mod autocast;
pub mod checkpoint;
pub mod dist;
pub mod engine;
pub mod memory;
pub mod model;
pub mod rl;

/// How a unit test that cannot run here is reported skipped.
#[cfg(test)]
#[path = "../../tests/support/skip.rs"]
pub(crate) mod skip;

pub use checkpoint::{
    CheckpointError, CheckpointMeta, latest_checkpoint, load_checkpoint, save_checkpoint,
};
