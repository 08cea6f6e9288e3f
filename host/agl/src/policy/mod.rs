//! The engine that serves the policy while `agl run` or `agl train` trains
//! it, and how it gets new weights: embedded = copied in place into agl's
//! own engine in the gateway's process; vLLM or SGLang = written as a
//! Hugging Face folder (or, training LoRA, a PEFT adapter folder) and loaded
//! by the server (`reload.rs`); agl's engine served apart = written as one
//! safetensors file (LoRA merged) and loaded through its `/load_weights`;
//! external = kept.

mod publish;
mod reload;

pub use publish::{Publish, publish};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use agl_engine::{EngineConfig as TchEngineConfig, InFlight};
use agl_gateway::Gateway;
use agl_inference::InferenceServer;
use agl_store::Store;
use agl_wire::api::{Engine, RegisterEngine, Render};
use agl_wire::urls;

use crate::config::{EngineKind, PolicyEngineConfig};
use crate::link::Link;
use agl_rl::Trainer;
use reload::Reloader;

/// The engine name agl registers in the store.
pub const ENGINE_NAME: &str = "policy";

/// Serves `server` inside `gateway` as engine `name` (base URL
/// `embedded://NAME`): the proxy calls it in-process, with the same
/// retries and recording as an HTTP engine, and renders its chat calls
/// (the engine takes token ids). This is what a one-process `agl run`
/// (gateway + embedded engine) calls.
pub async fn embed(
    gateway: &Gateway,
    store: &Store,
    name: &str,
    server: &InferenceServer,
) -> anyhow::Result<Engine> {
    gateway.register_embedded(name, server.router());
    let url = format!("embedded://{name}");
    let max_len = server.engine().max_len() as u64;
    let registration = RegisterEngine::new(name, &url, server.model_name())
        .with_render(Render::Gateway)
        .with_context_len(max_len);
    Ok(store.register_engine(&registration).await?)
}

pub enum Policy {
    Embedded(InferenceServer),
    Remote(Box<Remote>),
}

/// A server agl does not run.
pub struct Remote {
    /// `None`: an `external` engine, which keeps its weights.
    reloader: Option<Reloader>,
    /// Where new weights are written for the server to load.
    weights_dir: PathBuf,
    /// The engine's registration (its model name moves with the adapter).
    registration: Engine,
    /// The base model name the server serves.
    base_model: String,
    /// Training LoRA: the adapter requests use now.
    adapter: std::sync::Mutex<Option<String>>,
    lora: bool,
    link: Arc<dyn Link>,
}

