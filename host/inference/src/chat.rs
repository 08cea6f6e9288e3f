//! `/v1/chat/completions`: the prompt from the chat template, and the
//! response body and stream chunks in vLLM's shape.

use agl_wire::openai::{
    self, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatLogprobs, ChatMessage, ChunkChoice,
    Delta, ToolCallDelta, Usage,
};
use serde_json::Value;

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

/// OpenAI `tool_calls` entries.
fn tool_calls(calls: &[ToolCall], id_prefix: &str) -> Vec<openai::ToolCall> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let id = format!("call_{id_prefix}_{i}");
            openai::ToolCall::function(id, c.name.clone(), c.arguments_text.clone())
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
) -> ChatChoice {
    let (content, calls) = message_parts(job, text);
    let finish = if calls.is_empty() {
        finish
    } else {
        "tool_calls"
    };
    ChatChoice {
        index,
        message: ChatMessage {
            content,
            tool_calls: tool_calls(&calls, &call_prefix(job, index)),
            ..ChatMessage::default()
        },
        logprobs: job.opts.logprobs.then(|| logprobs(job, sampled)),
        finish_reason: Some(finish.to_string()),
        stop_reason: None,
        token_ids: job.opts.return_token_ids.then(|| sampled.ids.to_vec()),
        token_weight_versions: job.opts.return_token_ids.then(|| sampled.versions.to_vec()),
    }
}

/// The whole answer around its choices.
pub fn body(job: &Generation, choices: Vec<ChatChoice>) -> ChatCompletion {
    ChatCompletion {
        id: job.id.clone(),
        object: openai::CHAT_COMPLETION.to_string(),
        created: job.created,
        model: job.model.to_string(),
        prompt_token_ids: job.opts.return_token_ids.then(|| job.prompt_ids.clone()),
        choices,
        ..ChatCompletion::default()
    }
}

fn logprobs(job: &Generation, sampled: Sampled) -> ChatLogprobs {
    let content = sampled
        .tokens()
        .map(|(id, lp, top)| logprob_entry(&job.tokenizer, id, lp, top))
        .collect();
    ChatLogprobs { content }
}

/// A chunk of choice `index` (its head filled in).
fn chunk(job: &Generation, choice: ChunkChoice) -> ChatCompletionChunk {
    ChatCompletionChunk {
        id: job.id.clone(),
        object: openai::CHAT_COMPLETION_CHUNK.to_string(),
        created: job.created,
        model: job.model.to_string(),
        choices: vec![choice],
        ..ChatCompletionChunk::default()
    }
}

/// The usage chunk (`stream_options.include_usage`): no choices.
pub fn usage_chunk(job: &Generation, usage: Usage) -> ChatCompletionChunk {
    ChatCompletionChunk {
        choices: Vec::new(),
        usage: Some(usage),
        ..chunk(job, ChunkChoice::default())
    }
}

/// The opening chunk of choice `index`: the role, and (vLLM) the prompt ids.
pub fn first_chunk(job: &Generation, index: usize) -> ChatCompletionChunk {
    let mut first = chunk(
        job,
        ChunkChoice {
            index,
            delta: Delta::opening(),
            ..ChunkChoice::default()
        },
    );
    first.prompt_token_ids = job.opts.return_token_ids.then(|| job.prompt_ids.clone());
    first
}

pub fn token_chunk(
    job: &Generation,
    index: usize,
    token: Sampled,
    text: &str,
) -> ChatCompletionChunk {
    chunk(
        job,
        ChunkChoice {
            index,
            delta: Delta::content(text),
            logprobs: job.opts.logprobs.then(|| logprobs(job, token)),
            token_ids: job.opts.return_token_ids.then(|| token.ids.to_vec()),
            token_weight_versions: job.opts.return_token_ids.then(|| token.versions.to_vec()),
            ..ChunkChoice::default()
        },
    )
}

/// The closing chunk of choice `index`: unsent content, or the parsed tool calls.
pub fn last_chunk(
    job: &Generation,
    index: usize,
    rest: &str,
    calls: &[ToolCall],
    finish: &str,
) -> ChatCompletionChunk {
    let mut delta = Delta::content(rest);
    let finish = if calls.is_empty() {
        finish
    } else {
        delta.tool_calls = (0..)
            .zip(tool_calls(calls, &call_prefix(job, index)))
            .map(|(i, c)| ToolCallDelta::whole(i, c))
            .collect();
        "tool_calls"
    };
    chunk(
        job,
        ChunkChoice {
            index,
            delta,
            finish_reason: Some(finish.to_string()),
            stop_reason: Some(Value::Null),
            ..ChunkChoice::default()
        },
    )
}
