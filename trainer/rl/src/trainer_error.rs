//! What the trainer thread ([`crate::trainer`]) and its ranks
//! ([`crate::ranks`]) report when they fail.

use std::path::PathBuf;

use crate::RlError;
use crate::checkpoint::CheckpointError;
use crate::dist::DistError;
use agl_model::ModelError;

/// What the trainer thread (or a rank) could not do.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error("loading {what} from {path}: {source}")]
    Load {
        what: &'static str,
        path: PathBuf,
        source: ModelError,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Rl(#[from] RlError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: tch::TchError,
    },
    /// A rank message that did not encode or decode (is every rank the
    /// same agl build?).
    #[error("rank message (is every rank the same agl build?): {0}")]
    Message(#[from] postcard::Error),
    /// The group's shape disagrees with itself (`RANK`, `WORLD_SIZE`,
    /// `[train] world_size`).
    #[error("{0}")]
    Group(String),
    /// A collective failed; `ranks` says what became of the ranks this
    /// process started (a rank that died is the usual cause).
    #[error("{ranks}: {source}")]
    Collective {
        ranks: String,
        source: Box<TrainerError>,
    },
    #[error("rank {rank}: {source}")]
    Rank {
        rank: usize,
        source: Box<TrainerError>,
    },
    #[error("the trainer thread stopped")]
    Stopped,
}
