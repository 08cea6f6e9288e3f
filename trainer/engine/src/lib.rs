//! The token-level inference engine: iteration-level batching over a
//! per-sequence cache ([`SequenceCache`]: a slot per sequence over every
//! layer's state), no HTTP and no tokenizer.
//!
//! A [`Model`] lives on one dedicated thread (tch tensors are not `Sync`);
//! callers hold a cloneable [`EngineHandle`] and talk to that thread over a
//! channel. Each scheduler iteration:
//! 1. applies commands (new requests, weight updates);
//! 2. admits waiting requests into free cache slots with one batched
//!    prefill step (prefills are stepped apart from decodes, since a step
//!    pads every row to its longest new-token count);
//! 3. runs one batched decode step for every active sequence;
//! 4. finishes sequences (stop id, stop hook, `max_tokens`, `max_len`,
//!    dropped receiver) and frees their slots for the next iteration.
//!
//! **Logprobs.** Each sampled token reports the f32
//! `log_softmax(logits / temperature)[token]` over the full vocabulary:
//! exactly what [`token_logprobs`](agl_model::token_logprobs) computes
//! with the same temperature, so trainer and engine compare like with like.
//! `top_k`/`top_p` only restrict which tokens may be drawn; the reported
//! logprob is not renormalised over the kept set. Greedy decoding
//! (temperature 0) reports the temperature-1 log-softmax.
//!
//! **Sampling** uses a per-request RNG seeded from the request's `seed`
//! (or a fresh one), so a seeded request draws the same tokens whatever
//! else is in the batch.
//!
//! **Weights in place.** [`EngineHandle::update_weights`] is applied between
//! steps, that is at a token boundary of every running sequence. What
//! happens to those sequences is the caller's [`InFlight`] choice: `Abort`
//! finishes them with [`FinishReason::Abort`], so every finished sequence
//! was produced by one weight version (pause callers first to lose none);
//! `Continue` keeps them (a partial rollout): they go on under the new
//! weights from their next token, their cache entries kept as computed (as
//! vLLM's `pause?mode=keep` keeps them), and every token reports the
//! version that sampled it ([`EngineEvent::Token`], [`Finished::token_versions`]),
//! so its logprob is the behaviour logprob of its own version.

mod cache;
mod sampling;
mod scheduler;

pub use cache::{SequenceCache, SlotId};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tch::Tensor;
use tokio::sync::{mpsc, oneshot};

use agl_model::{Model, ModelError};

pub use sampling::{MAX_TOP_LOGPROBS, SamplingParams, TopLogprobs};

/// Called with the response ids so far after each sampled token; `true`
/// ends the sequence with [`FinishReason::Stop`] (e.g. a stop string).
pub type StopHook = Box<dyn FnMut(&[u32]) -> bool + Send>;

/// Constrained decoding: which tokens a sequence may sample next (a
/// grammar or JSON schema, see `agl-inference`). The engine samples only
/// among them, so each token's logprob (and its alternatives) is under the
/// masked distribution it was actually drawn from.
pub trait TokenConstraint: Send {
    /// The tokens allowed next: bit `id % 32` of word `id / 32`.
    fn allowed(&mut self) -> Result<Vec<u32>, String>;
    /// Takes the sampled token; `true` when the constraint is complete and
    /// the sequence ends (after this token).
    fn commit(&mut self, token: u32) -> Result<bool, String>;
}

pub struct Request {
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    pub stop_hook: Option<StopHook>,
    pub constraint: Option<Box<dyn TokenConstraint>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token id or the stop hook.
    Stop,
    /// `max_tokens` or the engine's `max_len`.
    Length,
    /// A weight update or an engine failure interrupted it.
    Abort,
    /// The constraint failed (or allowed no token): the sequence ends there.
    ConstraintError,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ConstraintError => "error",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Finished {
    pub finish_reason: FinishReason,
    pub prompt_ids: Vec<u32>,
    /// Every sampled token, stop ids included.
    pub response_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Per sampled token, its request's `top_logprobs` most likely tokens.
    pub top_logprobs: Vec<TopLogprobs>,
    /// The version of the weights when the sequence finished.
    pub weight_version: u64,
    /// Per sampled token, the version that sampled it: one value unless an
    /// update with [`InFlight::Continue`] came while it ran.
    pub token_versions: Vec<u64>,
    /// The request had a [`TokenConstraint`]: its logprobs are under the
    /// masked distributions.
    pub constrained: bool,
}

/// What a request's stream yields: tokens as they are sampled, then one
/// `Finished`.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    Token {
        id: u32,
        logprob: f32,
        top: TopLogprobs,
        /// The weight version that sampled it.
        version: u64,
    },
    Finished(Finished),
}

