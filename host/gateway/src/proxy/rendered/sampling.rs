//! What a rendered call asks of the engine's sampling beyond the prompt:
//! `top_logprobs` alternatives (and their chat shape from the completions
//! logprobs the engine answers), and an output constraint in vLLM's
//! `structured_outputs` shape.

use serde_json::{Value, json};

use agl_wire::ApiError;
use agl_wire::openai::{ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob};
use indexmap::IndexMap;

use crate::proxy::front::Front;

/// The `top_logprobs` a request asks for, `None` when it asks for no
/// logprobs (as its API asks, [`Front::asks_logprobs`]). More than the
/// engine computes is a 400 naming the field.
pub(super) fn top_logprobs_of(front: &dyn Front, body: &Value) -> Result<Option<usize>, ApiError> {
    if !front.asks_logprobs(body) {
        return Ok(None);
    }
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or_else(|| {
            ApiError::bad_request("`top_logprobs` must be a non-negative integer")
        })?,
    };
    if top > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_request(format!(
            "`top_logprobs` must be at most {MAX_TOP_LOGPROBS}, got {top}"
        )));
    }
    Ok(Some(top as usize))
}

/// The logprob entries (chat shape) of the tokens that wrote `content`
/// within `completion`, the text the entries' tokens spell: what a
/// Responses `output_text` part carries. Tokens are placed by the byte
/// length of their text; all of them when `content` is not found.
pub fn content_logprobs(
    entries: &[TokenLogprob],
    completion: &str,
    content: &str,
) -> Vec<TokenLogprob> {
    let Some(start) = completion.find(content) else {
        return entries.to_vec();
    };
    let end = start + content.len();
    let mut at = 0;
    let mut out = Vec::new();
    for e in entries {
        let len = e.token.len();
        if at < end && at + len > start {
            out.push(TokenLogprob {
                bytes: Some(e.token.as_bytes().to_vec()),
                ..e.clone()
            });
        }
        at += len;
    }
    out
}

/// The output constraint of a request body as vLLM's `structured_outputs`
/// (what the embedded engine and vLLM take on a completions request) and
/// its field: `response_format` JSON becomes `json` / `json_object`; a
/// `structured_outputs` the harness sent goes as it is.
pub(super) fn structured_outputs(body: &Value) -> Option<(&'static str, Value)> {
    if let Some(given) = body.get("structured_outputs").filter(|v| !v.is_null()) {
        return Some(("structured_outputs", given.clone()));
    }
    // Chat's `response_format` holds the schema under `json_schema`; the
    // Responses API's `text.format` holds it itself.
    let (field, format, schema) = match body.get("response_format") {
        Some(f) => ("response_format", f, "/json_schema/schema"),
        None => ("text.format", body.pointer("/text/format")?, "/schema"),
    };
    let structured = match format.get("type")?.as_str()? {
        "json_object" => json!({"json_object": true}),
        "json_schema" => json!({"json": format.pointer(schema)?}),
        _ => return None,
    };
    Some((field, structured))
}

/// OpenAI's (and vLLM's default) limit on alternatives per token.
const MAX_TOP_LOGPROBS: u64 = 20;

/// Completions logprobs (`tokens`, `token_logprobs`, and `top_logprobs`
/// maps of token text to logprob) as chat `content` entries with the `top`
/// most likely alternatives each.
pub fn chat_logprobs(lp: Option<&CompletionLogprobs>, top: usize) -> Option<ChatLogprobs> {
    let lp = lp?;
    let content = lp
        .token_logprobs
        .iter()
        .enumerate()
        .map(|(i, &logprob)| TokenLogprob {
            token: lp.tokens.get(i).cloned().unwrap_or_default(),
            logprob,
            bytes: None,
            top_logprobs: lp
                .top_logprobs
                .get(i)
                .map_or(Vec::new(), |m| most_likely(m, top)),
        })
        .collect();
    Some(ChatLogprobs { content })
}

/// The `top` most likely entries of a `{token: logprob}` map, most likely
/// first, as chat alternatives.
fn most_likely(map: &IndexMap<String, f64>, top: usize) -> Vec<TopLogprob> {
    let mut entries: Vec<(&String, f64)> = map.iter().map(|(t, &lp)| (t, lp)).collect();
    entries.sort_by(|a, b| b.1.total_cmp(&a.1));
    entries
        .into_iter()
        .take(top)
        .map(|(t, lp)| TopLogprob::new(t.clone(), lp))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_texts_logprobs_are_the_tokens_that_wrote_it() {
        let entries: Vec<TokenLogprob> = ["<think>", "hm", "</think>", "\n", "Hel", "lo", "."]
            .iter()
            .enumerate()
            .map(|(i, t)| TokenLogprob {
                token: t.to_string(),
                logprob: -(i as f64),
                ..TokenLogprob::default()
            })
            .collect();
        let text = "<think>hm</think>\nHello.";
        let part = content_logprobs(&entries, text, "Hello.");
        let tokens: Vec<&str> = part.iter().map(|e| e.token.as_str()).collect();
        assert_eq!(tokens, ["Hel", "lo", "."]);
        assert_eq!(part[0].bytes.as_deref(), Some(&b"Hel"[..]));
        assert_eq!(part[0].logprob, -4.0);
        // Content the text does not hold (rewritten by the parser): all.
        assert_eq!(content_logprobs(&entries, text, "Bye").len(), entries.len());
    }
}
