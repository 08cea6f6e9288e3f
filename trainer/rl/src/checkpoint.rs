//! Training checkpoints that survive `kill -9` at any moment.
//!
//! Layout under a run's checkpoint root:
//! ```text
//! step-000012/
//!   model/                  Model::save: config.json + safetensors (a
//!                           loadable Hugging Face folder, without tokenizer
//!                           files: copy those in if you need them)
//!   optimizer.safetensors   RlOptimizer::state_tensors (moments, steps)
//!   meta.json               CheckpointMeta, written last
//! ```
//! A save writes everything into `.tmp-step-N-<pid>/`, fsyncs it, renames it
//! to `step-N` and fsyncs the root, so a `step-*` folder is either complete
//! or absent. [`latest_checkpoint`] skips `.tmp-*` folders and any folder
//! without a readable `meta.json`.
//!
//! The trainer's state is the weights and the optimizer (AdamW moments and
//! the LR schedule position); `train_step` draws no random numbers. The
//! host's state (data cursor, RNG, scheduler) travels as the opaque
//! [`CheckpointMeta::host_state`].

use std::collections::HashSet;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::{RlError, RlOptimizer};
pub use agl_model::create_private_dir_all;
use agl_model::{Model, ModelError, read_safetensors_folder};

const MODEL_DIR: &str = "model";
const ADAPTER_DIR: &str = "adapter";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const META_FILE: &str = "meta.json";
const STEP_PREFIX: &str = "step-";
const TMP_PREFIX: &str = ".tmp-";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// The run's step (names the folder).
    pub step: u64,
    /// The weight version the engine serves with these weights.
    pub weight_version: u64,
    /// Unix time of the save, in milliseconds.
    pub created_ms: u64,
    /// The host's own state (data cursor, RNG, scheduler snapshot), opaque
    /// here.
    pub host_state: serde_json::Value,
}