/// What a weight update does with the sequences running when it comes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InFlight {
    /// Finish them with [`FinishReason::Abort`].
    #[default]
    Abort,
    /// Keep them going under the new weights (partial rollouts).
    Continue,
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Concurrent sequences (KV-cache slots).
    pub max_seqs: usize,
    /// Longest sequence, prompt plus response.
    pub max_len: usize,
    /// Version reported before the first update.
    pub weight_version: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_seqs: 16,
            max_len: 4096,
            weight_version: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("the engine thread has stopped")]
    Stopped,
    #[error(transparent)]
    Model(#[from] ModelError),
}

enum Command {
    Submit(Box<Pending>),
    Update {
        tensors: Vec<(String, Tensor)>,
        version: u64,
        in_flight: InFlight,
        done: oneshot::Sender<Result<(), ModelError>>,
    },
}

/// A request waiting for a slot, with where its events go.
struct Pending {
    request: Request,
    events: mpsc::UnboundedSender<EngineEvent>,
}

/// A cloneable, `Send + Sync` handle on the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: std::sync::mpsc::Sender<Command>,
    version: Arc<AtomicU64>,
    max_len: usize,
    vocab: usize,
}

impl EngineHandle {
    /// Moves `model` onto a new engine thread. The thread stops once every
    /// handle is dropped.
    pub fn spawn(model: Model, config: EngineConfig) -> Result<EngineHandle, EngineError> {
        if config.max_seqs == 0 || config.max_len < 2 {
            return Err(EngineError::Invalid(
                "max_seqs must be >= 1 and max_len >= 2".into(),
            ));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let version = Arc::new(AtomicU64::new(config.weight_version));
        let handle = EngineHandle {
            commands: tx,
            version: version.clone(),
            max_len: config.max_len,
            vocab: model.config().vocab_size as usize,
        };
        // The decode step's parallel loops run on this thread and a team of
        // helpers it makes on its first step (`model::team`).
        std::thread::Builder::new()
            .name("agl-engine".into())
            .spawn(move || scheduler::run(model, config, rx, version))
            .map_err(|e| EngineError::Invalid(format!("cannot start the engine thread: {e}")))?;
        Ok(handle)
    }

    /// Queues `request`; its events arrive on the returned receiver.
    /// Dropping the receiver aborts the sequence.
    pub fn submit(
        &self,
        request: Request,
    ) -> Result<mpsc::UnboundedReceiver<EngineEvent>, EngineError> {
        let n = request.prompt_ids.len();
        if n == 0 {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        if n >= self.max_len {
            return Err(EngineError::Invalid(format!(
                "the prompt has {n} tokens; this engine's maximum length is {}",
                self.max_len
            )));
        }
        if let Some(bad) = request
            .prompt_ids
            .iter()
            .find(|&&t| t as usize >= self.vocab)
        {
            return Err(EngineError::Invalid(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.vocab
            )));
        }
        request.params.validate().map_err(EngineError::Invalid)?;
        let (events, rx) = mpsc::unbounded_channel();
        self.commands
            .send(Command::Submit(Box::new(Pending { request, events })))
            .map_err(|_| EngineError::Stopped)?;
        Ok(rx)
    }

    /// Loads `tensors` (Hugging Face names) into the model between steps and
    /// sets the weight version; running sequences end or go on as
    /// `in_flight` says.
    pub async fn update_weights(
        &self,
        tensors: Vec<(String, Tensor)>,
        version: u64,
        in_flight: InFlight,
    ) -> Result<(), EngineError> {
        let rx = self.send_update(tensors, version, in_flight)?;
        Ok(rx.await.map_err(|_| EngineError::Stopped)??)
    }

    /// [`Self::update_weights`] for callers outside an async runtime.
    pub fn update_weights_blocking(
        &self,
        tensors: Vec<(String, Tensor)>,
        version: u64,
        in_flight: InFlight,
    ) -> Result<(), EngineError> {
        let rx = self.send_update(tensors, version, in_flight)?;
        Ok(rx.blocking_recv().map_err(|_| EngineError::Stopped)??)
    }

    /// Queues a weight update; the receiver answers once it is applied.
    fn send_update(
        &self,
        tensors: Vec<(String, Tensor)>,
        version: u64,
        in_flight: InFlight,
    ) -> Result<oneshot::Receiver<Result<(), ModelError>>, EngineError> {
        let (done, rx) = oneshot::channel();
        self.commands
            .send(Command::Update {
                tensors,
                version,
                in_flight,
                done,
            })
            .map_err(|_| EngineError::Stopped)?;
        Ok(rx)
    }

    /// The version of the weights the engine is sampling with now.
    pub fn weight_version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }
}
