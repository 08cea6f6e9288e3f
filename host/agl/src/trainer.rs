//! The trainer thread: owns the policy model and its optimizer (tch tensors
//! stay on one thread) and runs what the loop asks, one command at a time.

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;

use anyhow::Context;
use tch::{Device, Kind, Tensor};
use tokio::sync::oneshot;

use agl_trainer::checkpoint::{self, CheckpointMeta};
use agl_trainer::model::{LoraConfig, Model};
use agl_trainer::rl::{
    AdamWConfig, LrSchedule, RlOptimizer, StepConfig, StepStats, UpdateBatch, score_ref_logprobs,
    train_step,
};

type Reply<T> = oneshot::Sender<anyhow::Result<T>>;

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
    pub async fn start(spec: TrainerSpec) -> anyhow::Result<Trainer> {
        let (commands, rx) = std_mpsc::channel();
        let (ready, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("agl-trainer".into())
            .spawn(move || {
                let loaded = Model::load(&spec.model_dir, spec.kind, spec.device)
                    .with_context(|| {
                        format!("loading the policy from {}", spec.model_dir.display())
                    })
                    .and_then(|mut model| {
                        if let Some(lora) = &spec.lora {
                            model.add_lora(lora)?;
                        }
                        let opt = RlOptimizer::new(&model, spec.adamw, spec.schedule)?;
                        let reference = match (spec.reference, &spec.lora) {
                            (false, _) => None,
                            (true, Some(_)) => Some(Reference::Base),
                            (true, None) => {
                                let frozen = Model::load(&spec.model_dir, spec.kind, spec.device)
                                    .context("loading the KL reference")?;
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
                        serve(model, opt, reference, rx);
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            })
            .context("cannot start the trainer thread")?;
        ready_rx.await.context("the trainer thread died")??;
        Ok(Trainer { commands })
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> anyhow::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .map_err(|_| anyhow::anyhow!("the trainer thread stopped"))?;
        rx.await.context("the trainer thread stopped")?
    }

    pub async fn train(&self, batch: UpdateBatch, cfg: StepConfig) -> anyhow::Result<StepStats> {
        self.ask(|r| Command::Train(Box::new(batch), cfg, r)).await
    }

    pub async fn weights(&self) -> anyhow::Result<Vec<(String, Tensor)>> {
        self.ask(Command::Weights).await
    }

    pub async fn save_model(&self, dir: &Path) -> anyhow::Result<()> {
        self.ask(|r| Command::SaveModel(dir.to_path_buf(), r)).await
    }

    pub async fn save_serving_weights(&self, dir: &Path) -> anyhow::Result<()> {
        self.ask(|r| Command::SaveServing(dir.to_path_buf(), r))
            .await
    }

    pub async fn save_adapter(&self, dir: &Path) -> anyhow::Result<()> {
        self.ask(|r| Command::SaveAdapter(dir.to_path_buf(), r))
            .await
    }

    pub async fn checkpoint(
        &self,
        root: &Path,
        meta: CheckpointMeta,
        keep: usize,
    ) -> anyhow::Result<PathBuf> {
        self.ask(|r| Command::Checkpoint(root.to_path_buf(), meta, keep, r))
            .await
    }

    pub async fn restore(&self, path: &Path) -> anyhow::Result<CheckpointMeta> {
        self.ask(|r| Command::Restore(path.to_path_buf(), r)).await
    }
}

fn serve(
    model: Model,
    mut opt: RlOptimizer,
    reference: Option<Reference>,
    rx: std_mpsc::Receiver<Command>,
) {
    while let Ok(command) = rx.recv() {
        match command {
            Command::Train(mut batch, cfg, reply) => {
                let scored = match &reference {
                    None => Ok(()),
                    Some(Reference::Frozen(r)) => score_ref_logprobs(r, &mut batch, &cfg),
                    Some(Reference::Base) => {
                        model.without_adapter(|base| score_ref_logprobs(base, &mut batch, &cfg))
                    }
                };
                let out = scored
                    .and_then(|()| train_step(&model, &mut opt, &batch, &cfg))
                    .map_err(Into::into);
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
                let out = checkpoint::save_checkpoint(&root, &model, &opt, &meta, keep)
                    .map_err(Into::into);
                let _ = reply.send(out);
            }
            Command::Restore(path, reply) => {
                let out = checkpoint::load_checkpoint(&path, &model, &mut opt).map_err(Into::into);
                let _ = reply.send(out);
            }
        }
    }
}

/// `dir/model.safetensors`: every parameter as served, Hugging Face names.
fn save_serving(model: &Model, dir: &Path) -> anyhow::Result<()> {
    checkpoint::create_private_dir_all(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let weights = model.serving_weights();
    let named: Vec<(&str, Tensor)> = weights
        .iter()
        .map(|(n, t)| (n.as_str(), t.to_device(Device::Cpu)))
        .collect();
    let path = dir.join("model.safetensors");
    Tensor::write_safetensors(&named, &path).with_context(|| format!("writing {}", path.display()))
}
