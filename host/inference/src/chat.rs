//! `/v1/chat/completions`: the prompt from the chat template, and the
//! response body and stream chunks in vLLM's shape.

use serde_json::{Value, json};

use agl_tokenizer::Tokenizer;
use agl_wire::ApiError;

use super::{Generation, Sampled, logprob_entry};
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

/// Tool call ids of choice `index`: `call_{id}_{i}`, `call_{id}_{index}_{i}`
/// past the first choice.
fn call_prefix(job: &Generation, index: usize) -> String {
    if index == 0 {
        job.id.clone()
    } else {
        format!("{}_{index}", job.id)
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

/// Choice `index` of a whole answer.
pub fn choice(
    job: &Generation,
    index: usize,
    text: String,
    sampled: Sampled,
    finish: &str,
) -> Value {
    let (content, calls) = message_parts(job, text);
    let finish = if calls.is_empty() {
        finish
    } else {
        "tool_calls"
    };
    let mut choice = json!({
        "index": index,
        "message": {"role": "assistant", "content": content,
                    "tool_calls": calls_json(&calls, &call_prefix(job, index), false)},
        "logprobs": job.opts.logprobs.then(|| logprobs_json(job, sampled)),
        "finish_reason": finish,
        "stop_reason": null,
    });
    if job.opts.return_token_ids {
        choice["token_ids"] = json!(sampled.ids);
    }
    choice
}

/// The whole answer around its choices.
pub fn body(job: &Generation, choices: Vec<Value>) -> Value {
    let mut body = job.envelope("chat.completion");
    if job.opts.return_token_ids {
        body["prompt_token_ids"] = json!(job.prompt_ids);
    }
    body["choices"] = json!(choices);
    body
}

fn logprobs_json(job: &Generation, sampled: Sampled) -> Value {
    let content: Vec<Value> = sampled
        .tokens()
        .map(|(id, lp, top)| logprob_entry(&job.tokenizer, id, lp, top))
        .collect();
    json!({ "content": content })
}

/// The opening chunk of choice `index`: the role, and (vLLM) the prompt ids.
pub fn first_chunk(job: &Generation, index: usize) -> Value {
    let mut chunk = job.envelope("chat.completion.chunk");
    chunk["choices"] = json!([{"index": index, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null}]);
    if job.opts.return_token_ids {
        chunk["prompt_token_ids"] = json!(job.prompt_ids);
    }
    chunk
}

pub fn token_chunk(job: &Generation, index: usize, token: Sampled, text: &str) -> Value {
    let mut choice = json!({
        "index": index,
        "delta": {"content": text},
        "logprobs": job.opts.logprobs.then(|| logprobs_json(job, token)),
        "finish_reason": null,
    });
    if job.opts.return_token_ids {
        choice["token_ids"] = json!(token.ids);
    }
    let mut chunk = job.envelope("chat.completion.chunk");
    chunk["choices"] = json!([choice]);
    chunk
}

/// The closing chunk of choice `index`: unsent content, or the parsed tool calls.
pub fn last_chunk(
    job: &Generation,
    index: usize,
    rest: &str,
    calls: &[ToolCall],
    finish: &str,
) -> Value {
    let (delta, finish) = if calls.is_empty() {
        (json!({"content": rest}), finish)
    } else {
        let calls = calls_json(calls, &call_prefix(job, index), true);
        (json!({"content": rest, "tool_calls": calls}), "tool_calls")
    };
    let mut chunk = job.envelope("chat.completion.chunk");
    chunk["choices"] = json!([{"index": index, "delta": delta, "logprobs": null,
                               "finish_reason": finish, "stop_reason": null}]);
    chunk
}
