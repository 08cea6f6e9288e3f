//! The engine's own weight routes (`agl engine serve`), what vLLM's and
//! SGLang's RL routes are for them: `POST /load_weights {"path",
//! "weight_version"}` loads every `*.safetensors` file of the folder `path`
//! (Hugging Face names: what the trainer saves) into the engine between
//! steps and sets the weight version; `GET /weight_info` answers
//! `{"weight_version"}`. Sequences running while weights load end
//! (`"in_flight": "abort"`, the default: the caller pauses and drains its
//! gateway first), or go on under the new weights (`"continue"`: partial
//! rollouts, each token reporting the version that sampled it).

use std::path::{Path, PathBuf};

use axum::extract::State;
use axum::response::Json;
use serde::Deserialize;
use serde_json::{Value, json};
use tch::Tensor;

use crate::InferenceServer;
use agl_engine::InFlight;
use agl_wire::ApiError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadWeights {
    path: PathBuf,
    /// A decimal number, as vLLM and SGLang take it.
    weight_version: String,
    #[serde(default)]
    in_flight: InFlightMode,
}

/// `in_flight` of `POST /load_weights`.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum InFlightMode {
    #[default]
    Abort,
    Continue,
}

pub async fn load(
    State(s): State<InferenceServer>,
    body: Result<Json<LoadWeights>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let version: u64 = body.weight_version.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "weight_version `{}` is not a whole number",
            body.weight_version
        ))
    })?;
    let dir = body.path.clone();
    let tensors = tokio::task::spawn_blocking(move || read_folder(&dir))
        .await
        .map_err(|e| ApiError::internal(format!("reading weights: {e}")))??;
    let n = tensors.len();
    s.engine()
        .update_weights(
            tensors,
            version,
            match body.in_flight {
                InFlightMode::Abort => InFlight::Abort,
                InFlightMode::Continue => InFlight::Continue,
            },
        )
        .await
        .map_err(|e| ApiError::bad_request(format!("loading {}: {e}", body.path.display())))?;
    tracing::info!(version, tensors = n, path = %body.path.display(), "weights loaded");
    Ok(Json(
        json!({"weight_version": version.to_string(), "tensors": n}),
    ))
}

pub async fn info(State(s): State<InferenceServer>) -> Json<Value> {
    Json(json!({"weight_version": s.engine().weight_version().to_string()}))
}

/// Every tensor of the folder's `*.safetensors` files.
fn read_folder(dir: &Path) -> Result<Vec<(String, Tensor)>, ApiError> {
    let unreadable = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!("cannot read weights in {}: {e}", dir.display()))
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| unreadable(&e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(unreadable(&"no *.safetensors file"));
    }
    let mut tensors = Vec::new();
    for file in files {
        tensors.extend(Tensor::read_safetensors(&file).map_err(|e| unreadable(&e))?);
    }
    Ok(tensors)
}
