//! `/v1/completions`: a text (or token id) prompt, and the response body and
//! stream chunks in vLLM's shape (prompt ids on the choice).

use agl_wire::openai::{self, Completion, CompletionChoice, CompletionLogprobs};
use indexmap::IndexMap;
use serde_json::Value;

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
) -> CompletionChoice {
    let ids = job.opts.return_token_ids;
    CompletionChoice {
        index,
        text,
        logprobs: job.opts.logprobs.then(|| logprobs(job, sampled, 0)),
        finish_reason: Some(finish.to_string()),
        stop_reason: Some(Value::Null),
        prompt_token_ids: ids.then(|| job.prompt_ids.clone()),
        token_ids: ids.then(|| sampled.ids.to_vec()),
        token_weight_versions: ids.then(|| sampled.versions.to_vec()),
    }
}

/// The whole answer around its choices (a chunk is the same shape).
pub fn body(job: &Generation, choices: Vec<CompletionChoice>) -> Completion {
    Completion {
        id: job.id.clone(),
        object: openai::TEXT_COMPLETION.to_string(),
        created: job.created,
        model: job.model.to_string(),
        choices,
        ..Completion::default()
    }
}

/// Legacy logprobs: `top_logprobs` maps the `logprobs` most likely tokens
/// and the sampled one to their logprobs (vLLM's shape).
fn logprobs(job: &Generation, sampled: Sampled, offset: usize) -> CompletionLogprobs {
    let mut tokens = Vec::with_capacity(sampled.ids.len());
    let mut tops = Vec::with_capacity(sampled.ids.len());
    for (id, lp, top) in sampled.tokens() {
        let token = job.token_text(id);
        let mut map = IndexMap::new();
        for &(alt, alt_lp) in top {
            map.entry(job.token_text(alt)).or_insert(f64::from(alt_lp));
        }
        map.entry(token.clone()).or_insert(f64::from(lp));
        tops.push(map);
        tokens.push(token);
    }
    let values = sampled.logprobs.iter().map(|&lp| f64::from(lp)).collect();
    CompletionLogprobs::new(tokens, values, tops, offset)
}

pub fn token_chunk(
    job: &Generation,
    index: usize,
    token: Sampled,
    text: &str,
    first: bool,
) -> Completion {
    let ids = job.opts.return_token_ids;
    let choice = CompletionChoice {
        index,
        text: text.to_string(),
        logprobs: job.opts.logprobs.then(|| logprobs(job, token, 0)),
        token_ids: ids.then(|| token.ids.to_vec()),
        token_weight_versions: ids.then(|| token.versions.to_vec()),
        prompt_token_ids: (ids && first).then(|| job.prompt_ids.clone()),
        ..CompletionChoice::default()
    };
    body(job, vec![choice])
}

pub fn last_chunk(job: &Generation, index: usize, rest: &str, finish: &str) -> Completion {
    let choice = CompletionChoice {
        index,
        text: rest.to_string(),
        finish_reason: Some(finish.to_string()),
        stop_reason: Some(Value::Null),
        ..CompletionChoice::default()
    };
    body(job, vec![choice])
}
