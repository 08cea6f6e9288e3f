//! `stream: true`: SSE chunks as the engine samples tokens, each naming its
//! choice (`n` > 1 streams the choices interleaved), then per choice the
//! final chunk (unsent text or tool calls, finish reason), the usage chunk
//! when `stream_options.include_usage`, and `[DONE]`.

use std::io;

use agl_engine::EngineEvent;
use agl_wire::openai::Completion;
use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

use super::text::{TextState, final_text};
use super::{Generation, Sampled, completions};
use futures_util::StreamExt;

const CHANNEL: usize = 64;

pub fn respond(job: Generation, events: Vec<mpsc::UnboundedReceiver<EngineEvent>>) -> Response {
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

fn sse(v: &impl Serialize) -> Result<Bytes, io::Error> {
    let data = serde_json::to_string(v).map_err(io::Error::other)?;
    Ok(Bytes::from(format!("data: {data}\n\n")))
}

/// One choice being streamed: its decoded text so far.
struct Choice {
    text: TextState,
    first: bool,
}

/// Engine events of every choice -> SSE, each chunk naming its choice's
/// `index`, in the order the tokens come. Returning drops the receivers,
/// which aborts the sequences once the client has gone.
async fn pump(
    job: Generation,
    events: Vec<mpsc::UnboundedReceiver<EngineEvent>>,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
) {
    let mut choices: Vec<Choice> = (0..events.len())
        .map(|_| Choice {
            text: TextState::new(job.tokenizer.clone(), job.opts.stop.clone()),
            first: true,
        })
        .collect();
    let tagged = events.into_iter().enumerate().map(|(index, rx)| {
        futures_util::stream::unfold(rx, move |mut rx| async move {
            rx.recv().await.map(|event| ((index, event), rx))
        })
        .boxed()
    });
    let mut merged = futures_util::stream::select_all(tagged);
    let (mut open, mut completion_tokens) = (choices.len(), 0);
    while let Some((index, event)) = merged.next().await {
        let choice = &mut choices[index];
        let frame = match event {
            EngineEvent::Token {
                id,
                logprob,
                top,
                version,
            } => {
                let delta = choice.text.push(id);
                let token = Sampled {
                    ids: &[id],
                    logprobs: &[logprob],
                    top: std::slice::from_ref(&top),
                    versions: &[version],
                };
                let frame = sse(&completions::token_chunk(
                    &job,
                    index,
                    token,
                    &delta,
                    choice.first,
                ));
                choice.first = false;
                frame
            }
            EngineEvent::Finished(f) => {
                let full = final_text(&job.tokenizer, &f.response_ids, &job.opts.stop);
                let reason = f.finish_reason.as_str();
                let version = Some(Value::from(f.weight_version));
                completion_tokens += f.response_ids.len();
                open -= 1;
                let rest = choice.text.rest(&full);
                let mut last = completions::last_chunk(&job, index, rest, reason);
                last.weight_version = version;
                sse(&last)
            }
        };
        if tx.send(frame).await.is_err() {
            return;
        }
        if open == 0 {
            break;
        }
    }
    if open > 0 {
        // The engine stopped without finishing: cut the stream.
        let _ = tx.send(Err(io::Error::other("the engine stopped"))).await;
        return;
    }
    if job.opts.include_usage {
        let usage = job.usage(completion_tokens);
        let frame = sse(&Completion {
            usage: Some(usage),
            ..completions::body(&job, Vec::new())
        });
        let _ = tx.send(frame).await;
    }
    let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
}
