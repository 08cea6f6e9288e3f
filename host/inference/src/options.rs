//! The sampling and output options of a completions request body.

use agl_engine::{MAX_TOP_LOGPROBS, SamplingParams};
use serde_json::Value;

use agl_wire::ApiError;

pub struct Options {
    pub params: SamplingParams,
    /// Stop strings: generation ends once one appears; it is not returned.
    pub stop: Vec<String>,
    pub logprobs: bool,
    /// Choices to sample, each independently (`n`).
    pub n: usize,
    /// vLLM's `return_token_ids`.
    pub return_token_ids: bool,
    pub stream: bool,
    pub include_usage: bool,
}

/// Reads `body`'s options; `eos` ids stop generation unless `ignore_eos`.
/// Without `max_tokens` a request may run to the engine's `max_len`; `n`
/// may be at most `max_n`.
pub fn parse(body: &Value, eos: &[u32], max_len: usize, max_n: usize) -> Result<Options, ApiError> {
    let f64_of = |key: &str, default: f64| -> Result<f64, ApiError> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| ApiError::bad_request(format!("`{key}` must be a number"))),
        }
    };
    let u64_of = |key: &str| -> Result<Option<u64>, ApiError> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                ApiError::bad_request(format!("`{key}` must be a non-negative integer"))
            }),
        }
    };
    let n = u64_of("n")?.unwrap_or(1) as usize;
    if n == 0 || n > max_n {
        return Err(ApiError::bad_request(format!(
            "`n` must be between 1 and {max_n}, got {n}"
        )));
    }
    let max_tokens = u64_of("max_tokens")?.map_or(max_len, |n| n as usize);
    // vLLM: top_k <= 0 means no cut.
    let top_k = body
        .get("top_k")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        .max(0) as usize;
    let mut stop_ids: Vec<u32> = match body.get("stop_token_ids") {
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::bad_request("`stop_token_ids` must be token ids"))?,
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(ApiError::bad_request("`stop_token_ids` must be a list")),
    };
    if !body
        .get("ignore_eos")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        stop_ids.extend_from_slice(eos);
    }
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::bad_request("`stop` must be strings"))?,
        Some(_) => return Err(ApiError::bad_request("`stop` must be a string or a list")),
    };
    // The number of alternatives; any number asks for logprobs.
    let asked = u64_of("logprobs")?;
    let (logprobs, top_logprobs) = (asked.is_some(), asked.unwrap_or(0));
    if top_logprobs > MAX_TOP_LOGPROBS as u64 {
        return Err(ApiError::bad_request(format!(
            "`logprobs` must be at most {MAX_TOP_LOGPROBS}, got {top_logprobs}"
        )));
    }
    let params = SamplingParams {
        temperature: f64_of("temperature", 1.0)?,
        top_p: f64_of("top_p", 1.0)?,
        top_k,
        max_tokens,
        stop_ids,
        seed: u64_of("seed")?,
        top_logprobs: top_logprobs as usize,
    };
    params.validate().map_err(ApiError::bad_request)?;
    let flag = |v: Option<&Value>| v.and_then(Value::as_bool).unwrap_or(false);
    Ok(Options {
        params,
        stop,
        logprobs,
        n,
        return_token_ids: flag(body.get("return_token_ids")),
        stream: flag(body.get("stream")),
        include_usage: flag(body.pointer("/stream_options/include_usage")),
    })
}
