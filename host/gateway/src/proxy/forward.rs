//! Sending a checked call to its engine and answering it. The call runs in
//! the handler's own task (a task of its own cost a hand-off between
//! workers per call: ~65 µs of the gateway's ~280 µs, benches/gateway.rs).
//! A client that disconnects makes the server drop the handler; while the
//! engine is still answering, that drops the engine request (vLLM and the
//! embedded engine abort the sequence when their client goes) and
//! [`Pending`]'s drop records the call as cancelled. Once the answer is
//! in, nothing is left to cancel: its record is queued to the store at the
//! next step, and stands whether or not the client stays to read it.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use serde_json::value::RawValue;

use super::call::{Call, CallOutcome};
use super::dedup::DeliveryNote;
use super::record::Tokens;
use super::upstream::EngineResponse;
use super::{record, record_body, stream, token_scan};
use crate::ApiError;
use agl_wire::record::CallStatus;
use agl_wire::rollout::JsonText;

/// Runs `call` (POST `body` to `url`) and returns its answer.
pub async fn run(call: Call, url: String, body: Bytes, streaming: bool) -> Response {
    let pending = Pending(Some(call));
    let fetched = fetch(pending.call(), &url, body, streaming).await;
    let call = pending.answered();
    match fetched {
        Fetched::Stream(resp) => stream::respond(call, resp),
        Fetched::Unreachable(message) => {
            failed(&call, CallOutcome::failed(message.clone(), None), message).await
        }
        Fetched::Whole(status, Err(message)) => {
            let outcome = CallOutcome::failed(message.clone(), Some(status.as_u16()));
            failed(&call, outcome, message).await
        }
        Fetched::Whole(status, Ok(bytes)) => complete(&call, status, bytes).await,
    }
}

/// A call waiting for its engine. Dropped while it still holds the call
/// (the client left, and the server dropped the handler), it records the
/// call as cancelled, in a task of its own: the drop cannot wait.
struct Pending(Option<Call>);

impl Pending {
    fn call(&self) -> &Call {
        self.0
            .as_ref()
            .expect("a pending call holds its call until answered")
    }

    /// The engine answered: the call is the answer's to record.
    fn answered(mut self) -> Call {
        self.0.take().expect("answered once")
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(call) = self.0.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!(rollout = %call.rollout_id, "cannot record a cancelled call: no runtime");
            return;
        };
        runtime.spawn(async move {
            let outcome = CallOutcome::cancelled(JsonText::default(), Default::default(), None);
            if let Err(e) = call.commit(outcome).await {
                tracing::error!(rollout = %call.rollout_id, error = %e, "cannot record a cancelled call");
            }
        });
    }
}

/// What the engine sent back, before anything reached the client.
enum Fetched {
    /// A successful stream, head only: `stream.rs` copies it on.
    Stream(EngineResponse),
    /// A whole body (or the error reading it).
    Whole(StatusCode, Result<Bytes, String>),
    /// No answer at all.
    Unreachable(String),
}

async fn fetch(call: &Call, url: &str, body: Bytes, streaming: bool) -> Fetched {
    match call.st.upstream.send(&call.engine, url, body).await {
        Err(e) => Fetched::Unreachable(e.to_string()),
        Ok(resp) if resp.status().is_success() && streaming => Fetched::Stream(resp),
        Ok(resp) => {
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .map_err(|e| format!("reading the engine's response: {e}"));
            Fetched::Whole(status, bytes)
        }
    }
}

/// Records a call that got no usable answer and answers 502 (in the
/// called API's error shape).
async fn failed(call: &Call, outcome: CallOutcome, message: String) -> Response {
    if let Err(e) = call.commit(outcome).await {
        return call.front.error(e);
    }
    let e = ApiError::new(StatusCode::BAD_GATEWAY, "server_error", message);
    call.front.error(e)
}

