//! Native stand-ins for the host imports, and builders for hand-made
//! rollouts, so plugin logic runs under `cargo test` and native benchmarks.
//! State is per thread (each test runs on its own thread).
//!
//! ```
//! use agl_plugin::testing::{self, CallExt, FakeTokenizer, call, rollout};
//! testing::set_config_json(r#"{"chain_by_agent": false}"#);
//! testing::set_tokenizer(FakeTokenizer::from_pieces(&[(1, "hel"), (2, "lo"), (3, "hello")]));
//! let r = rollout(vec![call(0, &[1], &[2]).agent("planner")]);
//! assert_eq!(agl_plugin::tokenizer::decode(&[1, 2], false).as_deref(), Ok("hello"));
//! # let _ = r;
//! ```

use std::cell::RefCell;

use crate::log::Level;
use crate::{ApiKind, Event, ModelCall, Rollout, RolloutStatus, Tag};

mod fake_tokenizer;

pub use fake_tokenizer::FakeTokenizer;
pub(crate) use fake_tokenizer::host as tokenizer;
pub use fake_tokenizer::{clear_tokenizer, set_tokenizer};

thread_local! {
    static CONFIG: RefCell<Option<String>> = const { RefCell::new(None) };
    static LOGS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
}

/// Sets what [`crate::config::config_json`] returns on this thread.
pub fn set_config_json(json: impl Into<String>) {
    CONFIG.with(|c| *c.borrow_mut() = Some(json.into()));
}

/// Back to the default empty config (`{}`).
pub fn clear_config() {
    CONFIG.with(|c| *c.borrow_mut() = None);
}

pub(crate) fn config_json() -> String {
    CONFIG
        .with(|c| c.borrow().clone())
        .unwrap_or_else(|| "{}".to_owned())
}

pub(crate) fn record_log(level: Level, message: &str) {
    eprintln!("[plugin {}] {message}", level_name(level));
    LOGS.with(|l| l.borrow_mut().push((level, message.to_owned())));
}

/// The lines logged on this thread since the last call.
pub fn take_logs() -> Vec<(Level, String)> {
    LOGS.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

/// A chat-completions call with these ids, log-prob -0.5 per response
/// token, weight version 0 and `{}` request and response bodies.
pub fn call(index: u32, prompt_ids: &[u32], response_ids: &[u32]) -> ModelCall {
    ModelCall {
        index,
        api: ApiKind::ChatCompletions,
        request_json: "{}".to_owned(),
        response_json: "{}".to_owned(),
        prompt_ids: prompt_ids.to_vec(),
        response_ids: response_ids.to_vec(),
        response_logprobs: vec![-0.5; response_ids.len()],
        weight_version: 0,
        finish_reason: Some("stop".to_owned()),
        started_at_ms: 0,
        finished_at_ms: 0,
        tags: Vec::new(),
        continues: None,
        choice: None,
        constrained: false,
        response_versions: None,
    }
}

/// A succeeded rollout of these calls, input `{}`, no events.
pub fn rollout(calls: Vec<ModelCall>) -> Rollout {
    Rollout {
        id: "rollout-test".to_owned(),
        group_id: "group-test".to_owned(),
        attempt: 0,
        input_json: "{}".to_owned(),
        status: RolloutStatus::Succeeded,
        calls,
        events: Vec::new(),
    }
}

/// An event of `kind` with this JSON payload.
pub fn event(kind: &str, payload: serde_json::Value) -> Event {
    Event {
        kind: kind.to_owned(),
        payload_json: payload.to_string(),
        timestamp_ms: 0,
    }
}

/// Chainable tweaks of a [`call`].
pub trait CallExt: Sized {
    fn logprobs(self, logprobs: &[f32]) -> Self;
    fn weight_version(self, version: u64) -> Self;
    /// Sets the `x-agl-agent` tag.
    fn agent(self, agent: &str) -> Self;
    fn tag(self, key: &str, value: &str) -> Self;
    /// Records that the gateway served this call as a continuation of
    /// call `index`.
    fn continues(self, index: u32) -> Self;
    /// Makes the call choice `index` of a request that asked for `count`.
    fn choice(self, index: u32, count: u32) -> Self;
    /// Request `{"messages": ...}` and response
    /// `{"choices": [{"message": reply}]}` for the chat API.
    fn chat(self, messages: serde_json::Value, reply: serde_json::Value) -> Self;
    /// Request `{"prompt": ...}` and response `{"choices": [{"text": ...}]}`
    /// for the completions API.
    fn completion(self, prompt: &str, text: &str) -> Self;
    /// Anthropic Messages: request `{"system", "messages"}` and response
    /// `{"content": content}`.
    fn anthropic(
        self,
        system: serde_json::Value,
        messages: serde_json::Value,
        content: serde_json::Value,
    ) -> Self;
    /// OpenAI Responses: request `{"instructions", "input"}` and response
    /// `{"output": output}`.
    fn responses(
        self,
        instructions: &str,
        input: serde_json::Value,
        output: serde_json::Value,
    ) -> Self;
}

impl CallExt for ModelCall {
    fn logprobs(mut self, logprobs: &[f32]) -> Self {
        self.response_logprobs = logprobs.to_vec();
        self
    }

    fn weight_version(mut self, version: u64) -> Self {
        self.weight_version = version;
        self
    }

    fn agent(self, agent: &str) -> Self {
        self.tag(crate::call::AGENT_TAG, agent)
    }

    fn tag(mut self, key: &str, value: &str) -> Self {
        self.tags.push(Tag {
            key: key.to_owned(),
            value: value.to_owned(),
        });
        self
    }

    fn continues(mut self, index: u32) -> Self {
        self.continues = Some(index);
        self
    }

    fn choice(mut self, index: u32, count: u32) -> Self {
        self.choice = Some(crate::CallChoice { index, count });
        self
    }

    fn chat(mut self, messages: serde_json::Value, reply: serde_json::Value) -> Self {
        self.api = ApiKind::ChatCompletions;
        self.request_json =
            serde_json::json!({"model": "policy", "messages": messages}).to_string();
        self.response_json = serde_json::json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
        })
        .to_string();
        self
    }

    fn anthropic(
        mut self,
        system: serde_json::Value,
        messages: serde_json::Value,
        content: serde_json::Value,
    ) -> Self {
        self.api = ApiKind::AnthropicMessages;
        self.request_json =
            serde_json::json!({"model": "policy", "system": system, "messages": messages})
                .to_string();
        self.response_json =
            serde_json::json!({"type": "message", "role": "assistant", "content": content})
                .to_string();
        self
    }

    fn responses(
        mut self,
        instructions: &str,
        input: serde_json::Value,
        output: serde_json::Value,
    ) -> Self {
        self.api = ApiKind::Responses;
        self.request_json =
            serde_json::json!({"model": "policy", "instructions": instructions, "input": input})
                .to_string();
        self.response_json =
            serde_json::json!({"object": "response", "status": "completed", "output": output})
                .to_string();
        self
    }

    fn completion(mut self, prompt: &str, text: &str) -> Self {
        self.api = ApiKind::Completions;
        self.request_json = serde_json::json!({"model": "policy", "prompt": prompt}).to_string();
        self.response_json = serde_json::json!({
            "object": "text_completion",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
        })
        .to_string();
        self
    }
}
