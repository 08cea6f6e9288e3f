//! agl's inference server over the token-level engine (`agl_engine`):
//! token-in `/v1/completions` and `/v1/models`, shaped like vLLM (>= 0.10.2)
//! so the gateway records the same things from it: `return_token_ids`
//! gives the prompt ids and the choice's `token_ids` on the choice;
//! `logprobs: k` gives each sampled token's logprob (the engine's
//! convention, see `agl_engine`) and the k <= 20 most likely tokens under
//! the same distribution. `n` samples that many choices, each its own
//! engine sequence (seeded `seed + index`), streamed interleaved with their
//! index. `response_format` JSON and vLLM's `structured_outputs` (the
//! gateway sends a forced tool call's grammar there) are enforced with
//! llguidance (`constrain.rs`): the engine samples under the grammar's
//! token mask, each logprob under that mask.
//!
//! Chat is the gateway's: it renders every chat API with the policy's
//! template and sends the prompt's ids here (`render = "gateway"`, which
//! an engine of agl's own always is); this server renders nothing.
//!
//! Every response carries `x-agl-weight-version` (the version when the
//! request was admitted) and a body field `weight_version` (the version that
//! produced it; a request spanning a weight update ends with `abort`).
//!
//! `POST /load_weights` and `GET /weight_info` (`weights.rs`) take new
//! weights from a folder, as vLLM's and SGLang's RL routes do (`agl train`
//! publishes through them, `[engine] kind = "agl"`).
//!
//! The router serves over HTTP (`agl engine serve`) or in-process: `agl run`
//! registers it with the gateway as engine `embedded://NAME`, dispatched
//! without an HTTP hop.

mod completions;
mod constrain;
mod options;
mod stream;
mod text;
mod weights;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use agl_engine::{
    EngineConfig, EngineError, EngineEvent, EngineHandle, Finished, Request, StopHook,
    TokenConstraint, TopLogprobs,
};
use agl_model::Model;
use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};

/// Largest request body the engine takes: above the gateway's default
/// (32 MiB), so whatever the gateway accepts reaches the engine, which
/// answers a prompt too long for its context with a 400 of its own
/// (axum's default would refuse anything over 2 MB).
pub const BODY_LIMIT_BYTES: usize = 64 * 1024 * 1024;
use serde_json::Value;

use agl_tokenizer::Tokenizer;
use agl_wire::openai::{ModelCard, ModelList, Usage};
use agl_wire::{ApiError, WEIGHT_VERSION_HEADER};
use options::Options;
use text::{TextState, final_text, first_marker};

/// The engine, the tokenizer and the served model's name.
#[derive(Clone)]
pub struct InferenceServer {
    engine: EngineHandle,
    tokenizer: Arc<Tokenizer>,
    model_name: Arc<str>,
    /// Ids that end generation unless `ignore_eos`.
    eos: Arc<[u32]>,
    /// The most choices (`n`) one request may ask for.
    max_n: usize,
    /// Constrained decoding over this tokenizer.
    grammars: Arc<constrain::Grammars>,
}

/// Default [`InferenceServer::with_max_n`]: enough for best-of-n and
/// GRPO-style harnesses (each choice takes a sequence slot of its own).
pub const DEFAULT_MAX_N: usize = 16;

impl InferenceServer {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        model_name: &str,
        eos: Vec<u32>,
    ) -> Self {
        InferenceServer {
            grammars: Arc::new(constrain::Grammars::new(tokenizer.clone(), eos.clone())),
            engine,
            tokenizer,
            model_name: model_name.into(),
            eos: eos.into(),
            max_n: DEFAULT_MAX_N,
        }
    }

    /// At most `max_n` choices per request (`n` above it is a 400).
    pub fn with_max_n(mut self, max_n: usize) -> Self {
        self.max_n = max_n.max(1);
        self
    }

    /// Loads a Hugging Face folder (config.json, safetensors, tokenizer.json,
    /// tokenizer_config.json) and starts its engine.
    pub fn load(
        dir: &Path,
        model_name: &str,
        kind: tch::Kind,
        config: EngineConfig,
    ) -> anyhow::Result<Self> {
        let model = Model::load(dir, kind, tch::Device::cuda_if_available())
            .with_context(|| format!("loading the model in {}", dir.display()))?;
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let eos = tokenizer.eos_ids(dir);
        let engine = EngineHandle::spawn(model, config)?;
        Ok(Self::new(engine, Arc::new(tokenizer), model_name, eos))
    }

    /// The constraint a request `body` asks for (what the engine samples
    /// each of its choices under); `None` when it asks for none.
    pub fn constraint(&self, body: &Value) -> Result<Option<Box<dyn TokenConstraint>>, ApiError> {
        self.grammars.constraint(body)
    }

    pub fn engine(&self) -> &EngineHandle {
        &self.engine
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// The engine's routes. Bodies up to [`BODY_LIMIT_BYTES`] are taken.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/completions", post(answer))
            .route("/v1/chat/completions", post(no_chat))
            .route("/v1/models", get(models))
            .route("/load_weights", post(weights::load))
            .route("/weight_info", get(weights::info))
            .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
            .with_state(self.clone())
    }
}

/// One request being answered.
pub struct Generation {
    pub id: String,
    pub created: u64,
    pub model: Arc<str>,
    pub prompt_ids: Vec<u32>,
    pub opts: Options,
    pub tokenizer: Arc<Tokenizer>,
}

