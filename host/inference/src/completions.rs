//! `/v1/completions`: a text (or token id) prompt, and the response body and
//! stream chunks in vLLM's shape (prompt ids on the choice).

use serde_json::{Map, Value, json};

use agl_tokenizer::Tokenizer;
use agl_wire::ApiError;

use super::Generation;

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

pub fn body(job: &Generation, text: String, ids: &[u32], logprobs: &[f32], finish: &str) -> Value {
    let mut choice = json!({
        "index": 0,
        "text": text,
        "logprobs": job.opts.logprobs.then(|| logprobs_json(job, ids, logprobs, 0)),
        "finish_reason": finish,
        "stop_reason": null,
    });
    if job.opts.return_token_ids {
        choice["prompt_token_ids"] = json!(job.prompt_ids);
        choice["token_ids"] = json!(ids);
    }
    let mut body = job.envelope("text_completion");
    body["choices"] = json!([choice]);
    body
}

/// Legacy logprobs; `top_logprobs` holds just the sampled token.
fn logprobs_json(job: &Generation, ids: &[u32], logprobs: &[f32], offset: usize) -> Value {
    let tokens: Vec<String> = ids.iter().map(|&id| job.token_text(id)).collect();
    let mut offsets = Vec::with_capacity(ids.len());
    let mut at = offset;
    for t in &tokens {
        offsets.push(at);
        at += t.len();
    }
    let tops: Vec<Value> = tokens
        .iter()
        .zip(logprobs)
        .map(|(t, &lp)| Value::Object(Map::from_iter([(t.clone(), json!(lp))])))
        .collect();
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
           "text_offset": offsets})
}

pub fn token_chunk(job: &Generation, id: u32, logprob: f32, text: &str, first: bool) -> Value {
    let mut choice = json!({
        "index": 0,
        "text": text,
        "logprobs": job.opts.logprobs.then(|| logprobs_json(job, &[id], &[logprob], 0)),
        "finish_reason": null,
    });
    if job.opts.return_token_ids {
        choice["token_ids"] = json!([id]);
        if first {
            choice["prompt_token_ids"] = json!(job.prompt_ids);
        }
    }
    let mut chunk = job.envelope("text_completion");
    chunk["choices"] = json!([choice]);
    chunk
}

pub fn last_chunk(job: &Generation, rest: &str, finish: &str) -> Value {
    let mut chunk = job.envelope("text_completion");
    chunk["choices"] = json!([{"index": 0, "text": rest, "logprobs": null,
                               "finish_reason": finish, "stop_reason": null}]);
    chunk
}
