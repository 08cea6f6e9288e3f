//! Request parameters the engine honours, and OpenAI-shaped errors.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::body::Body;
use super::script::Endpoint;
use super::tokens::{Codec, render_chat};

/// An error in vLLM's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct VllmError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
}

impl VllmError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
        }
    }

    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = match status.as_u16() {
            429 => "rate_limit_error",
            404 => "not_found_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        Self {
            status,
            message: message.into(),
            kind,
        }
    }
}

impl IntoResponse for VllmError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message, "type": self.kind, "param": null, "code": self.status.as_u16(),
        }});
        (self.status, Json(body)).into_response()
    }
}

/// The fields of a request that shape the response.
#[derive(Debug, Clone)]
pub struct Params {
    pub endpoint: Endpoint,
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
    /// `Some(k)`: return logprobs with `k` alternatives per token.
    pub logprobs: Option<usize>,
    /// SGLang `return_text_in_logprobs`: logprob entries carry token text.
    pub logprob_text: bool,
    pub max_tokens: Option<usize>,
    pub prompt_text: String,
    pub prompt_ids: Vec<u32>,
}

impl Params {
    /// Reads a request body; `default_model` answers requests without `model`.
    pub(crate) fn parse(
        endpoint: Endpoint,
        body: Body,
        default_model: &str,
        codec: &Codec,
    ) -> Result<Self, VllmError> {
        let Body { fields, ids } = body;
        let body = &fields;
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(default_model)
            .to_owned();
        let (prompt_text, prompt_ids, logprobs, max_tokens) = match endpoint {
            Endpoint::Chat => {
                let messages = body
                    .get("messages")
                    .and_then(Value::as_array)
                    .ok_or_else(|| VllmError::bad_request("'messages' must be an array"))?;
                let text = render_chat(messages, body.get("tools"));
                let logprobs = body
                    .get("logprobs")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    .then(|| usize_field(body, "top_logprobs").unwrap_or(0));
                let max = usize_field(body, "max_completion_tokens")
                    .or_else(|| usize_field(body, "max_tokens"));
                let ids = codec.encode(&text);
                (text, ids, logprobs, max)
            }
            Endpoint::Generate => {
                let (ids, max, logprobs, top) = super::sglang::parse(body, ids)?;
                (codec.decode(&ids), ids, logprobs.then_some(top), max)
            }
            Endpoint::Completions => {
                let (text, ids) = completion_prompt(body.get("prompt"), ids, codec)?;
                (
                    text,
                    ids,
                    usize_field(body, "logprobs"),
                    usize_field(body, "max_tokens"),
                )
            }
        };
        Ok(Self {
            endpoint,
            model,
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            return_token_ids: body
                .get("return_token_ids")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            logprobs,
            logprob_text: endpoint == Endpoint::Generate
                && body.get("return_text_in_logprobs") == Some(&Value::Bool(true)),
            max_tokens,
            prompt_text,
            prompt_ids,
        })
    }
}

/// A completions prompt: a string, a list of token ids (`ids` when the body
/// read them as such), or a one-string list.
fn completion_prompt(
    prompt: Option<&Value>,
    ids: Option<Vec<u32>>,
    codec: &Codec,
) -> Result<(String, Vec<u32>), VllmError> {
    if let Some(ids) = ids {
        return Ok((codec.decode(&ids), ids));
    }
    match prompt {
        Some(Value::String(s)) => Ok((s.clone(), codec.encode(s))),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            let ids = items
                .iter()
                .filter_map(Value::as_u64)
                .map(|id| {
                    u32::try_from(id).map_err(|_| VllmError::bad_request("token id too large"))
                })
                .collect::<Result<Vec<u32>, VllmError>>()?;
            Ok((codec.decode(&ids), ids))
        }
        Some(Value::Array(items)) if items.len() == 1 => match &items[0] {
            Value::String(s) => Ok((s.clone(), codec.encode(s))),
            _ => Err(VllmError::bad_request("unsupported 'prompt'")),
        },
        _ => Err(VllmError::bad_request(
            "'prompt' must be a string or a list of token ids",
        )),
    }
}

fn usize_field(body: &Value, key: &str) -> Option<usize> {
    body.get(key)
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
}
