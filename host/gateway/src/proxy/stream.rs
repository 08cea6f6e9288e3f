//! Streamed calls: SSE chunks go to the client as they arrive while the
//! record is assembled; `[DONE]` is held back until the record is committed,
//! so a client that saw the end of the stream has its call in the store.
//! The body reports when it went out whole (see `dedup.rs`).

use std::io;

use axum::body::Bytes;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::call::{Call, CallOutcome};
use super::dedup::DeliveryNote;
use super::serving::Pushed;
use super::upstream::EngineResponse;
use crate::GatewayConfig;
use agl_wire::record::CallStatus;
use agl_wire::rollout::JsonText;

/// Chunks buffered between the upstream reader and the client.
const CHANNEL: usize = 64;

pub fn respond(call: Call, upstream: EngineResponse) -> Response {
    let status = upstream.status();
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(CHANNEL);
    let note = DeliveryNote::new(call.st.retries.clone(), call.rollout_id.clone());
    tokio::spawn(pump(call, upstream, tx, note.clone()));
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        status,
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        note.body(chunks),
    )
        .into_response()
}

/// Copies upstream events to `tx`, commits the record, then ends the stream.
/// A client that goes away stops the call: the upstream response is dropped
/// (the engine aborts the sequence) and the record says `cancelled`, with
/// the tokens produced until then.
async fn pump(
    call: Call,
    upstream: EngineResponse,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    note: DeliveryNote,
) {
    let upstream_status = Some(upstream.status().as_u16());
    let mut chunks = upstream.into_body().into_data_stream();
    let mut out = call.serving.stream(&call.rollout_id);
    let mut buf = Vec::new();
    let mut done = false;
    let mut left = false;
    let mut error = None;
    // A stream that pings opens at once and pings while the engine is
    // silent.
    let ping = GatewayConfig::seconds(call.st.config.stream_ping_secs);
    let pings = out.ping().is_some();
    for frame in out.start() {
        if tx.send(Ok(Bytes::from(frame))).await.is_err() {
            left = true;
        }
    }
    'read: loop {
        if left {
            break;
        }
        let item = tokio::select! {
            biased;
            () = tx.closed() => {
                left = true;
                break;
            }
            item = chunks.next() => item,
            () = tokio::time::sleep(ping), if pings => {
                let frame = out.ping().unwrap_or_default();
                if tx.send(Ok(Bytes::from(frame))).await.is_err() {
                    left = true;
                }
                continue;
            }
        };
        let Some(item) = item else { break };
        let bytes = match item {
            Ok(b) => b,
            Err(e) => {
                error = Some(format!("upstream stream failed: {e}"));
                break;
            }
        };
        buf.extend_from_slice(&bytes);
        let pushed = match out.push(&mut buf) {
            Ok(p) => p,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        for p in pushed {
            let frames = match p {
                Pushed::Done => {
                    done = true;
                    break 'read;
                }
                Pushed::Frames(frames) => frames,
            };
            for frame in frames {
                if tx.send(Ok(Bytes::from(frame))).await.is_err() {
                    left = true;
                    break 'read;
                }
            }
        }
    }
    // Closes the engine connection now, before the record is written.
    drop(chunks);
    let answers = out.answers();
    let record = answers.first().map(|(r, _)| r.clone()).unwrap_or_default();
    if left {
        let outcomes = answers
            .into_iter()
            .map(|(response, tokens)| {
                CallOutcome::cancelled(JsonText::from(response), tokens, upstream_status).checked()
            })
            .collect();
        if let Err(e) = call.commit_choices(outcomes).await {
            tracing::error!(rollout = %call.rollout_id, error = %e, "cannot record a cancelled call");
        }
        return;
    }
    if !done && error.is_none() {
        error = Some("upstream stream ended without [DONE]".into());
    }
    let response_ids: Vec<Vec<u32>> = answers
        .iter()
        .map(|(_, t)| t.response_ids.clone())
        .collect();
    let outcomes = answers
        .into_iter()
        .map(|(response, tokens)| {
            CallOutcome {
                status: if error.is_some() {
                    CallStatus::Error
                } else {
                    CallStatus::Ok
                },
                response: JsonText::from(response),
                tokens,
                error: error.clone(),
                upstream_status,
            }
            .checked()
        })
        .collect();
    let end = match (call.commit_choices(outcomes).await, error) {
        (Ok(committed), None) => {
            note.set(committed.iter().map(|c| (c.retry, c.seq)));
            out.served(committed.iter().map(|c| c.seq).collect(), response_ids);
            Ok(out.end(&record))
        }
        // An API with an error event says so in the stream, then ends it.
        (Ok(_), Some(e)) => out.failed(&e).ok_or_else(|| io::Error::other(e)),
        (Err(e), _) => {
            tracing::error!(rollout = %call.rollout_id, error = %e, "cannot record streamed call");
            Err(io::Error::other(e.to_string()))
        }
    };
    // An error item makes hyper abort the response, so the client sees a
    // cut stream rather than a clean end.
    let _ = tx.send(end).await;
    drop(call);
}
