//! Streamed calls: SSE chunks go to the client as they arrive while the
//! record is assembled; `[DONE]` is held back until the record is committed,
//! so a client that saw the end of the stream has its call in the store.

use std::io;

use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::assemble::{Assembler, take_events};
use super::call::{Call, CallOutcome};
use agl_wire::rollout::JsonText;

/// Chunks buffered between the upstream reader and the client.
const CHANNEL: usize = 64;

pub fn respond(call: Call, upstream: reqwest::Response) -> Response {
    let status = upstream.status();
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(CHANNEL);
    tokio::spawn(pump(call, upstream, tx));
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        status,
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Copies upstream events to `tx`, commits the record, then ends the stream.
/// A client that went away does not stop the pump: the call still happened
/// and its tokens are still training data.
async fn pump(call: Call, upstream: reqwest::Response, tx: mpsc::Sender<Result<Bytes, io::Error>>) {
    let upstream_status = Some(upstream.status().as_u16());
    let mut chunks = upstream.bytes_stream();
    let mut asm = Assembler::new(call.api);
    let mut buf = Vec::new();
    let mut done = false;
    let mut error = None;
    'read: while let Some(item) = chunks.next().await {
        let bytes = match item {
            Ok(b) => b,
            Err(e) => {
                error = Some(format!("upstream stream failed: {e}"));
                break;
            }
        };
        buf.extend_from_slice(&bytes);
        for data in take_events(&mut buf) {
            if data.trim() == "[DONE]" {
                done = true;
                break 'read;
            }
            if let Ok(v) = serde_json::from_str(&data) {
                asm.push(&v);
            }
            // A send error only means the client left; keep assembling.
            let _ = tx.send(Ok(Bytes::from(format!("data: {data}\n\n")))).await;
        }
    }
    if !done && error.is_none() {
        error = Some("upstream stream ended without [DONE]".into());
    }
    let outcome = CallOutcome {
        response: JsonText::from(asm.response()),
        tokens: std::mem::take(&mut asm.tokens),
        error: error.clone(),
        upstream_status,
    };
    let end = match (call.commit(outcome).await, error) {
        (Ok(_), None) => Ok(Bytes::from_static(b"data: [DONE]\n\n")),
        (Ok(_), Some(e)) => Err(io::Error::other(e)),
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
