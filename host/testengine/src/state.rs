//! State shared by all requests: script, faults and the request log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::TestEngineConfig;
use super::faults::{FaultState, Faults};
use super::script::Scripter;
use super::tokens::Codec;

/// One request as received, for tests to assert what a client sent.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Header names are lower case.
    pub headers: Vec<(String, String)>,
    /// The body, when it was valid JSON.
    pub body: Option<Value>,
    /// The body as text (lossy), valid JSON or not.
    pub raw: String,
}

impl RecordedRequest {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The engine's shared state; build one to serve [`super::router`] yourself.
#[derive(Debug)]
pub struct EngineState {
    pub(crate) model: String,
    pub(crate) chunk_chars: usize,
    pub(crate) body_limit: usize,
    pub(crate) codec: Codec,
    log_requests: bool,
    pub(crate) scripter: Scripter,
    pub(crate) faults: FaultState,
    requests: Mutex<Vec<RecordedRequest>>,
    next_id: AtomicU64,
    abandoned: Arc<AtomicU64>,
    /// What the weight-update routes changed (`admin.rs`).
    pub admin: super::admin::AdminState,
}

/// One answer being produced; counts as abandoned if dropped before
/// [`Answering::done`] (its client, e.g. the gateway, went away).
pub(crate) struct Answering {
    abandoned: Arc<AtomicU64>,
    done: bool,
}

impl Answering {
    pub(crate) fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if !self.done {
            self.abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl EngineState {
    pub fn new(config: TestEngineConfig) -> Self {
        Self {
            model: config.model,
            chunk_chars: config.stream_chunk_chars.max(1),
            body_limit: config.body_limit,
            codec: config.codec,
            log_requests: config.log_requests,
            scripter: Scripter::new(config.script),
            faults: FaultState::new(config.faults),
            requests: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            abandoned: Arc::default(),
            admin: Default::default(),
        }
    }

    /// Answers whose client left before the last byte (the engine stopped
    /// producing them then, as vLLM aborts a request whose client is gone).
    pub fn abandoned(&self) -> u64 {
        self.abandoned.load(Ordering::Relaxed)
    }

    pub(crate) fn answering(&self) -> Answering {
        Answering {
            abandoned: self.abandoned.clone(),
            done: false,
        }
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.log().clone()
    }

    pub fn clear_requests(&self) {
        self.log().clear();
    }

    /// Replaces the faults (counters included) for later requests.
    pub fn set_faults(&self, faults: Faults) {
        self.faults.set(faults);
    }

    /// The faults now in force, with counters as far as they have run down.
    pub fn faults(&self) -> Faults {
        self.faults.get()
    }

    pub(crate) fn record(&self, request: RecordedRequest) {
        if self.log_requests {
            self.log().push(request);
        }
    }

    pub(crate) fn logs_requests(&self) -> bool {
        self.log_requests
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Vec<RecordedRequest>> {
        // The log is plain data; a panicked holder cannot leave it inconsistent.
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }
}