impl Policy {
    /// Starts (embedded: inside `gateway`, this process's) or registers
    /// (a server agl does not run) the engine with the gateway `link`
    /// reaches.
    pub async fn start(
        cfg: &PolicyEngineConfig,
        (model_dir, kind): (&Path, tch::Kind),
        out_dir: &Path,
        (gateway, link): (Option<&Gateway>, &Arc<dyn Link>),
        lora: bool,
    ) -> anyhow::Result<Policy> {
        let default_name = model_dir
            .file_name()
            .map_or("policy".into(), |n| n.to_string_lossy().into_owned());
        let name = cfg.model_name.clone().unwrap_or(default_name);
        match cfg.kind {
            EngineKind::Embedded => {
                let engine_cfg = TchEngineConfig {
                    max_seqs: cfg.max_seqs,
                    max_len: cfg.max_len,
                    weight_version: 0,
                };
                let (Some(gateway), Some(store)) = (gateway, link.local_store()) else {
                    anyhow::bail!(
                        "engine.kind = \"embedded\" runs the engine inside the gateway's \
                         process (`agl run`); apart from it, serve the policy with `agl engine \
                         serve` and set engine.kind = \"agl\" and engine.base_url"
                    );
                };
                let server =
                    crate::assembly::engine_server(model_dir, &name, kind, engine_cfg).await?;
                embed(gateway, store, ENGINE_NAME, &server).await?;
                Ok(Policy::Embedded(server))
            }
            EngineKind::Vllm | EngineKind::Sglang | EngineKind::Agl | EngineKind::External => {
                let base_url = cfg.base_url.clone().with_context(|| {
                    format!("engine.kind = {:?} needs engine.base_url", cfg.kind)
                })?;
                // Either form is accepted: the proxy calls under `/v1`,
                // reloads go to the root (the admin routes live there).
                let openai_base = urls::engine_base_url(&base_url);
                let root = urls::engine_root_url(&base_url);
                let registration = RegisterEngine::new(ENGINE_NAME, &openai_base, &name)
                    .with_render(cfg.render())
                    .with_api(cfg.api);
                let registration = link.register_engine(&registration).await?;
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(600))
                    .build()?;
                let reloader = (cfg.kind != EngineKind::External).then(|| Reloader {
                    kind: cfg.kind,
                    root,
                    http,
                    pause: cfg.pause_mode,
                });
                Ok(Policy::Remote(Box::new(Remote {
                    reloader,
                    weights_dir: out_dir.join("weights"),
                    registration,
                    base_model: name,
                    adapter: std::sync::Mutex::new(None),
                    lora,
                    link: link.clone(),
                })))
            }
        }
    }

    /// Gives the engine the trainer's current weights as `version`, its
    /// running sequences ended or kept as `in_flight` says. The gateway is
    /// paused (and drained, unless they are kept) around this.
    pub async fn update(
        &self,
        trainer: &Trainer,
        version: u64,
        in_flight: InFlight,
    ) -> anyhow::Result<()> {
        match self {
            Policy::Embedded(server) => {
                let tensors = trainer.weights().await?;
                server
                    .engine()
                    .update_weights(tensors, version, in_flight)
                    .await
                    .context("loading new weights into the embedded engine")?;
            }
            Policy::Remote(remote) => remote.update(trainer, version, in_flight).await?,
        }
        Ok(())
    }
}

impl Remote {
    async fn update(
        &self,
        trainer: &Trainer,
        version: u64,
        in_flight: InFlight,
    ) -> anyhow::Result<()> {
        let Some(reloader) = &self.reloader else {
            return Ok(());
        };
        // agl's engine takes the weights as served (a LoRA adapter merged).
        if !self.lora || reloader.kind == EngineKind::Agl {
            let dir = self.weights_dir.join(format!("v{version}"));
            if reloader.kind == EngineKind::Agl {
                trainer.save_serving_weights(&dir).await?;
            } else {
                trainer.save_model(&dir).await?;
            }
            reloader.load_weights(&dir, version, in_flight).await?;
            // Keep only the folder the engine now serves.
            prune_except(&self.weights_dir, &dir);
            return Ok(());
        }
        // A new adapter name per version: requests move to it before the
        // old one is unloaded (the gateway is drained and paused).
        let name = format!("agl-v{version}");
        let dir = self.weights_dir.join(&name);
        trainer.save_adapter(&dir).await?;
        let first = self
            .adapter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none();
        if first {
            // A resumed run reloads its checkpoint under a version the run
            // before it may have loaded already: that name goes first.
            if let Err(e) = reloader.unload_adapter(&name).await {
                tracing::debug!(error = %e, "no adapter {name} to replace");
            }
        }
        reloader.load_adapter(&name, &dir).await?;
        let model = reloader.adapter_model(&self.base_model, &name);
        self.link
            .register_engine(&self.registration.registration(&model))
            .await?;
        let previous = self
            .adapter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(name);
        if let Some(old) = previous {
            reloader.unload_adapter(&old).await?;
        }
        prune_except(&self.weights_dir, &dir);
        Ok(())
    }
}

fn prune_except(root: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path != keep
            && let Err(e) = std::fs::remove_dir_all(&path)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove old weights");
        }
    }
}
