//! What the rules need of a model call ([`Call`]), and reading its request
//! and response JSON: each parsed on demand, as a long rollout carries
//! megabytes of JSON and most rules need only the token ids.

use std::borrow::Cow;

use serde_json::Value;

/// The tag a harness sets (header `x-agl-agent`) to name the agent or
/// sub-agent that made a call.
pub const AGENT_TAG: &str = "x-agl-agent";

/// Which HTTP API the harness called (`api-kind` in `wit/agl.wit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    ChatCompletions,
    Completions,
    Responses,
    AnthropicMessages,
}

/// Which of a request's `count` choices a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub index: u32,
    pub count: u32,
}

/// A prompt as the first `shared` ids of call `extends`'s `prompt ++
/// response`, then `tail` (`model-call.prompt`; [`crate::links`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLink<'a> {
    pub extends: Option<u32>,
    pub shared: usize,
    pub tail: &'a [u32],
}

/// A recorded model call, as the rules read it.
pub trait Call {
    /// Position in the rollout, in recording order.
    fn index(&self) -> u32;
    fn api(&self) -> Api;
    /// The whole prompt ids.
    fn prompt_ids(&self) -> Cow<'_, [u32]>;
    /// The prompt as linked to an earlier call, where the caller has it: a
    /// prompt that continues a sample in full is then merged by its tail
    /// alone.
    fn prompt_link(&self) -> Option<PromptLink<'_>> {
        None
    }
    fn response_ids(&self) -> &[u32];
    fn response_logprobs(&self) -> &[f32];
    fn weight_version(&self) -> u64;
    /// The value of tag `key` (lower case; matched case-insensitively).
    fn tag(&self, key: &str) -> Option<&str>;
    /// The call the gateway served this one as continuing.
    fn continues(&self) -> Option<u32>;
    fn choice(&self) -> Option<Choice>;
    /// The request body exactly as sent (JSON text); `None` where the
    /// caller cannot have it.
    fn request_json(&self) -> Option<Cow<'_, str>>;
    /// The response body (JSON text).
    fn response_json(&self) -> Option<Cow<'_, str>>;
}

/// The policy's tokenizer, for telling a re-tokenisation from an edit.
pub trait Decoder {
    fn decode(&self, ids: &[u32]) -> Result<String, String>;
}

/// The call's `x-agl-agent` tag.
pub fn agent(call: &impl Call) -> Option<&str> {
    call.tag(AGENT_TAG)
}

/// The request body, parsed.
pub fn request(call: &impl Call) -> Result<Value, String> {
    parse(call, "request", call.request_json())
}

/// The response body, parsed.
pub fn response(call: &impl Call) -> Result<Value, String> {
    parse(call, "response", call.response_json())
}

fn parse(call: &impl Call, what: &str, json: Option<Cow<'_, str>>) -> Result<Value, String> {
    let index = call.index();
    let json = json.ok_or_else(|| format!("call {index}: no {what} JSON"))?;
    serde_json::from_str(&json).map_err(|e| format!("call {index}: {what} is not JSON: {e}"))
}

/// The conversation the request sent, as OpenAI-style messages: chat
/// `messages`; Anthropic `messages` with `system` prepended as a system
/// message; Responses `input` (a string becomes one user message) with
/// `instructions` prepended. `None` for the completions API (a text prompt)
/// or an unparsable request.
pub fn request_messages(call: &impl Call) -> Option<Vec<Value>> {
    let request = request(call).ok()?;
    let (system_key, messages_key) = match call.api() {
        Api::ChatCompletions => (None, "messages"),
        Api::AnthropicMessages => (Some("system"), "messages"),
        Api::Responses => (Some("instructions"), "input"),
        Api::Completions => return None,
    };
    let mut messages = Vec::new();
    if let Some(system) = system_key
        .and_then(|k| request.get(k))
        .filter(|v| !v.is_null())
    {
        messages.push(serde_json::json!({"role": "system", "content": system}));
    }
    match request.get(messages_key)? {
        Value::Array(items) => messages.extend(items.iter().cloned()),
        Value::String(text) => messages.push(serde_json::json!({"role": "user", "content": text})),
        _ => return None,
    }
    Some(messages)
}

/// The assistant message the call returned, in the shape a harness echoes
/// back in its next request: chat `choices[0].message`; Anthropic
/// `{"role": "assistant", "content": <content blocks>}`. `None` for the
/// other APIs, whose replies are not echoed as one message.
pub fn assistant_message(call: &impl Call) -> Option<Value> {
    let response = response(call).ok()?;
    match call.api() {
        Api::ChatCompletions => response.pointer("/choices/0/message").cloned(),
        Api::AnthropicMessages => Some(serde_json::json!({
            "role": "assistant",
            "content": response.get("content")?.clone(),
        })),
        Api::Completions | Api::Responses => None,
    }
}

/// The text the model answered: chat `choices[0].message.content`,
/// completions `choices[0].text`, Responses `output_text` parts, Anthropic
/// `text` blocks. Text parts are concatenated; `None` when there is no text
/// (e.g. only tool calls) or the response is not JSON.
pub fn assistant_text(call: &impl Call) -> Option<String> {
    let response = response(call).ok()?;
    let text = match call.api() {
        Api::ChatCompletions => content_text(response.pointer("/choices/0/message/content")?),
        Api::Completions => response
            .pointer("/choices/0/text")?
            .as_str()
            .map(str::to_owned),
        Api::Responses => {
            let parts = response
                .get("output")?
                .as_array()?
                .iter()
                .filter_map(|item| {
                    (item.get("type")?.as_str()? == "message").then(|| item.get("content"))?
                });
            join_texts(parts.filter_map(Value::as_array).flatten())
        }
        Api::AnthropicMessages => join_texts(response.get("content")?.as_array()?.iter()),
    };
    text.filter(|t| !t.is_empty())
}

/// The text of the completions-API prompt, when it is text (not token ids).
pub fn completion_prompt(call: &impl Call) -> Option<String> {
    match request(call).ok()?.get("prompt")? {
        Value::String(text) => Some(text.clone()),
        Value::Array(items) if items.len() == 1 => items[0].as_str().map(str::to_owned),
        _ => None,
    }
}

/// A message `content`: a string, or an array of parts whose text is joined.
pub fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => join_texts(parts.iter()),
        _ => None,
    }
}

/// Concatenates the `text` of text parts (`text`, `input_text`,
/// `output_text`); `None` when there is none.
fn join_texts<'a>(parts: impl Iterator<Item = &'a Value>) -> Option<String> {
    let mut joined: Option<String> = None;
    for part in parts {
        if let Some(text) = text_part(part) {
            joined.get_or_insert_with(String::new).push_str(text);
        }
    }
    joined
}

/// The text of a content part whose type is a text type.
pub fn text_part(part: &Value) -> Option<&str> {
    let kind = part.get("type")?.as_str()?;
    if matches!(kind, "text" | "input_text" | "output_text") {
        part.get("text")?.as_str()
    } else {
        None
    }
}
