//! Native stand-ins for the host imports, and builders for hand-made
//! rollouts, so plugin logic runs under `cargo test` and native benchmarks.
//! State is per thread (each test runs on its own thread).
//!
//! A hand-made call ([`call`], a [`TestCall`]) holds its whole prompt and
//! its JSON; [`rollout`] links each prompt to an earlier call's as the host
//! does (`model-call.prompt`) and serves the rest through [`crate::data`],
//! as the rollout under way on this thread (the last one built). The
//! `samples` import is the host's own rules ([`agl_samples`]) run here.
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
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

use crate::log::Level;
use crate::{ApiKind, Event, ModelCall, Prompt, Rollout, RolloutStatus, Tag};

mod fake_tokenizer;

pub use fake_tokenizer::FakeTokenizer;
pub(crate) use fake_tokenizer::host as tokenizer;
pub use fake_tokenizer::{clear_tokenizer, set_tokenizer};

thread_local! {
    static CONFIG: RefCell<Option<String>> = const { RefCell::new(None) };
    static LOGS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
    static DATA: RefCell<HashMap<u32, CallData>> = RefCell::new(HashMap::new());
}

/// What the host serves of one call on demand (`rollout-data`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallData {
    pub request_json: String,
    pub response_json: String,
    pub prompt_ids: Vec<u32>,
}

/// Makes `calls` (by call index) the rollout data this thread serves, as
/// the host does for the rollout under way. [`rollout`] calls it; a native
/// benchmark that builds its own records calls it directly.
pub fn serve_rollout_data(calls: impl IntoIterator<Item = (u32, CallData)>) {
    DATA.with(|d| *d.borrow_mut() = calls.into_iter().collect());
}

/// The native `rollout-data` imports.
pub(crate) mod data {
    use super::DATA;

    fn with<T>(index: u32, f: impl FnOnce(&super::CallData) -> T) -> Option<T> {
        DATA.with(|d| d.borrow().get(&index).map(f))
    }

    pub(crate) fn request_json(index: u32) -> Option<String> {
        with(index, |c| c.request_json.clone())
    }

    pub(crate) fn response_json(index: u32) -> Option<String> {
        with(index, |c| c.response_json.clone())
    }

    pub(crate) fn prompt_ids(index: u32) -> Option<Vec<u32>> {
        with(index, |c| c.prompt_ids.clone())
    }
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

/// A hand-made call: the record a plugin gets, its prompt whole (linked to
/// no other call), and the JSON the host would serve for it. It derefs to
/// its [`ModelCall`], so one alone can be handed to anything taking a call;
/// [`rollout`] links the calls of a rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct TestCall {
    call: ModelCall,
    pub request_json: String,
    pub response_json: String,
}

impl Deref for TestCall {
    type Target = ModelCall;

    fn deref(&self) -> &ModelCall {
        &self.call
    }
}

impl DerefMut for TestCall {
    fn deref_mut(&mut self) -> &mut ModelCall {
        &mut self.call
    }
}

impl TestCall {
    /// The whole prompt.
    pub fn prompt_ids(&self) -> &[u32] {
        &self.call.prompt.tail
    }

    /// Replaces the whole prompt.
    pub fn set_prompt_ids(&mut self, ids: &[u32]) {
        self.call.prompt.tail = ids.to_vec();
    }
}

/// `call` alone as the rollout under way (see [`rollout`]): what the SDK's
/// JSON readers need to reach its request and response.
pub fn served(call: TestCall) -> ModelCall {
    let mut r = rollout(vec![call]);
    r.calls.remove(0)
}

/// A chat-completions call with these ids, log-prob -0.5 per response
/// token, weight version 0 and `{}` request and response bodies.
pub fn call(index: u32, prompt_ids: &[u32], response_ids: &[u32]) -> TestCall {
    TestCall {
        call: whole_prompt_call(index, prompt_ids, response_ids),
        request_json: "{}".to_owned(),
        response_json: "{}".to_owned(),
    }
}

fn whole_prompt_call(index: u32, prompt_ids: &[u32], response_ids: &[u32]) -> ModelCall {
    ModelCall {
        index,
        api: ApiKind::ChatCompletions,
        prompt: Prompt {
            extends: None,
            shared: 0,
            tail: prompt_ids.to_vec(),
        },
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

/// A succeeded rollout of these calls, input `{}`, no events: each prompt
/// linked to an earlier call's as the host links them, the calls' JSON and
/// whole prompts served on this thread ([`serve_rollout_data`]).
pub fn rollout(calls: Vec<TestCall>) -> Rollout {
    let whole: Vec<ModelCall> = calls.iter().map(|c| c.call.clone()).collect();
    let links = agl_samples::links::prompt_links(&whole);
    serve_rollout_data(calls.iter().map(|c| {
        let data = CallData {
            request_json: c.request_json.clone(),
            response_json: c.response_json.clone(),
            prompt_ids: c.prompt_ids().to_vec(),
        };
        (c.index, data)
    }));
    let calls = calls
        .into_iter()
        .zip(links)
        .map(|(mut c, link)| {
            c.call.prompt = Prompt {
                extends: link.extends.map(|at| whole[at].index),
                shared: link.shared as u32,
                tail: c.call.prompt.tail.split_off(link.shared),
            };
            c.call
        })
        .collect();
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

impl CallExt for TestCall {
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
