//! Reading a model call's request and response JSON. Both are fetched
//! from the host and parsed on demand: a long rollout carries megabytes of
//! JSON, and most adapters need only the token ids.

use serde_json::Value;

use crate::{ApiKind, ModelCall};

/// The tag a harness sets (header `x-agl-agent`) to name the agent or
/// sub-agent that made a call.
pub const AGENT_TAG: &str = "x-agl-agent";

/// The value of tag `key` (case-insensitive, as headers are).
pub fn tag<'a>(call: &'a ModelCall, key: &str) -> Option<&'a str> {
    call.tags
        .iter()
        .find(|t| t.key.eq_ignore_ascii_case(key))
        .map(|t| t.value.as_str())
}

/// The call's `x-agl-agent` tag.
pub fn agent(call: &ModelCall) -> Option<&str> {
    tag(call, AGENT_TAG)
}

/// The request body, parsed.
pub fn request(call: &ModelCall) -> Result<Value, String> {
    serde_json::from_str(&crate::data::request_json(call)?)
        .map_err(|e| format!("call {}: request is not JSON: {e}", call.index))
}

/// The response body, parsed.
pub fn response(call: &ModelCall) -> Result<Value, String> {
    serde_json::from_str(&crate::data::response_json(call)?)
        .map_err(|e| format!("call {}: response is not JSON: {e}", call.index))
}

/// The conversation the request sent, as OpenAI-style messages: chat
/// `messages`; Anthropic `messages` with `system` prepended as a system
/// message; Responses `input` (a string becomes one user message) with
/// `instructions` prepended. `None` for the completions API (a text prompt)
/// or an unparsable request.
pub fn request_messages(call: &ModelCall) -> Option<Vec<Value>> {
    let request = request(call).ok()?;
    let (system_key, messages_key) = match call.api {
        ApiKind::ChatCompletions => (None, "messages"),
        ApiKind::AnthropicMessages => (Some("system"), "messages"),
        ApiKind::Responses => (Some("instructions"), "input"),
        ApiKind::Completions => return None,
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
pub fn assistant_message(call: &ModelCall) -> Option<Value> {
    let response = response(call).ok()?;
    match call.api {
        ApiKind::ChatCompletions => response.pointer("/choices/0/message").cloned(),
        ApiKind::AnthropicMessages => Some(serde_json::json!({
            "role": "assistant",
            "content": response.get("content")?.clone(),
        })),
        ApiKind::Completions | ApiKind::Responses => None,
    }
}

/// The text the model answered: chat `choices[0].message.content`,
/// completions `choices[0].text`, Responses `output_text` parts, Anthropic
/// `text` blocks. Text parts are concatenated; `None` when there is no text
/// (e.g. only tool calls) or the response is not JSON.
pub fn assistant_text(call: &ModelCall) -> Option<String> {
    let response = response(call).ok()?;
    let text = match call.api {
        ApiKind::ChatCompletions => content_text(response.pointer("/choices/0/message/content")?),
        ApiKind::Completions => response
            .pointer("/choices/0/text")?
            .as_str()
            .map(str::to_owned),
        ApiKind::Responses => {
            let parts = response
                .get("output")?
                .as_array()?
                .iter()
                .filter_map(|item| {
                    (item.get("type")?.as_str()? == "message").then(|| item.get("content"))?
                });
            join_texts(parts.filter_map(Value::as_array).flatten())
        }
        ApiKind::AnthropicMessages => join_texts(response.get("content")?.as_array()?.iter()),
    };
    text.filter(|t| !t.is_empty())
}

/// The text of the completions-API prompt, when it is text (not token ids).
pub fn completion_prompt(call: &ModelCall) -> Option<String> {
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
pub(crate) fn text_part(part: &Value) -> Option<&str> {
    let kind = part.get("type")?.as_str()?;
    if matches!(kind, "text" | "input_text" | "output_text") {
        part.get("text")?.as_str()
    } else {
        None
    }
}