/// A non-streamed call (or an upstream error answer): commit the record
/// (one per choice), then answer with the engine's body.
async fn complete(call: &Call, status: StatusCode, bytes: Bytes) -> Response {
    // What the harness gets (a rendered call: its API's shape from the
    // engine's completion), and the record keeps what it got; an engine's
    // error answer goes on verbatim.
    let (bytes, written, known_tokens, replies) = if status.is_success() {
        let whole = call.serving.whole(bytes, &call.rollout_id);
        (whole.client, whole.written, whole.tokens, whole.replies)
    } else {
        (bytes, None, None, Vec::new())
    };
    // The engine's body is kept as its own JSON text; only the token
    // fields are read out of it, by a walk that also checks the limits
    // (`token_scan`), so serde is left only its syntax. What the gateway
    // wrote is JSON already, checked as it was written.
    let scanned = match known_tokens {
        None if status.is_success() => token_scan::scan(&bytes),
        _ => None,
    };
    let raw = match written {
        Some(raw) => Some(raw),
        None => std::str::from_utf8(&bytes).ok().and_then(|text| {
            if scanned.is_some() {
                RawValue::from_string(text.to_owned()).ok()
            } else {
                record_body(text).ok()
            }
        }),
    };
    let valid = raw.is_some();
    let outcomes = match (raw, status.is_success()) {
        (Some(body), true) => {
            let tokens = known_tokens
                .or(scanned)
                .or_else(|| record::tokens_by_serde(&bytes))
                .unwrap_or_else(|| {
                    let v = serde_json::from_str(body.get()).unwrap_or(Value::Null);
                    record::tokens_of(call.front.kind(), &v)
                });
            answered(call, status, body, tokens)
        }
        (None, true) => vec![CallOutcome::failed(
            "engine answered with invalid JSON".into(),
            Some(status.as_u16()),
        )],
        (body, false) => vec![CallOutcome {
            response: body.map(JsonText::from_raw).unwrap_or_default(),
            ..CallOutcome::failed(
                format!("engine answered HTTP {status}"),
                Some(status.as_u16()),
            )
        }],
    };
    let response_ids: Vec<Vec<u32>> = outcomes
        .iter()
        .map(|o| o.tokens.response_ids.clone())
        .collect();
    let ok = outcomes.iter().all(|o| o.status == CallStatus::Ok);
    let committed = match call.commit_choices(outcomes).await {
        Ok(c) => c,
        Err(e) => return call.front.error(e),
    };
    if ok {
        let seqs = committed.iter().map(|c| c.seq);
        call.serving.served(seqs, response_ids, replies);
    }
    if status.is_success() && !valid {
        let e = ApiError::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            "engine answered with invalid JSON",
        );
        return call.front.error(e);
    }
    let note = DeliveryNote::new(call.st.retries.clone(), call.rollout_id.clone());
    note.set(committed.iter().map(|c| (c.retry, c.seq)));
    let body = note.body(futures_util::stream::once(async move {
        Ok::<_, std::io::Error>(bytes)
    }));
    // Client errors from the engine (bad parameters, context too long) are
    // the harness's to see, verbatim.
    (status, [(CONTENT_TYPE, "application/json")], body).into_response()
}

/// A successful answer's outcomes: one, or one per choice of an `n` > 1
/// call, each holding its choice alone.
fn answered(
    call: &Call,
    status: StatusCode,
    body: Box<RawValue>,
    tokens: Vec<Tokens>,
) -> Vec<CallOutcome> {
    let ok = |response, tokens| CallOutcome {
        status: CallStatus::Ok,
        tokens,
        response,
        error: None,
        upstream_status: Some(status.as_u16()),
    };
    let split = (call.choices > 1 && tokens.len() > 1)
        .then(|| record::split_choices(body.get()))
        .flatten()
        .filter(|bodies| bodies.len() == tokens.len());
    match split {
        Some(bodies) => bodies
            .into_iter()
            .zip(tokens)
            .map(|(body, tokens)| ok(JsonText::from(body), tokens))
            .collect(),
        None => {
            let tokens = tokens.into_iter().next().unwrap_or_default();
            vec![ok(JsonText::from_raw(body), tokens)]
        }
    }
}
