//! The weight-update routes of the engines agl reloads, as the pinned
//! versions answer them (a mock: weights are checked for presence, not
//! loaded; the script keeps answering). Every call is recorded.
//!
//! vLLM 0.33.0 (dev mode), read from `vllm/entrypoints/rl/online/api_router.py`
//! (`POST /pause?mode=abort|wait|keep`, `POST /resume`,
//! `POST /update_weight_version {"new_version"}`, `GET /weight_info`),
//! `vllm/entrypoints/serve/dev/rpc/api_router.py` (`POST /collective_rpc
//! {"method", "args", "kwargs"}`, string arguments only; here the worker
//! method `reload_weights(weights_path=...)` of
//! `vllm/v1/worker/gpu_model_runner.py`) and
//! `vllm/entrypoints/serve/lora/{api_router,protocol}.py`
//! (`POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}`,
//! `POST /v1/unload_lora_adapter {"lora_name"}`).
//!
//! SGLang 0.5.23, read from `sglang/srt/entrypoints/http_server.py` and
//! `sglang/srt/managers/io_struct.py`: `POST /pause_generation {"mode":
//! "abort"|"retract"|"in_place"}`, `POST /continue_generation`,
//! `POST /update_weights_from_disk` (`UpdateWeightFromDiskReqInput`:
//! `model_path`, `weight_version`, `flush_cache`, `abort_all_requests`, ...;
//! answers `{"success", "message", "num_paused_requests"}`, 400 when not
//! successful), `POST /load_lora_adapter` / `/unload_lora_adapter`
//! (`LoRAUpdateOutput`: `success`, `error_message`, `loaded_adapters`),
//! `GET /model_info` (`weight_version`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::state::{EngineState, RecordedRequest};

/// What the admin routes change.
#[derive(Debug)]
pub struct AdminState {
    weight_version: Mutex<String>,
    paused: AtomicBool,
    adapters: Mutex<BTreeMap<String, String>>,
    /// Fail the next N weight or adapter loads (as a load error).
    fail_loads: AtomicU32,
    /// Hold answers from the next weight version on (set by a test).
    hold_on_reload: AtomicBool,
    /// While true, generation requests wait (recorded, not answered).
    held: tokio::sync::watch::Sender<bool>,
}