impl CheckpointMeta {
    /// A meta stamped with the current time.
    pub fn new(step: u64, weight_version: u64, host_state: serde_json::Value) -> Self {
        let created_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        CheckpointMeta {
            step,
            weight_version,
            created_ms,
            host_state,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a complete checkpoint ({reason})")]
    Incomplete { path: PathBuf, reason: String },
    #[error("checkpoint {path} does not fit this model: {reason}")]
    Mismatch { path: PathBuf, reason: String },
    #[error("checkpoint {path}: {source}")]
    Model { path: PathBuf, source: ModelError },
    #[error("checkpoint {path}: {source}")]
    Optimizer { path: PathBuf, source: RlError },
    #[error("checkpoint {path}: {source}")]
    Torch {
        path: PathBuf,
        source: tch::TchError,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn torch_err(path: &Path) -> impl FnOnce(tch::TchError) -> CheckpointError + '_ {
    move |source| CheckpointError::Torch {
        path: path.to_path_buf(),
        source,
    }
}

/// Saves `dir/step-<meta.step>` (six digits or more) and then keeps only the
/// newest `keep_last` complete checkpoints (0 keeps all). A checkpoint of the
/// same step is replaced. Returns the checkpoint's path.
pub fn save_checkpoint(
    dir: &Path,
    model: &Model,
    opt: &RlOptimizer,
    meta: &CheckpointMeta,
    keep_last: usize,
) -> Result<PathBuf, CheckpointError> {
    save_checkpoint_with_state(dir, model, opt.state_tensors(), meta, keep_last)
}

/// [`save_checkpoint`] with the optimizer's state given as
/// [`RlOptimizer::state_tensors`] would give it (a ZeRO-1 run gathers it
/// from every rank first, `rl::data_parallel::gather_optimizer_state`).
pub fn save_checkpoint_with_state(
    dir: &Path,
    model: &Model,
    state: Vec<(String, Tensor)>,
    meta: &CheckpointMeta,
    keep_last: usize,
) -> Result<PathBuf, CheckpointError> {
    create_private_dir_all(dir).map_err(io_err(dir))?;
    let tmp = dir.join(format!(
        "{TMP_PREFIX}step-{}-{}",
        meta.step,
        std::process::id()
    ));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    create_private_dir_all(&tmp).map_err(io_err(&tmp))?;

    // With LoRA only the adapter changes: it is the checkpoint's weights
    // (PEFT's folder); the base stays where the run loaded it from.
    let (weights_dir, saved) = match model.lora_config() {
        Some(_) => {
            let dir = tmp.join(ADAPTER_DIR);
            let saved = model.save_adapter(&dir, "base");
            (dir, saved)
        }
        None => {
            let dir = tmp.join(MODEL_DIR);
            let saved = model.save(&dir);
            (dir, saved)
        }
    };
    saved.map_err(|source| CheckpointError::Model {
        path: weights_dir,
        source,
    })?;
    let opt_path = tmp.join(OPTIMIZER_FILE);
    // Left on their device: the writer copies one tensor at a time to the
    // host, so a GPU run needs no second copy of the moments in RAM.
    let state = state
        .into_iter()
        .map(|(name, t)| Ok((name, t.f_contiguous()?)))
        .collect::<Result<Vec<_>, tch::TchError>>()
        .map_err(torch_err(&opt_path))?;
    Tensor::write_safetensors(&state, &opt_path).map_err(torch_err(&opt_path))?;
    // meta.json last: its presence marks a complete folder even if the
    // rename below were ever observed early.
    let meta_path = tmp.join(META_FILE);
    let text = serde_json::to_string_pretty(meta).map_err(|e| CheckpointError::Io {
        path: meta_path.clone(),
        source: e.into(),
    })?;
    fs::write(&meta_path, text + "\n").map_err(io_err(&meta_path))?;
    fsync_tree(&tmp)?;

    let target = dir.join(format!("{STEP_PREFIX}{:06}", meta.step));
    if target.exists() {
        discard(dir, &target)?;
    }
    fs::rename(&tmp, &target).map_err(io_err(&target))?;
    fsync_dir(dir)?;
    tracing::info!(path = %target.display(), step = meta.step, "checkpoint saved");
    prune(dir, keep_last)?;
    Ok(target)
}

/// The newest complete checkpoint under `dir` (by step), if any; a missing
/// `dir` has none.
pub fn latest_checkpoint(dir: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    Ok(complete_checkpoints(dir)?.pop().map(|(_, path)| path))
}

/// Loads a checkpoint's weights into `model` and its state into `opt` (built
/// with [`RlOptimizer::new`] for this model), and returns its meta. The
/// shapes and names are checked before anything is copied, so a checkpoint
/// of another model is an error that changes nothing.
pub fn load_checkpoint(
    path: &Path,
    model: &Model,
    opt: &mut RlOptimizer,
) -> Result<CheckpointMeta, CheckpointError> {
    let meta = read_meta(path)?;
    if model.lora_config().is_some() {
        return load_adapter_checkpoint(path, meta, model, opt);
    }
    let model_dir = path.join(MODEL_DIR);
    let weights = read_safetensors_folder(&model_dir).map_err(|source| CheckpointError::Model {
        path: model_dir.clone(),
        source,
    })?;
    check_weights(path, model, &weights)?;
    let opt_path = path.join(OPTIMIZER_FILE);
    let state = Tensor::read_safetensors(&opt_path).map_err(torch_err(&opt_path))?;
    opt.load_state_tensors(state)
        .map_err(|source| CheckpointError::Optimizer {
            path: opt_path.clone(),
            source,
        })?;
    model
        .load_weights_in_place(&weights)
        .map_err(|source| CheckpointError::Model {
            path: model_dir,
            source,
        })?;
    tracing::info!(path = %path.display(), step = meta.step, "checkpoint loaded");
    Ok(meta)
}

/// [`load_checkpoint`] of a LoRA run: the adapter folder and the adapter's
/// optimizer state, both checked before either is copied.
fn load_adapter_checkpoint(
    path: &Path,
    meta: CheckpointMeta,
    model: &Model,
    opt: &mut RlOptimizer,
) -> Result<CheckpointMeta, CheckpointError> {
    let adapter_dir = path.join(ADAPTER_DIR);
    if !adapter_dir.is_dir() {
        return Err(CheckpointError::Mismatch {
            path: path.to_path_buf(),
            reason: "this run trains a LoRA adapter; the checkpoint has full weights".into(),
        });
    }
    let load = model
        .prepare_adapter(&adapter_dir)
        .map_err(|source| CheckpointError::Model {
            path: adapter_dir.clone(),
            source,
        })?;
    let opt_path = path.join(OPTIMIZER_FILE);
    let state = Tensor::read_safetensors(&opt_path).map_err(torch_err(&opt_path))?;
    opt.load_state_tensors(state)
        .map_err(|source| CheckpointError::Optimizer {
            path: opt_path.clone(),
            source,
        })?;
    load.apply().map_err(|source| CheckpointError::Model {
        path: adapter_dir,
        source,
    })?;
    tracing::info!(path = %path.display(), step = meta.step, "checkpoint loaded (LoRA adapter)");
    Ok(meta)
}

fn read_meta(path: &Path) -> Result<CheckpointMeta, CheckpointError> {
    let meta_path = path.join(META_FILE);
    let incomplete = |reason: String| CheckpointError::Incomplete {
        path: path.to_path_buf(),
        reason,
    };
    let text =
        fs::read_to_string(&meta_path).map_err(|e| incomplete(format!("{META_FILE}: {e}")))?;
    serde_json::from_str(&text).map_err(|e| incomplete(format!("{META_FILE}: {e}")))
}

/// Every parameter present with its shape, nothing unknown (a tied
/// `lm_head.weight` copy is tolerated, as `Model::load` does).
fn check_weights(
    path: &Path,
    model: &Model,
    weights: &[(String, Tensor)],
) -> Result<(), CheckpointError> {
    let mismatch = |reason: String| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        reason,
    };
    let vars = model.var_store().variables();
    let mut seen = HashSet::new();
    for (name, t) in weights {
        match vars.get(name) {
            Some(v) if v.size() != t.size() => {
                return Err(mismatch(format!(
                    "{name}: shape {:?}, model has {:?}",
                    t.size(),
                    v.size()
                )));
            }
            Some(_) => {
                seen.insert(name.as_str());
            }
            None if name == "lm_head.weight" && model.config().tie_word_embeddings => {}
            None => return Err(mismatch(format!("unknown parameter {name}"))),
        }
    }
    let mut missing: Vec<&str> = vars
        .keys()
        .map(String::as_str)
        .filter(|n| !seen.contains(n))
        .collect();
    if !missing.is_empty() {
        missing.sort();
        return Err(mismatch(format!("missing {}", missing.join(", "))));
    }
    Ok(())
}

/// Complete `step-N` folders under `dir`, oldest first.
fn complete_checkpoints(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let Some(step) = name
            .to_str()
            .and_then(|n| n.strip_prefix(STEP_PREFIX))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let path = entry.path();
        match read_meta(&path) {
            Ok(_) => found.push((step, path)),
            Err(e) => tracing::warn!("skipping checkpoint: {e}"),
        }
    }
    found.sort();
    Ok(found)
}

/// Drops all but the newest `keep_last` complete checkpoints (0 keeps all),
/// and `.tmp-*` leftovers of crashed saves. One process saves into a root.
fn prune(dir: &Path, keep_last: usize) -> Result<(), CheckpointError> {
    let entries = fs::read_dir(dir).map_err(io_err(dir))?;
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            let path = entry.path();
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(io_err(&path))?;
        }
    }
    if keep_last == 0 {
        return Ok(());
    }
    let complete = complete_checkpoints(dir)?;
    let excess = complete.len().saturating_sub(keep_last);
    for (_, path) in &complete[..excess] {
        discard(dir, path)?;
    }
    Ok(())
}

/// Removes a checkpoint folder: first renamed to a `.tmp-` name (atomic), so
/// a crash halfway through the deletion never leaves a partial `step-*`.
fn discard(dir: &Path, path: &Path) -> Result<(), CheckpointError> {
    let name = path
        .file_name()
        .map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned());
    let doomed = dir.join(format!("{TMP_PREFIX}old-{name}-{}", std::process::id()));
    fs::rename(path, &doomed).map_err(io_err(path))?;
    fsync_dir(dir)?;
    fs::remove_dir_all(&doomed).map_err(io_err(&doomed))
}

/// fsyncs every file under `dir`, then the folders themselves, so the data
/// is on disk before the rename publishes it.
fn fsync_tree(dir: &Path) -> Result<(), CheckpointError> {
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        if path.is_dir() {
            fsync_tree(&path)?;
        } else {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&path))?;
        }
    }
    fsync_dir(dir)
}

fn fsync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io_err(dir))
}
