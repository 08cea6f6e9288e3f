//! The engine that serves the policy during `agl run`, and how it gets new
//! weights: embedded = copied in place into agl's own engine; vLLM or
//! SGLang = written as a Hugging Face folder (or, training LoRA, a PEFT
//! adapter folder) and loaded by the server (`reload.rs`); external = kept.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use agl_conversation::Renderer;
use agl_gateway::Gateway;
use agl_inference::InferenceServer;
use agl_store::Store;
use agl_tokenizer::Tokenizer;
use agl_trainer::engine::EngineConfig as TchEngineConfig;
use agl_wire::api::{Engine, Render};
use agl_wire::urls;
use std::sync::Arc;

use super::config::{EngineKind, PolicyEngineConfig};
use super::reload::Reloader;
use super::worker::Trainer;

/// The engine name agl registers in the store.
pub const ENGINE_NAME: &str = "policy";

/// Serves `server` inside `gateway` as engine `name` (base URL
/// `embedded://NAME`): the proxy calls it in-process, with the same
/// retries and recording as an HTTP engine. This is what a one-process
/// `agl run` (gateway + embedded engine) calls.
pub async fn embed(
    gateway: &Gateway,
    store: &Store,
    name: &str,
    server: &InferenceServer,
    render: Render,
) -> anyhow::Result<Engine> {
    gateway.register_embedded(name, server.router());
    let url = format!("embedded://{name}");
    Ok(store
        .register_engine(name, &url, server.model_name(), render, Default::default())
        .await?)
}

/// The policy's template and tokenizer for gateway-rendered chat calls.
pub fn renderer(model_dir: &Path) -> anyhow::Result<Renderer> {
    let tokenizer = Tokenizer::from_file(&model_dir.join("tokenizer.json"))?;
    let eos = agl_inference::eos_ids(model_dir, &tokenizer);
    Ok(Renderer::new(Arc::new(tokenizer), &eos)?)
}

/// [`renderer`] with `[engine]`'s `tool_parser` / `reasoning` applied over
/// what the template implies.
pub fn configured_renderer(model_dir: &Path, cfg: &PolicyEngineConfig) -> anyhow::Result<Renderer> {
    let renderer = renderer(model_dir)?;
    let mut family = renderer.family();
    family.tools = cfg.tool_parser.unwrap_or(family.tools);
    family.reasoning = cfg.reasoning.unwrap_or(family.reasoning);
    Ok(renderer.with_family(family))
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
    store: Store,
}

impl Policy {
    /// Starts (embedded) or registers (external) the engine with the gateway.
    pub async fn start(
        cfg: &PolicyEngineConfig,
        model_dir: &Path,
        kind: tch::Kind,
        out_dir: &Path,
        gateway: &Gateway,
        store: &Store,
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
                let dir = model_dir.to_path_buf();
                let server = tokio::task::spawn_blocking(move || {
                    InferenceServer::load(&dir, &name, kind, engine_cfg)
                })
                .await??;
                embed(gateway, store, ENGINE_NAME, &server, cfg.render).await?;
                Ok(Policy::Embedded(server))
            }
            EngineKind::Vllm | EngineKind::Sglang | EngineKind::External => {
                let base_url = cfg.base_url.clone().with_context(|| {
                    format!("engine.kind = {:?} needs engine.base_url", cfg.kind)
                })?;
                // Either form is accepted: the proxy calls under `/v1`,
                // reloads go to the root (the admin routes live there).
                let openai_base = urls::engine_base_url(&base_url);
                let root = urls::engine_root_url(&base_url);
                let registration = store
                    .register_engine(ENGINE_NAME, &openai_base, &name, cfg.render, cfg.api)
                    .await?;
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
                    store: store.clone(),
                })))
            }
        }
    }

    /// Gives the engine the trainer's current weights as `version`. The
    /// gateway is paused and drained around this.
    pub async fn update(&self, trainer: &Trainer, version: u64) -> anyhow::Result<()> {
        match self {
            Policy::Embedded(server) => {
                let tensors = trainer.weights().await?;
                server
                    .engine()
                    .update_weights(tensors, version)
                    .await
                    .context("loading new weights into the embedded engine")?;
            }
            Policy::Remote(remote) => remote.update(trainer, version).await?,
        }
        Ok(())
    }
}

impl Remote {
    async fn update(&self, trainer: &Trainer, version: u64) -> anyhow::Result<()> {
        let Some(reloader) = &self.reloader else {
            return Ok(());
        };
        if !self.lora {
            let dir = self.weights_dir.join(format!("v{version}"));
            trainer.save_model(&dir).await?;
            reloader.load_weights(&dir, version).await?;
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
        let r = &self.registration;
        let model = reloader.adapter_model(&self.base_model, &name);
        self.store
            .register_engine(&r.name, &r.base_url, &model, r.render, r.api)
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
