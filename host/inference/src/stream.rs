//! `stream: true`: SSE chunks as the engine samples tokens, then the final
//! chunk (unsent text or tool calls, finish reason), the usage chunk when
//! `stream_options.include_usage`, and `[DONE]`.

use std::io;

use agl_trainer::engine::EngineEvent;
use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::text::{TextState, final_text};
use super::{Api, Generation, chat, completions};

const CHANNEL: usize = 64;

/// Text from here on is held back from content deltas: it is a tool call.
const TOOL_CALL_OPEN: &str = "<tool_call>";

pub fn respond(job: Generation, events: mpsc::UnboundedReceiver<EngineEvent>) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(CHANNEL);
    tokio::spawn(pump(job, events, tx));
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

fn sse(v: &Value) -> Result<Bytes, io::Error> {
    Ok(Bytes::from(format!("data: {v}\n\n")))
}

/// Engine events -> SSE. Returning drops `events`, which aborts the
/// sequence once the client has gone.
async fn pump(
    job: Generation,
    mut events: mpsc::UnboundedReceiver<EngineEvent>,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
) {
    let mut markers = job.opts.stop.clone();
    if job.tools {
        markers.push(TOOL_CALL_OPEN.to_string());
    }
    let mut text = TextState::new(job.tokenizer.clone(), markers);
    if job.api == Api::Chat && tx.send(sse(&chat::first_chunk(&job))).await.is_err() {
        return;
    }
    let mut first = true;
    while let Some(event) = events.recv().await {
        let chunk = match event {
            EngineEvent::Token { id, logprob } => {
                let delta = text.push(id);
                let chunk = match job.api {
                    Api::Chat => chat::token_chunk(&job, id, logprob, &delta),
                    Api::Completions => completions::token_chunk(&job, id, logprob, &delta, first),
                };
                first = false;
                chunk
            }
            EngineEvent::Finished(f) => {
                let full = final_text(&job.tokenizer, &f.response_ids, &job.opts.stop);
                let reason = f.finish_reason.as_str();
                let mut last = match job.api {
                    Api::Chat => {
                        let (content, calls) = chat::message_parts(&job, full);
                        let content = content.unwrap_or_default();
                        chat::last_chunk(&job, text.rest(&content), &calls, reason)
                    }
                    Api::Completions => completions::last_chunk(&job, text.rest(&full), reason),
                };
                last["weight_version"] = json!(f.weight_version);
                let _ = tx.send(sse(&last)).await;
                if job.opts.include_usage {
                    let mut usage = job.envelope(match job.api {
                        Api::Chat => "chat.completion.chunk",
                        Api::Completions => "text_completion",
                    });
                    usage["choices"] = json!([]);
                    usage["usage"] = job.usage(f.response_ids.len());
                    let _ = tx.send(sse(&usage)).await;
                }
                let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
                return;
            }
        };
        if tx.send(sse(&chunk)).await.is_err() {
            return;
        }
    }
    // The engine stopped without finishing: cut the stream.
    let _ = tx.send(Err(io::Error::other("the engine stopped"))).await;
}
