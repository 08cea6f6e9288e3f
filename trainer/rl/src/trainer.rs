//! The trainer thread: owns the policy model and its optimizer (tch tensors
//! stay on one thread) and runs what the training loop asks, one command at
//! a time. With `[train] world_size > 1` it is rank 0 of a data-parallel
//! group ([`crate::ranks`]) and leads every other rank through each update.

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;

use tch::{Device, Kind, Tensor};
use tokio::sync::oneshot;

use crate::checkpoint::{self, CheckpointMeta};
use crate::data_parallel::gather_optimizer_state;
use crate::ranks::{DataParallel, Dist, RankCommand, RankSpec};
use crate::trainer_error::TrainerError;
use crate::{
    AdamWConfig, LrSchedule, OneRank, RlOptimizer, StepConfig, StepStats, UpdateBatch,
    score_ref_logprobs, train_step,
};
use agl_model::{LoraConfig, Model};

type Result<T, E = TrainerError> = std::result::Result<T, E>;
type Reply<T> = oneshot::Sender<Result<T>>;

enum Command {
    Train(Box<UpdateBatch>, StepConfig, Reply<StepStats>),
    /// Copies of every parameter under its Hugging Face name, as served
    /// (a LoRA adapter merged).
    Weights(Reply<Vec<(String, Tensor)>>),
    /// A loadable Hugging Face folder of the current weights.
    SaveModel(PathBuf, Reply<()>),
    /// The weights as served (a LoRA adapter merged) in one safetensors
    /// file in the folder.
    SaveServing(PathBuf, Reply<()>),
    /// The LoRA adapter as PEFT writes it.
    SaveAdapter(PathBuf, Reply<()>),
    Checkpoint(PathBuf, CheckpointMeta, usize, Reply<PathBuf>),
    Restore(PathBuf, Reply<CheckpointMeta>),
}

/// Handle to the trainer thread; dropping it stops the thread.
pub struct Trainer {
    commands: std_mpsc::Sender<Command>,
}

pub struct TrainerSpec {
    pub model_dir: PathBuf,
    pub kind: Kind,
    pub device: Device,
    pub adamw: AdamWConfig,
    pub schedule: LrSchedule,
    /// Train a LoRA adapter on the frozen base.
    pub lora: Option<LoraConfig>,
    /// Score every sample under a KL reference (`kl_coef != 0`): the
    /// initial weights, frozen; with LoRA the base without the adapter.
    pub reference: bool,
    /// More than one rank: this thread is rank 0 of the group.
    pub data_parallel: Option<DataParallel>,
    /// `[train] release_freed_memory`, for this process and every rank.
    pub release_freed_memory: bool,
}

/// The KL term's reference model.
enum Reference {
    /// A frozen copy of the initial weights (one more copy of the weights
    /// on the trainer's device, no gradients or optimizer state).
    Frozen(Box<Model>),
    /// The policy with its LoRA adapter left out: the frozen base, at no
    /// extra weight memory.
    Base,
}