impl Default for AdminState {
    fn default() -> Self {
        AdminState {
            // SGLang's `--weight-version` default.
            weight_version: Mutex::new("default".into()),
            paused: AtomicBool::new(false),
            adapters: Mutex::default(),
            fail_loads: AtomicU32::new(0),
            hold_on_reload: AtomicBool::new(false),
            held: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl AdminState {
    pub fn weight_version(&self) -> String {
        self.weight_version
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Loaded adapters by name (their paths).
    pub fn adapters(&self) -> BTreeMap<String, String> {
        self.adapters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn adapters_mut(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.adapters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn fail_next_loads(&self, n: u32) {
        self.fail_loads.store(n, Ordering::SeqCst);
    }

    fn load_fails(&self) -> bool {
        self.fail_loads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn set_version(&self, v: &str) {
        *self
            .weight_version
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = v.to_string();
        // Before the reload answers: no call on the new version is served
        // until the test releases the engine.
        if self.hold_on_reload.swap(false, Ordering::SeqCst) {
            self.held.send_replace(true);
        }
    }

    /// From the next weight version the engine takes, every generation
    /// request waits until [`AdminState::release`]: a test can act between
    /// two steps of a run, whatever the speed of its agents.
    pub fn hold_after_next_reload(&self) {
        self.hold_on_reload.store(true, Ordering::SeqCst);
    }

    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// Waits while the engine is held.
    pub(crate) async fn wait_released(&self) {
        let mut rx = self.held.subscribe();
        let _ = rx.wait_for(|held| !held).await;
    }
}

pub fn routes(router: Router<Arc<EngineState>>) -> Router<Arc<EngineState>> {
    router
        // vLLM
        .route("/pause", post(vllm_pause))
        .route("/resume", post(vllm_resume))
        .route("/collective_rpc", post(vllm_rpc))
        .route("/update_weight_version", post(update_weight_version))
        .route("/weight_info", get(vllm_weight_info))
        .route("/v1/load_lora_adapter", post(vllm_load_lora))
        .route("/v1/unload_lora_adapter", post(vllm_unload_lora))
        // SGLang
        .route("/pause_generation", post(sglang_pause))
        .route("/continue_generation", post(sglang_continue))
        .route("/update_weights_from_disk", post(sglang_update_from_disk))
        .route("/load_lora_adapter", post(sglang_load_lora))
        .route("/unload_lora_adapter", post(sglang_unload_lora))
        .route("/model_info", get(sglang_model_info))
}

fn record(state: &EngineState, path: &str, body: &Value) {
    state.record(RecordedRequest {
        method: "POST".into(),
        path: path.into(),
        headers: Vec::new(),
        raw: body.to_string(),
        body: Some(body.clone()),
    });
}

/// FastAPI's 422 for a body that does not fit the request model.
fn unprocessable(detail: String) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Json(json!({"detail": [{"msg": detail}]})),
    )
        .into_response()
}

fn string_field<'a>(body: &'a Value, key: &str) -> Result<&'a str, String> {
    body.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("field required: {key} (a string)"))
}

/// A load request's `lora_name` and `lora_path`.
fn name_and_path(body: &Value) -> Result<(String, String), String> {
    let name = string_field(body, "lora_name")?;
    let path = string_field(body, "lora_path")?;
    Ok((name.to_string(), path.to_string()))
}

fn is_model(dir: &str) -> bool {
    Path::new(dir).join("config.json").is_file()
}

fn is_adapter(dir: &str) -> bool {
    let dir = Path::new(dir);
    dir.join("adapter_config.json").is_file() && dir.join("adapter_model.safetensors").is_file()
}

#[derive(serde::Deserialize)]
struct PauseQuery {
    #[serde(default)]
    mode: Option<String>,
}

async fn vllm_pause(
    State(state): State<Arc<EngineState>>,
    Query(q): Query<PauseQuery>,
) -> Response {
    let mode = q.mode.unwrap_or_else(|| "abort".into());
    record(&state, "/pause", &json!({"mode": mode}));
    if !["abort", "wait", "keep"].contains(&mode.as_str()) {
        return unprocessable(format!("mode: `{mode}` is not abort, wait or keep"));
    }
    state.admin.paused.store(true, Ordering::SeqCst);
    Json(json!({"status": "paused"})).into_response()
}

async fn vllm_resume(State(state): State<Arc<EngineState>>) -> Json<Value> {
    record(&state, "/resume", &Value::Null);
    state.admin.paused.store(false, Ordering::SeqCst);
    Json(json!({"status": "resumed"}))
}

async fn vllm_rpc(State(state): State<Arc<EngineState>>, Json(body): Json<Value>) -> Response {
    record(&state, "/collective_rpc", &body);
    let Some(method) = body.get("method").and_then(Value::as_str) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"detail": "Missing 'method' in request body"})),
        )
            .into_response();
    };
    // Only serialized string kwargs pass the route.
    let kwargs = body.get("kwargs").cloned().unwrap_or(json!({}));
    if kwargs
        .as_object()
        .is_some_and(|m| m.values().any(|v| !v.is_string()))
    {
        return unprocessable("kwargs values must be strings".into());
    }
    if method != "reload_weights" {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"detail": format!("worker has no method {method}")})),
        )
            .into_response();
    }
    let path = kwargs["weights_path"].as_str().unwrap_or_default();
    if state.admin.load_fails() || !is_model(path) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"detail": format!("reload_weights: cannot load {path:?}")})),
        )
            .into_response();
    }
    Json(json!({"results": [null]})).into_response()
}

async fn update_weight_version(
    State(state): State<Arc<EngineState>>,
    Json(body): Json<Value>,
) -> Response {
    record(&state, "/update_weight_version", &body);
    let v = match string_field(&body, "new_version") {
        Ok(v) => v.to_string(),
        Err(e) => return unprocessable(e),
    };
    state.admin.set_version(&v);
    Json(json!({"success": true, "new_version": v})).into_response()
}

async fn vllm_weight_info(State(state): State<Arc<EngineState>>) -> Json<Value> {
    Json(json!({"weight_version": state.admin.weight_version()}))
}

async fn vllm_load_lora(
    State(state): State<Arc<EngineState>>,
    Json(body): Json<Value>,
) -> Response {
    record(&state, "/v1/load_lora_adapter", &body);
    let (name, path) = match name_and_path(&body) {
        Ok(pair) => pair,
        Err(e) => return unprocessable(e),
    };
    let inplace = body
        .get("load_inplace")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut adapters = state.admin.adapters_mut();
    if adapters.contains_key(&name) && !inplace {
        return vllm_error(
            StatusCode::BAD_REQUEST,
            format!("The lora adapter '{name}' has already been loaded."),
        );
    }
    if state.admin.load_fails() || !is_adapter(&path) {
        return vllm_error(
            StatusCode::BAD_REQUEST,
            format!("No adapter found for {path}"),
        );
    }
    adapters.insert(name.clone(), path);
    (
        StatusCode::OK,
        format!("Success: LoRA adapter '{name}' added successfully."),
    )
        .into_response()
}

