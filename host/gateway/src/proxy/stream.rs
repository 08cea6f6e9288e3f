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

use super::assemble::{Assembler, take_events};
use super::call::{Call, CallOutcome};
use super::dedup::DeliveryNote;
use super::record::Tokens;
use crate::GatewayConfig;
use agl_wire::record::CallStatus;
use agl_wire::rollout::ApiKind;
use agl_wire::rollout::JsonText;
use serde_json::Value;

/// Chunks buffered between the upstream reader and the client.
const CHANNEL: usize = 64;

pub fn respond(call: Call, upstream: reqwest::Response) -> Response {
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
    upstream: reqwest::Response,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    note: DeliveryNote,
) {
    let upstream_status = Some(upstream.status().as_u16());
    let mut chunks = upstream.bytes_stream();
    // A gateway-rendered stream is assembled from the chat chunks it
    // becomes, whichever API was called.
    let assembled = match call.rendered {
        Some(_) => ApiKind::ChatCompletions,
        None => call.api,
    };
    let mut asm = Assembler::new(assembled);
    // Gateway-rendered: completion chunks in, chat chunks out.
    let mut translate = call
        .rendered
        .as_ref()
        .map(|r| r.chat_chunks(&call.rollout_id));
    // An engine whose events are not completions chunks (SGLang's).
    let mut native = call.rendered.as_ref().and_then(|r| r.native_chunks());
    // A Messages or Responses call: its events instead of chat chunks.
    let mut events = call
        .rendered
        .as_ref()
        .and_then(|r| r.front_events(&call.rollout_id));
    let mut buf = Vec::new();
    let mut done = false;
    let mut left = false;
    let mut error = None;
    // Such a stream opens at once and pings while the engine is silent.
    let ping = GatewayConfig::seconds(call.st.config.stream_ping_secs);
    if let Some(e) = &mut events {
        for frame in e.start() {
            if tx.send(Ok(Bytes::from(frame))).await.is_err() {
                left = true;
            }
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
            () = tokio::time::sleep(ping), if events.is_some() => {
                let frame = events.as_ref().map(|e| e.ping()).unwrap_or_default();
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
        for data in take_events(&mut buf) {
            if data.trim() == "[DONE]" {
                done = true;
                break 'read;
            }
            let mut parsed = serde_json::from_str::<Value>(&data).ok();
            if let (Some(n), Some(v)) = (&mut native, &parsed) {
                match n.push(v) {
                    Ok(chunk) => parsed = Some(chunk),
                    Err(e) => {
                        error = Some(e);
                        break 'read;
                    }
                }
            }
            // What the client gets: the engine's chunk as it came, or the
            // chat chunks a completion chunk becomes; each is assembled once.
            // (A Messages or Responses call gets each chat chunk as its
            // events.)
            let mut out: Vec<String> = Vec::new();
            match (&mut translate, parsed) {
                (Some(t), Some(v)) => {
                    for c in t.push(&v) {
                        asm.push(&c);
                        match &mut events {
                            Some(e) => out.extend(e.push(&c)),
                            None => out.push(format!("data: {c}\n\n")),
                        }
                    }
                }
                (_, parsed) => {
                    parsed.iter().for_each(|v| asm.push(v));
                    out.push(format!("data: {data}\n\n"));
                }
            }
            for frame in out {
                if tx.send(Ok(Bytes::from(frame))).await.is_err() {
                    left = true;
                    break 'read;
                }
            }
        }
    }
    // Closes the engine connection now, before the record is written.
    drop(chunks);
    // One record per choice (a call of one choice: one), each holding its
    // choice alone.
    let mut answers: Vec<(Value, Tokens)> = (0..asm.len()).map(|i| asm.choice(i)).collect();
    // A Messages or Responses call's record holds the answer it streamed,
    // in that API's shape.
    if let (Some(r), Some(t), Some((response, tokens))) =
        (&call.rendered, &translate, answers.first_mut())
    {
        let finish = response
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str);
        let logprobs = response
            .pointer("/choices/0/logprobs")
            .cloned()
            .unwrap_or_default();
        if let Some(answer) = r.streamed_record(
            t.text(0),
            finish,
            &logprobs,
            tokens.response_ids.len(),
            &call.rollout_id,
        ) {
            *response = answer;
        }
    }
    let record = answers.first().map(|(r, _)| r.clone()).unwrap_or_default();
    if left {
        let outcomes = answers
            .into_iter()
            .map(|(response, tokens)| {
                CallOutcome::cancelled(JsonText::from(response), tokens, upstream_status)
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
        .map(|(response, tokens)| CallOutcome {
            status: if error.is_some() {
                CallStatus::Error
            } else {
                CallStatus::Ok
            },
            response: JsonText::from(response),
            tokens,
            error: error.clone(),
            upstream_status,
        })
        .collect();
    let end = match (call.commit_choices(outcomes).await, error) {
        (Ok(committed), None) => {
            note.set(committed.iter().map(|c| (c.retry, c.seq)));
            if let (Some(r), Some(t)) = (&call.rendered, &translate) {
                let replies = (0..committed.len()).map(|i| r.parse(t.text(i)));
                let seqs = committed.iter().map(|c| c.seq);
                r.served(seqs.zip(response_ids).zip(replies));
            }
            Ok(match &mut events {
                Some(e) => Bytes::from(e.end(&record).concat()),
                None => Bytes::from_static(b"data: [DONE]\n\n"),
            })
        }
        // An API with an error event says so in the stream, then ends it.
        (Ok(_), Some(e)) => match &mut events {
            Some(front) => Ok(Bytes::from(front.failed(&e))),
            None => Err(io::Error::other(e)),
        },
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
