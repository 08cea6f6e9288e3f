//! SGLang's native `POST /generate`, as sgl-project/sglang 0.5.x answers it
//! with its default server settings (read from `managers/io_struct.py`
//! `GenerateReqInput`, `sampling/sampling_params.py`,
//! `managers/tokenizer_manager.py` `_handle_batch_output`,
//! `managers/schedule_batch.py` finish reasons, `entrypoints/http_server.py`):
//! token ids in (`input_ids`), `{"text", "output_ids", "meta_info"}` out,
//! `output_token_logprobs` as `[logprob, id, text|null]` (and
//! `output_top_logprobs` for `top_logprobs_num`), and a stream whose
//! every event is cumulative (everything so far), then `data: [DONE]`.

use serde_json::{Value, json};

use super::api::VllmError;
use super::plan::FinishReason;
use super::response::Call;
use super::tokens::{alternative, logprob, token_str, top_logprob};

/// `SamplingParams.__init__`'s arguments: any other key is a TypeError,
/// answered 400.
const SAMPLING_PARAMS: [&str; 24] = [
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "custom_params",
    "stream_interval",
    "sampling_seed",
];

/// What `/generate` asks for, read from the body and its `input_ids` when
/// they are a flat list of token ids: (prompt ids, max_new_tokens, logprobs
/// wanted, top_logprobs_num).
pub(crate) fn parse(
    body: &Value,
    ids: Option<Vec<u32>>,
) -> Result<(Vec<u32>, Option<usize>, bool, usize), VllmError> {
    let ids = match ids {
        Some(ids) => ids,
        None => input_ids(body)?,
    };
    let sampling = match body.get("sampling_params") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(VllmError::bad_request(
                "`sampling_params` must be an object",
            ));
        }
    };
    if let Some(bad) = sampling
        .keys()
        .find(|k| !SAMPLING_PARAMS.contains(&k.as_str()))
    {
        return Err(VllmError::bad_request(format!(
            "SamplingParams.__init__() got an unexpected keyword argument '{bad}'"
        )));
    }
    let max = sampling
        .get("max_new_tokens")
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    let logprobs = body
        .get("return_logprob")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let top = body
        .get("top_logprobs_num")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    Ok((ids, max, logprobs, top))
}

/// `input_ids` read from the JSON body, when the body did not read them as
/// ids: each way it is not a flat list of `u32`s, refused.
fn input_ids(body: &Value) -> Result<Vec<u32>, VllmError> {
    body.get("input_ids")
        .and_then(Value::as_array)
        .filter(|a| a.iter().all(Value::is_u64))
        .ok_or_else(|| {
            VllmError::bad_request("this mock serves `input_ids` (a flat list of token ids)")
        })?
        .iter()
        .filter_map(Value::as_u64)
        .map(|id| u32::try_from(id).map_err(|_| VllmError::bad_request("token id too large")))
        .collect()
}

fn finish_reason(call: &Call, ids: &[u32]) -> Value {
    match call.plan.finish {
        FinishReason::Length => json!({"type": "length", "length": ids.len()}),
        // A stop on the last sampled id (this engine has no EOS token).
        _ => json!({"type": "stop", "matched": ids.last().copied().unwrap_or(0)}),
    }
}

/// The answer after `n` sampled tokens (`text` their text): cumulative,
/// like every event of a default SGLang stream and the whole answer.
fn state(call: &Call, ids: &[u32], text: &str, finished: bool) -> Value {
    let mut meta = json!({
        "id": call.id,
        "finish_reason": if finished { finish_reason(call, ids) } else { Value::Null },
        "prompt_tokens": call.params.prompt_ids.len(),
        "weight_version": call.weight_version,
        "completion_tokens": ids.len(),
        "cached_tokens": 0,
    });
    if call.params.logprobs.is_some() {
        let last_prompt = call.params.prompt_ids.last().copied().unwrap_or(0);
        meta["input_token_logprobs"] = json!([[null, last_prompt, null]]);
        // `return_text_in_logprobs`: each entry's token text, else null.
        let text = |id: u32| {
            if call.params.logprob_text {
                json!(token_str(id))
            } else {
                Value::Null
            }
        };
        meta["output_token_logprobs"] = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| json!([logprob(i), id, text(id)]))
            .collect();
        let top = call.params.logprobs.unwrap_or(0);
        if top > 0 {
            // `top_logprobs_num` alternatives per token, most likely first.
            meta["output_top_logprobs"] = ids
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    (0..top)
                        .map(|rank| {
                            let alt = alternative(id, rank);
                            json!([top_logprob(i, rank), alt, text(alt)])
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
        }
    }
    json!({"text": text, "output_ids": ids, "meta_info": meta})
}

/// The non-streamed answer.
pub fn body(call: &Call) -> Value {
    state(call, &call.plan.ids(), &call.plan.content(), true)
}

/// Every event of the stream, before `[DONE]`: one per piece, cumulative.
pub fn chunks(call: &Call) -> Vec<Value> {
    let mut ids = Vec::new();
    let mut text = String::new();
    let n = call.plan.pieces.len();
    let mut out: Vec<Value> = call
        .plan
        .pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            ids.extend_from_slice(&piece.ids);
            if let super::plan::Delta::Content(t) = &piece.delta {
                text.push_str(t);
            }
            state(call, &ids, &text, i + 1 == n)
        })
        .collect();
    if out.is_empty() {
        out.push(state(call, &[], "", true));
    }
    out
}
