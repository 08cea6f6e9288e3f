//! `/v1/chat/completions`: the prompt from the chat template, and the
//! response body and stream chunks in vLLM's shape.

use serde_json::{Value, json};

use agl_tokenizer::Tokenizer;
use agl_wire::ApiError;

use super::{Generation, logprob_entry};
use agl_conversation::ToolCall;

/// Renders `messages` (+ `tools`) with the chat template and tokenizes the
/// result without adding special tokens (the template has them), as vLLM does.
pub fn prompt(tokenizer: &Tokenizer, body: &Value) -> Result<Vec<u32>, ApiError> {
    let messages = body
        .get("messages")
        .filter(|m| m.is_array())
        .ok_or_else(|| ApiError::bad_request("`messages` must be a list"))?;
    let tools = body
        .get("tools")
        .filter(|t| !t.is_null())
        .map(Value::to_string);
    let add_generation_prompt = body
        .get("add_generation_prompt")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let text = tokenizer
        .apply_chat_template(
            &messages.to_string(),
            tools.as_deref(),
            add_generation_prompt,
        )
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Content and tool calls of the final text, read as the template's model
/// family writes them (`agl_conversation::family`).
pub fn message_parts(job: &Generation, text: String) -> (Option<String>, Vec<ToolCall>) {
    if job.tools {
        let turn = job.family.parse(&text);
        (turn.content, turn.tool_calls)
    } else {
        (Some(text), Vec::new())
    }
}

/// OpenAI `tool_calls` entries; `with_index` for stream deltas.
fn calls_json(calls: &[ToolCall], id_prefix: &str, with_index: bool) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({"id": format!("call_{id_prefix}_{i}"), "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments_text}});
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

pub fn body(job: &Generation, text: String, ids: &[u32], logprobs: &[f32], finish: &str) -> Value {
    let (content, calls) = message_parts(job, text);
    let finish = if calls.is_empty() {
        finish
    } else {
        "tool_calls"
    };
    let mut choice = json!({
        "index": 0,
        "message": {"role": "assistant", "content": content,
                    "tool_calls": calls_json(&calls, &job.id, false)},
        "logprobs": job.opts.logprobs.then(|| logprobs_json(job, ids, logprobs)),
        "finish_reason": finish,
        "stop_reason": null,
    });
    let mut body = job.envelope("chat.completion");
    if job.opts.return_token_ids {
        body["prompt_token_ids"] = json!(job.prompt_ids);
        choice["token_ids"] = json!(ids);
    }
    body["choices"] = json!([choice]);
    body
}

fn logprobs_json(job: &Generation, ids: &[u32], logprobs: &[f32]) -> Value {
    let content: Vec<Value> = ids
        .iter()
        .zip(logprobs)
        .map(|(&id, &lp)| logprob_entry(&job.tokenizer, id, lp))
        .collect();
    json!({ "content": content })
}

/// The opening chunk: the role, and (vLLM) the prompt ids.
pub fn first_chunk(job: &Generation) -> Value {
    let mut chunk = job.envelope("chat.completion.chunk");
    chunk["choices"] = json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null}]);
    if job.opts.return_token_ids {
        chunk["prompt_token_ids"] = json!(job.prompt_ids);
    }
    chunk
}

pub fn token_chunk(job: &Generation, id: u32, logprob: f32, text: &str) -> Value {
    let mut choice = json!({
        "index": 0,
        "delta": {"content": text},
        "logprobs": job.opts.logprobs.then(|| logprobs_json(job, &[id], &[logprob])),
        "finish_reason": null,
    });
    if job.opts.return_token_ids {
        choice["token_ids"] = json!([id]);
    }
    let mut chunk = job.envelope("chat.completion.chunk");
    chunk["choices"] = json!([choice]);
    chunk
}

/// The closing chunk: unsent content, or the parsed tool calls.
pub fn last_chunk(job: &Generation, rest: &str, calls: &[ToolCall], finish: &str) -> Value {
    let (delta, finish) = if calls.is_empty() {
        (json!({"content": rest}), finish)
    } else {
        let calls = calls_json(calls, &job.id, true);
        (json!({"content": rest, "tool_calls": calls}), "tool_calls")
    };
    let mut chunk = job.envelope("chat.completion.chunk");
    chunk["choices"] = json!([{"index": 0, "delta": delta, "logprobs": null,
                               "finish_reason": finish, "stop_reason": null}]);
    chunk
}
