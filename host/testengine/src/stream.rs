//! Streamed (SSE) responses, chunked exactly like the plan's pieces.

use std::io;
use std::time::Duration;

use agl_wire::openai::{
    ChatCompletionChunk, ChunkChoice, Completion, CompletionChoice, Delta as OpenAiDelta,
    ToolCallDelta,
};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::faults::{Action, Decision};
use super::plan::Delta as PlanDelta;
use super::response::{Call, chat_logprobs, completion_logprobs};
use super::script::Endpoint;
use super::state::Answering;

/// Pause before a cut so the chunks before it reach the client.
const CUT_FLUSH: Duration = Duration::from_millis(5);

/// The SSE response for `call`, with the decision's chunk latency and cut.
pub fn respond(call: &Call, decision: Decision, answering: Answering) -> Response {
    let mut items: Vec<Result<Bytes, io::Error>> = chunks(call)
        .into_iter()
        .map(|chunk| Ok(Bytes::from(format!("data: {chunk}\n\n"))))
        .collect();
    items.push(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
    if let Action::CutStream(after) = decision.action
        && after < items.len()
    {
        // A body error makes hyper abort the connection mid-response.
        items.truncate(after);
        items.push(Err(io::Error::other("stream cut by fault injection")));
    }
    let body = Body::from_stream(paced(items, decision.chunk_latency, answering));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Yields `items`, waiting `gap` before each one after the first.
/// The stream is abandoned if dropped before its last item.
fn paced(
    items: Vec<Result<Bytes, io::Error>>,
    gap: Duration,
    answering: Answering,
) -> impl futures_util::Stream<Item = Result<Bytes, io::Error>> {
    futures_util::stream::unfold(
        (items.into_iter(), true, Some(answering)),
        move |(mut rest, first, mut answering)| async move {
            let Some(item) = rest.next() else {
                if let Some(a) = answering.take() {
                    a.done();
                }
                return None;
            };
            if !first && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            if item.is_err() {
                // Give hyper a pending poll to flush what was sent, else the
                // cut would discard the head too and look like a reset.
                tokio::time::sleep(CUT_FLUSH).await;
            }
            Some((item, (rest, false, answering)))
        },
    )
}

/// Every chunk body of the stream, before `[DONE]`.
pub fn chunks(call: &Call) -> Vec<Value> {
    let typed: Vec<Result<Value, _>> = match call.params.endpoint {
        Endpoint::Chat => chat_chunks(call).iter().map(serde_json::to_value).collect(),
        Endpoint::Completions => completion_chunks(call)
            .iter()
            .map(serde_json::to_value)
            .collect(),
        Endpoint::Generate => return super::sglang::chunks(call),
    };
    typed.into_iter().filter_map(Result::ok).collect()
}

fn chat_chunks(call: &Call) -> Vec<ChatCompletionChunk> {
    let params = &call.params;
    let mut out = Vec::new();
    let mut first = call.chat_chunk(vec![ChunkChoice {
        delta: OpenAiDelta::opening(),
        ..ChunkChoice::default()
    }]);
    // vLLM sends the prompt ids once, on the first chunk.
    first.prompt_token_ids = params.return_token_ids.then(|| params.prompt_ids.clone());
    out.push(first);
    let mut pos = 0;
    for piece in &call.plan.pieces {
        let delta = match &piece.delta {
            PlanDelta::Content(text) => OpenAiDelta::content(text.clone()),
            PlanDelta::ToolStart { index, id, name } => OpenAiDelta {
                tool_calls: vec![ToolCallDelta::start(*index, id.clone(), name.clone())],
                ..OpenAiDelta::default()
            },
            PlanDelta::ToolArgs { index, arguments } => OpenAiDelta {
                tool_calls: vec![ToolCallDelta::arguments(*index, arguments.clone())],
                ..OpenAiDelta::default()
            },
        };
        out.push(call.chat_chunk(vec![ChunkChoice {
            delta,
            logprobs: params.logprobs.map(|top| chat_logprobs(&piece.ids, pos, top)),
            token_ids: params.return_token_ids.then(|| piece.ids.clone()),
            ..ChunkChoice::default()
        }]));
        pos += piece.ids.len();
    }
    out.push(call.chat_chunk(vec![ChunkChoice {
        finish_reason: Some(call.plan.finish.as_str().to_string()),
        stop_reason: Some(Value::Null),
        ..ChunkChoice::default()
    }]));
    if params.include_usage {
        // With `stream_options.include_usage`, a last chunk with no choices.
        out.push(ChatCompletionChunk {
            usage: Some(call.usage()),
            ..call.chat_chunk(Vec::new())
        });
    }
    out
}

fn completion_chunks(call: &Call) -> Vec<Completion> {
    let params = &call.params;
    let mut out = Vec::new();
    let mut pos = 0;
    for piece in &call.plan.pieces {
        let text = match &piece.delta {
            PlanDelta::Content(text) => text.clone(),
            // Completion plans hold content only; keep arguments if one slips in.
            PlanDelta::ToolArgs { arguments, .. } => arguments.clone(),
            PlanDelta::ToolStart { .. } => String::new(),
        };
        out.push(completion_chunk(
            call,
            CompletionChoice {
                text,
                logprobs: params
                    .logprobs
                    .map(|top| completion_logprobs(&piece.ids, pos, top)),
                token_ids: params.return_token_ids.then(|| piece.ids.clone()),
                ..CompletionChoice::default()
            },
        ));
        pos += piece.ids.len();
    }
    out.push(completion_chunk(
        call,
        CompletionChoice {
            finish_reason: Some(call.plan.finish.as_str().to_string()),
            ..CompletionChoice::default()
        },
    ));
    if params.return_token_ids
        && let Some(choice) = out.first_mut().and_then(|c| c.choices.first_mut())
    {
        choice.prompt_token_ids = Some(params.prompt_ids.clone());
    }
    if params.include_usage {
        out.push(Completion {
            usage: Some(call.usage()),
            ..call.completion_head()
        });
    }
    out
}

fn completion_chunk(call: &Call, choice: CompletionChoice) -> Completion {
    Completion {
        choices: vec![choice],
        ..call.completion_head()
    }
}
