//! A small vLLM-like OpenAI-compatible server for tests and benchmarks.
//!
//! Replies come from a [`Script`]; token ids are UTF-8 bytes + 1000 (see
//! [`tokens`]); logprobs are `-0.01 * ((i % 7) + 1)` for completion position
//! `i`. vLLM >= 0.10.2 fields (`return_token_ids` -> `prompt_token_ids`,
//! `token_ids`) and [`Faults`] (latency, error statuses, resets, cut streams)
//! are supported, and every request is recorded.

mod admin;
mod api;
mod body;
mod faults;
mod plan;
mod response;
mod routes;
mod script;
mod server;
mod sglang;
mod state;
mod stream;
pub mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use admin::AdminState;
pub use api::VllmError;
pub use faults::Faults;
pub use plan::FinishReason;
pub use routes::router;
pub use script::{Endpoint, EngineRequest, Reply, Script, ToolCall};
pub use state::{EngineState, RecordedRequest};
pub use tokens::Codec;

/// How to run a test engine.
#[derive(Debug, Clone)]
pub struct TestEngineConfig {
    /// Served by `/v1/models` and used when a request names no model.
    pub model: String,
    pub script: Script,
    pub faults: Faults,
    /// Where to listen; `None` = 127.0.0.1 on a free port.
    pub addr: Option<SocketAddr>,
    /// Characters of content per stream chunk.
    pub stream_chunk_chars: usize,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Text <-> token ids (one id per byte unless set).
    pub codec: Codec,
    /// Keep every request for [`TestEngine::requests`] (benchmarks turn it
    /// off: copying long prompts is the engine's cost, not the caller's).
    pub log_requests: bool,
}

impl Default for TestEngineConfig {
    fn default() -> Self {
        Self {
            model: "test-model".into(),
            script: Script::default(),
            faults: Faults::default(),
            addr: None,
            stream_chunk_chars: 1,
            body_limit: 32 << 20,
            codec: Codec::default(),
            log_requests: true,
        }
    }
}

impl TestEngineConfig {
    /// Answers with `replies` in turn, cycling.
    pub fn with_replies(mut self, replies: impl IntoIterator<Item = Reply>) -> Self {
        self.script = Script::Cycle(replies.into_iter().collect());
        self
    }

    /// Answers with `f(request)`.
    pub fn with_script(
        mut self,
        f: impl Fn(&EngineRequest) -> Reply + Send + Sync + 'static,
    ) -> Self {
        self.script = Script::func(f);
        self
    }

    /// Tokenizes prompts and replies with `codec` instead of one id per
    /// byte (e.g. the policy tokenizer a gateway renders with).
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TestEngineError {
    #[error("test engine cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running engine; stops on [`TestEngine::shutdown`] or drop.
#[derive(Debug)]
pub struct TestEngine {
    addr: SocketAddr,
    state: Arc<EngineState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestEngine {
    /// Binds and starts serving on the current tokio runtime.
    pub async fn start(config: TestEngineConfig) -> Result<Self, TestEngineError> {
        let want = config
            .addr
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let bind_err = |source| TestEngineError::Bind { addr: want, source };
        let listener = TcpListener::bind(want).await.map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        let state = Arc::new(EngineState::new(config));
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(server::serve(listener, router(state.clone()), stopped));
        Ok(Self {
            addr,
            state,
            stop: Some(stop),
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/v1`, the OpenAI `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn state(&self) -> &Arc<EngineState> {
        &self.state
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests()
    }

    pub fn clear_requests(&self) {
        self.state.clear_requests();
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.set_faults(faults);
    }

    pub fn faults(&self) -> Faults {
        self.state.faults()
    }

    /// Stops accepting, drops open connections and waits for the server task.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
