//! The engine that serves the policy during `agl run`, and how it gets new
//! weights: embedded = copied in place into agl's own engine; external =
//! written as a Hugging Face folder and reloaded by the server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use agl_conversation::Renderer;
use agl_gateway::Gateway;
use agl_inference::InferenceServer;
use agl_store::Store;
use agl_tokenizer::Tokenizer;
use agl_trainer::engine::EngineConfig as TchEngineConfig;
use agl_wire::api::{Engine, Render};
use agl_wire::urls;
use std::sync::Arc;

use super::config::{EngineKind, PolicyEngineConfig, ReloadKind};
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
    External {
        base_url: String,
        reload: ReloadKind,
        http: reqwest::Client,
        /// Where new weights are written for the server to load.
        weights_dir: PathBuf,
    },
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
            EngineKind::External => {
                let base_url = cfg
                    .base_url
                    .clone()
                    .context("engine.kind = \"external\" needs engine.base_url")?;
                // Either form is accepted: the proxy calls under `/v1`,
                // reloads go to the root (SGLang's admin routes live there).
                let openai_base = urls::engine_base_url(&base_url);
                let base_url = urls::engine_root_url(&base_url);
                store
                    .register_engine(ENGINE_NAME, &openai_base, &name, cfg.render, cfg.api)
                    .await?;
                Ok(Policy::External {
                    base_url,
                    reload: cfg.reload,
                    http: reqwest::Client::builder()
                        .timeout(Duration::from_secs(600))
                        .build()?,
                    weights_dir: out_dir.join("weights"),
                })
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
            Policy::External {
                base_url,
                reload,
                http,
                weights_dir,
            } => {
                if *reload == ReloadKind::None {
                    return Ok(());
                }
                let dir = weights_dir.join(format!("v{version}"));
                trainer.save_model(&dir).await?;
                let body = json!({
                    "model_path": dir,
                    "weight_version": version.to_string(),
                    "flush_cache": true,
                });
                let url = format!("{base_url}/update_weights_from_disk");
                let resp = http
                    .post(&url)
                    .json(&body)
                    .send()
                    .await
                    .with_context(|| format!("POST {url}"))?;
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                let ok = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v.get("success").and_then(|s| s.as_bool()))
                    .unwrap_or(status.is_success());
                anyhow::ensure!(status.is_success() && ok, "{url} answered {status}: {text}");
                // Keep only the folder the engine now serves.
                prune_except(weights_dir, &dir);
            }
        }
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
