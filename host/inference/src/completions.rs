//! `/v1/completions`: a text (or token id) prompt, and the response body and
//! stream chunks in vLLM's shape (prompt ids on the choice).

use serde_json::{Map, Value, json};

use agl_tokenizer::Tokenizer;
use agl_wire::ApiError;

use super::{Generation, Sampled};

/// A string prompt is tokenized with special tokens (vLLM's default); a list
/// of ints is used as is.
pub fn prompt(tokenizer: &Tokenizer, body: &Value) -> Result<Vec<u32>, ApiError> {
    match body.get("prompt") {
        Some(Value::String(text)) => tokenizer
            .encode(text, true)
            .map_err(|e| ApiError::bad_request(e.to_string())),
        Some(Value::Array(ids)) if ids.iter().all(Value::is_u64) => Ok(ids
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as u32)
            .collect()),
        _ => Err(ApiError::bad_request(
            "`prompt` must be a string or a list of token ids (one prompt per request)",
        )),
    }
}

/// Choice `index` of a whole answer.
pub fn choice(
    job: &Generation,
    index: usize,
    text: String,
    sampled: Sampled,
    finish: &str,
) -> Value {
    let mut choice = json!({
        "index": index,
        "text": text,
        "logprobs": job.opts.logprobs.then(|| logprobs_json(job, sampled, 0)),
        "finish_reason": finish,
        "stop_reason": null,
    });
    if job.opts.return_token_ids {
        choice["prompt_token_ids"] = json!(job.prompt_ids);
        choice["token_ids"] = json!(sampled.ids);
    }
    choice
}

/// The whole answer around its choices.
pub fn body(job: &Generation, choices: Vec<Value>) -> Value {
    let mut body = job.envelope("text_completion");
    body["choices"] = json!(choices);
    body
}

/// Legacy logprobs: `top_logprobs` maps the `logprobs` most likely tokens
/// and the sampled one to their logprobs (vLLM's shape).
fn logprobs_json(job: &Generation, sampled: Sampled, offset: usize) -> Value {
    let mut tokens = Vec::with_capacity(sampled.ids.len());
    let mut tops = Vec::with_capacity(sampled.ids.len());
    for (id, lp, top) in sampled.tokens() {
        let token = job.token_text(id);
        let mut map = Map::new();
        for &(alt, alt_lp) in top {
            map.entry(job.token_text(alt)).or_insert(json!(alt_lp));
        }
        map.entry(token.clone()).or_insert(json!(lp));
        tops.push(Value::Object(map));
        tokens.push(token);
    }
    let mut offsets = Vec::with_capacity(tokens.len());
    let mut at = offset;
    for t in &tokens {
        offsets.push(at);
        at += t.len();
    }
    json!({"tokens": tokens, "token_logprobs": sampled.logprobs, "top_logprobs": tops,
           "text_offset": offsets})
}

pub fn token_chunk(
    job: &Generation,
    index: usize,
    token: Sampled,
    text: &str,
    first: bool,
) -> Value {
    let mut choice = json!({
        "index": index,
        "text": text,
        "logprobs": job.opts.logprobs.then(|| logprobs_json(job, token, 0)),
        "finish_reason": null,
    });
    if job.opts.return_token_ids {
        choice["token_ids"] = json!(token.ids);
        if first {
            choice["prompt_token_ids"] = json!(job.prompt_ids);
        }
    }
    let mut chunk = job.envelope("text_completion");
    chunk["choices"] = json!([choice]);
    chunk
}

pub fn last_chunk(job: &Generation, index: usize, rest: &str, finish: &str) -> Value {
    let mut chunk = job.envelope("text_completion");
    chunk["choices"] = json!([{"index": index, "text": rest, "logprobs": null,
                               "finish_reason": finish, "stop_reason": null}]);
    chunk
}