impl Generation {
    /// One token's text, special tokens included.
    pub fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    fn usage(&self, completion: usize) -> Usage {
        Usage::new(self.prompt_ids.len(), completion)
    }
}

/// The tokens one choice sampled: ids, their logprobs and, per token, the
/// request's `top_logprobs` alternatives (empty lists when none were asked).
#[derive(Clone, Copy)]
pub struct Sampled<'a> {
    pub ids: &'a [u32],
    pub logprobs: &'a [f32],
    pub top: &'a [TopLogprobs],
    /// The weight version that sampled each token.
    pub versions: &'a [u64],
}

impl<'a> Sampled<'a> {
    /// `(id, logprob, alternatives)` per token.
    fn tokens(self) -> impl Iterator<Item = (u32, f32, &'a [(u32, f32)])> {
        let top = self
            .top
            .iter()
            .map(Vec::as_slice)
            .chain(std::iter::repeat(&[][..]));
        self.ids
            .iter()
            .zip(self.logprobs)
            .zip(top)
            .map(|((&id, &lp), top)| (id, lp, top))
    }
}

/// Chat is the gateway's to render: a harness pointed here by mistake is
/// told where to go, in OpenAI's error shape.
async fn no_chat() -> ApiError {
    ApiError::not_found(
        "agl's engine serves token-in /v1/completions; chat is rendered by agl's gateway \
         (register this engine with render = \"gateway\" and call the gateway)",
    )
}

async fn models(State(s): State<InferenceServer>) -> Json<ModelList> {
    let mut card = ModelCard::new(s.model_name.to_string(), now_s(), "agl");
    card.max_model_len = Some(s.engine.max_len() as u64);
    Json(ModelList::of(vec![card]))
}

async fn answer(State(s): State<InferenceServer>, body: Bytes) -> Response {
    generate(s, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn generate(s: InferenceServer, body: Bytes) -> Result<Response, ApiError> {
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    let prompt_ids = completions::prompt(&s.tokenizer, &body)?;
    let opts = options::parse(&body, &s.eos, s.engine.max_len(), s.max_n)?;
    let version = s.engine.weight_version();
    // One engine sequence per choice; a seeded request seeds choice i with
    // seed + i, so the choices differ and the answer is reproducible.
    let constraints = s.grammars.constraints(&body, opts.n)?;
    let mut events = Vec::with_capacity(opts.n);
    for (i, constraint) in constraints.into_iter().enumerate() {
        let mut params = opts.params.clone();
        params.seed = params.seed.map(|seed| seed.wrapping_add(i as u64));
        let submitted = s.engine.submit(Request {
            prompt_ids: prompt_ids.clone(),
            params,
            stop_hook: stop_hook(&s.tokenizer, &opts.stop),
            constraint,
        });
        events.push(submitted.map_err(|e| match e {
            EngineError::Invalid(m) => ApiError::bad_request(m),
            other => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                other.to_string(),
            ),
        })?);
    }
    let job = Generation {
        id: format!("cmpl-{}", request_id()),
        created: now_s(),
        model: s.model_name.clone(),
        prompt_ids,
        opts,
        tokenizer: s.tokenizer.clone(),
    };
    let mut resp = if job.opts.stream {
        stream::respond(job, events)
    } else {
        complete(job, events).await?
    };
    resp.headers_mut()
        .insert(WEIGHT_VERSION_HEADER, HeaderValue::from(version));
    Ok(resp)
}

/// Ends generation once a stop string appears in the decoded text.
fn stop_hook(tokenizer: &Arc<Tokenizer>, stop: &[String]) -> Option<StopHook> {
    if stop.is_empty() {
        return None;
    }
    let (tokenizer, stop) = (tokenizer.clone(), stop.to_vec());
    Some(Box::new(move |ids: &[u32]| {
        first_marker(&TextState::text_of(&tokenizer, ids), &stop).is_some()
    }))
}

async fn complete(
    job: Generation,
    events: Vec<tokio::sync::mpsc::UnboundedReceiver<EngineEvent>>,
) -> Result<Response, ApiError> {
    let mut choices = Vec::with_capacity(events.len());
    let (mut completion_tokens, mut version) = (0, 0);
    for (index, rx) in events.into_iter().enumerate() {
        let f = finished(rx).await?;
        let text = final_text(&job.tokenizer, &f.response_ids, &job.opts.stop);
        let reason = f.finish_reason.as_str();
        let sampled = Sampled {
            ids: &f.response_ids,
            logprobs: &f.logprobs,
            top: &f.top_logprobs,
            versions: &f.token_versions,
        };
        choices.push(completions::choice(&job, index, text, sampled, reason));
        completion_tokens += f.response_ids.len();
        version = version.max(f.weight_version);
    }
    let version = Some(Value::from(version));
    let usage = Some(job.usage(completion_tokens));
    let mut body = completions::body(&job, choices);
    (body.usage, body.weight_version) = (usage, version);
    Ok(Json(body).into_response())
}

/// The sequence's end, skipping its token events.
async fn finished(
    mut events: tokio::sync::mpsc::UnboundedReceiver<EngineEvent>,
) -> Result<Finished, ApiError> {
    while let Some(event) = events.recv().await {
        if let EngineEvent::Finished(f) = event {
            return Ok(f);
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        EngineError::Stopped.to_string(),
    ))
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A random hex id (a fresh `RandomState` is randomly keyed).
fn request_id() -> String {
    use std::hash::BuildHasher;
    let h = std::collections::hash_map::RandomState::new().hash_one(now_s());
    format!("{h:016x}")
}