impl Trainer {
    /// Loads the model on its own thread; returns once it is ready.
    pub async fn start(spec: TrainerSpec) -> Result<Trainer> {
        let (commands, rx) = std_mpsc::channel();
        let (ready, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("agl-trainer".into())
            .spawn(move || {
                if spec.release_freed_memory && !crate::memory::release_freed_memory() {
                    tracing::warn!(
                        "train.release_freed_memory: not on this allocator (glibc only)"
                    );
                }
                let dist = match &spec.data_parallel {
                    Some(dp) if dp.world_size > 1 => {
                        let rank_spec = RankSpec {
                            model_dir: spec.model_dir.clone(),
                            bf16: spec.kind == Kind::BFloat16,
                            adamw: spec.adamw,
                            schedule: spec.schedule,
                            lora: spec.lora.clone(),
                            zero1: dp.zero1,
                            release_freed_memory: spec.release_freed_memory,
                        };
                        match Dist::start(dp, spec.device, &rank_spec) {
                            Ok(d) => Some(d),
                            Err(e) => {
                                let _ = ready.send(Err(e));
                                return;
                            }
                        }
                    }
                    _ => None,
                };
                let world = dist.as_ref().map(|d| d.group.world_size());
                let loaded = Model::load(&spec.model_dir, spec.kind, spec.device)
                    .map_err(|source| TrainerError::Load {
                        what: "the policy",
                        path: spec.model_dir.clone(),
                        source,
                    })
                    .and_then(|mut model| {
                        if let Some(lora) = &spec.lora {
                            model.add_lora(lora)?;
                        }
                        let opt = match (world, &spec.data_parallel) {
                            (Some(world), Some(dp)) if dp.zero1 => RlOptimizer::new_sharded(
                                &model,
                                spec.adamw,
                                spec.schedule,
                                0,
                                world,
                            )?,
                            _ => RlOptimizer::new(&model, spec.adamw, spec.schedule)?,
                        };
                        let reference = match (spec.reference, &spec.lora) {
                            (false, _) => None,
                            (true, Some(_)) => Some(Reference::Base),
                            (true, None) => {
                                let frozen = Model::load(&spec.model_dir, spec.kind, spec.device)
                                    .map_err(|source| TrainerError::Load {
                                    what: "the KL reference",
                                    path: spec.model_dir.clone(),
                                    source,
                                })?;
                                frozen.var_store().variables().values().for_each(|t| {
                                    let _ = t.set_requires_grad(false);
                                });
                                Some(Reference::Frozen(Box::new(frozen)))
                            }
                        };
                        Ok((model, opt, reference))
                    });
                match loaded {
                    Ok((model, opt, reference)) => {
                        let _ = ready.send(Ok(()));
                        serve(model, opt, reference, dist, rx);
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            })
            .map_err(|source| TrainerError::Io {
                what: "starting the trainer thread".into(),
                source,
            })?;
        ready_rx.await.map_err(|_| TrainerError::Stopped)??;
        Ok(Trainer { commands })
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .map_err(|_| TrainerError::Stopped)?;
        rx.await.map_err(|_| TrainerError::Stopped)?
    }

    pub async fn train(&self, batch: UpdateBatch, cfg: StepConfig) -> Result<StepStats> {
        self.ask(|r| Command::Train(Box::new(batch), cfg, r)).await
    }

    pub async fn weights(&self) -> Result<Vec<(String, Tensor)>> {
        self.ask(Command::Weights).await
    }

    pub async fn save_model(&self, dir: &Path) -> Result<()> {
        self.ask(|r| Command::SaveModel(dir.to_path_buf(), r)).await
    }

    pub async fn save_serving_weights(&self, dir: &Path) -> Result<()> {
        self.ask(|r| Command::SaveServing(dir.to_path_buf(), r))
            .await
    }

    pub async fn save_adapter(&self, dir: &Path) -> Result<()> {
        self.ask(|r| Command::SaveAdapter(dir.to_path_buf(), r))
            .await
    }

    pub async fn checkpoint(
        &self,
        root: &Path,
        meta: CheckpointMeta,
        keep: usize,
    ) -> Result<PathBuf> {
        self.ask(|r| Command::Checkpoint(root.to_path_buf(), meta, keep, r))
            .await
    }

    pub async fn restore(&self, path: &Path) -> Result<CheckpointMeta> {
        self.ask(|r| Command::Restore(path.to_path_buf(), r)).await
    }
}

fn serve(
    model: Model,
    mut opt: RlOptimizer,
    reference: Option<Reference>,
    mut dist: Option<Dist>,
    rx: std_mpsc::Receiver<Command>,
) {
    while let Ok(command) = rx.recv() {
        match command {
            Command::Train(mut batch, cfg, reply) => {
                // The reference lives on rank 0 only: the batch carries its
                // logprobs to the other ranks.
                let scored = match &reference {
                    None => Ok(()),
                    Some(Reference::Frozen(r)) => score_ref_logprobs(r, &mut batch, &cfg),
                    Some(Reference::Base) => {
                        model.without_adapter(|base| score_ref_logprobs(base, &mut batch, &cfg))
                    }
                };
                let out = match scored {
                    Err(e) => Err(e.into()),
                    Ok(()) => match &mut dist {
                        None => train_step(&model, &mut opt, &batch, &cfg, &mut OneRank)
                            .map_err(Into::into),
                        Some(d) => train_ranks(d, &model, &mut opt, batch, cfg),
                    },
                };
                let _ = reply.send(out);
            }
            Command::Weights(reply) => {
                // As served: a LoRA adapter merged into its linears.
                let _ = reply.send(Ok(model.serving_weights()));
            }
            Command::SaveModel(dir, reply) => {
                let _ = reply.send(model.save(&dir).map_err(Into::into));
            }
            Command::SaveServing(dir, reply) => {
                let _ = reply.send(save_serving(&model, &dir));
            }
            Command::SaveAdapter(dir, reply) => {
                let _ = reply.send(model.save_adapter(&dir, "base").map_err(Into::into));
            }
            Command::Checkpoint(root, meta, keep, reply) => {
                let _ = reply.send(save_checkpoint(&mut dist, &model, &opt, &root, &meta, keep));
            }
            Command::Restore(path, reply) => {
                let sent = match &mut dist {
                    Some(d) => d.send(&RankCommand::Restore(path.clone())),
                    None => Ok(()),
                };
                let out = sent.and_then(|()| {
                    checkpoint::load_checkpoint(&path, &model, &mut opt).map_err(Into::into)
                });
                let _ = reply.send(out);
            }
        }
    }
}

/// One update led on every rank; an error names a rank that died.
fn train_ranks(
    dist: &mut Dist,
    model: &Model,
    opt: &mut RlOptimizer,
    batch: Box<UpdateBatch>,
    cfg: StepConfig,
) -> Result<StepStats> {
    let command = RankCommand::Train(batch, cfg);
    let out = dist.send(&command).and_then(|()| {
        let RankCommand::Train(batch, cfg) = &command else {
            unreachable!("built above")
        };
        train_step(model, opt, batch, cfg, &mut dist.group).map_err(Into::into)
    });
    out.map_err(|e| dist.explain(e))
}

/// A checkpoint of rank 0's weights and the whole optimizer state (ZeRO-1:
/// gathered from every rank first).
fn save_checkpoint(
    dist: &mut Option<Dist>,
    model: &Model,
    opt: &RlOptimizer,
    root: &Path,
    meta: &CheckpointMeta,
    keep: usize,
) -> Result<PathBuf> {
    let state = match dist {
        Some(d) if d.zero1 => d
            .send(&RankCommand::GatherState)
            .and_then(|()| gather_optimizer_state(model, opt, &mut d.group).map_err(Into::into))
            .map_err(|e| d.explain(e))?,
        _ => opt.state_tensors(),
    };
    Ok(checkpoint::save_checkpoint_with_state(
        root, model, state, meta, keep,
    )?)
}

/// `dir/model.safetensors`: every parameter as served, Hugging Face names.
fn save_serving(model: &Model, dir: &Path) -> Result<()> {
    checkpoint::create_private_dir_all(dir).map_err(|source| TrainerError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let weights = model.serving_weights();
    let named: Vec<(&str, Tensor)> = weights
        .iter()
        .map(|(n, t)| (n.as_str(), t.to_device(Device::Cpu)))
        .collect();
    let path = dir.join("model.safetensors");
    Tensor::write_safetensors(&named, &path).map_err(|source| TrainerError::Write { path, source })
}
