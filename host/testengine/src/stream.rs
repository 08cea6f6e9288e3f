//! Streamed (SSE) responses, chunked exactly like the plan's pieces.

use std::io;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::faults::{Action, Decision};
use super::plan::Delta;
use super::response::{Call, chat_logprobs, completion_logprobs, insert};
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
    match call.params.endpoint {
        Endpoint::Chat => chat_chunks(call),
        Endpoint::Completions => completion_chunks(call),
        Endpoint::Generate => super::sglang::chunks(call),
    }
}

fn chat_chunks(call: &Call) -> Vec<Value> {
    let params = &call.params;
    let mut out = Vec::new();
    let mut first = chat_chunk(
        call,
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    );
    if params.return_token_ids {
        // vLLM sends the prompt ids once, on the first chunk.
        insert(&mut first, "prompt_token_ids", json!(params.prompt_ids));
    }
    out.push(first);
    let mut pos = 0;
    for piece in &call.plan.pieces {
        let delta = match &piece.delta {
            Delta::Content(text) => json!({"content": text}),
            Delta::ToolStart { index, id, name } => json!({"tool_calls": [{
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            Delta::ToolArgs { index, arguments } => json!({"tool_calls": [{
                "index": index, "function": {"arguments": arguments},
            }]}),
        };
        let mut chunk = chat_chunk(call, delta, Value::Null);
        if let Some(top) = params.logprobs {
            set_choice(&mut chunk, "logprobs", chat_logprobs(&piece.ids, pos, top));
        }
        if params.return_token_ids {
            set_choice(&mut chunk, "token_ids", json!(piece.ids));
        }
        pos += piece.ids.len();
        out.push(chunk);
    }
    let mut last = chat_chunk(call, json!({}), json!(call.plan.finish.as_str()));
    set_choice(&mut last, "stop_reason", Value::Null);
    out.push(last);
    push_usage(call, "chat.completion.chunk", &mut out);
    out
}

fn chat_chunk(call: &Call, delta: Value, finish: Value) -> Value {
    let mut chunk = call.envelope("chat.completion.chunk");
    insert(
        &mut chunk,
        "choices",
        json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]),
    );
    chunk
}

fn completion_chunks(call: &Call) -> Vec<Value> {
    let params = &call.params;
    let mut out = Vec::new();
    let mut pos = 0;
    for piece in &call.plan.pieces {
        let text = match &piece.delta {
            Delta::Content(text) => text.clone(),
            // Completion plans hold content only; keep arguments if one slips in.
            Delta::ToolArgs { arguments, .. } => arguments.clone(),
            Delta::ToolStart { .. } => String::new(),
        };
        let mut chunk = completion_chunk(call, &text, Value::Null);
        if let Some(top) = params.logprobs {
            set_choice(
                &mut chunk,
                "logprobs",
                completion_logprobs(&piece.ids, pos, top),
            );
        }
        if params.return_token_ids {
            set_choice(&mut chunk, "token_ids", json!(piece.ids));
        }
        pos += piece.ids.len();
        out.push(chunk);
    }
    out.push(completion_chunk(call, "", json!(call.plan.finish.as_str())));
    if params.return_token_ids
        && let Some(first) = out.first_mut()
    {
        set_choice(first, "prompt_token_ids", json!(params.prompt_ids));
    }
    push_usage(call, "text_completion", &mut out);
    out
}

fn completion_chunk(call: &Call, text: &str, finish: Value) -> Value {
    let mut chunk = call.envelope("text_completion");
    insert(
        &mut chunk,
        "choices",
        json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]),
    );
    chunk
}

/// With `stream_options.include_usage`, a last chunk with no choices.
fn push_usage(call: &Call, object: &str, out: &mut Vec<Value>) {
    if call.params.include_usage {
        let mut chunk = call.envelope(object);
        insert(&mut chunk, "choices", json!([]));
        insert(&mut chunk, "usage", call.usage());
        out.push(chunk);
    }
}

fn set_choice(chunk: &mut Value, key: &str, value: Value) {
    if let Some(choice) = chunk.pointer_mut("/choices/0") {
        insert(choice, key, value);
    }
}