async fn vllm_unload_lora(
    State(state): State<Arc<EngineState>>,
    Json(body): Json<Value>,
) -> Response {
    record(&state, "/v1/unload_lora_adapter", &body);
    let name = match string_field(&body, "lora_name") {
        Ok(n) => n.to_string(),
        Err(e) => return unprocessable(e),
    };
    let mut adapters = state.admin.adapters_mut();
    if adapters.remove(&name).is_none() {
        return vllm_error(
            StatusCode::NOT_FOUND,
            format!("The lora adapter '{name}' cannot be found."),
        );
    }
    (
        StatusCode::OK,
        format!("Success: LoRA adapter '{name}' removed successfully."),
    )
        .into_response()
}

/// vLLM's `ErrorResponse`.
fn vllm_error(status: StatusCode, message: String) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": "BadRequestError", "code": status.as_u16()}})),
    )
        .into_response()
}

async fn sglang_pause(State(state): State<Arc<EngineState>>, Json(body): Json<Value>) -> Response {
    record(&state, "/pause_generation", &body);
    let mode = body.get("mode").and_then(Value::as_str).unwrap_or("abort");
    if !["abort", "retract", "in_place"].contains(&mode) {
        return unprocessable(format!("mode: `{mode}` is not abort, retract or in_place"));
    }
    state.admin.paused.store(true, Ordering::SeqCst);
    Json(json!({"message": "Generation paused successfully.", "status": "ok"})).into_response()
}

async fn sglang_continue(
    State(state): State<Arc<EngineState>>,
    Json(body): Json<Value>,
) -> Json<Value> {
    record(&state, "/continue_generation", &body);
    state.admin.paused.store(false, Ordering::SeqCst);
    Json(json!({"message": "Generation continued successfully.", "status": "ok"}))
}

/// Loads when `model_path` is a folder with a `config.json`, then takes
/// `weight_version`.
async fn sglang_update_from_disk(
    State(state): State<Arc<EngineState>>,
    Json(body): Json<Value>,
) -> Response {
    record(&state, "/update_weights_from_disk", &body);
    let path = match string_field(&body, "model_path") {
        Ok(p) => p.to_string(),
        Err(e) => return unprocessable(e),
    };
    let ok = !state.admin.load_fails() && is_model(&path);
    if ok && let Some(v) = body.get("weight_version").and_then(Value::as_str) {
        state.admin.set_version(v);
    }
    let message = if ok {
        format!("Succeeded to update model weights from {path}.")
    } else {
        format!("Failed to get weights iterator: no model at {path:?}")
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    (
        status,
        Json(json!({"success": ok, "message": message, "num_paused_requests": 0})),
    )
        .into_response()
}

async fn sglang_load_lora(
    State(state): State<Arc<EngineState>>,
    Json(body): Json<Value>,
) -> Response {
    record(&state, "/load_lora_adapter", &body);
    let (name, path) = match name_and_path(&body) {
        Ok(pair) => pair,
        Err(e) => return unprocessable(e),
    };
    let mut adapters = state.admin.adapters_mut();
    let error = if adapters.contains_key(&name) {
        Some(format!("LoRA adapter {name} is already loaded"))
    } else if state.admin.load_fails() || !is_adapter(&path) {
        Some(format!("Failed to load LoRA adapter {name} from {path}"))
    } else {
        adapters.insert(name.clone(), path);
        None
    };
    lora_output(error, &adapters)
}

async fn sglang_unload_lora(
    State(state): State<Arc<EngineState>>,
    Json(body): Json<Value>,
) -> Response {
    record(&state, "/unload_lora_adapter", &body);
    let name = match string_field(&body, "lora_name") {
        Ok(n) => n.to_string(),
        Err(e) => return unprocessable(e),
    };
    let mut adapters = state.admin.adapters_mut();
    let error = adapters
        .remove(&name)
        .is_none()
        .then(|| format!("LoRA adapter {name} is not loaded"));
    lora_output(error, &adapters)
}

/// `LoRAUpdateOutput`, 400 when not successful.
fn lora_output(error: Option<String>, adapters: &BTreeMap<String, String>) -> Response {
    let status = if error.is_none() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    (
        status,
        Json(json!({"success": error.is_none(), "error_message": error, "loaded_adapters": adapters})),
    )
        .into_response()
}

async fn sglang_model_info(State(state): State<Arc<EngineState>>) -> Json<Value> {
    Json(
        json!({"model_path": state.model, "served_model_name": state.model,
                "is_generation": true, "weight_version": state.admin.weight_version()}),
    )
}
