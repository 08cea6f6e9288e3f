//! New weights into a running vLLM or SGLang server, through the RL routes
//! of the pinned versions (the routes and bodies are listed, with the
//! source files they were read from, in `agl-testengine`'s `admin.rs`,
//! which serves them for the contract tests):
//!
//! - full weights, vLLM 0.33 (dev mode): `POST /pause?mode=keep|abort`,
//!   `POST /collective_rpc {"method": "reload_weights", "kwargs":
//!   {"weights_path"}}`, `POST /update_weight_version {"new_version"}`,
//!   `POST /resume`, then `GET /weight_info` must report the version;
//! - full weights, SGLang 0.5.23: `POST /pause_generation {"mode":
//!   "retract"|"abort"}`, `POST /update_weights_from_disk {"model_path",
//!   "weight_version", "flush_cache": true}`, `POST /continue_generation`,
//!   then `GET /model_info` must report the version;
//! - full weights, agl's engine (`agl engine serve`): `POST /load_weights
//!   {"path", "weight_version"}` (between engine steps; the gateway is
//!   drained), then `GET /weight_info` must report the version;
//! - a LoRA adapter (PEFT folder), loaded under a new name per version
//!   (vLLM `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`, SGLang
//!   `POST /load_lora_adapter`), the old one unloaded once the caller has
//!   switched requests to the new name.
//!
//! A failed step resumes the engine on the weights it had (a paused engine
//! would serve nothing) and says which step failed and what the engine
//! answered.

use std::path::Path;

use anyhow::Context;
use serde_json::{Value, json};

use agl_engine::InFlight;

use crate::config::{EngineKind, PauseMode};

/// The engine end of a reload.
pub struct Reloader {
    pub kind: EngineKind,
    /// The server root (admin routes live there).
    pub root: String,
    pub http: reqwest::Client,
    pub pause: PauseMode,
}

impl Reloader {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.root);
        let resp = self
            .http
            .post(&url)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        // SGLang answers some failures with 200 and `success: false`.
        let refused = value.get("success").and_then(Value::as_bool) == Some(false);
        anyhow::ensure!(
            status.is_success() && !refused,
            "POST {url} answered {status}: {text}"
        );
        Ok(value)
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.root);
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        anyhow::ensure!(status.is_success(), "GET {url} answered {status}: {text}");
        serde_json::from_str(&text).with_context(|| format!("GET {url}: not JSON: {text}"))
    }

    async fn pause(&self) -> anyhow::Result<()> {
        match self.kind {
            EngineKind::Vllm => {
                let mode = match self.pause {
                    PauseMode::Keep => "keep",
                    PauseMode::Abort => "abort",
                };
                self.post(&format!("/pause?mode={mode}"), Value::Null)
                    .await?;
            }
            _ => {
                // `retract` keeps requests (recomputed on the new weights)
                // and lets the cache be flushed, which `in_place` does not.
                let mode = match self.pause {
                    PauseMode::Keep => "retract",
                    PauseMode::Abort => "abort",
                };
                self.post("/pause_generation", json!({"mode": mode}))
                    .await?;
            }
        }
        Ok(())
    }

    async fn resume(&self) -> anyhow::Result<()> {
        match self.kind {
            EngineKind::Vllm => self.post("/resume", Value::Null).await?,
            _ => self.post("/continue_generation", json!({})).await?,
        };
        Ok(())
    }

    /// The weight version the engine reports.
    pub async fn engine_version(&self) -> anyhow::Result<Option<String>> {
        let info = match self.kind {
            EngineKind::Vllm | EngineKind::Agl => self.get("/weight_info").await?,
            _ => self.get("/model_info").await?,
        };
        Ok(info
            .get("weight_version")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// Loads the full weights in `dir` as `version`; on success the engine
    /// reports that version.
    /// `in_flight`: agl's engine keeps or ends its running sequences as
    /// asked; vLLM and SGLang do what `pause_mode` says (`keep` keeps them).
    pub async fn load_weights(
        &self,
        dir: &Path,
        version: u64,
        in_flight: InFlight,
    ) -> anyhow::Result<()> {
        if self.kind == EngineKind::Agl {
            // Loaded between engine steps: no pause of its own.
            self.swap_weights(dir, version, in_flight).await?;
            return self.check_version(version).await;
        }
        self.pause().await.context("pausing the engine")?;
        let loaded = self.swap_weights(dir, version, in_flight).await;
        let resumed = self.resume().await.context("resuming the engine");
        loaded?;
        resumed?;
        self.check_version(version).await
    }

    async fn check_version(&self, version: u64) -> anyhow::Result<()> {
        let reported = self.engine_version().await?;
        anyhow::ensure!(
            reported.as_deref() == Some(version.to_string().as_str()),
            "the engine reports weight version {reported:?} after loading version {version}"
        );
        Ok(())
    }

    async fn swap_weights(
        &self,
        dir: &Path,
        version: u64,
        in_flight: InFlight,
    ) -> anyhow::Result<()> {
        let path = dir.display().to_string();
        match self.kind {
            EngineKind::Agl => {
                let in_flight = match in_flight {
                    InFlight::Abort => "abort",
                    InFlight::Continue => "continue",
                };
                self.post(
                    "/load_weights",
                    json!({"path": path, "weight_version": version.to_string(),
                           "in_flight": in_flight}),
                )
                .await
                .context("loading the weights")?;
            }
            EngineKind::Vllm => {
                self.post(
                    "/collective_rpc",
                    json!({"method": "reload_weights", "kwargs": {"weights_path": path}}),
                )
                .await
                .context("reloading the weights")?;
                self.post(
                    "/update_weight_version",
                    json!({"new_version": version.to_string()}),
                )
                .await
                .context("setting the weight version")?;
            }
            _ => {
                self.post(
                    "/update_weights_from_disk",
                    json!({"model_path": path, "weight_version": version.to_string(),
                           "flush_cache": true, "abort_all_requests": false}),
                )
                .await
                .context("loading the weights from disk")?;
            }
        }
        Ok(())
    }

    /// Loads the adapter folder `dir` under `name`.
    pub async fn load_adapter(&self, name: &str, dir: &Path) -> anyhow::Result<()> {
        let route = match self.kind {
            EngineKind::Vllm => "/v1/load_lora_adapter",
            _ => "/load_lora_adapter",
        };
        self.post(
            route,
            json!({"lora_name": name, "lora_path": dir.display().to_string()}),
        )
        .await
        .with_context(|| format!("loading LoRA adapter {name}"))?;
        Ok(())
    }

    pub async fn unload_adapter(&self, name: &str) -> anyhow::Result<()> {
        let route = match self.kind {
            EngineKind::Vllm => "/v1/unload_lora_adapter",
            _ => "/unload_lora_adapter",
        };
        self.post(route, json!({"lora_name": name}))
            .await
            .with_context(|| format!("unloading LoRA adapter {name}"))?;
        Ok(())
    }

    /// The model name requests use to get adapter `name` (vLLM serves an
    /// adapter under its own name; SGLang's OpenAI routes read
    /// `base:adapter`).
    pub fn adapter_model(&self, base: &str, name: &str) -> String {
        match self.kind {
            EngineKind::Vllm => name.to_string(),
            _ => format!("{base}:{name}"),
        }
    }
}
