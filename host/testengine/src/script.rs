//! What the engine answers: scripted replies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::Value;

/// Which endpoint a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    /// SGLang's native `/generate` (token ids in and out).
    Generate,
}

/// A request as the script sees it.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    pub endpoint: Endpoint,
    /// The prompt as the engine tokenized it (see [`super::tokens`]).
    pub prompt_text: String,
    raw: Bytes,
    body: OnceLock<Value>,
}

impl EngineRequest {
    pub(crate) fn new(endpoint: Endpoint, raw: Bytes, prompt_text: String) -> Self {
        Self {
            endpoint,
            prompt_text,
            raw,
            body: OnceLock::new(),
        }
    }

    /// The JSON body as received, read when a script first asks: the engine
    /// itself reads only the fields it answers by.
    pub fn body(&self) -> &Value {
        self.body
            .get_or_init(|| serde_json::from_slice(&self.raw).unwrap_or(Value::Null))
    }
}

/// One scripted tool call (OpenAI `tool_calls[]`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Defaults to `call_<index>` when `None`.
    pub id: Option<String>,
    pub name: String,
    /// The `function.arguments` string, normally JSON.
    pub arguments: String,
}

/// One scripted model answer: text and/or tool calls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

impl Reply {
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    /// Adds a tool call with the default id.
    pub fn with_tool_call(mut self, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        self.tool_calls.push(ToolCall {
            id: None,
            name: name.into(),
            arguments: arguments.into(),
        });
        self
    }

    /// The text the engine "samples" for this reply; its bytes are the
    /// completion's token ids. Tool calls render as
    /// `<tool_call>NAME ARGUMENTS</tool_call>` after the content.
    pub fn sampled_text(&self) -> String {
        let mut out = self.content.clone();
        for call in &self.tool_calls {
            out.push_str(&tool_call_open(&call.name));
            out.push_str(&call.arguments);
            out.push_str(TOOL_CALL_CLOSE);
        }
        out
    }
}

pub(crate) const TOOL_CALL_CLOSE: &str = "</tool_call>";

pub(crate) fn tool_call_open(name: &str) -> String {
    format!("<tool_call>{name} ")
}

type ReplyFn = dyn Fn(&EngineRequest) -> Reply + Send + Sync;

/// How replies are chosen.
#[derive(Clone)]
pub enum Script {
    /// Replies in order, starting over after the last.
    Cycle(Vec<Reply>),
    /// Computed from each request.
    Func(Arc<ReplyFn>),
}

impl Script {
    pub fn func(f: impl Fn(&EngineRequest) -> Reply + Send + Sync + 'static) -> Self {
        Self::Func(Arc::new(f))
    }
}

impl Default for Script {
    fn default() -> Self {
        Self::Cycle(vec![Reply::text("Hello from the test engine.")])
    }
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cycle(replies) => f.debug_tuple("Cycle").field(replies).finish(),
            Self::Func(_) => f.write_str("Func(..)"),
        }
    }
}

/// A script plus the cursor of a cycling script.
#[derive(Debug, Default)]
pub(crate) struct Scripter {
    script: Script,
    next: AtomicUsize,
}

impl Scripter {
    pub(crate) fn new(script: Script) -> Self {
        Self {
            script,
            next: AtomicUsize::new(0),
        }
    }

    pub(crate) fn reply(&self, request: &EngineRequest) -> Reply {
        match &self.script {
            Script::Cycle(replies) if replies.is_empty() => Reply::default(),
            Script::Cycle(replies) => {
                let i = self.next.fetch_add(1, Ordering::Relaxed);
                replies[i % replies.len()].clone()
            }
            Script::Func(f) => f(request),
        }
    }
}
